"""OpenAI request bodies -> validated generation jobs, and OpenAI-style errors.

Every field is checked for type and range before anything is queued, and each
failure is an `APIError` that the server turns into HTTP 400 with the body
`{"error": {"message", "type", "param", "code"}}`. Unknown fields are refused
as OpenAI refuses them, so a misspelt option is an error rather than silently
ignored. `response_format` (json_object, json_schema, and verispec's regex /
grammar) and `tools` with a forcing `tool_choice` (verispec.serving.tools)
constrain the output with a grammar (verispec.grammar).

Logprobs (chat `logprobs` / `top_logprobs`, completions `logprobs: N` and
`echo`) and the logit processors (`presence_penalty`, `frequency_penalty`,
`logit_bias`, and vLLM's `repetition_penalty`, `min_p`, `min_tokens`) are
honoured under speculation (verispec.processors). A lone UTF-16 surrogate in
any string is a 400 naming the field: no tokenizer can encode it.

verispec extensions: `top_k`, `ignore_eos`, and a `speculation` object
`{"proposer", "k" (an integer, or "auto" for load-adaptive k), "tree", "draft"}`,
and `stream_options.include_provenance`: every streamed chunk then carries, per
choice, a `provenance` object telling where each token came from (the format is
in `verispec.serving.provenance`). Without it a stream is exactly OpenAI's.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from typing import Any

from .. import spec_text
from ..config import SamplingParams, SpecConfig
from .errors import APIError
from .options import logit_bias, response_grammar, surrogate_path
from .tools import plan_tools

MAX_N = 16
MAX_K = 32


@dataclass(frozen=True)
class ServeDefaults:
    """The server's speculation settings, which a request's `speculation` may override."""
    proposer: str = "ngram"
    k: int = 8  # the fixed k, or the cap of adaptive k
    adaptive: bool = True  # choose k per step from the cost curve and acceptance
    tree: int = 0
    draft: str | None = None  # for proposer draft: a preloaded model or self:L
    profile: str | None = None  # cost profile JSON, the adaptive prior
    allowed_drafts: tuple[str, ...] = ()  # draft sources a request may name besides self:L


@dataclass(frozen=True)
class Job:
    """One validated request: prompts (one per completion prompt) times n choices."""
    chat: bool
    prompts: list[list[int]]
    prompt_texts: list[str]  # for echo
    sampling: SamplingParams
    spec: SpecConfig
    n: int
    stream: bool
    include_usage: bool
    echo: bool
    include_provenance: bool = False  # stream_options.include_provenance (a verispec extension)
    tools: Any = None  # a verispec.serving.tools.ToolPlan: the reply is a tool call

    def choice_sampling(self, index: int) -> SamplingParams:
        """Choice i of n draws from its own seed, so seeded choices differ but repeat."""
        if self.sampling.seed is None or index == 0:
            return self.sampling
        return replace(self.sampling, seed=self.sampling.seed + index)


_TYPES = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
          list: "an array", dict: "an object"}


def _is(value: Any, kind: type) -> bool:
    if isinstance(value, bool):  # JSON true is not the number 1
        return kind is bool
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _typed(body: dict, name: str, kind: type | tuple, default: Any = None) -> Any:
    value = body.get(name)
    if value is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not any(_is(value, k) for k in kinds):
        want = " or ".join(_TYPES[k] for k in kinds)
        raise APIError(f"Invalid type for '{name}': expected {want}, got "
                       f"{type(value).__name__} {value!r}", name, "invalid_type")
    return value


def _ranged(body: dict, name: str, kind: type, lo: float, hi: float, default: Any,
            lo_open: bool = False) -> Any:
    value = _typed(body, name, kind, default)
    if value is not None and not math.isfinite(value):
        raise APIError(f"Invalid value for '{name}': must be a finite number, got {value}", name)
    if value is not None and (value < lo or value > hi or (lo_open and value == lo)):
        bracket = "(" if lo_open else "["
        raise APIError(f"Invalid value for '{name}': must be in {bracket}{lo}, {hi}], got {value}",
                       name)
    return value


_COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options",
           "stop", "seed", "user", "frequency_penalty", "presence_penalty", "logit_bias",
           "logprobs", "top_k", "ignore_eos", "speculation", "repetition_penalty", "min_p",
           "min_tokens"}
_COMPLETION = _COMMON | {"prompt", "echo", "best_of", "suffix"}
_CHAT = _COMMON | {"messages", "max_completion_tokens", "response_format", "tools", "tool_choice",
                   "parallel_tool_calls", "top_logprobs", "store", "metadata", "service_tier"}


def check_fields(body: Any, chat: bool) -> None:
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object.", None, "invalid_json")
    bad = surrogate_path(body, "")
    if bad is not None:
        # Valid JSON ("\ud800") but no valid text: every tokenizer refuses it.
        raise APIError(f"Invalid value for '{bad}': the string holds a lone UTF-16 surrogate, "
                       "which is not valid Unicode text", bad)
    known = _CHAT if chat else _COMPLETION
    for name in body:
        if name not in known:
            raise APIError(f"Unrecognized request argument supplied: {name}", name,
                           "unknown_parameter")


def check_model(body: dict, served: tuple[str, ...]) -> None:
    model = _typed(body, "model", str)
    if model is None:
        raise APIError("You must provide a model parameter.", "model", "missing_required_parameter")
    if model not in served:
        raise APIError(f"The model '{model}' does not exist; this server serves "
                       f"{', '.join(repr(m) for m in served)}", "model", "model_not_found")


def _neutral(body: dict, name: str, neutral: tuple) -> None:
    value = body.get(name)
    if value is not None and value not in neutral and value != {} and value != []:
        raise APIError(f"'{name}' is not supported by verispec (only {neutral[0]!r})", name,
                       "unsupported_parameter")


def parse_sampling(body: dict, chat: bool) -> tuple[SamplingParams, int, bool, bool]:
    """Sampling params (max_new_tokens left at a placeholder), n, stream, include_usage."""
    penalties = {name: float(_ranged(body, name, float, -2.0, 2.0, 0.0))
                 for name in ("frequency_penalty", "presence_penalty")}
    penalties["repetition_penalty"] = float(_ranged(body, "repetition_penalty", float, 0.0, 10.0,
                                                    1.0, lo_open=True))
    penalties["min_p"] = float(_ranged(body, "min_p", float, 0.0, 1.0, 0.0))
    penalties["min_tokens"] = _ranged(body, "min_tokens", int, 0, 1 << 30, 0)
    penalties["logit_bias"] = logit_bias(_typed(body, "logit_bias", dict, {}))
    _typed(body, "user", str)
    if chat:
        if _typed(body, "logprobs", bool, False):
            logprobs = _ranged(body, "top_logprobs", int, 0, 20, 0)
        else:
            logprobs = None
            if _ranged(body, "top_logprobs", int, 0, 20, None) is not None:
                raise APIError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        _typed(body, "parallel_tool_calls", bool)
        _typed(body, "store", bool)
        _typed(body, "metadata", dict)
        _typed(body, "service_tier", str)
        grammar = response_grammar(_typed(body, "response_format", dict))
    else:
        logprobs = _ranged(body, "logprobs", int, 0, 20, None)
        grammar = None
        _typed(body, "suffix", str)
        _neutral(body, "suffix", ("",))
    temperature = _ranged(body, "temperature", float, 0.0, 2.0, 1.0)
    top_p = _ranged(body, "top_p", float, 0.0, 1.0, 1.0, lo_open=True)
    top_k = _ranged(body, "top_k", int, -1, 1 << 20, 0)
    n = _ranged(body, "n", int, 1, MAX_N, 1)
    if not chat:
        best_of = _ranged(body, "best_of", int, 1, MAX_N, n)
        if best_of != n:
            raise APIError("best_of must equal n (verispec returns every sample)", "best_of")
    seed = _typed(body, "seed", int)
    stop = _typed(body, "stop", (str, list), ())
    stop = (stop,) if isinstance(stop, str) else stop
    if len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise APIError("'stop' must be a non-empty string or up to 4 non-empty strings", "stop")
    stream = _typed(body, "stream", bool, False)
    options = _typed(body, "stream_options", dict, {})
    if options and not stream:
        raise APIError("'stream_options' is only allowed with stream: true", "stream_options")
    unknown = set(options) - {"include_usage", "include_provenance"}
    if unknown:
        raise APIError(f"Unrecognized stream_options field: {sorted(unknown)[0]}", "stream_options",
                       "unknown_parameter")
    include_usage = _typed(options, "include_usage", bool, False)
    ignore_eos = _typed(body, "ignore_eos", bool, False)
    sampling = SamplingParams(temperature=float(temperature), top_k=max(0, top_k),
                              top_p=float(top_p), seed=seed, max_new_tokens=1,
                              stop=tuple(stop), ignore_eos=ignore_eos, logprobs=logprobs,
                              grammar=grammar, **penalties)
    return sampling, n, stream, include_usage


def parse_spec(body: dict, defaults: ServeDefaults, num_layers: int) -> SpecConfig:
    try:
        return _parse_spec(_typed(body, "speculation", dict, {}), defaults, num_layers)
    except APIError as exc:
        if exc.param and not exc.param.startswith("speculation"):
            exc.param = f"speculation.{exc.param}"
        raise


_SPEC_FIELDS = ("proposer", "k", "tree", "draft")


def _parse_spec(raw: dict, defaults: ServeDefaults, num_layers: int) -> SpecConfig:
    unknown = set(raw) - set(_SPEC_FIELDS)
    if unknown:
        raise APIError(f"Unrecognized speculation field: {sorted(unknown)[0]}", "speculation",
                       "unknown_parameter")
    k = raw.get("k")
    if k != "auto":
        k = _ranged(raw, "k", int, 0, MAX_K, None)
    typed = {"proposer": _typed(raw, "proposer", str, defaults.proposer),
             "k": ("auto" if defaults.adaptive else defaults.k) if k is None else k,
             "k_max": defaults.k, "tree": _ranged(raw, "tree", int, 0, 256, defaults.tree),
             "draft": _typed(raw, "draft", str, defaults.draft), "profile": defaults.profile}
    try:
        spec = spec_text.parse_spec(typed)
    except spec_text.SpecError as exc:
        field = {"k_max": "k"}.get(exc.field, exc.field)
        raise APIError(str(exc), f"speculation.{field}" if field in _SPEC_FIELDS
                       else "speculation") from None
    if spec.proposer == "draft":
        # A draft source made from the target (self:L) needs no preloading; its layer
        # count needs the model, which only the server knows here.
        source = spec_text.draft_source(spec.draft)
        derived = source is not None and (source != "self" or int(spec.draft[5:]) <= num_layers)
        if not (derived or spec.draft in defaults.allowed_drafts):
            allowed = ", ".join([f"self:1..self:{num_layers}", *defaults.allowed_drafts])
            raise APIError(f"proposer 'draft' needs speculation.draft in: {allowed}; "
                           f"got {spec.draft!r}", "speculation.draft")
    return spec


def message_texts(body: dict) -> list[dict]:
    """Chat messages as [{"role", "content": str}], content parts joined."""
    messages = _typed(body, "messages", list)
    if not messages:
        raise APIError("'messages' must be a non-empty array", "messages",
                       "missing_required_parameter" if messages is None else "invalid_value")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise APIError(f"Invalid type for '{where}': expected an object", where, "invalid_type")
        role = _typed(message, "role", str)
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise APIError(f"Invalid value for '{where}.role': {role!r}", f"{where}.role")
        content = message.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise APIError(f"'{where}.content' parts must be {{'type': 'text', 'text': str}}",
                                   f"{where}.content", "invalid_type")
                parts.append(part["text"])
            content = "".join(parts)
        elif content is None and role == "assistant":
            content = ""
        elif not isinstance(content, str):
            raise APIError(f"Invalid type for '{where}.content': expected a string or an array "
                           "of text parts", f"{where}.content", "invalid_type")
        out.append({"role": role, "content": content})
    if not any(m["content"].strip() for m in out):
        raise APIError("The messages are all empty", "messages")
    return out


def prompt_inputs(body: dict) -> list[str | list[int]]:
    """A completion's prompts: a string, a list of strings, token ids, or lists of token ids."""
    prompt = body.get("prompt")
    if prompt is None:
        raise APIError("You must provide a prompt.", "prompt", "missing_required_parameter")
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and all(
            isinstance(p, str) or (isinstance(p, list) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in p)) for p in prompt):
        prompts = list(prompt)
    else:
        raise APIError("Invalid type for 'prompt': expected a string, an array of strings, an "
                       "array of token ids or an array of such arrays", "prompt", "invalid_type")
    if not prompts or any(not p or (isinstance(p, str) and not p.strip()) for p in prompts):
        raise APIError("The prompt is empty", "prompt")
    return prompts


