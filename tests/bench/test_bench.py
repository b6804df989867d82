"""`verispec bench` and `verispec profile` on tiny random models: the runner,
the report's numbers, the files written, and flag errors exiting with 2."""
from __future__ import annotations

import json
import statistics

import pytest
from conftest import CharTokenizer, tiny_target

from verispec import Engine, SamplingParams, SpecConfig
from verispec.bench import bench_cli
from verispec.bench.calculator import expected_tokens
from verispec.bench.configs import parse_k_list, verispec_configs
from verispec.bench.peers import parse_peers
from verispec.bench.runner import BenchPrompt
from verispec.cli.main import build_parser, main
from verispec.models.base import TargetModel
from verispec.policy.economics import load_profile


class ChatCharTokenizer(CharTokenizer):
    """CharTokenizer plus a chat template that returns a dict, as transformers 5 does."""
    chat_template = "stub"

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + ">"
        return {"input_ids": self.encode(text), "attention_mask": [1] * len(text)}


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_target(0, layers=4), tokenizer=ChatCharTokenizer())


def plan(*argv):
    return bench_cli.plan_from_args(build_parser().parse_args(["bench", *argv]))


def test_k_lists_and_config_labels():
    assert parse_k_list("1..4") == [1, 2, 3, 4]
    assert parse_k_list("8,1,2,4,2") == [1, 2, 4, 8]
    assert parse_k_list("1..2,6") == [1, 2, 6]
    configs = verispec_configs("none,ngram,self:2", 3, None, sweep=[1, 5])
    assert [(c.label, c.k) for c in configs] == [
        ("none", 0), ("ngram k=1", 1), ("ngram k=5", 5), ("self:2 k=1", 1), ("self:2 k=5", 5)]
    assert configs[0].is_plain and all(c.speculative for c in configs[1:])
    assert configs[3].spec.proposer == "draft" and configs[3].spec.draft == "self:2"
    # An adaptive config chooses k itself: one run, capped at the sweep's largest k.
    configs = verispec_configs("ngram,ngram+auto", 3, None, sweep=[1, 5])
    assert [(c.label, c.k, c.spec.adaptive) for c in configs] == [
        ("ngram k=1", 1, False), ("ngram k=5", 5, False), ("ngram+auto", 5, True)]
    picked = parse_peers("hf-plain,hf-assisted", 4, None)
    assert [c.label for c in picked.configs] == ["hf-plain"] and "hf-assisted" in picked.notes[0]


