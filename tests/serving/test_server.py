"""`verispec serve` through the official openai client and raw HTTP, against a
server started here on a free loopback port over a tiny random model."""
from __future__ import annotations

import gc
import http.client
import json
import re
import threading
import time

import openai
import pytest
from conftest import CharTokenizer, tiny_engine, tiny_target
from server_support import ChatCharTokenizer, openai_client, raw, tiny_server

from verispec import Engine, SamplingParams, SpecConfig
from verispec.serving.protocol import ServeDefaults, encode_chat, fallback_chat_text
from verispec.serving.scheduler import SchedulerConfig
from verispec.serving.server import ServerConfig, ServerThread, create_app

PLAIN = SpecConfig("none", k=0)




@pytest.fixture(scope="module")
def engine():
    return tiny_engine(ChatCharTokenizer())


@pytest.fixture(scope="module")
def server(engine):
    with tiny_server(engine, max_num_seqs=6, max_queue=32, proposer="ngram", k=6, adaptive=True,
                     allowed_drafts=("same",)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)




def metric(server, name: str) -> float:
    _, text = raw(server, "GET", "/metrics")
    match = re.search(rf"^verispec_{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def wait_drained(server, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gc.collect()
        if (metric(server, "running_requests"), metric(server, "queue_depth"),
                metric(server, "kv_caches")) == (0, 0, 0):
            return
        time.sleep(0.05)
    raise AssertionError("the server did not drain: requests, queue or caches left")


def test_completion_equals_engine(engine, client):
    prompt = "abcabcabcab"
    want = engine.generate(prompt, SamplingParams(max_new_tokens=24), PLAIN)
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0)
    assert got.choices[0].text == want.text and got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 24 and got.usage.prompt_tokens == len(prompt)
    spec = got.model_extra["speculation"]
    assert spec["proposer"] == "ngram" and spec["tau"] >= 1.0
    assert set(spec) >= {"drafted", "accepted", "tau", "proposer"}


def test_chat_completion_equals_engine(engine, client):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "xyzxyzxy"}]
    want = engine.generate(engine.encode_messages(messages), SamplingParams(max_new_tokens=20), PLAIN)
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20,
                                         temperature=0)
    assert got.choices[0].message.content == want.text
    assert got.choices[0].message.role == "assistant"


def test_streamed_chat_equals_engine(engine, client, server):
    messages = [{"role": "user", "content": "hello hello hello"}]
    want = engine.generate(engine.encode_messages(messages), SamplingParams(max_new_tokens=30), PLAIN)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=30,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 30 and "speculation" in chunks[-1].model_extra
    body = json.dumps({"model": "tiny", "messages": messages, "max_tokens": 5, "stream": True})
    status, sse = raw(server, "POST", "/v1/chat/completions", body.encode())
    assert status == 200 and sse.rstrip().endswith("data: [DONE]")


def test_continuous_usage_stats_as_vllm_sends_it(engine, client):
    """vLLM's stream_options.continuous_usage_stats (guidellm sends it with every
    request): every chunk carries the usage so far, counting up to the total."""
    messages = [{"role": "user", "content": "hello hello hello"}]
    want = engine.generate(engine.encode_messages(messages), SamplingParams(max_new_tokens=30), PLAIN)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=30, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    counts = [c.usage.completion_tokens for c in chunks]
    assert all(c.usage is not None for c in chunks) and counts == sorted(counts)
    assert counts[-1] == 30 and len(set(counts)) > 2
    assert all(c.usage.prompt_tokens == chunks[0].usage.prompt_tokens for c in chunks)


def test_n_seed_stop_and_echo(engine, client):
    prompt = "abcabcabcab"
    free = engine.generate(prompt, SamplingParams(max_new_tokens=24), PLAIN).text
    stop = free[10:12]
    got = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0,
                                    stop=[stop], echo=True)
    assert got.choices[0].text == prompt + free[:free.find(stop)]
    assert got.choices[0].finish_reason == "stop"
    # Fixed k: adaptive k follows measured step times, and k changes which draws a seed feeds.
    kwargs = dict(model="tiny", prompt=prompt, max_tokens=16, temperature=1.0, seed=5, n=3,
                  extra_body={"speculation": {"proposer": "ngram", "k": 4}})
    first, again = client.completions.create(**kwargs), client.completions.create(**kwargs)
    texts = [c.text for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2] and len(set(texts)) > 1
    assert texts == [c.text for c in again.choices]  # seeded: repeatable per choice
    assert first.usage.completion_tokens == 48 and first.usage.prompt_tokens == len(prompt)


