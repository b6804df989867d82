"""Structured outputs and tool calls through the server, with real clients:
the openai client's `chat.completions.parse` with a pydantic model,
response_format json_object / json_schema / verispec's regex, and tools with
tool_choice named or "required" returning tool_calls. A tiny random model with
the default model's tokenizer and chat template: whatever parses is the grammar's."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest
import torch
from conftest import tiny_engine_default_tokenizer, tiny_llama
from pydantic import BaseModel, Field
from server_support import openai_client, raw, tiny_server

from verispec import Engine
from verispec.models.llama import NativeLlama
from verispec.models.loading import default_gguf_path, gguf_tokenizer
from verispec.serving.protocol import message_texts
from verispec.serving.requests import Message


class City(BaseModel):
    name: str = Field(max_length=10)
    population: int = Field(ge=0, le=10**7)
    coastal: bool


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "the time in a zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}},
                   "required": ["zone"], "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": "Tell me about a city."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = tiny_engine_default_tokenizer(tmp_path_factory.mktemp("tiny-49k-serve"), seed=5)
    with tiny_server(engine, proposer="ngram", k=4, adaptive=False) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def test_parse_with_a_pydantic_model(client):
    for seed in range(3):
        completion = client.chat.completions.parse(
            model="tiny", messages=MESSAGES, response_format=City, max_tokens=120,
            temperature=1.0, seed=seed)
        city = completion.choices[0].message.parsed
        assert isinstance(city, City) and completion.choices[0].finish_reason == "stop"


def test_json_object_schema_and_regex(client):
    # Any object: the random model may write an endless key (tests/step/test_grammar.py checks
    # json_object on the default model), so only the opening is certain here.
    got = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=30,
                                         response_format={"type": "json_object"}, temperature=0)
    assert got.choices[0].message.content.lstrip().startswith('{"')
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 3}
    got = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=100, temperature=0.7, seed=1,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "ints", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(got.choices[0].message.content), schema)
    got = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=20, temperature=0,
        extra_body={"response_format": {"type": "regex", "regex": r"\d{3}-[a-z]{2}"}})
    assert re.fullmatch(r"\d{3}-[a-z]{2}", got.choices[0].message.content)


def test_named_and_required_tool_calls(client):
    got = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=[WEATHER, TIME], max_tokens=120, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    for seed in range(3):
        got = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER, TIME],
                                             tool_choice="required", max_tokens=120,
                                             temperature=1.0, seed=seed)
        call = got.choices[0].message.tool_calls[0]
        tool = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=[WEATHER], tool_choice="required", max_tokens=120,
        temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER],
                                           tool_choice="auto", max_tokens=8, temperature=0)
    assert plain.choices[0].message.tool_calls is None and plain.choices[0].finish_reason


def test_forced_drafts_switch_over_http(client, monkeypatch):
    """speculation.grammar_forced reaches the request's grammar (SpecConfig.grammar_forced),
    and the output is the same either way: forced tokens are ordinary drafts."""
    from verispec.step.grammar import Constraint

    seen = []
    forced = Constraint.forced
    monkeypatch.setattr(Constraint, "forced", lambda self, limit: (
        seen.append(self.draft_forced), forced(self, limit))[1])
    schema = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
              "required": ["unit"], "additionalProperties": False}
    answers = {}
    for on in (True, False):
        seen.clear()
        got = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=40, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "u", "schema": schema}},
            extra_body={"speculation": {"proposer": "ngram", "k": 4, "grammar_forced": on}})
        answers[on] = got.choices[0].message.content
        assert seen and set(seen) == {on}
    assert answers[True] == answers[False]
    jsonschema.validate(json.loads(answers[True]), schema)


@pytest.mark.parametrize("body, param", [
    ({"speculation": {"grammar_forced": "no"}}, "speculation.grammar_forced"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": 3}}, "response_format.json_schema"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [{"type": "function"}], "tool_choice": "required"}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]},
     "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": "\udc00"}}]},
     "tools[0].function.description"),
    ({"response_format": {"type": "regex", "regex": ""}}, "response_format.regex"),
    ({"response_format": {"regex": "a+"}}, "response_format.type"),
    ({"tool_choice": "sometimes", "tools": [WEATHER]}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": "x", "tool_choice": "required"}, "tools"),
])
def test_bad_structured_requests_are_400(server, body, param):
    payload = {"model": "tiny", "messages": MESSAGES, **body}
    status, text = raw(server, "POST", "/v1/chat/completions", json.dumps(payload).encode())
    assert status == 400, text
    assert json.loads(text)["error"]["param"] == param


# Loose enough that llguidance's Earley items grow past a tight limit (25) at the
# first value, three or four tokens into the output.
LOOSE = {"type": "object", "properties": {"name": {"type": "string"},
                                          "tags": {"type": "array", "items": {"type": "string"}}},
         "required": ["name", "tags"], "additionalProperties": False}


def test_a_grammar_past_the_engines_limits_is_a_400_naming_them(client, monkeypatch):
    """A grammar that outgrows llguidance's limits mid-output ends the request with
    OpenAI's error JSON, not a 500: a 400 naming the field and the limit, before
    any text (non-streamed) or as the stream's error event after the text so far."""
    from verispec.step import grammar

    monkeypatch.setitem(grammar.LIMITS, "step_max_items", 25)
    loose = {"type": "json_schema", "json_schema": {"name": "loose", "schema": LOOSE}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=loose,
                                       max_tokens=60, temperature=0)
    assert caught.value.code == "grammar_too_complex"
    assert caught.value.body["param"] == "response_format"
    assert "Too many items (limit 25" in caught.value.message
    assert "<state>" not in caught.value.message  # llguidance's parser dump stays out
    tool = {"type": "function", "function": {"name": "tag", "parameters": LOOSE}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[tool],
                                       tool_choice="required", max_tokens=60, temperature=0)
    assert caught.value.body["param"] == "tools"
    # Plain decoding, streamed: one token a step, so text streams before the limit.
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, response_format=loose, max_tokens=200, temperature=0,
        stream=True, extra_body={"speculation": {"k": 0}})
    text = ""
    with pytest.raises(openai.APIError, match="Too many items") as caught:
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
    assert caught.value.code == "grammar_too_complex" and text.startswith("{") and "name" in text
    monkeypatch.undo()
    got = client.chat.completions.create(model="tiny", messages=MESSAGES, response_format=loose,
                                         max_tokens=60, temperature=0)
    assert got.choices[0].finish_reason in ("stop", "length")