def test_bench_runs_reports_and_writes_files(engine, tmp_path):
    p = plan("--workload", "chat", "--limit", "2", "--proposer", "none,ngram",
             "--peers", "hf-plain,hf-pld", "--k", "3", "--max-new-tokens", "12")
    out = bench_cli.execute(engine, p, tmp_path, progress=False)
    rows = {r.config: r for r in out.rows}
    assert list(rows) == ["none", "ngram", "hf-plain", "hf-pld"]
    assert len(out.records) == 2 * 4 and all(r.tokens == 12 for r in out.records)

    ngram = rows["ngram"]
    runs = [r for r in out.records if r.config == "ngram"]
    assert ngram.alpha == pytest.approx(sum(r.accepted for r in runs) / sum(r.drafted for r in runs))
    assert ngram.tau == pytest.approx(24 / sum(r.target_forwards for r in runs))
    if ngram.alpha < 1:
        assert ngram.expected_tau == pytest.approx(expected_tokens(ngram.alpha, 3))
    assert sum(ngram.time_split.values()) == pytest.approx(1.0)
    assert rows["none"].tau == pytest.approx(1.0) and rows["none"].alpha is None
    # The speedup reference is hf-plain, and its ratio to itself is exactly 1.
    assert rows["hf-plain"].speedup == 1.0 and ngram.reference == "hf-plain"
    assert ngram.speedup > 0 and rows["hf-pld"].alpha is None

    # fp32 tiny model: every greedy run equals plain decoding exactly.
    for label in ("ngram", "hf-plain", "hf-pld"):
        assert rows[label].vs_plain.identical == 2 and rows[label].vs_plain.mismatch == 0
    assert rows["none"].vs_plain.checked == 0  # the reference is not compared with itself
    assert rows["ngram"].vs_hf_plain.identical == 2 and rows["hf-plain"].vs_hf_plain.checked == 0

    for name in ("results.json", "report.md", "tau_vs_alpha.png", "time_split.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    # Static k only: no trajectory to plot, even where k shrinks near max_new_tokens.
    assert not (tmp_path / "k_trajectory.png").exists()
    data = json.loads((tmp_path / "results.json").read_text())
    assert {"cpu", "cores", "torch_threads", "torch", "transformers", "dtype", "device",
            "model", "weights", "command"} <= set(data["environment"])
    # A transformers model has no kernels' weights path; a GGUF target reports its own.
    report = (tmp_path / "report.md").read_text()
    assert data["environment"]["weights"] is None and "- model: " in report and ", weights " not in report
    record = data["records"][1]
    assert {"workload", "prompt_id", "config", "k", "tokens", "seconds", "tokens_per_s",
            "drafted", "accepted", "target_forwards", "time_split", "vs_plain"} <= set(record)
    assert "| ngram | 3 |" in out.markdown and "### chat (2 prompts)" in out.markdown
    assert out.markdown in (tmp_path / "report.md").read_text()


def test_adaptive_and_auto_runs_record_and_plot_their_choices(engine, tmp_path):
    p = plan("--workload", "chat", "--limit", "1", "--proposer", "ngram+auto,auto+auto",
             "--k", "4", "--max-new-tokens", "24")
    out = bench_cli.execute(engine, p, tmp_path, progress=False)
    for record in (r for r in out.records if r.kind != "peer"):
        assert len(record.step_k) == record.target_forwards == len(record.step_proposer)
        assert max(record.step_k) <= 4
    auto = next(r for r in out.records if r.config == "auto+auto")
    assert set(auto.step_proposer) <= {"ngram", "suffix", "none"}
    # Adaptive n-gram lookup records the evidence (matched suffix length) behind each k.
    keyed = next(r for r in out.records if r.config == "ngram+auto")
    assert len(keyed.step_evidence) == len(keyed.step_k)
    assert all(e is None or 0 <= e <= 4 for e in keyed.step_evidence)
    assert any(e is not None for e in keyed.step_evidence)
    # auto's evidence is the longer match of its two lookups, recorded the same way.
    assert len(auto.step_evidence) == len(auto.step_k)
    assert all(e is None or e >= 0 for e in auto.step_evidence)
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["step_k"] for r in data["records"]] == [r.step_k for r in out.records]
    assert all(r.adaptive for r in out.records if r.kind != "peer")
    assert (tmp_path / "k_trajectory.png").stat().st_size > 0


def test_sweep_on_pretokenized_prompts_without_tokenizer(tmp_path):
    bare = Engine(tiny_target(1, layers=2), tokenizer=None)
    prompts = [BenchPrompt("p0", "code-edit", tuple([3, 17, 4, 9, 3, 17, 4] * 3)),
               BenchPrompt("p1", "code-edit", tuple(range(10, 30)))]
    p = plan("--workload", "code-edit", "--proposer", "none,ngram,self:1,ngram+auto",
             "--sweep-k", "1,3", "--peers", "none", "--max-new-tokens", "10", "--repeats", "3")
    out = bench_cli.execute(bare, p, tmp_path, progress=False, prompts=prompts)
    assert [(s.name, s.ks) for s in out.sweeps] == [("ngram", [1, 3]), ("self:1", [1, 3])]
    assert all(s.best_k in (1, 3) for s in out.sweeps)
    ngram, selfdraft = out.sweeps
    # k is scored by decode speedup (prefill excluded) against verispec's plain run.
    assert ngram.scored_by == "decode speedup" and "| decode speedup |" in out.markdown
    best = ngram.decode_speedup[ngram.ks.index(ngram.best_k)]
    assert best == max(ngram.decode_speedup)
    assert ngram.adaptive_vs_best == pytest.approx(ngram.adaptive / best)
    for record in out.records:
        decode = statistics.median(record.decode_seconds_all)
        assert len(record.decode_seconds_all) == 3 and 0 < decode < record.seconds
        assert record.decode_tokens_per_s == pytest.approx(record.tokens / decode)
    plain = {r.prompt_id: r for r in out.records if r.config == "none"}
    for row in (r for r in out.rows if r.config == "ngram k=3"):
        mine = [r for r in out.records if r.config == row.config]
        assert row.decode_speedup == pytest.approx(statistics.median(
            r.decode_tokens_per_s / plain[r.prompt_id].decode_tokens_per_s for r in mine))
    # Tokens per CPU second of the process, the noise-robust twin of the wall-time ratio.
    for record in out.records:
        assert len(record.cpu_seconds_all) == 3 and record.cpu_seconds > 0
        assert record.cpu_seconds == sorted(record.cpu_seconds_all)[1]
    for row in (r for r in out.rows if r.config == "ngram k=3"):
        mine = [r for r in out.records if r.config == row.config]
        assert row.cpu_speedup == pytest.approx(statistics.median(
            r.cpu_tokens_per_s / plain[r.prompt_id].cpu_tokens_per_s for r in mine))
    assert "| cpu speedup |" in out.markdown
    assert selfdraft.adaptive is None and "+auto / best" in out.markdown
    # Three timed repeats per run; the record's time is their median.
    assert all(len(r.seconds_all) == 3 and r.seconds == sorted(r.seconds_all)[1]
               for r in out.records)
    assert "3 timed repeats" in (tmp_path / "report.md").read_text()
    # No hf-plain: speedups are over verispec's plain loop.
    assert all(r.reference == "none" for r in out.rows)
    assert all(r.vs_plain.mismatch == 0 for r in out.rows)
    assert (tmp_path / "speedup_vs_k.png").exists() and "### k sweep" in out.markdown


