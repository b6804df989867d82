"""Validated OpenAI requests -> generation jobs.

The bodies are pydantic models (`verispec.serving.requests`), validated by
FastAPI before a route runs; `build_job` adds what needs the model and the
server: the served names, the vocabulary, the context, a grammar's
compilation, the speculation settings, and the checks across fields. Each
failure is an `APIError`, which the server turns into OpenAI's error JSON.
`response_format` (json_object, json_schema, and verispec's regex / grammar)
and `tools` with a forcing `tool_choice` (verispec.serving.tools) constrain
the output with a grammar (verispec.step.grammar).

Logprobs (chat `logprobs` / `top_logprobs`, completions `logprobs: N` and
`echo`) and the logit processors (`presence_penalty`, `frequency_penalty`,
`logit_bias`, and vLLM's `repetition_penalty`, `min_p`, `min_tokens`) are
honoured under speculation (verispec.step.processors).

`prediction` (OpenAI's Predicted Outputs, on both routes) drafts first
(verispec.proposers.prediction); its accepted and rejected tokens are counted in
`usage.completion_tokens_details`. Fields OpenAI takes that verispec does not
honour are ignored or refused as `conformance` lists them.

verispec extensions: `top_k`, `ignore_eos`, and a `speculation` object
`{"proposer", "k" (an integer, or "auto" for load-adaptive k), "tree", "draft",
"lookahead_window", "lookahead_ngram", "lookahead_guesses"}` (the last three: lookahead's
W, N and G, for proposer lookahead or auto),
and `stream_options.include_provenance`: every streamed chunk then carries, per
choice, a `provenance` object telling where each token came from (the format is
in `verispec.serving.provenance`). Without it a stream is exactly OpenAI's.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from typing import Any

from jinja2 import TemplateError
from pydantic import ValidationError

from verispec import spec_text
from verispec.config import SamplingParams, SpecConfig
from verispec.serving.conformance import ignored_fields, refuse_unsupported
from verispec.serving.errors import APIError, validation_error
from verispec.serving.options import logit_bias, response_grammar
from verispec.serving.requests import (
    MAX_K,
    MAX_TREE,
    ChatRequest,
    CompletionRequest,
    Message,
    Speculation,
    content_text,
)
from verispec.serving.tools import plan_tools


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
    tools: Any = None  # a verispec.serving.tools.ToolPlan: the reply is (or may be) a tool call
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (vLLM's extension)
    prediction: tuple[int, ...] | None = None  # the predicted output's ids (Predicted Outputs)
    ignored: tuple[str, ...] = ()  # fields accepted and ignored (conformance.IGNORED)

    def choice_sampling(self, index: int) -> SamplingParams:
        """Choice i of n draws from its own seed, so seeded choices differ but repeat."""
        if self.sampling.seed is None or index == 0:
            return self.sampling
        return replace(self.sampling, seed=self.sampling.seed + index)


Request = ChatRequest | CompletionRequest


def parse_request(body: Any, chat: bool) -> Request:
    """A request body (parsed JSON) validated as the server validates it."""
    model = ChatRequest if chat else CompletionRequest
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False), model) from None


def check_model(request: Request, served: tuple[str, ...]) -> None:
    if request.model not in served:
        raise APIError(f"The model '{request.model}' does not exist; this server serves "
                       f"{', '.join(repr(m) for m in served)}", "model", "model_not_found")


def _logprobs(request: Request) -> int | None:
    if isinstance(request, CompletionRequest):
        return request.logprobs
    if request.logprobs:
        return request.top_logprobs or 0
    if request.top_logprobs is not None:
        raise APIError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    return None


GREEDY_BELOW = 1e-5
TOP_P_FLOOR = 1e-6


def parse_sampling(request: Request) -> SamplingParams:
    """Sampling params, max_new_tokens left at a placeholder; the checks across fields."""
    if isinstance(request, CompletionRequest):
        if request.best_of is not None and request.best_of != request.n:
            raise APIError("best_of must equal n (verispec returns every sample)", "best_of")
        grammar = None
    else:
        grammar = response_grammar(request.response_format)
    if request.stream_options is not None and not request.stream:
        raise APIError("'stream_options' is only allowed with stream: true", "stream_options")
    # As vLLM does: a temperature this small is greedy (dividing by it overflows).
    temperature = request.temperature if request.temperature >= GREEDY_BELOW else 0.0
    # A top_p under 1 / vocab keeps the top token alone, as TOP_P_FLOOR does; smaller
    # ones round to 0 in float32 and would keep nothing.
    return SamplingParams(
        temperature=temperature, top_k=max(0, request.top_k), top_p=max(request.top_p, TOP_P_FLOOR),
        seed=request.seed, max_new_tokens=1, stop=request.stops, ignore_eos=request.ignore_eos,
        logprobs=_logprobs(request), grammar=grammar,
        frequency_penalty=request.frequency_penalty, presence_penalty=request.presence_penalty,
        repetition_penalty=request.repetition_penalty, min_p=request.min_p,
        min_tokens=request.min_tokens, logit_bias=logit_bias(request.logit_bias))


_LOOKAHEAD_FIELDS = ("lookahead_window", "lookahead_ngram", "lookahead_guesses")
_SPEC_FIELDS = ("proposer", "k", "tree", "draft", *_LOOKAHEAD_FIELDS)


def parse_spec(raw: Speculation | None, defaults: ServeDefaults, num_layers: int) -> SpecConfig:
    """A request's speculation object over the server's defaults."""
    raw = raw or Speculation()
    typed = {"proposer": raw.proposer or defaults.proposer,
             "k": ("auto" if defaults.adaptive else defaults.k) if raw.k is None else raw.k,
             "k_max": defaults.k, "tree": defaults.tree if raw.tree is None else raw.tree,
             "draft": raw.draft or defaults.draft, "profile": defaults.profile,
             "grammar_forced": raw.grammar_forced,
             **{name: getattr(raw, name) for name in _LOOKAHEAD_FIELDS}}
    try:
        spec = spec_text.parse_spec(typed)
    except spec_text.SpecError as exc:
        field = {"k_max": "k"}.get(exc.field, exc.field)
        raise APIError(str(exc), f"speculation.{field}" if field in _SPEC_FIELDS
                       else "speculation") from None
    typed_lookahead = [name for name in _LOOKAHEAD_FIELDS if getattr(raw, name) is not None]
    if typed_lookahead and spec.proposer != "lookahead":
        raise APIError(f"speculation.{typed_lookahead[0]} sets lookahead decoding: it needs "
                       f"proposer 'lookahead', not {spec.proposer!r}",
                       f"speculation.{typed_lookahead[0]}")
    if spec.proposer == "lookahead" and spec.tree > MAX_TREE:
        # Without "tree" a lookahead step feeds its whole window and guesses.
        raise APIError(f"lookahead with W={spec.lookahead_window}, N={spec.lookahead_ngram}, "
                       f"G={spec.lookahead_guesses} feeds (W + G) * (N - 1) = {spec.tree} tree "
                       f"nodes a step, over the {MAX_TREE} a request may have; make them smaller "
                       f"or cap the nodes with speculation.tree", "speculation")
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


def max_tokens(request: Request, longest_prompt: int, context: int) -> int:
    """The completion budget; past the context it is refused with the numbers."""
    chat = isinstance(request, ChatRequest)
    name, value = "max_tokens", request.max_tokens
    if chat and request.max_completion_tokens is not None:
        name, value = "max_completion_tokens", request.max_completion_tokens
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


def message_texts(messages: list[Message]) -> list[dict]:
    """Chat messages as [{"role", "content": str}], content parts joined; an assistant's
    tool calls (arguments as objects, as chat templates read them) and a tool
    message's call id are kept for templates that write them."""
    out = []
    for m in messages:
        message = {"role": m.role, "content": m.text()}
        if m.tool_calls:
            message["tool_calls"] = [_template_call(call) for call in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def _template_call(call: dict) -> dict:
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except ValueError:
            pass  # a template gets what the client sent
    return {**call, "function": function}


def fallback_chat_text(messages: list[dict]) -> str:
    """A plain transcript for tokenizers without a chat template (base models,
    test tokenizers): one `<|role|>` header per turn, then the assistant's."""
    turns = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    return turns + "<|assistant|>\n"


def encode_chat(engine, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The prompt ids of a chat: the tokenizer's template (given the tools, for one
    that writes them), else `fallback_chat_text`."""
    if getattr(engine.tokenizer, "chat_template", None):
        return engine.encode_messages(messages, tools) if tools else engine.encode_messages(messages)
    return engine.encode(fallback_chat_text(messages))


def build_job(request: Request | dict, chat: bool, engine, served: tuple[str, ...],
              defaults: ServeDefaults) -> Job:
    """Check a validated request against the model and the server, and tokenize
    its prompts (a dict body is validated first)."""
    if not isinstance(request, (ChatRequest, CompletionRequest)):
        request = parse_request(request, chat)
    check_model(request, served)
    refuse_unsupported(request)
    sampling = parse_sampling(request)
    spec = parse_spec(request.speculation, defaults, engine.target.num_layers)
    echo = not chat and request.echo
    if engine.tokenizer is None and (chat or sampling.stop):
        raise APIError("this model has no tokenizer: send token ids, without chat or stop",
                       "messages" if chat else "stop")
    tools = plan_tools(request, engine.tokenizer) if chat else None
    if tools is not None and tools.grammar is not None:
        if sampling.grammar is not None:
            raise APIError("a forced tool call and a response_format cannot be combined",
                           "response_format")
        sampling = replace(sampling, grammar=tools.grammar)
    if sampling.grammar is not None and sampling.ignore_eos:
        # The grammar's end is an EOS: past it there is nothing the grammar allows.
        raise APIError("'ignore_eos' cannot be combined with response_format or a forced tool "
                       "call", "ignore_eos")
    try:
        if chat:
            messages = message_texts(request.messages)
            if tools is not None and tools.note:
                messages = [{"role": "system", "content": tools.note}] + messages
            inputs: list = [encode_chat(engine, messages, tools and tools.template_tools)]
            texts = [""]
        else:
            prompts = request.prompts()
            texts = [p if isinstance(p, str) else engine.decode(p) for p in prompts]
            inputs = [engine.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    except (ValueError, TemplateError) as exc:  # a template may refuse a conversation
        raise APIError(str(exc), "messages" if chat else "prompt") from None
    vocab = engine.target.vocab_size
    if sampling.grammar is not None:
        try:
            engine.constraint(sampling)  # compiles it: a bad schema or pattern is a 400 now
        except (ValueError, RuntimeError) as exc:
            field = "tools" if tools is not None and tools.grammar is not None else "response_format"
            raise APIError(f"Invalid {field}: {exc}", field) from None
    bad_bias = [t for t, _ in sampling.logit_bias if t >= vocab]
    if bad_bias:
        raise APIError(f"Invalid key in 'logit_bias': token id {bad_bias[0]} is not in "
                       f"[0, {vocab})", "logit_bias")
    for ids in inputs:
        if not ids:
            raise APIError("The prompt is empty", "messages" if chat else "prompt")
        if max(ids) >= vocab:
            raise APIError(f"prompt token ids must be in [0, {vocab})", "prompt")
    budget = max_tokens(request, max(len(ids) for ids in inputs), engine.target.max_context)
    options = request.stream_options
    provenance = options is not None and options.include_provenance
    if provenance and sampling.stop:
        # Token texts stream per pass, ahead of the text held back for a partial stop
        # string, so they would show what a stop trims: refused rather than leaked.
        raise APIError("stream_options.include_provenance cannot be combined with 'stop'",
                       "stream_options")
    continuous = options is not None and options.continuous_usage_stats
    return Job(chat, inputs, texts, replace(sampling, max_new_tokens=budget), spec, request.n,
               request.stream, options is not None and (options.include_usage or continuous),
               echo, provenance, tools, continuous, predicted_ids(request, engine),
               tuple(ignored_fields(request)))


def predicted_ids(request: Request, engine) -> tuple[int, ...] | None:
    """The ids of the request's predicted output (None without one)."""
    if request.prediction is None:
        return None
    try:
        return engine.prediction_ids(content_text(request.prediction.content))
    except ValueError as exc:  # a model without a tokenizer
        raise APIError(str(exc), "prediction") from None


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
