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
from pydantic import BaseModel, Field

from conftest import tiny_llama
from test_server import raw
from verispec import Engine
from verispec.models.llama import NativeLlama
from verispec.models.loading import default_gguf_path, gguf_tokenizer
from verispec.serving.protocol import ServeDefaults
from verispec.serving.scheduler import SchedulerConfig
from verispec.serving.server import ServerConfig, ServerThread, create_app


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
    tokenizer = gguf_tokenizer(default_gguf_path())
    folder = tmp_path_factory.mktemp("tiny-49k-serve")
    tiny_llama(5, vocab=49152, layers=2).save_pretrained(folder)
    target = NativeLlama.from_dir(folder, dtype=torch.float32)
    target.eos_token_ids = frozenset({tokenizer.eos_token_id})
    engine = Engine(target, tokenizer=tokenizer)
    config = ServerConfig(("tiny",), ServeDefaults(proposer="ngram", k=4, adaptive=False),
                          SchedulerConfig(max_num_seqs=4, max_queue=16))
    with ServerThread(create_app(engine, config)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_parse_with_a_pydantic_model(client):
    for seed in range(3):
        completion = client.chat.completions.parse(
            model="tiny", messages=MESSAGES, response_format=City, max_tokens=120,
            temperature=1.0, seed=seed)
        city = completion.choices[0].message.parsed
        assert isinstance(city, City) and completion.choices[0].finish_reason == "stop"


def test_json_object_schema_and_regex(client):
    # Any object: the random model may write an endless key (tests/test_grammar.py checks
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


@pytest.mark.parametrize("body, param", [
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