class OtherBackend(TargetModel):
    """A non-transformers backend: it has no `.model` to hand to HF generate."""

    def __init__(self, inner):
        self._inner = inner
        for attr in ("vocab_size", "max_context", "eos_token_ids", "num_layers",
                     "hidden_size", "dtype", "device"):
            setattr(self, attr, getattr(inner, attr))
        self.name = "other"

    def new_cache(self, capacity=None):
        return self._inner.new_cache(capacity)

    def forward(self, tokens, cache, positions=None, mask=None, num_logits=None, hidden_layers=()):
        return self._inner.forward(tokens, cache, positions, mask, num_logits, hidden_layers)


def test_peers_are_skipped_with_a_note_on_another_backend(tmp_path):
    other = Engine(OtherBackend(tiny_target(2, layers=1)), tokenizer=ChatCharTokenizer())
    p = plan("--workload", "chat", "--limit", "1", "--proposer", "none,ngram",
             "--peers", "hf-plain", "--max-new-tokens", "6")
    out = bench_cli.execute(other, p, tmp_path, progress=False)
    assert [r.config for r in out.rows] == ["none", "ngram"]
    assert out.rows[1].reference == "none" and "peers skipped" in out.markdown


def test_hf_assisted_with_a_layer_skip_draft(engine, tmp_path):
    p = plan("--workload", "chat", "--limit", "1", "--proposer", "none", "--draft", "self:2",
             "--peers", "hf-plain,hf-assisted", "--max-new-tokens", "8")
    out = bench_cli.execute(engine, p, tmp_path, progress=False)
    rows = {r.config: r for r in out.rows}
    assert rows["hf-assisted"].tokens == 8 and rows["hf-assisted"].vs_plain.identical == 1
    # The assistant's private settings never leak into the target's generate.
    assert engine.target.model.generation_config.num_assistant_tokens_schedule != "constant"


def test_profile_writes_a_loadable_cost_profile(engine, tmp_path):
    result, path, figure = bench_cli.run_profile(
        engine, context=48, max_n=6, repeats=2, draft="self:1", out=tmp_path / "p.json",
        bandwidth_mb=8)
    cost = load_profile(path)
    assert len(cost.profile) == 6 and cost.profile[0] == 1.0
    assert cost.draft_cost == pytest.approx(result.draft_cost_per_token) and cost.draft_cost > 0
    data = json.loads(path.read_text())
    assert data["n"] == [1, 2, 3, 4, 5, 6] and data["context"] == 48
    assert data["weight_bytes"] > 0 and data["bandwidth_bytes_per_s"] > 0
    assert figure.exists() and figure.suffix == ".png"


