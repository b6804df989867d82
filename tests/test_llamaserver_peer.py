"""The llama-server bench peers: found through the build's READY file or the environment,
a note with the build command when missing, and (slow, with a built binary) greedy runs
on the default GGUF over HTTP, its speculation checked against its own plain run."""
from __future__ import annotations

import os
import stat

import pytest

from conftest import tiny_target
from test_bench import ChatCharTokenizer, plan
from verispec import Engine
from verispec.bench import bench_cli, llamaserver
from verispec.config import SamplingParams
from verispec.models.loading import default_gguf_path


def _no_server(monkeypatch, tmp_path):
    monkeypatch.setenv(llamaserver.DIR_ENV, str(tmp_path / "nothing-built"))
    monkeypatch.delenv(llamaserver.SERVER_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))


def test_missing_server_leaves_a_note_that_says_how_to_build_it(monkeypatch, tmp_path):
    _no_server(monkeypatch, tmp_path)
    p = plan("--workload", "chat", "--limit", "1", "--proposer", "none",
             "--peers", "hf-plain,llamaserver-plain,llamaserver-ngram-mod", "--max-new-tokens", "4")
    assert [c.label for c in p.configs] == ["none", "hf-plain"]
    assert len(p.notes) == 1 and "\n" not in p.notes[0]
    assert p.notes[0].startswith("llamaserver-plain, llamaserver-ngram-mod skipped: no llama-server")
    assert "scripts/build_llama_cpp.sh" in p.notes[0] and llamaserver.SERVER_ENV in p.notes[0]
    engine = Engine(tiny_target(3, layers=1), tokenizer=ChatCharTokenizer())
    out = bench_cli.execute(engine, p, tmp_path / "out", progress=False)
    assert [r.config for r in out.rows] == ["none", "hf-plain"]
    # A broken override is named as such, not silently replaced by another binary.
    monkeypatch.setenv(llamaserver.SERVER_ENV, str(tmp_path / "no-such-binary"))
    assert llamaserver.missing_reason().startswith(f"{llamaserver.SERVER_ENV}=")


def test_tools_are_found_through_the_ready_file(monkeypatch, tmp_path):
    _no_server(monkeypatch, tmp_path)
    build = tmp_path / "llama.cpp"
    build.mkdir()
    tool = build / "llama-bench"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    (build / "READY").write_text(f"llama-bench={tool}\nllama-server={build / 'gone'}\n"
                                 "llama-cpp-python=0.3.36\n")
    monkeypatch.setenv(llamaserver.DIR_ENV, str(build))
    assert llamaserver.find_tool("llama-bench") == tool
    assert llamaserver.read_ready()["llama-cpp-python"] == "0.3.36"
    assert llamaserver.find_tool("llama-server") is None  # listed, but not there
    monkeypatch.setenv(llamaserver.SERVER_ENV, str(tool))
    assert llamaserver.find_tool("llama-server") == tool and llamaserver.missing_reason() is None


def test_each_peer_gets_its_spec_type_and_the_draft_needs_a_gguf(monkeypatch, tmp_path):
    gguf = tmp_path / "m.gguf"
    plain = llamaserver.server_args(gguf, llamaserver.PLAIN, 2, 1024)
    assert plain[plain.index("-t") + 1] == "2" and plain[plain.index("-tb") + 1] == "2"
    assert "--spec-type" not in plain and plain[plain.index("-c") + 1] == "1024"
    mod = llamaserver.server_args(gguf, "llamaserver-ngram-mod", 1, 2048)
    assert mod[mod.index("--spec-type") + 1] == "ngram-mod"
    draft = llamaserver.server_args(gguf, llamaserver.DRAFT, 1, 2048, draft=tmp_path / "d.gguf")
    assert draft[draft.index("--spec-type") + 1] == "draft-simple"
    assert draft[draft.index("-md") + 1] == str(tmp_path / "d.gguf")
    with pytest.raises(ValueError, match="draft"):
        llamaserver.server_args(gguf, llamaserver.DRAFT, 1, 2048)
    monkeypatch.setenv(llamaserver.SERVER_ENV, "/bin/true")
    p = plan("--workload", "chat", "--limit", "1", "--proposer", "none",
             "--peers", "llamaserver-plain,llamaserver-draft", "--draft", "self:4")
    assert [c.label for c in p.configs] == ["none", "llamaserver-plain"]
    assert "llamaserver-draft skipped" in p.notes[0] and "self-style" in p.notes[0]


