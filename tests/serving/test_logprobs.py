"""Logprobs of every emitted token (accepted, recovered, bonus) from the
target's processed row: equal to plain decoding's bit for bit on the native
backend, cut with the tokens at EOS and stop strings, and carried by the
server in OpenAI's shapes, streamed or not."""
from __future__ import annotations

import json
import math

import openai
import pytest
import torch
from conftest import CharTokenizer, tiny_target
from server_support import ChatCharTokenizer, raw

from verispec import Engine, SamplingParams, SpecConfig
from verispec.serving.protocol import ServeDefaults
from verispec.serving.scheduler import SchedulerConfig
from verispec.serving.server import ServerConfig, ServerThread, create_app

PLAIN = SpecConfig("none", k=0)
PROMPTS = [[3, 17, 4, 9, 3, 17, 4], list(range(10, 30))]
SPECS = [SpecConfig("ngram", k=4), SpecConfig("ngram", k=4, tree=12),
         SpecConfig("draft", k=5, draft="same"), SpecConfig("draft", k=3, draft="same", tree=8),
         SpecConfig("draft", k=3, draft="random")]


@pytest.fixture(scope="module")
def native_engine(tiny_native):
    engine = Engine(tiny_native, tokenizer=CharTokenizer())
    engine._drafts["same"] = tiny_native
    engine._drafts["random"] = tiny_target(99, layers=1)
    return engine


@pytest.mark.parametrize("processing", [{}, dict(presence_penalty=1.0, repetition_penalty=1.3,
                                                 logit_bias={5: 2.0})])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.proposer}-k{s.k}-t{s.tree}-{s.draft}")
def test_greedy_logprobs_equal_plain_bit_for_bit_on_native(native_engine, spec, processing):
    sampling = SamplingParams(max_new_tokens=24, logprobs=5, **processing)
    for prompt in PROMPTS:
        want = native_engine.generate(prompt, sampling, PLAIN)
        got = native_engine.generate(prompt, sampling, spec)
        assert got.token_ids == want.token_ids
        assert got.logprobs == want.logprobs  # token, logprob and top-5, exactly
        assert [lp.token for lp in got.logprobs] == got.token_ids
        for lp in got.logprobs:  # greedy: the emitted token is the best one
            assert lp.top[0] == (lp.token, lp.logprob)
            assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)
        if spec.draft == "same":
            assert got.stats.accepted > 0 and any(s.bonus for s in got.stats.steps)


def test_sampled_logprobs_are_the_targets_processed_distribution(native_engine):
    """Sampled with speculation: each emitted token's logprob equals the target's
    tempered log-softmax at that prefix, recomputed by one teacher-forced forward."""
    temperature = 0.8
    sampling = SamplingParams(temperature=temperature, seed=3, max_new_tokens=30, logprobs=2)
    prompt = PROMPTS[0]
    got = native_engine.generate(prompt, sampling, SpecConfig("draft", k=4, draft="same"))
    ids = prompt + got.token_ids
    target = native_engine.target
    with torch.no_grad():
        logits = target.forward(torch.tensor(ids[:-1]), target.new_cache()).logits  # [n - 1, V]
    reference = torch.log_softmax(logits[len(prompt) - 1:].float() / temperature, -1)
    for i, lp in enumerate(got.logprobs):
        assert math.isclose(lp.logprob, float(reference[i, lp.token]), abs_tol=1e-4)
    assert got.stats.accepted > 0


def test_logprobs_end_with_the_tokens_at_a_stop_string(native_engine):
    prompt = PROMPTS[0]
    free = native_engine.generate(prompt, SamplingParams(max_new_tokens=40), PLAIN)
    stop = free.text[11:14]
    sampling = SamplingParams(max_new_tokens=40, stop=(stop,), logprobs=0)
    got = native_engine.generate(prompt, sampling, SpecConfig("draft", k=8, draft="same"))
    assert len(got.logprobs) == len(got.token_ids) < len(free.token_ids)
    chunks = list(native_engine.stream(prompt, sampling, SpecConfig("draft", k=8, draft="same")))
    assert [lp for c in chunks for lp in c.logprobs] == got.logprobs