def test_models_health_and_fallback_chat_template(client, server):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    status, text = raw(server, "GET", "/health")
    assert status == 200 and json.loads(text)["status"] == "ok"
    status, text = raw(server, "GET", "/openapi.json")  # the pydantic bodies, described
    schemas = json.loads(text)["components"]["schemas"]
    assert status == 200 and {"ChatRequest", "CompletionRequest", "ChatCompletion"} <= set(schemas)
    plain = Engine(tiny_target(0, layers=1), tokenizer=CharTokenizer())
    messages = [{"role": "user", "content": "hi"}]
    assert encode_chat(plain, messages) == plain.encode(fallback_chat_text(messages))


MIXED = [  # (prompt, temperature, seed, speculation)
    ("abcabcabc", 0.0, None, {"proposer": "none"}),
    ("hello hello", 0.0, None, {"proposer": "ngram", "k": 4}),
    ("xyxyxyxyxy", 0.0, None, {"proposer": "ngram", "k": "auto"}),
    ("the the the", 0.0, None, {"proposer": "draft", "draft": "same", "k": 3}),
    ("qwerty qwerty", 0.0, None, {"proposer": "ngram", "k": 4, "tree": 8}),
    ("zzzzzzzz", 0.0, None, {"proposer": "draft", "draft": "self:1", "k": "auto"}),
    ("lorem ipsum lorem", 0.8, 1, {"proposer": "ngram", "k": 4}),
    ("12341234", 1.0, 2, {"proposer": "auto"}),
]


def stream_text(client, prompt, temperature, seed, speculation, max_tokens):
    stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                       temperature=temperature, seed=seed, stream=True,
                                       extra_body={"speculation": speculation})
    text, reason = "", None
    for chunk in stream:
        text += chunk.choices[0].text
        reason = chunk.choices[0].finish_reason or reason
    return text, reason


def test_sixteen_concurrent_streams(engine, client, server):
    jobs = [MIXED[i % len(MIXED)] for i in range(16)]
    lengths = [16 + 4 * (i % 5) for i in range(16)]
    solo = {(p, n): engine.generate(p, SamplingParams(max_new_tokens=n), PLAIN).text
            for (p, t, _, _), n in zip(jobs, lengths) if t == 0}
    results: list = [None] * 16

    def worker(i: int) -> None:
        try:
            results[i] = stream_text(client, *jobs[i], lengths[i])
        except Exception as exc:  # reported below with its index
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, ((prompt, temperature, _, _), n) in enumerate(zip(jobs, lengths)):
        assert not isinstance(results[i], Exception), (i, results[i])
        text, reason = results[i]
        assert reason == "length"
        if temperature == 0:
            assert text == solo[(prompt, n)], (i, jobs[i])
    wait_drained(server)


