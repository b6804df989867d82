"""The soak test's request templates (scripts/soak.py): every kind of request a
client sends, each with what its reply must satisfy. Prompts come from the bench
workloads, so the texts are the installed ones."""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

from verispec.bench.workloads import load_workload

CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                         "country": {"type": "string", "maxLength": 24},
                                         "population": {"type": "integer", "minimum": 0}},
        "required": ["name", "country", "population"], "additionalProperties": False}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}


@dataclass(frozen=True)
class Template:
    name: str
    route: str
    body: dict
    # Greedy: every reply equals the solo one (the lossless law). A seeded sampled reply
    # repeats only when its draft lengths do, which adaptive k and the batch change.
    deterministic: bool
    schema: dict | None = None  # the reply's text must validate
    tool_schema: dict | None = None  # each tool call's arguments must validate
    stop: tuple[str, ...] = ()
    prediction: bool = False
    short: bool = False  # cheap enough for a burst

    @property
    def chat(self) -> bool:
        return self.route.endswith("chat/completions")

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    def without_prediction(self) -> "Template":
        body = {k: v for k, v in self.body.items() if k != "prediction"}
        return replace(self, name=self.name + "/plain", body=body, prediction=False)

    def describe(self) -> dict:
        return {"name": self.name, "route": self.route, "stream": self.stream,
                "deterministic": self.deterministic, "max_tokens": self.body.get("max_tokens")}


def _chat(model: str, text: str, **more) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], **more}


def templates(model: str, max_tokens: int | None = None) -> list[Template]:
    """Every template, each request's max_tokens capped at `max_tokens` when given."""
    out = _templates(model)
    if max_tokens is None:
        return out
    return [replace(t, body={**t.body, "max_tokens": min(t.body["max_tokens"], max_tokens)})
            for t in out]


def _templates(model: str) -> list[Template]:
    chats = [p.messages[-1]["content"] for p in load_workload("chat", limit=4)]
    edits = load_workload("predicted-edit", limit=3)
    out: list[Template] = []
    for i, text in enumerate(chats):
        for stream in (False, True):
            tag = f"chat{i}-{'stream' if stream else 'json'}"
            out.append(Template(f"{tag}-greedy", "/v1/chat/completions",
                                _chat(model, text, max_tokens=48, temperature=0, stream=stream),
                                True, short=True))
            out.append(Template(f"{tag}-seeded", "/v1/chat/completions",
                                _chat(model, text, max_tokens=48, temperature=0.8, seed=i,
                                      stream=stream), False, short=True))
        out.append(Template(f"chat{i}-sampled", "/v1/chat/completions",
                            _chat(model, text, max_tokens=48, temperature=1.0, n=2), False))
    for i, text in enumerate(chats[:2]):
        for stream in (False, True):
            out.append(Template(f"completion{i}-{'stream' if stream else 'json'}", "/v1/completions",
                                {"model": model, "prompt": text, "max_tokens": 40,
                                 "temperature": 0, "stream": stream}, True, short=True))
    out.append(Template("chat-stop", "/v1/chat/completions",
                        _chat(model, chats[0], max_tokens=64, temperature=0, stop=[".", "\n"]),
                        True, stop=(".", "\n"), short=True))
    out.append(Template("chat-stop-stream", "/v1/chat/completions",
                        _chat(model, chats[1], max_tokens=64, temperature=0, stop=[","],
                              stream=True, stream_options={"include_usage": True}),
                        True, stop=(",",)))
    schema_format = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY,
                                                            "strict": True}}
    for stream in (False, True):
        out.append(Template(f"schema-{'stream' if stream else 'json'}", "/v1/chat/completions",
                            _chat(model, "Describe one large city as JSON.", max_tokens=96,
                                  temperature=0, stream=stream, response_format=schema_format),
                            True, schema=CITY))
    out.append(Template("schema-sampled", "/v1/chat/completions",
                        _chat(model, "Describe one city as JSON.", max_tokens=96,
                              temperature=0.9, response_format=schema_format), False, schema=CITY))
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER,
                                             "description": "the weather in a city"}}
    for stream in (False, True):
        out.append(Template(f"tool-{'stream' if stream else 'json'}", "/v1/chat/completions",
                            _chat(model, "What is the weather in Paris?", max_tokens=64,
                                  temperature=0, stream=stream, tools=[tool],
                                  tool_choice="required"), True, tool_schema=WEATHER))
    for i, prompt in enumerate(edits):
        body = _chat(model, prompt.messages[-1]["content"], max_tokens=160, temperature=0,
                     prediction={"type": "content", "content": prompt.prediction})
        for stream in (False, True):
            mine = copy.deepcopy(body)
            if stream:
                mine.update(stream=True, stream_options={"include_usage": True})
            out.append(Template(f"predicted{i}-{'stream' if stream else 'json'}",
                                "/v1/chat/completions", mine, True, prediction=True))
    return out