@pytest.fixture(scope="module")
def lp_server(tiny_native):
    engine = Engine(tiny_native, tokenizer=ChatCharTokenizer())
    engine._drafts["same"] = tiny_native
    config = ServerConfig(("tiny",), ServeDefaults(proposer="draft", draft="same", k=4,
                                                   adaptive=False, allowed_drafts=("same",)),
                          SchedulerConfig(max_num_seqs=4, max_queue=16))
    with ServerThread(create_app(engine, config)) as srv:
        yield engine, srv


def test_chat_logprobs_through_the_openai_client(lp_server):
    engine, server = lp_server
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "abcabcabc"}]
    want = engine.generate(engine.encode_messages(messages),
                           SamplingParams(max_new_tokens=20, logprobs=3), PLAIN)
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20,
                                         temperature=0, logprobs=True, top_logprobs=3)
    content = got.choices[0].logprobs.content
    assert "".join(c.token for c in content) == got.choices[0].message.content == want.text
    assert [c.logprob for c in content] == [lp.logprob for lp in want.logprobs]
    assert all(len(c.top_logprobs) == 3 and c.bytes == list(c.token.encode()) for c in content)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20,
                                            temperature=0, logprobs=True, top_logprobs=3,
                                            stream=True)
    streamed = [c for chunk in stream if chunk.choices and chunk.choices[0].logprobs
                for c in chunk.choices[0].logprobs.content]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_echo_and_stop(lp_server):
    engine, server = lp_server
    prompt = "abcabcabcab"
    free = engine.generate(prompt, SamplingParams(max_new_tokens=24), PLAIN).text
    stop = free[10:12]
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "logprobs": 2, "echo": True, "stop": [stop]}
    status, text = raw(server, "POST", "/v1/completions", json.dumps(body).encode())
    assert status == 200, text
    choice = json.loads(text)["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"] == prompt + free[:free.find(stop)]
    # Never past the stop string: the listed tokens spell exactly the returned text.
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert [choice["text"][o] for o in logprobs["text_offset"]] == list(choice["text"])
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    ids = engine.encode(prompt)
    echoed = engine.prompt_logprobs(ids, 2)
    assert logprobs["token_logprobs"][1:len(ids)] == [lp.logprob for lp in echoed[1:]]
    assert all(len(top) == 2 for top in logprobs["top_logprobs"][1:])
    stream_body = dict(body, stream=True)
    status, sse = raw(server, "POST", "/v1/completions", json.dumps(stream_body).encode())
    events = [json.loads(line[6:]) for line in sse.splitlines()
              if line.startswith("data: {")]
    tokens = [t for e in events for c in e["choices"] if c["logprobs"]
              for t in c["logprobs"]["tokens"]]
    assert tokens == logprobs["tokens"]


def test_async_client_with_penalties_equals_the_engine(lp_server):
    """openai's AsyncOpenAI, penalties and logit_bias in the body: the server's
    speculative answer equals the engine's plain one with the same settings."""
    import asyncio

    engine, server = lp_server
    prompt = "abcabcabcab"
    settings = dict(presence_penalty=1.0, frequency_penalty=0.5, logit_bias={"5": 3.0})
    want = engine.generate(prompt, SamplingParams(
        max_new_tokens=20, presence_penalty=1.0, frequency_penalty=0.5,
        logit_bias={5: 3.0}, repetition_penalty=1.2, min_tokens=3), PLAIN)

    async def ask():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                    max_retries=0)
        return await client.completions.create(
            model="tiny", prompt=prompt, max_tokens=20, temperature=0, **settings,
            extra_body={"repetition_penalty": 1.2, "min_tokens": 3})

    got = asyncio.run(ask())
    assert got.choices[0].text == want.text
    unprocessed = engine.generate(prompt, SamplingParams(max_new_tokens=20), PLAIN)
    assert unprocessed.text != want.text
