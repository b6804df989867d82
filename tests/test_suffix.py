"""Suffix decoding: the store finds what a scan finds, stays within its bounds,
survives a corrupt cache file, is shared consistently by concurrent server
requests; and the proposer is lossless (greedy identical, sampled output the
target's) whether its drafts come from past outputs or the request itself."""
from __future__ import annotations

import gc
import json
from array import array
import random
import threading
import tracemalloc

import numpy as np
import pytest

from conftest import CharTokenizer, tiny_target
from test_head_equality import _exact_marginals, _first_two_counts, _worst_pvalue
from verispec import Engine, SamplingParams, SpecConfig
from verispec.cli import main
from verispec.lossless import compare_greedy
from verispec.proposers.base import DraftContext
from verispec import kernels
from verispec.proposers.suffix import (SuffixProposer, SuffixSettings, chain_lookup, grow_draft,
                                       likeliest_chain, native_lookup)
from verispec.proposers.suffix_store import ANCHORS, SuffixCacheError, SuffixIndex, SuffixStore

PLAIN = SpecConfig("none", k=0)
PROMPTS = [[3, 17, 4, 9, 3, 17, 4], list(range(10, 40)), [7, 7, 7, 7, 8, 7, 7, 7]]


# -- the store -------------------------------------------------------------------

def _scan(sequences: list[list[int]], context: list[int], depth: int) -> dict[tuple[int, int], int]:
    """(sequence, index of the matched suffix's last token) -> match length, for every
    occurrence of the context's longest anchor that has a continuation: a full scan."""
    for n in ANCHORS:
        found = {}
        for s, seq in enumerate(sequences):
            for i in range(n - 1, len(seq) - 1):
                m = 0
                while m < min(depth, len(context)) and m <= i and seq[i - m] == context[-1 - m]:
                    m += 1
                if m >= n:
                    found[(s, i)] = m
        if found:
            return found
    return {}


def test_store_matches_equal_a_full_scan():
    rng = random.Random(1)
    for trial in range(40):
        sequences = [[rng.randrange(5) for _ in range(rng.randrange(1, 30))] for _ in range(6)]
        store = SuffixStore(max_depth=8, recent=10_000)
        for seq in sequences:
            store.add(seq)
        context = [rng.randrange(5) for _ in range(rng.randrange(1, 12))]
        starts = np.cumsum([1] + [len(s) + 1 for s in sequences])  # stream position of each
        want = _scan(sequences, context, 8)
        got = {}
        for match in store.matches(context):
            s = int(np.searchsorted(starts, match.position, side="right")) - 1
            got[(s, match.position - int(starts[s]))] = match.length
        assert got == want, (sequences, context)
        for (s, i), m in want.items():
            position = int(starts[s]) + i
            assert store._index.continuation(position, 3) == sequences[s][i + 1:i + 4]


def test_store_reads_the_newest_live_occurrences_past_evictions():
    """With eviction and a small `recent`, a lookup finds exactly the newest `recent`
    occurrences of the longest anchor among the outputs still cached (a full scan of
    the live outputs), however many outputs came and went."""
    rng = random.Random(2)
    store = SuffixStore(max_requests=12, max_tokens=150, max_depth=8, recent=5)
    for step in range(2000):
        store.add([rng.randrange(4) for _ in range(rng.randrange(1, 25))])
        if step % 25:
            continue
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        live = store.sequences()
        starts = [start for start, _ in store._index.bounds]
        newest = sorted(_scan(live, context, 8).items(), reverse=True)[:5]
        got = {(starts.index(max(b for b in starts if b <= m.position)),
                m.position - max(b for b in starts if b <= m.position)): m.length
               for m in store.matches(context)}
        assert got == dict(newest), (live, context)