BAD = [  # (path, body, param the error names)
    ("/v1/completions", b'{"model": "tiny", "prompt": "ab",', None),
    ("/v1/completions", b'[1, 2]', None),
    ("/v1/completions", {"model": "gpt-5", "prompt": "ab"}, "model"),
    ("/v1/completions", {"model": "tiny", "prompt": ""}, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": []}, "prompt"),
    ("/v1/chat/completions", {"model": "tiny", "messages": []}, "messages"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": ""}]},
     "messages"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "max_tokens": 100000}, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "temperature": 2.5}, "temperature"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "top_p": 0}, "top_p"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "n": 0}, "n"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "stream": "yes"}, "stream"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "seed": 1.5}, "seed"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "stop": 3}, "stop"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "frobnicate": 1}, "frobnicate"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "speculation": {"proposer": "magic"}},
     "speculation.proposer"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "speculation": {"k": -1}},
     "speculation.k"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "speculation": {"k": "lots"}},
     "speculation.k"),
    ("/v1/chat/completions", {"model": "tiny", "messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": 5}]},
     "messages[0].content"),
    # A lone UTF-16 surrogate is valid JSON but no text a tokenizer can encode.
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "\ud800"}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}]},
     "messages[0].content[0].text"),
    ("/v1/completions", {"model": "tiny", "prompt": ["ok", "x\udc00"]}, "prompt[1]"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "stop": ["\ud83d"]}, "stop[0]"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "logit_bias": {"5": 500}}, "logit_bias"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "logit_bias": {"96": 1}}, "logit_bias"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "logit_bias": [1]}, "logit_bias"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "repetition_penalty": 0},
     "repetition_penalty"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "min_p": 1.5}, "min_p"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "min_tokens": -1}, "min_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "logprobs": 30}, "logprobs"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                              "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                              "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                              "logprobs": 1}, "logprobs"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "robot", "content": "hi"}]},
     "messages[0].role"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user"}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    ("/v1/completions", {"model": "tiny"}, "prompt"),
    ("/v1/completions", {"prompt": "ab"}, "model"),
    ("/v1/completions", {"model": "tiny", "prompt": [1, "a"]}, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": [[1, 2], []]}, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": [-1]}, "prompt[0]"),
    ("/v1/completions", {"model": "tiny", "prompt": [999]}, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "speculation": {"colour": 1}},
     "speculation.colour"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "stream_options": {}}, "stream_options"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "stream": True,
                         "stream_options": {"x": 1}}, "stream_options.x"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "best_of": 2}, "best_of"),
    ("/v1/completions", {"model": "tiny", "prompt": "ab", "suffix": "cd"}, "suffix"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "ab", "temperature": NaN}', "temperature"),
    ("/v1/completions", b'{"model": "tiny", "prompt": "\xff\xfe"}', None),
    ("/v1/completions", b'', None),
]


@pytest.mark.parametrize("path, body, param", BAD)
def test_bad_input_is_400_and_the_server_keeps_serving(client, server, path, body, param):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, text = raw(server, "POST", path, data)
    assert status == 400, text
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    if param == "max_tokens" and error["code"] == "context_length_exceeded":
        assert "512" in error["message"] and "100000" in error["message"]
    ok = client.completions.create(model="tiny", prompt="ab", max_tokens=3, temperature=0)
    assert len(ok.choices[0].text) == 3


_ODD = [None, True, 0, -1, 1.5, 1e300, "", "x", "\ud800", [], [1], ["a"], {}, {"a": 1}]
_VALID = {"model": "tiny", "max_tokens": 3, "temperature": 0.5, "top_p": 0.9, "n": 1,
          "stop": ["zz"], "seed": 1, "user": "u", "frequency_penalty": 0.1,
          "presence_penalty": 0.1, "logit_bias": {"5": 1}, "repetition_penalty": 1.1,
          "min_p": 0.05, "min_tokens": 1, "top_k": 5, "ignore_eos": False,
          "speculation": {"proposer": "ngram", "k": 2, "tree": 0}}
_CHAT = {**_VALID, "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
         "top_logprobs": 1, "max_completion_tokens": 3, "response_format": {"type": "text"},
         "tool_choice": "none", "parallel_tool_calls": False, "store": False,
         "metadata": {"a": "b"}, "service_tier": "auto"}
_COMPLETION = {**_VALID, "prompt": "ab", "logprobs": 1, "echo": False, "best_of": 1, "suffix": ""}


def _mutants(body: dict):
    """The body with each field (and each speculation / message field) set to each odd value."""
    for name in body:
        for value in _ODD:
            yield {**body, name: value}
    for name in ("proposer", "k", "tree", "draft"):
        for value in _ODD:
            yield {**body, "speculation": {name: value}}
    if "messages" in body:
        for name in ("role", "content"):
            for value in _ODD:
                yield {**body, "messages": [{"role": "user", "content": "hi", name: value}]}


def test_no_odd_field_reaches_a_500(server):
    """Every field of both routes set to every odd JSON value: served or a clean 400."""
    seen = {200: 0, 400: 0}
    for path, valid in (("/v1/chat/completions", _CHAT), ("/v1/completions", _COMPLETION)):
        assert raw(server, "POST", path, json.dumps(valid).encode())[0] == 200
        for body in _mutants(valid):
            status, text = raw(server, "POST", path, json.dumps(body).encode())
            assert status in seen, (status, body, text)
            seen[status] += 1
            if status == 400:
                error = json.loads(text)["error"]
                assert error["type"] == "invalid_request_error" and error["message"], body
    assert seen[200] > 50 and seen[400] > 200, seen


