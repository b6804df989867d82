"""Predicted Outputs through the official openai client (`prediction=`), streamed and
not, on both routes: the reply is the plain reply, and usage reports the accepted
and rejected prediction tokens as OpenAI does."""
from __future__ import annotations

import json

import pytest
from conftest import tiny_engine
from server_support import ChatCharTokenizer, openai_client, raw, tiny_server
from test_server import wait_drained

from verispec import SamplingParams, SpecConfig

PLAIN = SpecConfig("none", k=0)
MESSAGES = [{"role": "user", "content": "hello hello hello"}]
# A fixed k: adaptive k on a tiny model, whose passes cost little beside the host work,
# is held back by the guard and the allocator, which would leave the prediction idle.
FIXED = {"speculation": {"k": 4}}


@pytest.fixture(scope="module")
def engine():
    return tiny_engine(ChatCharTokenizer())


@pytest.fixture(scope="module")
def server(engine):
    with tiny_server(engine, proposer="ngram", k=6, adaptive=False) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


@pytest.fixture(scope="module")
def answer(engine) -> str:
    return engine.generate(engine.encode_messages(MESSAGES), SamplingParams(max_new_tokens=40),
                           PLAIN).text


def test_chat_prediction_through_the_openai_client(client, answer):
    # CharTokenizer reads the text of ids past 89 back as lower ids: a few drafts miss
    # even for the answer itself; an edit adds misses.
    for prediction, edited in ((answer, False), (answer[:12] + "QQQ" + answer[15:], True),
                               ([{"type": "text", "text": answer[:20]},
                                 {"type": "text", "text": answer[20:]}], False)):
        got = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40,
                                             temperature=0, extra_body=FIXED,
                                             prediction={"type": "content", "content": prediction})
        assert got.choices[0].message.content == answer
        details = got.usage.completion_tokens_details
        assert details.accepted_prediction_tokens >= 20, details
        assert details.rejected_prediction_tokens > 0 or not edited, details
        assert details.reasoning_tokens == 0 and details.audio_tokens == 0


def test_streamed_prediction_reports_usage_at_the_end(client, answer, server):
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=40, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=FIXED,
        prediction={"type": "content", "content": answer})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    usage = chunks[-1].usage
    assert usage.completion_tokens == 40
    assert usage.completion_tokens_details.accepted_prediction_tokens >= 20
    wait_drained(server)


def test_completions_take_a_prediction_too(engine, client):
    want = engine.generate("abcabcabcab", SamplingParams(max_new_tokens=24), PLAIN).text
    got = client.completions.create(model="tiny", prompt="abcabcabcab", max_tokens=24,
                                    temperature=0,
                                    extra_body={**FIXED, "prediction": {"type": "content",
                                                                        "content": want}})
    assert got.choices[0].text == want
    assert got.usage.completion_tokens_details.accepted_prediction_tokens >= 10


def test_no_details_without_a_prediction_and_bad_predictions_are_400(client, server):
    got = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4)
    assert got.usage.completion_tokens_details is None
    for bad, param in (({"type": "file", "content": "x"}, "prediction.type"),
                       ({"type": "content"}, "prediction.content"),
                       ({"type": "content", "content": 5}, "prediction.content")):
        body = {"model": "tiny", "messages": MESSAGES, "prediction": bad}
        status, text = raw(server, "POST", "/v1/chat/completions", json.dumps(body).encode())
        assert status == 400 and json.loads(text)["error"]["param"] == param, text


def test_sampled_request_with_a_prediction_is_served_and_counted(client, answer):
    """Its distribution is tests/proposers/test_prediction.py's chi-square test."""
    got = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=40,
                                         temperature=0.8, seed=3,
                                         prediction={"type": "content", "content": answer})
    details = got.usage.completion_tokens_details
    assert got.usage.completion_tokens == 40
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens > 0


def test_streamed_usage_sums_every_choice_and_grows_with_continuous_stats(engine, client,
                                                                           server):
    """Completions streamed with n=2: the usage chunk (include_usage) counts both
    choices' prediction tokens; with vLLM's continuous_usage_stats every chunk carries
    the counts so far, which never fall and end at the final usage."""
    prompt = "abcabcabcab"
    want = engine.generate(prompt, SamplingParams(max_new_tokens=24), PLAIN).text
    body = {**FIXED, "prediction": {"type": "content", "content": want}}
    stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=24,
                                       temperature=0, n=2, stream=True,
                                       stream_options={"include_usage": True}, extra_body=body)
    chunks = list(stream)
    texts = ["".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)
             for i in (0, 1)]
    assert texts == [want, want]
    usage = chunks[-1].usage
    assert usage.completion_tokens == 48
    details = usage.completion_tokens_details
    # Each choice alone accepts at least 10 (test_completions_take_a_prediction_too).
    assert details.accepted_prediction_tokens >= 20, details
    stream = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body=body)
    accepted = [c.usage.completion_tokens_details.accepted_prediction_tokens
                for c in stream if c.usage is not None]
    assert len(accepted) >= 3 and accepted == sorted(accepted) and accepted[-1] >= 10
    wait_drained(server)