def test_a_large_store_adds_nothing_for_the_garbage_collector_to_walk():
    """The index holds arrays and flat dicts of ints: a store of 10^5 tokens tracks a
    handful of objects, not one per anchor (each full collection would walk them all,
    and its pause lands inside some request's step)."""
    rng = random.Random(3)
    gc.collect()
    before = len(gc.get_objects())
    store = SuffixStore(max_requests=10_000, max_tokens=200_000)
    for _ in range(1000):
        store.add([rng.randrange(2000) for _ in range(100)])
    gc.collect()
    assert store.stats().tokens == 100_000
    assert len(gc.get_objects()) - before < 100
    twin = store.copy()
    assert twin.sequences() == store.sequences()
    twin.add([1, 2, 3])
    assert len(twin.sequences()) == len(store.sequences()) + 1


def test_open_sequence_indexes_as_it_grows():
    """The per-request index, fed step by step, matches the same index built at once."""
    rng = random.Random(2)
    tokens = [rng.randrange(4) for _ in range(60)]
    grown = SuffixIndex(max_depth=16)
    grown.add(tokens[:5], keep_open=True)
    for i in range(5, 60, 3):
        grown.extend(tokens[i:i + 3])
    whole = SuffixIndex(max_depth=16)
    whole.add(tokens)
    assert grown.matches(tokens) == whole.matches(tokens) != []


def test_store_memory_stays_bounded_over_1e5_requests():
    """10^5 inserted outputs into a store bounded at 1000 outputs and 5000 tokens:
    the bounds hold throughout, the index is swept so memory plateaus, the
    reported memory is what the store really allocates, and old outputs are gone."""
    rng = random.Random(0)
    store = SuffixStore(max_requests=1000, max_tokens=5000)
    first_full = None
    for i in range(100_000):
        store.add([rng.randrange(300) for _ in range(rng.randrange(1, 10))])
        if i % 10_000 == 9_999:
            stats = store.stats()
            assert stats.requests <= 1000 and stats.tokens <= 5000
            assert stats.index_entries <= 2 * len(ANCHORS) * 5000 + 1024
            first_full = first_full or stats.memory_bytes
            assert stats.memory_bytes < 1.5 * first_full
    assert store.inserted == 100_000
    assert store.stats().requests == len(store.sequences())
    store.add([301, 302, 303, 304])
    assert store.matches([301, 302, 303])
    # The report against the allocator: copy the live outputs into a fresh store under
    # tracemalloc (a fresh store has no dead entries, so it reports its live size).
    kept = store.sequences()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    copy = SuffixStore(max_requests=1000, max_tokens=5000)
    for seq in kept:
        copy.add(seq)
    allocated = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert 0.5 < copy.stats().memory_bytes / allocated < 1.5


def test_cache_file_round_trip_and_corruption(tmp_path):
    store = SuffixStore()
    for seq in ([1, 2, 3], [4, 5], [6]):
        store.add(seq)
    path = str(tmp_path / "suffix.npz")
    store.save(path)
    loaded = SuffixStore()
    assert loaded.load(path, vocab_size=10) == 3
    assert loaded.sequences() == [[1, 2, 3], [4, 5], [6]]
    with pytest.raises(SuffixCacheError, match="another model's vocabulary"):
        SuffixStore().load(path, vocab_size=5)
    bad = tmp_path / "bad.npz"
    for payload in (b"not a cache at all", open(path, "rb").read()[:100]):
        bad.write_bytes(payload)
        fresh = SuffixStore()
        with pytest.raises(SuffixCacheError) as caught:
            fresh.load(str(bad))
        assert "\n" not in str(caught.value) and "not a readable suffix cache" in str(caught.value)
        assert fresh.sequences() == []


# -- drafting ---------------------------------------------------------------------

def test_drafts_follow_frequencies_within_caps():
    paths = [[5, 6, 7]] * 6 + [[5, 8]] * 3 + [[9]]
    chain, score = grow_draft(paths, 8, chain=True, min_prob=0.1, stop=frozenset())
    assert chain.tokens == [5, 6, 7] and score == pytest.approx(0.9 + 0.6 + 0.6)
    tree, score = grow_draft(paths, 8, chain=False, min_prob=0.25, stop=frozenset())
    assert tree.tokens == [5, 6, 7, 8] and score == pytest.approx(0.9 + 0.6 + 0.6 + 0.3)
    cut, _ = grow_draft(paths, 8, chain=True, min_prob=0.1, stop=frozenset({6}))
    assert cut.tokens == [5, 6]  # nothing past a stop token
    # Depth <= factor * m + offset: a 2-token match drafts at most 2 with factor 1.
    proposer = SuffixProposer(None, frozenset(), settings=SuffixSettings(1.0, 0.0, 0.0))
    tokens = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2]
    assert proposer.propose(DraftContext(tokens, len(tokens)), 8).tokens.tolist() == [3, 4]



