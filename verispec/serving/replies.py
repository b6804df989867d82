"""A request's reply, from its run's events: one JSON body, or server-sent
events ending with `data: [DONE]`, in OpenAI's shapes (`responses`)."""
from __future__ import annotations

import json
import time

from fastapi import Request
from fastapi.responses import JSONResponse

from verispec.api import Engine
from verispec.serving.errors import APIError
from verispec.serving.protocol import Job
from verispec.serving.responses import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatMessage,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Delta,
    ToolCall,
)
from verispec.serving.run import Run
from verispec.serving.scheduler import Failure
from verispec.serving.tools import held_from, tool_calls, without_calls
from verispec.step.grammar import GrammarLimitError

_FAILURE_STATUS = {"invalid": 400, "shutdown": 503, "cancelled": 499, "error": 500}


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


# The scheduler's message for a request its step raised on: the exception's type first.
_GRAMMAR_FAILURE = f"{GrammarLimitError.__name__}: "


def failure_error(failure: Failure, job: Job | None = None) -> APIError:
    """The error a failed request answers with. A grammar that gave up mid-output
    (`GrammarLimitError`: the request's own schema or grammar outgrew the grammar
    engine's limits) is a 400 naming the field and the limit, not a 500: the same
    request fails the same way again, and clients retry a 5xx (the openai client
    twice by default), which would only repeat the work."""
    if failure.reason == "error" and failure.message.startswith(_GRAMMAR_FAILURE):
        forced = job is not None and job.tools is not None and job.tools.grammar is not None
        param = "tools" if forced else "response_format"
        # llguidance's first line names the limit; its verbose parser state follows.
        detail = failure.message[len(_GRAMMAR_FAILURE):].splitlines()[0]
        return APIError(f"The grammar of '{param}' failed during generation ({detail}): it went "
                        "past the grammar engine's limits, or cannot be matched. Simplify it: "
                        "bound string lengths and array sizes, use fewer alternatives.", param,
                        "grammar_too_complex")
    status = _FAILURE_STATUS.get(failure.reason, 500)
    kind = "invalid_request_error" if status == 400 else "server_error"
    return APIError(failure.message, None, failure.reason, status, kind)


