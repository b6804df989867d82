"""Every field a real client sends: the installed openai package's request types
(`openai.types.chat.completion_create_params`, `openai.types.completion_create_params`)
are walked field by field, each sent as null and once with a typical value, nested
optional fields as null too. Each gets a 200 and is honoured, or (for the fields
`conformance.REFUSED` lists) a clean 400 naming it; an ignored field comes back
named in the `X-Verispec-Ignored` header. Never a 500, never a 400 for a null.
The field list comes from the package, so a new field OpenAI adds fails here until
it is classified. A tiny random model with the default tokenizer, so grammars run."""
from __future__ import annotations

import json
import types
import typing
from pathlib import Path

import openai.types.chat.completion_create_params as chat_params
import openai.types.completion_create_params as completion_params
import pytest
from conftest import tiny_engine_default_tokenizer
from server_support import tiny_server
from typing_extensions import is_typeddict

from verispec.serving import conformance

ROUTES = {"/v1/chat/completions": chat_params, "/v1/completions": completion_params}
TOOL = {"type": "function", "function": {"name": "ping", "description": "ping a host",
                                         "parameters": {"type": "object", "properties": {},
                                                        "additionalProperties": False}}}
BASE = {"/v1/chat/completions": {"model": "tiny", "max_tokens": 4,
                                 "messages": [{"role": "user", "content": "Say hi."}]},
        "/v1/completions": {"model": "tiny", "max_tokens": 4, "prompt": "Say hi."}}
# Typical values where one derived from the type would not be (a served name, a
# conversation) or needs a companion field; everything else is derived (`example`).
TYPICAL = {
    "model": ("tiny", {}), "messages": ([{"role": "user", "content": "Hello there"}], {}),
    "prompt": ("Once upon a time", {}), "max_tokens": (3, {}), "max_completion_tokens": (3, {}),
    "n": (2, {}), "best_of": (2, {"n": 2}), "logit_bias": ({"5": 2}, {}), "stop": (["zz"], {}),
    "seed": (7, {}), "temperature": (0.7, {}), "top_logprobs": (2, {"logprobs": True}),
    "stream_options": ({"include_usage": True}, {"stream": True}),
    "response_format": ({"type": "json_object"}, {}), "tools": ([TOOL], {}),
    # Greedy: sampled, the random model's JSON could wander through whitespace past
    # max_tokens on some draws and end "length" instead of "tool_calls".
    "tool_choice": ("required", {"tools": [TOOL], "max_tokens": 40, "temperature": 0}),
    "functions": ([TOOL["function"]], {}), "function_call": ("auto", {}),
    "prediction": ({"type": "content", "content": "Hello, how are you?"}, {}),
    "metadata": ({"team": "a"}, {}), "modalities": (["text"], {}),
    "parallel_tool_calls": (False, {"tools": [TOOL], "tool_choice": "auto"}),
}
REQUIRED = {"model", "messages", "prompt"}


def _bare(hint):
    """The type without Required / NotRequired / Annotated / Optional wrappers."""
    while True:
        origin = typing.get_origin(hint)
        if origin in (typing.Required, typing.NotRequired, typing.Annotated):
            hint = typing.get_args(hint)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(members) > 1:
                return hint
            hint = members[0]
        else:
            return hint