def test_likeliest_chain_is_grow_drafts_chain():
    """The chain drafts' trie-free walk picks grow_draft's chain and score: ties to the
    first path to show a token, shares of all paths, nothing past a stop token."""
    rng = random.Random(5)
    for _ in range(500):
        paths = [[rng.randrange(4) for _ in range(rng.randrange(0, 7))]
                 for _ in range(rng.randrange(1, 12))]
        depth, min_prob = rng.randrange(1, 8), rng.choice([0.0, 0.1, 0.3])
        stop = frozenset(rng.sample(range(4), rng.randrange(0, 2)))
        draft, score = grow_draft(paths, depth, chain=True, min_prob=min_prob, stop=stop)
        tokens, probs = likeliest_chain(paths, depth, min_prob, stop)
        assert tokens == draft.tokens and sum(probs) == score


@pytest.mark.skipif(not kernels.available(), reason="verispec kernels unavailable here")
def test_native_lookup_equals_the_python_reference():
    """The kernel's lookup returns what chain_lookup's Python reference returns: over a
    store that evicted (offset streams, dead chain links), and over the request's own
    context, which the kernel scans where the reference reads the request's index; for
    contexts that copy a stored stretch and ones that do not, at several caps,
    thresholds and stops."""
    rng = random.Random(11)
    checked = {"request": 0, "global": 0}
    for trial in range(12):
        store = SuffixStore(max_requests=40, max_tokens=rng.choice([300, 2000]))
        sequences = []
        for _ in range(80):
            sequence = [rng.randrange(6) for _ in range(rng.randrange(3, 40))]
            sequences.append(sequence)
            store.add(sequence)
        settings = SuffixSettings(rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 1.0]),
                                  rng.choice([0.0, 0.1, 0.4]))
        caps = [settings.depth_cap(m) for m in range(store.max_depth + 1)]
        stop = frozenset(rng.sample(range(6), rng.randrange(0, 2)))
        for _ in range(30):
            source = rng.choice(sequences)
            cut = rng.randrange(1, len(source) + 1)
            context = [rng.randrange(6) for _ in range(rng.randrange(0, 60))] + source[:cut]
            k = rng.randrange(1, 9)
            own = SuffixIndex(store.max_depth)
            own.add(context, keep_open=True)
            python = {"request": chain_lookup(own, context, k, caps, settings.min_prob, stop),
                      "global": store.read(lambda index: chain_lookup(
                          index, context, k, caps, settings.min_prob, stop))}
            native = store.read(lambda index: native_lookup(
                array("q", context), index, context, k, caps, settings.min_prob, stop,
                store.max_depth, own.recent))
            assert native == python
            alone = native_lookup(array("q", context), None, context, k, caps, settings.min_prob,
                                  stop, store.max_depth, own.recent)
            assert alone == {"request": python["request"]}
            for source_name, lookup in python.items():
                checked[source_name] += bool(lookup.chains)
    assert min(checked.values()) > 150  # most contexts found something to draft in each


@pytest.mark.skipif(not kernels.available(), reason="verispec kernels unavailable here")
def test_native_and_python_proposers_draft_alike_as_the_context_grows():
    """Step by step over growing contexts, and past one that is not an extension (the
    proposer starts over), the kernel's proposer drafts what the Python one drafts."""
    rng = random.Random(3)
    store = SuffixStore()
    for _ in range(50):
        store.add([rng.randrange(8) for _ in range(rng.randrange(5, 30))])
    native = SuffixProposer(store, frozenset({7}), max_k=6)
    python = SuffixProposer(store, frozenset({7}), max_k=6)
    python._native = False
    assert native._native
    for text in range(3):
        tokens = [rng.randrange(8) for _ in range(5)]
        for _ in range(40):
            ctx = DraftContext(list(tokens), 2)
            assert native.evidence(ctx) == python.evidence(ctx)
            k = rng.randrange(1, 7)
            assert native.propose(ctx, k).tokens.tolist() == python.propose(ctx, k).tokens.tolist()
            assert native.last == python.last
            tokens += [rng.randrange(8) for _ in range(rng.randrange(1, 4))]


