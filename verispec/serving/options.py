"""Request options turned into the engine's terms: `response_format` as a
grammar, `logit_bias` as token ids."""
from __future__ import annotations

import json

from verispec.config import Grammar
from verispec.serving.requests import (
    GrammarFormat,
    JsonObjectFormat,
    JsonSchemaFormat,
    LogitBias,
    RegexFormat,
    ResponseFormat,
)


def response_grammar(fmt: ResponseFormat | None) -> Grammar | None:
    """OpenAI's response_format as a grammar: text (none), json_object, json_schema;
    verispec's regex and grammar (Lark, llguidance's dialect). Non-strict
    json_schema is enforced too: stricter than asked."""
    if isinstance(fmt, JsonObjectFormat):
        return Grammar("json_object")
    if isinstance(fmt, JsonSchemaFormat):
        return Grammar("json_schema", json.dumps(fmt.json_schema.schema_))
    if isinstance(fmt, RegexFormat):
        return Grammar("regex", fmt.regex)
    if isinstance(fmt, GrammarFormat):
        return Grammar("lark", fmt.grammar)
    return None


def logit_bias(raw: LogitBias | None) -> dict[int, float]:
    """{"token id": bias} as {id: bias}; the ids are checked against the vocabulary
    in build_job, which knows it."""
    return {int(key): float(value) for key, value in (raw or {}).items()}