def example(hint):
    """A value of the type: a Literal's first choice, a TypedDict with every key."""
    hint = _bare(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return args[0]
    if origin in (typing.Union, types.UnionType):
        return example(next(a for a in args if a is not type(None)))
    if origin in (list, typing.List) or getattr(origin, "__name__", "") in ("Iterable", "Sequence"):
        return [example(args[0])]
    if origin in (dict, typing.Dict):
        return {"x": example(args[1]) if args[1] is not object else "x"}
    if isinstance(hint, type) and is_typeddict(hint):
        return {key: example(value) for key, value in
                typing.get_type_hints(hint, include_extras=True).items()}
    return {bool: True, int: 1, float: 0.5, str: "x"}.get(hint, "x")


def package_fields(module) -> dict[str, object]:
    """Every request field of a params module, `stream` included, with its type."""
    hints = {}
    for name in ("CompletionCreateParamsNonStreaming", "CompletionCreateParamsStreaming"):
        hints.update(typing.get_type_hints(getattr(module, name), include_extras=True))
    return hints


def nested_nulls(hint, value):
    """The typical value with, one at a time, each optional key of its object set to null."""
    hint = _bare(hint)
    if not (isinstance(hint, type) and is_typeddict(hint) and isinstance(value, dict)):
        return
    for key, kind in typing.get_type_hints(hint, include_extras=True).items():
        if typing.get_origin(kind) is not typing.Required and key in value:
            yield key, {**value, key: None}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    engine = tiny_engine_default_tokenizer(tmp_path_factory.mktemp("tiny-49k-fields"), seed=5)
    with tiny_server(engine, proposer="ngram", k=4, adaptive=True) as srv:
        yield srv


def post(server, path: str, body: dict) -> tuple[int, str, dict]:
    import http.client

    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    response = conn.getresponse()
    text = response.read().decode()
    headers = {k.lower(): v for k, v in response.getheaders()}
    conn.close()
    return response.status, text, headers


def _reply(text: str, stream: bool) -> dict:
    """The JSON reply, or a stream's chunks folded into one: the last usage and the choices."""
    if not stream:
        return json.loads(text)
    assert text.rstrip().endswith("data: [DONE]"), text[-200:]
    chunks = [json.loads(line[6:]) for line in text.splitlines()
              if line.startswith("data: {")]
    return {"chunks": chunks, "usage": chunks[-1].get("usage")}


HONOURED = {  # field -> what its typical value must show in the reply
    "n": lambda r, chat: len(r["choices"]) == 2,
    "best_of": lambda r, chat: len(r["choices"]) == 2,
    "max_tokens": lambda r, chat: r["usage"]["completion_tokens"] <= 3,
    "max_completion_tokens": lambda r, chat: r["usage"]["completion_tokens"] <= 3,
    "logprobs": lambda r, chat: (r["choices"][0]["logprobs"]["content"] if chat
                                 else r["choices"][0]["logprobs"]["tokens"]),
    "top_logprobs": lambda r, chat: len(r["choices"][0]["logprobs"]["content"][0]
                                        ["top_logprobs"]) == 2,
    "echo": lambda r, chat: r["choices"][0]["text"].startswith("Say hi."),
    "stream": lambda r, chat: bool(r["chunks"]),
    "stream_options": lambda r, chat: r["usage"]["completion_tokens"] >= 1,
    "prediction": lambda r, chat: "accepted_prediction_tokens" in
    r["usage"]["completion_tokens_details"],
    "tool_choice": lambda r, chat: r["choices"][0]["finish_reason"] == "tool_calls",
    "response_format": lambda r, chat: r["choices"][0]["message"]["content"].lstrip()
    .startswith("{"),
}


def _check(server, path: str, name: str, body: dict, typical: bool = False) -> str:
    """Send the body; a 200 (a `typical` value honoured, an ignored field that was sent
    named back) or the documented 400. Returns "200" or "400"."""
    status, text, headers = post(server, path, body)
    assert status in (200, 400), (name, body, status, text)
    if status == 400:
        error = json.loads(text)["error"]
        assert error["type"] == "invalid_request_error" and error["message"], text
        assert name in conformance.REFUSED and error["param"] == name, (name, body, text)
        assert error["code"] == "unsupported_parameter", text
        return "400"
    reply = _reply(text, bool(body.get("stream")))
    named = headers.get(conformance.HEADER.lower(), "")
    sent = body.get(name) is not None
    assert (name in named) == (sent and name in conformance.IGNORED), (name, headers)
    check = HONOURED.get(name)
    if check is not None and typical:
        assert check(reply, path.endswith("chat/completions")), (name, text[:400])
    return "200"


@pytest.mark.parametrize("path", list(ROUTES))
def test_every_openai_field_as_null_and_as_a_typical_value(server, path):
    fields = package_fields(ROUTES[path])
    seen = {"200": 0, "400": 0}
    for name, hint in fields.items():
        value, companions = TYPICAL[name] if name in TYPICAL else (example(hint), {})
        null_body = {**BASE[path], name: None}
        if name in REQUIRED:
            status, text, _ = post(server, path, null_body)
            assert status == 400 and json.loads(text)["error"]["param"] == name, text
        else:
            assert _check(server, path, name, null_body) == "200", name
        seen[_check(server, path, name, {**BASE[path], **companions, name: value}, True)] += 1
        for key, nulled in nested_nulls(hint, value):
            body = {**BASE[path], **companions, name: nulled}
            assert _check(server, path, name, body) in ("200", "400"), (name, key)
    refused = set(conformance.REFUSED) & set(fields)
    assert seen["400"] == len(refused - {"modalities"}), seen  # ["text"] is served
    assert seen["200"] >= len(fields) - len(refused)


def test_refused_values_name_their_field(server):
    chat = BASE["/v1/chat/completions"]
    for name, value in (("modalities", ["text", "audio"]), ("audio", {"format": "wav",
                                                                       "voice": "alloy"}),
                        ("web_search_options", {}), ("moderation", {"model": "m"})):
        status, text, _ = post(server, "/v1/chat/completions", {**chat, name: value})
        error = json.loads(text)["error"]
        assert status == 400 and error["param"] == name and name in error["message"], text
    status, text, _ = post(server, "/v1/completions", {**BASE["/v1/completions"], "suffix": "!"})
    assert status == 400 and json.loads(text)["error"]["param"] == "suffix"


def test_nulls_inside_every_nested_object(server):
    chat = BASE["/v1/chat/completions"]
    body = {**chat, "stream": True, "temperature": None, "top_p": None, "stop": None,
            "seed": None, "n": None, "logprobs": None,
            "stream_options": {"include_usage": None, "include_obfuscation": None},
            "speculation": {"proposer": None, "k": None, "tree": None, "draft": None},
            "tools": [{"type": "function", "function": {"name": "ping", "description": None,
                                                        "parameters": None, "strict": None}}],
            "tool_choice": None,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "x", "description": None, "strict": None,
                "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                           "required": ["a"], "additionalProperties": False}}}}
    status, text, _ = post(server, "/v1/chat/completions", body)
    assert status == 200, text
    completion = {**BASE["/v1/completions"], "stream": True, "echo": None, "best_of": None,
                  "stream_options": {"include_usage": None, "continuous_usage_stats": None},
                  "speculation": {"proposer": None, "k": None}, "suffix": None,
                  "logit_bias": None}
    status, text, _ = post(server, "/v1/completions", completion)
    assert status == 200 and text.rstrip().endswith("data: [DONE]"), text
    for inner in ({"type": "content", "content": None}, {"type": None, "content": "x"}):
        status, text, _ = post(server, "/v1/chat/completions", {**chat, "prediction": inner})
        assert status == 400 and json.loads(text)["error"]["param"].startswith("prediction."), text


def test_the_docs_table_covers_every_field():
    """docs/openai_conformance.md names every field of both request types."""
    table = (Path(__file__).resolve().parents[2] / "docs" / "openai_conformance.md").read_text()
    for module in ROUTES.values():
        for name in package_fields(module):
            assert f"`{name}`" in table, name
    for name in list(conformance.IGNORED) + list(conformance.REFUSED):
        assert f"`{name}`" in table, name