def _joined(echoed: CompletionLogprobs, generated: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(tokens=echoed.tokens + generated.tokens,
                              token_logprobs=echoed.token_logprobs + generated.token_logprobs,
                              top_logprobs=echoed.top_logprobs + generated.top_logprobs,
                              text_offset=echoed.text_offset + generated.text_offset)


def _tool_reply(run: Run, index: int, text: str) -> tuple[str | None, list[ToolCall]] | None:
    """A reply's (content, tool calls); None for a plain answer, or for a call cut
    short by max_tokens or a stop string (then the text is returned as it is)."""
    plan = run.job.tools
    if plan is None or run.finish[index] != "stop":
        return None
    found = tool_calls(plan, text)
    if found is None:
        return None
    return found[0], [ToolCall(**call) for call in found[1]]


async def complete(run: Run, first, request: Request, ident: str, model: str, engine: Engine):
    """The whole reply as one body (or an error response)."""
    texts = [""] * len(run.tickets)
    event = first
    while True:
        index, delta, ev = event
        if isinstance(ev, Failure):
            return error_response(failure_error(ev, run.job))
        texts[index] += delta
        if not run.open:
            break
        try:
            event = await run.next(request)
        except ConnectionAbortedError:
            return JSONResponse({}, status_code=499)
    chat = run.job.chat
    choices = []
    for i, text in enumerate(texts):
        run.deltas[i].take_logprobs(final=True)
        logprobs = run.choice_logprobs(i, run.deltas[i].released, engine)
        common = dict(index=i, logprobs=logprobs, finish_reason=run.finish[i],
                      speculation=run.speculation(i))
        if chat:
            reply = _tool_reply(run, i, text)
            if reply is not None:
                common["finish_reason"] = "tool_calls"
                message = ChatMessage(role="assistant", content=reply[0], tool_calls=reply[1])
            else:
                message = ChatMessage(role="assistant", content=text)
            choices.append(ChatChoice(message=message, **common))
        else:
            echo = run.job.prompt_texts[i // run.job.n] if run.job.echo else ""
            echoed = run.echo_logprobs(i, engine)
            if echoed is not None:
                common["logprobs"] = _joined(echoed, logprobs)
            choices.append(CompletionChoice(text=echo + text, **common))
    kind = ChatCompletion if chat else Completion
    return kind(id=ident, object="chat.completion" if chat else "text_completion",
                created=int(time.time()), model=model, choices=choices, usage=run.usage(),
                speculation=run.speculation())


async def stream(run: Run, first, ident: str, model: str, engine: Engine):
    """The reply as server-sent events."""
    created = int(time.time())
    chat = run.job.chat

    def chunk(choices: list, **extra) -> str:
        if run.job.include_usage:
            extra.setdefault("usage", run.usage() if run.job.continuous_usage else None)
        if chat:
            body = ChatCompletionChunk(id=ident, object="chat.completion.chunk", created=created,
                                       model=model, choices=choices, **extra)
        else:
            body = Completion(id=ident, object="text_completion", created=created, model=model,
                              choices=choices, **extra)
        return body.sse()

    # A reply that is (or may become) a tool call is held back and sent whole when
    # complete: text[i] is choice i's text so far, sent[i] how much of it went out.
    text, sent = [""] * len(run.tickets), [0] * len(run.tickets)
    try:
        if chat:
            yield chunk([ChunkChoice(index=i, delta=Delta(role="assistant", content=""),
                                     logprobs=None, finish_reason=None)
                         for i in range(len(run.tickets))])
        elif run.job.echo:
            yield chunk([CompletionChoice(index=i, text=run.job.prompt_texts[i // run.job.n],
                                          logprobs=run.echo_logprobs(i, engine),
                                          finish_reason=None)
                         for i in range(len(run.tickets))])
        event = first
        while True:
            index, delta, ev = event
            if isinstance(ev, Failure):
                yield f"data: {json.dumps(failure_error(ev, run.job).body())}\n\n"
            else:
                reason = ev.finish_reason
                extra = {"speculation": run.speculation(index)} if reason else {}
                if run.provenance and ev.record is not None:
                    extra["provenance"] = run.provenance[index].step(ev.record, ev.tokens,
                                                                     reason is not None)
                shown = run.deltas[index].take_logprobs(final=reason is not None)
                calls = None
                plan = run.job.tools
                if plan is not None:
                    text[index] += delta
                    reply = _tool_reply(run, index, text[index]) if reason else None
                    if reply is not None:
                        calls = [c.model_copy(update={"index": j}) for j, c in enumerate(reply[1])]
                        delta, reason = without_calls(text[index][sent[index]:]), "tool_calls"
                    else:
                        # A forced call holds everything; "auto" streams up to where a call may start.
                        upto = len(text[index]) if reason else 0 if plan.grammar is not None \
                            else max(sent[index], held_from(text[index]))
                        delta, sent[index] = text[index][sent[index]:upto], max(sent[index], upto)
                if delta or extra or shown or calls:
                    logprobs = run.choice_logprobs(index, shown, engine)
                    if not chat:
                        choice = CompletionChoice(index=index, text=delta, logprobs=logprobs,
                                                  finish_reason=reason, **extra)
                    else:
                        body = Delta(content=delta or None, tool_calls=calls) if calls else \
                            Delta(content=delta) if delta else Delta()
                        choice = ChunkChoice(index=index, delta=body, logprobs=logprobs,
                                             finish_reason=reason, **extra)
                    yield chunk([choice])
            if not run.open:
                break
            event = await run.next()
        if run.job.include_usage:
            yield chunk([], usage=run.usage(), speculation=run.speculation())
        yield "data: [DONE]\n\n"
    finally:
        # Normal end: a no-op. Client gone (the response task is cancelled): free the KV now.
        run.cancel()
