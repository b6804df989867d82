"""The llama.cpp bench peers: a note, not a crash, without llama-cpp-python, and
with it, short greedy runs on the default GGUF through the bench's peer runner."""
from __future__ import annotations

import sys

from conftest import tiny_target
from test_bench import ChatCharTokenizer, plan
from verispec import Engine
from verispec.bench import bench_cli
from verispec.bench.peers import PeerRunner
from verispec.config import SamplingParams

LLAMACPP = ("llamacpp-plain", "llamacpp-pld")


def test_missing_llama_cpp_leaves_a_note(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    p = plan("--workload", "chat", "--limit", "1", "--proposer", "none",
             "--peers", "hf-plain,llamacpp-plain,llamacpp-pld", "--max-new-tokens", "4")
    assert [c.label for c in p.configs] == ["none", "hf-plain"]
    assert len(p.notes) == 1 and "\n" not in p.notes[0]
    assert p.notes[0].startswith("llamacpp-plain, llamacpp-pld skipped: llama-cpp-python")
    assert "verispec[llamacpp]" in p.notes[0]
    engine = Engine(tiny_target(3, layers=1), tokenizer=ChatCharTokenizer())
    out = bench_cli.execute(engine, p, tmp_path, progress=False)
    assert [r.config for r in out.rows] == ["none", "hf-plain"]
    assert "note: llamacpp-plain, llamacpp-pld skipped" in out.markdown


def test_llamacpp_peers_on_the_default_gguf(llama_cpp, default_engine, tmp_path):
    p = plan("--workload", "code-edit", "--limit", "1", "--proposer", "none",
             "--peers", "llamacpp-plain,llamacpp-pld", "--k", "3", "--max-new-tokens", "10")
    peers = PeerRunner(default_engine, None, p.configs[1:], p.model)
    assert peers.notes == [] and all(peers.runs(c) for c in p.configs[1:])
    plain_cfg, pld_cfg = p.configs[1:]
    ids = default_engine.encode_messages([{"role": "user", "content": "Count from 1 to 20."}])

    fixed = SamplingParams(max_new_tokens=6, ignore_eos=True)
    plain = peers.run(plain_cfg, ids, fixed)
    assert len(plain.token_ids) == 6 and plain.finish_reason == "length" and plain.seconds > 0
    assert peers.run(plain_cfg, ids, fixed).token_ids == plain.token_ids  # deterministic
    pld = peers.run(pld_cfg, ids, fixed)
    assert len(pld.token_ids) == 6
    assert peers.compare(pld_cfg, ids, plain.token_ids, plain.token_ids).identical
    # A changed token is found and judged in llama.cpp's own logits: the plain pick is
    # its top-1, so a token of the other end of the vocabulary is no tie.
    worst = plain.token_ids[:5] + [default_engine.target.vocab_size - 1]
    cmp = peers.compare(pld_cfg, ids, plain.token_ids, worst)
    assert cmp.diverged_at == 5 and cmp.top2_gap >= 0 and not cmp.ok
    # Longer than llama.cpp's 512-token batch: prefill runs in chunks, and the
    # prompt-lookup model keeps logits for every one of those positions.
    long = default_engine.encode_messages([{"role": "user", "content": "one two three " * 200}])
    assert len(long) > 512
    assert len(peers.run(pld_cfg, long, SamplingParams(max_new_tokens=3, ignore_eos=True)).token_ids) == 3

    # A stop at EOS ends the run with the EOS token, as HF generate and verispec do.
    hello = default_engine.encode_messages([{"role": "user", "content": "Say hi."}])
    short = peers.run(plain_cfg, hello, SamplingParams(max_new_tokens=64))
    if short.finish_reason == "stop":
        assert short.token_ids[-1] in default_engine.target.eos_token_ids
    else:
        assert len(short.token_ids) == 64

    out = bench_cli.execute(default_engine, p, tmp_path, progress=False)
    rows = {r.config: r for r in out.rows}
    assert list(rows) == ["none", *LLAMACPP]
    # llama.cpp is never compared with verispec's dense-weight outputs, only with itself.
    assert rows["llamacpp-plain"].vs_plain.checked == 0
    assert rows["llamacpp-pld"].vs_plain.checked == 1 and rows["llamacpp-pld"].vs_hf_plain.checked == 0
    assert "n/a (another function)" in out.markdown and "vs llamacpp-plain" in out.markdown


def test_llamacpp_peers_refuse_another_vocabulary(llama_cpp, tmp_path):
    engine = Engine(tiny_target(4, layers=1), tokenizer=ChatCharTokenizer())
    p = plan("--workload", "chat", "--limit", "1", "--proposer", "none",
             "--peers", "llamacpp-plain", "--max-new-tokens", "4")
    out = bench_cli.execute(engine, p, tmp_path, progress=False)
    assert [r.config for r in out.rows] == ["none"]
    assert "peers skipped (llamacpp-plain)" in out.markdown and "token ids" in out.markdown