def max_tokens(body: dict, chat: bool, longest_prompt: int, context: int) -> int:
    """The completion budget; past the context it is refused with the numbers."""
    name = "max_tokens"
    value = _ranged(body, "max_tokens", int, 1, 1 << 30, None)
    if chat:
        other = _ranged(body, "max_completion_tokens", int, 1, 1 << 30, None)
        if other is not None:
            name, value = "max_completion_tokens", other
    if longest_prompt >= context:
        raise APIError(f"This model's maximum context length is {context} tokens, and the prompt "
                       f"has {longest_prompt} tokens, which leaves no room for a completion",
                       "messages" if chat else "prompt", "context_length_exceeded")
    if value is None:
        # OpenAI's completions default to 16 tokens; chat defaults to the rest of the context.
        return min(16, context - longest_prompt) if not chat else context - longest_prompt
    if longest_prompt + value > context:
        raise APIError(f"This model's maximum context length is {context} tokens. However, you "
                       f"requested {longest_prompt + value} tokens ({longest_prompt} in the prompt, "
                       f"{value} for the completion). Please reduce the prompt or {name}.",
                       name, "context_length_exceeded")
    return value


def fallback_chat_text(messages: list[dict]) -> str:
    """A plain transcript for tokenizers without a chat template (base models,
    test tokenizers): one `<|role|>` header per turn, then the assistant's."""
    turns = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return turns + "<|assistant|>\n"


