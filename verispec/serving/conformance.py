"""The OpenAI request fields verispec takes but does not honour: accepted and
ignored (named back in the `X-Verispec-Ignored` response header and a log
line), or refused with a 400 that names the field. Every other field OpenAI's
client sends is honoured; docs/openai_conformance.md has the whole table, and
tests/test_openai_fields.py walks the installed openai package's request types
against it.

A field is ignored when it asks for something with no meaning on a local server
(storage, billing, caching, an identity for abuse tracking) or is a hint the served
model has no control for; it is refused when honouring it would change the output
in a way verispec cannot (audio out, web search, moderation) or it names a
feature verispec does not have (insertion, the legacy functions API).
"""
from __future__ import annotations

import logging

from verispec.serving.errors import APIError
from verispec.serving.requests import ChatRequest, CompletionRequest

log = logging.getLogger("verispec.serving")

HEADER = "X-Verispec-Ignored"

IGNORED: dict[str, str] = {
    "store": "no stored completions on a local server",
    "metadata": "tags for stored completions, which a local server does not keep",
    "service_tier": "one tier: every request is served alike",
    "user": "an end-user id for OpenAI's abuse monitoring",
    "safety_identifier": "an end-user id for OpenAI's abuse monitoring",
    "prompt_cache_key": "OpenAI's cache routing; verispec's cache is per request",
    "prompt_cache_retention": "OpenAI's cache lifetime; verispec's cache is per request",
    "prompt_cache_options": "OpenAI's cache settings; verispec's cache is per request",
    "reasoning_effort": "a hint for reasoning models; the served model has no such control",
    "verbosity": "a length hint for OpenAI's models; the served model has no such control",
    "stream_options.include_obfuscation": "padding of streamed chunks against network "
                                          "side channels on OpenAI's wire",
}

REFUSED: dict[str, str] = {
    "audio": "verispec generates text only",
    "modalities": "verispec generates text only: modalities may be [\"text\"]",
    "web_search_options": "verispec has no web search",
    "moderation": "verispec has no moderation model",
    "functions": "the deprecated functions API is not supported: send them as `tools`",
    "function_call": "the deprecated functions API is not supported: use `tool_choice`",
    "suffix": "insertion (text after the completion) is not supported",
}


def _sent(request: ChatRequest | CompletionRequest, name: str) -> bool:
    """Whether the request set the field (a dotted name: in a nested object); a null
    is not set (requests.Body)."""
    value: object = request
    for part in name.split("."):
        if value is None or part not in value.model_fields_set:
            return False
        value = getattr(value, part)
    return True


def refuse_unsupported(request: ChatRequest | CompletionRequest) -> None:
    """A 400 naming the first field that asks for what verispec cannot do."""
    for name, why in REFUSED.items():
        if not _sent(request, name):
            continue
        value = getattr(request, name)
        if (name == "modalities" and set(value) <= {"text"}) or (name == "suffix" and not value):
            continue
        raise APIError(f"'{name}' is not supported: {why}.", name, "unsupported_parameter")


def ignored_fields(request: ChatRequest | CompletionRequest) -> list[str]:
    """The ignored fields the request set, logged with the reasons."""
    found = [name for name in IGNORED if _sent(request, name)]
    if found:
        log.info("ignored request fields: %s", "; ".join(f"{name} ({IGNORED[name]})"
                                                         for name in found))
    return found
