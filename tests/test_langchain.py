"""langchain-openai's `ChatOpenAI`, unchanged, against `verispec serve` on the
default model: `invoke` and `stream` give what the engine gives alone, and
`with_structured_output` returns validated pydantic objects in both its
JSON-schema and function-calling modes (what each mode sends is checked at the
server's side, so a silent fallback to plain text would fail)."""
from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, Field

from verispec import SamplingParams, SpecConfig
from verispec.serving.protocol import ServeDefaults
from verispec.serving.scheduler import SchedulerConfig
from verispec.serving.server import ServerConfig, ServerThread, create_app

PLAIN = SpecConfig("none", k=0)

class Colour(BaseModel):
    """A colour and how it looks."""
    name: str = Field(max_length=12, description="the colour's name")
    warm: bool = Field(description="whether it is a warm colour")


@pytest.fixture(scope="module")
def served(default_engine, langchain_openai):
    """The server, and the bodies it received (to see what each mode sent)."""
    # The server's default speculation (adaptive k up to 8): k follows measured step
    # times, so the drafts differ run to run, and every run must still validate.
    config = ServerConfig(("default",), ServeDefaults(), SchedulerConfig(max_num_seqs=2))
    app = create_app(default_engine, config)
    bodies: list[dict] = []

    @app.middleware("http")
    async def record(request, call_next):
        if request.method == "POST":
            bodies.append(json.loads(await request.body()))
        return await call_next(request)

    with ServerThread(app) as srv:
        yield srv, bodies


def chat(served, **kwargs):
    from langchain_openai import ChatOpenAI  # the fixture `served` skipped where it is missing

    server, _ = served
    return ChatOpenAI(base_url=server.url + "/v1", api_key="unused", model="default",
                      max_retries=0, **kwargs)


def test_invoke_and_stream_equal_the_engine(default_engine, served):
    question = "Name three colors."
    ids = default_engine.encode_messages([{"role": "user", "content": question}])
    alone = default_engine.generate(ids, SamplingParams(max_new_tokens=24), PLAIN)
    want = alone.text
    model = chat(served, temperature=0, max_tokens=24)
    reply = model.invoke(question)
    assert reply.content == want and want
    assert reply.response_metadata["finish_reason"] == alone.finish_reason
    assert reply.usage_metadata["output_tokens"] == len(alone.token_ids)
    pieces = list(model.stream(question))
    assert "".join(p.content for p in pieces) == want and len(pieces) > 2


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(served, method):
    _, bodies = served
    # strict: the schema closes the object (additionalProperties false), so a weak model
    # cannot ramble through extra keys until max_tokens.
    model = chat(served, temperature=0, max_tokens=120).with_structured_output(
        Colour, method=method, strict=True)
    before = len(bodies)
    got = model.invoke("Describe the colour of a ripe tomato as JSON.")
    assert isinstance(got, Colour) and got.name
    sent = bodies[before]
    if method == "json_schema":
        assert sent["response_format"]["type"] == "json_schema"
        assert "tools" not in sent
    else:
        assert sent["tools"][0]["function"]["name"] == "Colour"
        assert sent["tool_choice"]["function"]["name"] == "Colour"
