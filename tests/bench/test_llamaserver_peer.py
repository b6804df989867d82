"""The llama-server bench peers: found through the build's READY file or the environment,
a note with the build command when missing, the requests they send and the answers they
read, a clear error when the binary cannot start or the server dies; and, where
scripts/build_llama_cpp.sh built it (the `llama_server` fixture: slow, skipped in CI),
greedy runs on the default GGUF over HTTP, its speculation checked against its own plain
run."""
from __future__ import annotations

import os
import stat
import subprocess
import tempfile

import pytest
from conftest import VOCAB, tiny_target
from gguf_support import TinyShape, write_tiny_gguf
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


def test_a_request_asks_for_the_ids_greedily_with_no_cache_and_no_other_sampler():
    body = llamaserver.completion_body([5, 6, 7], SamplingParams(max_new_tokens=9), 9)
    assert body["prompt"] == [5, 6, 7] and body["n_predict"] == 9 and body["temperature"] == 0.0
    assert body["cache_prompt"] is False and body["return_tokens"] is True
    assert body["ignore_eos"] is False and body["n_probs"] == 0 and "top_k" not in body
    # Its samplers that verispec's greedy or sampled decoding does not have are off.
    assert body["repeat_penalty"] == 1.0 and body["dry_multiplier"] == 0.0
    assert body["min_p"] == 0.0 and body["xtc_probability"] == 0.0 and body["top_n_sigma"] == -1.0
    sampled = SamplingParams(max_new_tokens=4, temperature=0.7, top_k=20, top_p=0.9, seed=3,
                             ignore_eos=True)
    body = llamaserver.completion_body([1], sampled, 4, n_probs=20)
    assert (body["temperature"], body["top_k"], body["top_p"], body["seed"]) == (0.7, 20, 0.9, 3)
    assert body["ignore_eos"] is True and body["n_probs"] == 20
    assert llamaserver.completion_body([1], SamplingParams(temperature=0.7), 4)["top_k"] == 0


# Two answers of llama-server 0c1e57098 to /completion on the default GGUF, trimmed to the
# fields the peer reads and a few it does not: a plain one with n_probs 2 that reached
# n_predict, and a speculative one that ended on the end-of-sequence token.
_PLAIN_ANSWER = {
    "index": 0, "content": " friendly AI assistant", "tokens": [7952, 5646, 11173], "stop": True,
    "stop_type": "limit", "stopping_word": "", "tokens_predicted": 3, "tokens_evaluated": 6,
    "timings": {"cache_n": 0, "prompt_n": 6, "prompt_ms": 45.353, "predicted_n": 3,
                "predicted_ms": 28.496, "predicted_per_second": 70.185},
    "completion_probabilities": [
        {"id": 7952, "token": " friendly", "logprob": -2.577, "top_logprobs": [
            {"id": 7952, "token": " friendly", "logprob": -2.577},
            {"id": 33011, "token": " cunning", "logprob": -2.896}]},
        {"id": 5646, "token": " AI", "logprob": -0.815, "top_logprobs": [
            {"id": 5646, "token": " AI", "logprob": -0.815},
            {"id": 284, "token": " and", "logprob": -1.124}]},
        {"id": 11173, "token": " assistant", "logprob": -0.909, "top_logprobs": [
            {"id": 11173, "token": " assistant", "logprob": -0.909},
            {"id": 281, "token": " in", "logprob": -2.356}]}],
}
_SPEC_ANSWER = {
    "tokens": [30, 1812, 47, 2], "stop": True, "stop_type": "eos",
    "timings": {"prompt_n": 6, "prompt_ms": 43.184, "predicted_n": 4, "predicted_ms": 40.5,
                "draft_n": 6, "draft_n_accepted": 2},
}


def test_an_answer_is_read_as_llama_server_writes_it():
    plain = llamaserver.parse_completion(_PLAIN_ANSWER, seconds=0.1, cpu_seconds=0.09)
    assert plain.token_ids == [7952, 5646, 11173] and plain.finish_reason == "length"
    assert plain.prefill_seconds == pytest.approx(0.045353)
    assert plain.decode_seconds == pytest.approx(0.028496)
    assert (plain.seconds, plain.cpu_seconds, plain.drafted, plain.accepted) == (0.1, 0.09, None, None)
    assert plain.top_logprobs[0] == {7952: -2.577, 33011: -2.896} and len(plain.top_logprobs) == 3
    spec = llamaserver.parse_completion(_SPEC_ANSWER, seconds=0.1, cpu_seconds=0.1)
    assert spec.finish_reason == "stop" and spec.token_ids[-1] == 2
    assert (spec.drafted, spec.accepted) == (6, 2) and spec.top_logprobs == []