# A chat template that writes the tools into the prompt and teaches <tool_call> blocks
# (the Hermes / Qwen convention), set on the default model's tokenizer.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou can call functions. To call one, write "
    "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>. Functions:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{%- if m.get('tool_calls') %}{% for c in m['tool_calls'] %}<tool_call>{\"name\": \""
    "{{ c['function']['name'] }}\", \"arguments\": {{ c['function']['arguments'] | tojson }}}"
    "</tool_call>{% endfor %}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>'


@pytest.fixture(scope="module")
def tool_engine(tmp_path_factory):
    tokenizer = gguf_tokenizer(default_gguf_path())
    tokenizer.chat_template = TOOL_TEMPLATE
    folder = tmp_path_factory.mktemp("tiny-49k-tools")
    tiny_llama(5, vocab=49152, layers=2).save_pretrained(folder)
    target = NativeLlama.from_dir(folder, dtype=torch.float32)
    target.eos_token_ids = frozenset({tokenizer.eos_token_id})
    return Engine(target, tokenizer=tokenizer)


@pytest.fixture(scope="module")
def tool_client(tool_engine):
    with tiny_server(tool_engine, max_num_seqs=2, max_queue=64, proposer="ngram", k=4,
                     adaptive=False) as srv:
        yield openai_client(srv)


def _lark_literal(text: str) -> dict:
    return {"type": "grammar", "grammar": f"start: {json.dumps(text)}"}


def test_auto_tool_calls_with_a_template_that_writes_tools(tool_engine, tool_client):
    """tool_choice "auto" with a template that renders `tools`: the tools reach the
    prompt, and a call in the template's format becomes `tool_calls` (the output is
    pinned to a call by a verispec grammar, since a random model calls nothing on
    its own); text that is no call stays the answer, streamed or not."""
    from verispec.serving.tools import renders_tools

    assert renders_tools(tool_engine.tokenizer)
    with_tools = tool_engine.encode_messages(MESSAGES, [WEATHER])
    assert "get_weather" in tool_engine.decode(with_tools)
    got = tool_client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=[WEATHER], max_tokens=200, temperature=0,
        extra_body={"response_format": _lark_literal("Let me check. " + CALL)})
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}
    assert got.usage.prompt_tokens == len(with_tools)
    stream = tool_client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=[WEATHER], max_tokens=200, temperature=0,
        stream=True, extra_body={"response_format": _lark_literal("Let me check. " + CALL)})
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert text.strip() == "Let me check." and "<tool_call>" not in text
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The call's result goes back through the template; a reply that calls nothing
    # (a call of an unknown function, or plain text) stays the answer.
    history = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "get_weather",
                                                         "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
    for answer in ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "It is 18 C."):
        got = tool_client.chat.completions.create(
            model="tiny", messages=history, tools=[WEATHER], max_tokens=200, temperature=0,
            extra_body={"response_format": _lark_literal(answer)})
        assert got.choices[0].message.content == answer and got.choices[0].finish_reason == "stop"
        assert got.choices[0].message.tool_calls is None
    prompt = tool_engine.decode(tool_engine.encode_messages(
        message_texts([Message(**m) for m in history]), [WEATHER]))
    assert '"city": "Paris"' in prompt and "18 C" in prompt


# ASCII digits: the grammar engine's \d is Unicode 16's digit class, which sampled byte
# tokens can reach (U+16133) and Python 3.11's re (Unicode 14) does not know.
DIGITS = {"type": "regex", "regex": r"[0-9]{2}"}
ARG_TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}


@pytest.mark.parametrize("body, status, param", [
    ({"temperature": 1.0, "top_p": 1e-300}, 200, None),  # rounds to 0 in float32
    ({"temperature": 1e-300}, 200, None),  # greedy, as vLLM reads it
    ({"seed": 2 ** 64}, 400, "seed"),
    ({"seed": -5, "temperature": 1.0}, 200, None),
    ({"response_format": DIGITS, "min_tokens": 5}, 200, None),  # the grammar's end wins
    ({"response_format": DIGITS, "min_tokens": 5, "temperature": 1.0}, 200, None),
    ({"response_format": DIGITS, "ignore_eos": True}, 400, "ignore_eos"),
    ({"tools": [ARG_TOOL], "tool_choice": "required", "stop": [","]}, 200, None),
    ({"response_format": {"type": "grammar", "grammar": "start: start"}}, 400, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "string", "minLength": 5, "maxLength": 2}}}}, 400, "response_format"),
])
def test_odd_inputs_never_reach_a_500(server, body, status, param):
    payload = {"model": "tiny", "messages": MESSAGES, "max_tokens": 12, **body}
    got, text = raw(server, "POST", "/v1/chat/completions", json.dumps(payload).encode())
    assert got == status, text
    reply = json.loads(text)
    if status != 200:
        assert reply["error"]["param"] == param
    elif body.get("response_format") is DIGITS:
        assert re.fullmatch(r"[0-9]{2}", reply["choices"][0]["message"]["content"])