def test_queue_full_is_429(engine):
    with tiny_server(engine, max_num_seqs=1, max_queue=0) as srv:
        conn = http.client.HTTPConnection(srv.host, srv.port, timeout=30)
        body = {"model": "tiny", "prompt": "ab", "max_tokens": 400, "stream": True,
                "ignore_eos": True}
        conn.request("POST", "/v1/completions", json.dumps(body).encode(),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        status, text = raw(srv, "POST", "/v1/completions",
                           json.dumps({"model": "tiny", "prompt": "cd"}).encode())
        assert status == 429 and json.loads(text)["error"]["code"] == "queue_full"
        conn.close()


def test_disconnect_cancels_without_disturbing_others(engine, client, server):
    others_want = engine.generate("hello hello", SamplingParams(max_new_tokens=60), PLAIN).text
    cancelled = metric(server, 'requests_total{outcome="cancelled"}')
    result: list = []
    other = threading.Thread(target=lambda: result.append(
        stream_text(client, "hello hello", 0.0, None, {"proposer": "ngram", "k": 4}, 60)))
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    body = {"model": "tiny", "prompt": "abcabc", "max_tokens": 480, "stream": True,
            "ignore_eos": True}
    conn.request("POST", "/v1/completions", json.dumps(body).encode(),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    other.start()
    assert response.status == 200
    for _ in range(3):
        assert response.readline().startswith(b"data: ")
        response.readline()
    conn.sock.shutdown(2)  # the client goes away mid-stream
    conn.close()
    deadline = time.monotonic() + 10
    while metric(server, 'requests_total{outcome="cancelled"}') < cancelled + 1:
        assert time.monotonic() < deadline, "the disconnect was not seen as a cancellation"
        time.sleep(0.02)
    other.join(60)
    assert result == [(others_want, "length")]
    wait_drained(server)


def test_default_model_served(default_engine):
    config = ServerConfig(("default",), ServeDefaults(proposer="ngram"),
                          SchedulerConfig(max_num_seqs=2))
    messages = [{"role": "user", "content": "Name three colors."}]
    want = default_engine.generate(default_engine.encode_messages(messages),
                                   SamplingParams(max_new_tokens=12), PLAIN)
    with ServerThread(create_app(default_engine, config)) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        got = c.chat.completions.create(model="default", messages=messages, max_tokens=12,
                                        temperature=0)
    assert got.choices[0].message.content == want.text


def test_load_driver_and_serving_bench(server, tmp_path):
    from verispec.cli.main import main
    from verispec.serving.load import LoadConfig, run_load

    report = run_load(LoadConfig(server.url, concurrency=2, duration=0.5, max_tokens=8))
    summary = report.summary()
    assert summary["requests"] >= 2 and summary["errors"] == 0 and summary["tokens_per_s"] > 0
    assert summary["latency_p50_s"] <= summary["latency_p99_s"] and summary["tau"] >= 1.0
    code = main(["bench", "--server", server.url, "--concurrency", "1,2", "--duration", "0.3",
                 "--max-new-tokens", "6", "--workload", "chat", "--proposer", "none,ngram",
                 "--k", "3", "--rounds", "2", "--control", "--out", str(tmp_path)])
    assert code == 0
    table = (tmp_path / "report.md").read_text()
    assert "none tok/s" in table and "ngram k=3 tok/s" in table and "ngram adaptive tok/s" in table
    assert "ngram adaptive / none" in table and "none again / none" in table  # the A/A control
    assert "Per-round ratios" in table
    assert (tmp_path / "serving.png").exists()
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert all(row["errors"] == 0 for mode in results.values() for row in mode.values())
    # Each cell is the median of its two rounds.
    for mode in results.values():
        for row in mode.values():
            speeds = sorted(r["tokens_per_s"] for r in row["rounds"])
            assert len(speeds) == 2 and row["tokens_per_s"] == pytest.approx(sum(speeds) / 2)
    wait_drained(server)