def _no_log_left(tmp_path) -> None:
    assert not list(tmp_path.glob("llama-server-*.log"))


def test_a_binary_that_cannot_start_or_exits_while_loading_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the server logs go
    with pytest.raises(ValueError, match="cannot start llama-server .*No such file") as missing:
        llamaserver.LlamaServer(tmp_path / "no-such-llama-server", ["-m", "x.gguf"])
    assert "scripts/build_llama_cpp.sh" in str(missing.value)
    not_executable = tmp_path / "llama-server"
    not_executable.write_text("#!/bin/sh\n")
    with pytest.raises(ValueError, match="cannot start llama-server .*Permission denied"):
        llamaserver.LlamaServer(not_executable, [])
    _no_log_left(tmp_path)
    # A process that fails while loading: its exit code and its last words, then no log left.
    failing = tmp_path / "failing-server"
    failing.write_text("#!/bin/sh\necho \"error: failed to load model '$2'\"\nexit 3\n")
    failing.chmod(failing.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(ValueError, match="exited with code 3 while loading") as failed:
        llamaserver.LlamaServer(failing, ["-m", "x.gguf"])
    assert "failed to load model 'x.gguf'" in str(failed.value)
    _no_log_left(tmp_path)
    # Killed by SIGILL, as llama.cpp's AMX kernels die on some Xeons: the signal by name and
    # the build that avoids it.
    faulting = tmp_path / "faulting-server"
    faulting.write_text("#!/bin/sh\nkill -ILL $$\n")
    faulting.chmod(faulting.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(ValueError, match=r"exited with code -4 \(SIGILL\).*--flags avx512"):
        llamaserver.LlamaServer(faulting, ["-m", "x.gguf"])
    _no_log_left(tmp_path)


def test_a_gguf_of_another_vocabulary_is_refused(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "other.gguf", shape=TinyShape(vocab=VOCAB + 4),
                           vocab_strings=True)
    with pytest.raises(ValueError, match=f"{VOCAB + 4} tokens and the target {VOCAB}"):
        llamaserver.LlamaServerPeers(gguf, tiny_target(0, layers=1), binary=tmp_path / "unused")
    same = write_tiny_gguf(tmp_path / "same.gguf", shape=TinyShape(vocab=VOCAB), vocab_strings=True)
    peers = llamaserver.LlamaServerPeers(same, tiny_target(0, layers=1), threads=1,
                                         binary=tmp_path / "unused")
    with pytest.raises(ValueError, match="unknown llama-server peer"):
        peers.server("llamaserver-medusa", 64)


def test_every_draftless_type_exists_in_the_built_server(llama_server):
    help_text = subprocess.run([str(llama_server), "--help"], capture_output=True, text=True).stdout
    spec_line = next(line for line in help_text.splitlines() if "--spec-type" in line)
    for spec_type in llamaserver.DRAFTLESS:
        assert spec_type in spec_line


def test_llamaserver_peers_on_the_default_gguf(llama_server, default_engine, tmp_path):
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
    assert f", weights {default_engine.target.weights_kind})" in (tmp_path / "report.md").read_text()
    record = next(r for r in out.records if r.config == "llamaserver-plain")
    assert record.decode_tokens_per_s and record.cpu_seconds


def test_a_bad_model_file_or_a_dead_server_fails_with_the_servers_own_words(llama_server,
                                                                          tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + os.urandom(64))
    with pytest.raises(ValueError, match="exited with code"):
        llamaserver.LlamaServer(llama_server, ["-m", str(broken)])
    server = llamaserver.LlamaServer(llama_server, llamaserver.server_args(
        default_gguf_path(), llamaserver.PLAIN, 1, 256))
    body = llamaserver.completion_body([1, 9690, 198], SamplingParams(max_new_tokens=2), 2)
    assert len(llamaserver.complete(server, body).token_ids) <= 2
    server.proc.kill()
    server.proc.wait()
    with pytest.raises(ValueError, match="no answer .*it has exited with code -9"):
        server.post("/completion", body)
    server.close()