def encode_chat(engine, messages: list[dict]) -> list[int]:
    """The prompt ids of a chat: the tokenizer's template, else `fallback_chat_text`."""
    if getattr(engine.tokenizer, "chat_template", None):
        return engine.encode_messages(messages)
    return engine.encode(fallback_chat_text(messages))


def build_job(body: Any, chat: bool, engine, served: tuple[str, ...],
              defaults: ServeDefaults) -> Job:
    """Validate a request body completely and tokenize its prompts."""
    check_fields(body, chat)
    check_model(body, served)
    sampling, n, stream, include_usage = parse_sampling(body, chat)
    spec = parse_spec(body, defaults, engine.target.num_layers)
    echo = False if chat else _typed(body, "echo", bool, False)
    if engine.tokenizer is None and (chat or sampling.stop):
        raise APIError("this model has no tokenizer: send token ids, without chat or stop",
                       "messages" if chat else "stop")
    tools = None
    if chat:
        tools = plan_tools(body)
        if tools is not None:
            if sampling.grammar is not None:
                raise APIError("a forced tool call and a response_format cannot be combined",
                               "response_format")
            sampling = replace(sampling, grammar=tools.grammar)
    try:
        if chat:
            messages = message_texts(body)
            if tools is not None:
                messages = [{"role": "system", "content": tools.note}] + messages
            inputs: list = [encode_chat(engine, messages)]
            texts = [""]
        else:
            inputs = prompt_inputs(body)
            texts = [p if isinstance(p, str) else engine.decode(p) for p in inputs]
            inputs = [engine.encode(p) if isinstance(p, str) else list(p) for p in inputs]
    except ValueError as exc:
        raise APIError(str(exc), "messages" if chat else "prompt") from None
    vocab = engine.target.vocab_size
    if sampling.grammar is not None:
        try:
            engine.constraint(sampling)  # compiles it: a bad schema or pattern is a 400 now
        except (ValueError, RuntimeError) as exc:
            raise APIError(f"Invalid {'tools' if tools else 'response_format'}: {exc}",
                           "tools" if tools else "response_format") from None
    bad_bias = [t for t, _ in sampling.logit_bias if t >= vocab]
    if bad_bias:
        raise APIError(f"Invalid key in 'logit_bias': token id {bad_bias[0]} is not in "
                       f"[0, {vocab})", "logit_bias")
    for ids in inputs:
        if not ids:
            raise APIError("The prompt is empty", "messages" if chat else "prompt")
        if min(ids) < 0 or max(ids) >= vocab:
            raise APIError(f"prompt token ids must be in [0, {vocab})", "prompt")
    budget = max_tokens(body, chat, max(len(ids) for ids in inputs), engine.target.max_context)
    provenance = _typed(_typed(body, "stream_options", dict, {}), "include_provenance", bool, False)
    if provenance and sampling.stop:
        # Token texts stream per pass, ahead of the text held back for a partial stop
        # string, so they would show what a stop trims: refused rather than leaked.
        raise APIError("stream_options.include_provenance cannot be combined with 'stop'",
                       "stream_options")
    return Job(chat, inputs, texts, replace(sampling, max_new_tokens=budget), spec, n, stream,
               include_usage, echo, provenance, tools)


def serve_defaults(args: argparse.Namespace) -> ServeDefaults:
    """The server's speculation defaults, checked by the one parser of speculation
    text (`verispec.spec_text`) before the model loads."""
    spec = spec_text.parse_spec(proposer=args.proposer, k=args.k, k_max=args.k_max, tree=args.tree,
                      draft=args.draft, profile=args.profile)
    adaptive = str(args.k) == "auto"
    k = args.k_max if adaptive else int(args.k)
    if not 0 <= k <= MAX_K:
        raise ValueError(f"--k / --k-max must be in [0, {MAX_K}], got {k}")
    draft = spec.draft
    drafts = (draft,) if draft and not spec_text.draft_source(draft) else ()
    return ServeDefaults(proposer=spec.proposer, k=k, adaptive=adaptive, tree=spec.tree,
                         draft=draft, profile=args.profile, allowed_drafts=drafts)