@pytest.mark.parametrize("argv", [
    ["bench", "--workload", "nope"],
    ["bench", "--k", "-1"],
    ["bench", "--proposer", "ngram,telepathy"],
    ["bench", "--limit", "0"],
    ["bench", "--proposer", "draft"],
    ["bench", "--sweep-k", "0..3"],
    ["bench", "--peers", "vllm"],
    ["profile", "--max-n", "1"],
    ["profile", "--repeats", "0"],
])
def test_bad_flags_exit_2_with_one_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"verispec {argv[0]}: error:") and "\n" not in err


def test_cli_bench_on_the_default_model(default_model, tmp_path, capsys):
    argv = ["bench", "--model", default_model, "--limit", "1", "--max-new-tokens", "16", "--workload", "chat",
            "--proposer", "none,ngram", "--out", str(tmp_path), "--no-progress"]
    assert main(argv) == 0
    assert "| ngram | 4 |" in capsys.readouterr().out
    data = json.loads((tmp_path / "results.json").read_text())
    ngram = next(r for r in data["records"] if r["config"] == "ngram")
    assert ngram["vs_plain"] in ("identical", "near-tie")


def test_proposer_modifiers():
    from verispec.bench.configs import proposer_spec

    spec = proposer_spec("ngram+tree=16+auto", 6, None)
    assert (spec.proposer, spec.k, spec.tree, spec.adaptive) == ("ngram", 6, 16, True)
    assert proposer_spec("self:4+auto", 3, None).draft == "self:4"
    with pytest.raises(ValueError, match="unknown modifier"):
        proposer_spec("ngram+fast", 4, None)
    spec = proposer_spec("eagle+head=runs/new+tree=8", 5, None)
    assert (spec.proposer, spec.head, spec.tree) == ("eagle", "runs/new", 8)
    assert proposer_spec("medusa", 5, None).head is None  # the shipped head
    with pytest.raises(ValueError, match="trained-head proposer"):
        proposer_spec("ngram+head=runs/new", 4, None)


def test_replay_reproduces_the_engine_and_scores_k_without_a_clock(engine):
    """The exercise-3 replay (verispec.bench.replay) must commit what the engine commits:
    for greedy n-gram lookup at a static k, the same number of target passes and drafts.
    Its modelled time is then a pure function of those, and adaptive k runs the real
    controller on it. (A random model accepts few drafts; tests/models/test_default_model.py
    checks the same on a copy, where most are accepted.)"""
    from verispec.bench.replay import replay

    prompt = [3, 17, 4, 9, 3, 17, 4] * 4 + [5, 6]
    sampling = SamplingParams(max_new_tokens=40, ignore_eos=True)
    output = engine.generate(prompt, sampling, SpecConfig("none", k=0)).token_ids
    for k in (1, 3, 6):
        run = engine.generate(prompt, sampling, SpecConfig("ngram", k=k)).stats
        again = replay(prompt, output, 0.05, k)
        assert (again.passes, again.drafted, again.tokens) == \
            (run.target_forwards, run.drafted, len(output))
        assert again.time == pytest.approx(again.passes + 0.05 * again.drafted)
    adaptive = replay(prompt, output, 0.05, None, k_cap=6)
    assert adaptive.tokens == len(output) and adaptive.passes <= len(output)
    assert replay(prompt, output, 0.05, 0).speedup == pytest.approx(1.0)


def test_cli_bench_on_the_users_own_prompts(default_model, tmp_path, capsys):
    """`--workload FILE.jsonl` benchmarks a user's prompts: plain text or chats, ids optional."""
    own = tmp_path / "mine.jsonl"
    own.write_text(json.dumps({"prompt": "Repeat: red green blue red green blue"}) + "\n\n"
                   + json.dumps({"id": "q2", "messages": [{"role": "user", "content": "Hi"}]})
                   + "\n", encoding="utf-8")
    argv = ["bench", "--model", default_model, "--max-new-tokens", "12", "--workload", str(own),
            "--proposer", "none,ngram", "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(argv) == 0
    assert "### mine (2 prompts)" in capsys.readouterr().out
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["prompt_id"] for r in data["records"]} == {"mine:1", "q2"}
    assert all(r["vs_plain"] in ("identical", "near-tie") for r in data["records"]
               if r["config"] == "ngram")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": ""}\n', encoding="utf-8")
    assert main(["bench", "--workload", str(bad), "--out", str(tmp_path / "o2")]) == 2
    assert main(["bench", "--workload", str(tmp_path / "absent.jsonl")]) == 2