@pytest.fixture(scope="module")
def server_binary():
    binary = llamaserver.find_tool()
    if binary is None:
        pytest.skip(f"no llama-server binary: {llamaserver.BUILD_HINT}")
    return binary


@pytest.mark.slow
def test_every_draftless_type_exists_in_the_built_server(server_binary):
    import subprocess

    help_text = subprocess.run([str(server_binary), "--help"], capture_output=True, text=True).stdout
    spec_line = next(line for line in help_text.splitlines() if "--spec-type" in line)
    for spec_type in llamaserver.DRAFTLESS:
        assert spec_type in spec_line


@pytest.mark.slow
def test_llamaserver_peers_on_the_default_gguf(server_binary, default_engine, tmp_path):
    p = plan("--workload", "code-edit", "--limit", "1", "--proposer", "none",
             "--peers", "llamaserver-plain,llamaserver-ngram-simple", "--max-new-tokens", "12")
    plain_cfg, spec_cfg = p.configs[1:]
    peers = llamaserver.LlamaServerPeers(default_gguf_path(), default_engine.target, threads=1)
    ids = default_engine.encode_messages([{"role": "user", "content": "Count from 1 to 20."}])
    fixed = SamplingParams(max_new_tokens=8, ignore_eos=True)
    plain = peers.run(plain_cfg, ids, fixed)
    assert len(plain.token_ids) == 8 and plain.finish_reason == "length"
    assert 0 < plain.prefill_seconds and 0 < plain.decode_seconds < plain.seconds
    assert plain.cpu_seconds is not None and plain.drafted is None
    assert peers.run(plain_cfg, ids, fixed).token_ids == plain.token_ids  # deterministic
    spec = peers.run(spec_cfg, ids, fixed)
    first = peers.server(spec_cfg.peer, 1)
    again = peers.run(spec_cfg, ids, fixed)
    # A speculative type keeps state across requests, so each request gets a fresh server.
    assert peers.server(spec_cfg.peer, 1) is not first and first.proc.poll() is not None
    assert spec.token_ids == again.token_ids
    assert peers.compare(ids, plain.token_ids, spec.token_ids).ok
    # A changed token is found and judged in llama-server's own log-probabilities: the
    # plain pick is its top-1, so a token from the other end of the vocabulary is no tie.
    worst = plain.token_ids[:5] + [default_engine.target.vocab_size - 1]
    cmp = peers.compare(ids, plain.token_ids, worst)
    assert cmp.diverged_at == 5 and cmp.top2_gap >= 0 and not cmp.ok
    servers = [peers.server(name, 1) for name in (plain_cfg.peer, spec_cfg.peer)]
    peers.close()
    assert all(s.proc.poll() is not None for s in servers)

    out = bench_cli.execute(default_engine, p, tmp_path, progress=False)
    rows = {r.config: r for r in out.rows}
    assert list(rows) == ["none", "llamaserver-plain", "llamaserver-ngram-simple"]
    assert rows["llamaserver-plain"].vs_plain.checked == 0
    assert rows["llamaserver-ngram-simple"].vs_plain.checked == 1
    assert "vs llamaserver-plain" in out.markdown and "note: llama-server: " in out.markdown
    record = next(r for r in out.records if r.config == "llamaserver-plain")
    assert record.decode_tokens_per_s and record.cpu_seconds


@pytest.mark.slow
def test_a_bad_model_file_fails_with_the_servers_own_words(server_binary, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + os.urandom(64))
    with pytest.raises(ValueError, match="exited with code"):
        llamaserver.LlamaServer(server_binary, ["-m", str(broken)])
