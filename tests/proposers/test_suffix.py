"""Suffix decoding end to end: the proposer is lossless (greedy identical, sampled output
the target's) whether its drafts come from past outputs or the request itself, `auto`
weighs it, and at the edges the CLI's cache file, a server's shared store and the
bench's repeats behave."""
from __future__ import annotations

import json
import random
import threading

import pytest
from conftest import CharTokenizer, tiny_target
from distribution_support import exact_marginals, first_two_counts, worst_pvalue

from verispec import Engine, SamplingParams, SpecConfig
from verispec.cli.main import main
from verispec.proposers.suffix_store import SuffixStore
from verispec.step.lossless import compare_greedy

PLAIN = SpecConfig("none", k=0)
PROMPTS = [[3, 17, 4, 9, 3, 17, 4], list(range(10, 40)), [7, 7, 7, 7, 8, 7, 7, 7]]

# -- lossless -----------------------------------------------------------------------

def _random_store(vocab: int, seed: int) -> SuffixStore:
    """Past outputs unrelated to the target: drafts that are mostly rejected."""
    rng = random.Random(seed)
    store = SuffixStore()
    for _ in range(200):
        store.add([rng.randrange(vocab) for _ in range(rng.randrange(5, 40))])
    return store


@pytest.mark.parametrize("backend,tree", [("native", 0), ("native", 12), ("hf", 12)])
def test_greedy_equality_tiny(backend, tree, tiny, tiny_native):
    target = tiny if backend == "hf" else tiny_native
    spec = SpecConfig("suffix", k=6, tree=tree, suffix_min_prob=0.0)
    for store in (SuffixStore(), _random_store(target.vocab_size, 3)):
        engine = Engine(target, tokenizer=CharTokenizer())
        engine.suffix_store = store
        for prompt in PROMPTS:
            want = engine.generate(prompt, SamplingParams(max_new_tokens=32), PLAIN).token_ids
            for run in ("cold", "warm"):
                got = engine.generate(prompt, SamplingParams(max_new_tokens=32), spec)
                comparison = compare_greedy(target, prompt, want, got.token_ids)
                assert comparison.identical, (run, comparison.describe())
            # Warm: the store holds this prompt's output, so it is drafted and accepted.
            assert got.stats.accepted >= 24 and got.stats.tau > 3


def test_greedy_equality_default_model(default_engine):
    engine = default_engine
    saved = engine.suffix_store
    engine.suffix_store = SuffixStore()
    try:
        prompts = [engine.encode("List three colours as JSON: {\"colours\": ["),
                   engine.encode("def fibonacci(n):\n")]
        for prompt in prompts:
            want = engine.generate(prompt, SamplingParams(max_new_tokens=24), PLAIN).token_ids
            for tree in (0, 8):
                got = engine.generate(prompt, SamplingParams(max_new_tokens=24),
                                      SpecConfig("suffix", k=6, tree=tree))
                comparison = compare_greedy(engine.target, prompt, want, got.token_ids)
                assert comparison.identical, comparison.describe()
            assert got.stats.tau > 2  # the second run drafts from the first's output
    finally:
        engine.suffix_store = saved


@pytest.mark.parametrize("tree", [0, 6])
def test_sampled_output_follows_the_target(tree, full_size_runs):
    """1000 seeded three-token requests on a vocab-8 target at T = 2, drafting from a
    store whose outputs after the prompt branch several ways (and which learns every
    request's output as it goes): the first and second tokens' marginals pass
    chi-square against the target's exact ones, and drafts are often accepted."""
    target = tiny_target(11, layers=1, vocab=8)
    engine = Engine(target)
    rng = random.Random(5)
    for _ in range(40):
        engine.suffix_store.add([1, 2, 3, rng.randrange(8), rng.randrange(8)])
    prompt, temperature, runs = [1, 2, 3], 2.0, full_size_runs
    spec = SpecConfig("suffix", k=2, tree=tree, suffix_min_prob=0.0)
    counts, drafted, accepted = first_two_counts(engine, prompt, spec, temperature, runs)
    assert drafted >= 2 * runs and 0.1 * runs < accepted < drafted
    assert worst_pvalue(counts, exact_marginals(target, prompt, temperature), runs) > 1e-3


def test_auto_has_suffix_as_a_candidate(tiny):
    engine = Engine(tiny, tokenizer=CharTokenizer())
    prompt = PROMPTS[1]
    want = engine.generate(prompt, SamplingParams(max_new_tokens=32), PLAIN).token_ids
    spec = SpecConfig("auto", k=6, adaptive=True)
    for _ in range(2):
        got = engine.generate(prompt, SamplingParams(max_new_tokens=32), spec)
        assert got.token_ids == want
    assert engine.suffix_store.sequences() == [want, want]
    assert "suffix" in {step.proposer for step in got.stats.steps}


# -- the edges: the CLI's cache file, one store behind a server --------------------