def test_global_store_beats_a_weaker_request_match():
    """The best-scoring draft of both stores wins: three past outputs agree on
    what follows, this request's two earlier occurrences disagree (score 1.5 < 3)."""
    store = SuffixStore()
    for _ in range(3):
        store.add([1, 2, 3, 4, 5, 6])
    proposer = SuffixProposer(store, frozenset(), settings=SuffixSettings(2.0, 0.0, 0.1))
    tokens = [2, 3, 7, 2, 3, 8, 5, 2, 3]
    assert proposer.propose(DraftContext(tokens, 4), 3).tokens.tolist() == [4, 5, 6]
    assert proposer.last.source == "global" and proposer.last.score == pytest.approx(3)
    alone = SuffixProposer(None, frozenset(), settings=SuffixSettings(2.0, 0.0, 0.1))
    # Alone, an even split goes to the newest occurrence.
    assert alone.propose(DraftContext(tokens, 4), 3).tokens.tolist() == [8, 5, 2]
    assert alone.last.source == "request" and alone.last.score == pytest.approx(1.5)
    proposer.finished(DraftContext(tokens, 4))
    assert store.sequences()[-1] == tokens[4:]


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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("tree", [0, 6])
def test_sampled_output_follows_the_target(tree):
    """1000 seeded three-token requests on a vocab-8 target at T = 2, drafting from a
    store whose outputs after the prompt branch several ways (and which learns every
    request's output as it goes): the first and second tokens' marginals pass
    chi-square against the target's exact ones, and drafts are often accepted."""
    target = tiny_target(11, layers=1, vocab=8)
    engine = Engine(target)
    rng = random.Random(5)
    for _ in range(40):
        engine.suffix_store.add([1, 2, 3, rng.randrange(8), rng.randrange(8)])
    prompt, temperature, runs = [1, 2, 3], 2.0, 1000
    spec = SpecConfig("suffix", k=2, tree=tree, suffix_min_prob=0.0)
    counts, drafted, accepted = _first_two_counts(engine, prompt, spec, temperature, runs)
    assert drafted >= 2 * runs and 0.1 * runs < accepted < drafted
    assert _worst_pvalue(counts, _exact_marginals(target, prompt, temperature), runs) > 1e-3


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

    from test_server import ChatCharTokenizer
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
    from verispec.bench.runner import BenchPrompt, Runner, run_bench, verispec_configs

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


def test_evidence_then_propose_reads_the_stores_once_and_drafts_the_same():
    """An adaptive step asks for evidence, then a draft: the draft comes from the
    evidence's lookup and equals what a fresh proposer drafts for the same context."""
    store = SuffixStore()
    for _ in range(3):
        store.add([1, 2, 3, 4, 5, 6, 7, 8])
    tokens = [9, 9, 1, 2, 3]
    cached = SuffixProposer(store, frozenset(), max_k=6)
    calls = []
    original = store.read
    store.read = lambda *a: calls.append(a) or original(*a)
    evidence = cached.evidence(DraftContext(tokens, 2))
    for k in (4, 2, 6):
        draft = cached.propose(DraftContext(tokens, 2), k).tokens.tolist()
        fresh = SuffixProposer(store, frozenset()).propose(DraftContext(tokens, 2), k)
        assert draft == fresh.tokens.tolist() == [4, 5, 6, 7, 8][:min(k, 3)]
    assert evidence.key == 3 and len(calls) == 1 + 3  # the fresh proposers' own lookups
    cached.propose(DraftContext(tokens + [4], 2), 2)  # the next step searches again
    assert len(calls) == 5
