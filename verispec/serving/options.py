"""Request fields that need more than a type and a range check: the strings'
text (a lone UTF-16 surrogate), `logit_bias`, and `response_format` as a grammar."""
from __future__ import annotations

import json
import math
from typing import Any

from ..config import Grammar
from .errors import APIError


def surrogate_path(value: Any, where: str) -> str | None:
    """The path of the first string holding a lone UTF-16 surrogate, or None."""
    if isinstance(value, str):
        return where if any("\ud800" <= c <= "\udfff" for c in value) else None
    if isinstance(value, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((bad for path, v in items if (bad := surrogate_path(v, path))), None)


def response_grammar(fmt: dict | None) -> Grammar | None:
    """OpenAI's response_format as a grammar: text (none), json_object, json_schema
    ({"json_schema": {"name", "schema", "strict"}}); verispec extensions
    {"type": "regex", "regex": str} and {"type": "grammar", "grammar": str} (Lark,
    llguidance's dialect). Non-strict json_schema is enforced too: stricter than asked."""
    if fmt is None or fmt.get("type") == "text":
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return Grammar("json_object")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise APIError("response_format json_schema needs {'json_schema': {'name': ..., "
                           "'schema': {...}}}", "response_format.json_schema")
        return Grammar("json_schema", json.dumps(spec.get("schema", {})))
    if kind in ("regex", "grammar") and isinstance(fmt.get(kind), str) and fmt[kind]:
        return Grammar("regex" if kind == "regex" else "lark", fmt[kind])
    raise APIError(f"Invalid value for 'response_format.type': {kind!r}; use text, json_object, "
                   "json_schema, or verispec's regex / grammar (with the pattern under that key)",
                   "response_format.type")


def logit_bias(raw: dict) -> dict[int, float]:
    """OpenAI's {"token id": bias in [-100, 100]}; ids are checked against the
    vocabulary in build_job, which knows it."""
    out = {}
    for key, value in raw.items():
        if not (isinstance(key, str) and key.strip().isdigit()):
            raise APIError(f"Invalid key in 'logit_bias': {key!r} is not a token id",
                           "logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not -100 <= value <= 100:
            raise APIError(f"Invalid value in 'logit_bias' for {key}: must be a number in "
                           f"[-100, 100], got {value!r}", "logit_bias")
        out[int(key)] = float(value)
    return out