def test_cli_corrupt_suffix_cache_warns_once_and_starts_fresh(capsys, tmp_path):
    import shutil

    from conftest import tiny_llama

    from verispec.models import loading

    folder = tmp_path / "small"  # a random model with the default model's tokenizer
    tiny_llama(0, vocab=49152, layers=2, max_positions=256).save_pretrained(folder)
    source = loading.resolve_model_dir(None)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, folder / name)
    cache = tmp_path / "suffix.npz"
    cache.write_bytes(b"\x00garbage, not a cache")
    # A fixed k: adaptive k prices drafts on measured step times, so what it accepts from the
    # stored answer would depend on how busy the machine is.
    argv = ["generate", "--model", str(folder), "--prompt", "a b a b a b", "--max-new-tokens",
            "12", "--json", "--dtype", "fp32", "--proposer", "suffix", "--k", "4",
            "--suffix-cache", str(cache)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert any("saved 1 outputs" in line for line in err.splitlines())
    assert len(warnings) == 1 and "not a readable suffix cache" in warnings[0]
    assert "starting with an empty store" in warnings[0]
    first = json.loads(out)["token_ids"]
    assert SuffixStore().load(str(cache)) == 1  # rewritten, valid, with this run's output
    assert main(argv) == 0  # the second run learns from the first
    out, err = capsys.readouterr()
    assert "1 cached outputs" in err
    second = json.loads(out)
    assert second["token_ids"] == first and second["stats"]["accepted"] >= 8


def test_concurrent_server_requests_share_one_consistent_store(tiny):
    """Eight clients at once, twice: every answer equals plain decoding, the store
    holds exactly the first wave's outputs after it, and the second wave (other
    connections, the same prompts) drafts from them."""
    import http.client

    from server_support import ChatCharTokenizer

    from verispec.serving.protocol import ServeDefaults
    from verispec.serving.scheduler import SchedulerConfig
    from verispec.serving.server import ServerConfig, ServerThread, create_app

    engine = Engine(tiny, tokenizer=ChatCharTokenizer())
    prompts = ["abcabcab", "hello world", "xyzzy", "0123456789", "aaaa", "qwerty", "+-+-+", "zz"]
    want = {p: engine.generate(p, SamplingParams(max_new_tokens=20), PLAIN).text for p in prompts}
    config = ServerConfig(("tiny",), ServeDefaults(proposer="suffix", k=6, adaptive=False),
                          SchedulerConfig(max_num_seqs=4, max_queue=32))

    def ask(server, prompt, out):
        conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 20, "temperature": 0})
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        out[prompt] = json.loads(conn.getresponse().read())
        conn.close()

    def wave(server):
        out: dict = {}
        threads = [threading.Thread(target=ask, args=(server, p, out)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    with ServerThread(create_app(engine, config)) as server:
        first = wave(server)
        stored = sorted(engine.decode(seq) for seq in engine.suffix_store.sequences())
        second = wave(server)
    for answers in (first, second):
        assert {p: a["choices"][0]["text"] for p, a in answers.items()} == want
    assert stored == sorted(want.values())
    assert engine.suffix_store.stats().requests == 2 * len(prompts)
    cold, warm = (sum(a["speculation"]["accepted"] for a in answers.values())
                  for answers in (first, second))
    assert warm >= 0.5 * 19 * len(prompts) and warm > 2 * cold


def test_bench_repeats_never_draft_from_their_own_earlier_run():
    """`bench --repeats`: every timed run of a prompt starts from the store the
    earlier prompts left, and the session learns each prompt's answer once. Before,
    the second repeat of a suffix (or auto) run drafted the first repeat's output and
    its replay was timed as speculation."""
    from conftest import tiny_engine

    from verispec.bench.configs import verispec_configs
    from verispec.bench.runner import BenchPrompt, Runner, run_bench

    engine = tiny_engine()
    prompts = [BenchPrompt(f"p{i}", "w", tuple(p)) for i, p in enumerate(PROMPTS)]
    configs = verispec_configs("none,suffix", 4, None)
    runner = Runner(engine, SamplingParams(max_new_tokens=12))
    seen: list[tuple[str, int]] = []
    timed = runner.run

    def spy(prompt, config, sampling=None):
        seen.append((prompt.id, engine.suffix_store.stats().requests))
        return timed(prompt, config, sampling)

    runner.run = spy
    records = run_bench(runner, prompts, configs, progress=False, warmup=False, repeats=3)
    assert seen == [(f"p{i}", i) for i in range(len(PROMPTS)) for _ in range(3 * len(configs))]
    plain = {r.prompt_id: r.token_ids for r in records if r.config == "none"}
    assert engine.suffix_store.sequences() == [plain[f"p{i}"] for i in range(len(PROMPTS))]
    suffix = {r.prompt_id: r for r in records if r.config == "suffix"}
    assert all(suffix[p].token_ids == plain[p] for p in plain)
