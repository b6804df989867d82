"""A request's reply, from its run's events: one JSON body, or server-sent
events ending with `data: [DONE]`, in OpenAI's shapes (`responses`)."""
from __future__ import annotations

import json
import time

from fastapi import Request
from fastapi.responses import JSONResponse

from ..api import Engine
from .errors import APIError
from .responses import (ChatChoice, ChatCompletion, ChatCompletionChunk, ChatMessage, ChunkChoice,
                        Completion, CompletionChoice, CompletionLogprobs, Delta, ToolCall)
from .run import Run
from .scheduler import Failure
from .tools import tool_calls

_FAILURE_STATUS = {"invalid": 400, "shutdown": 503, "cancelled": 499, "error": 500}


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def failure_error(failure: Failure) -> APIError:
    status = _FAILURE_STATUS.get(failure.reason, 500)
    kind = "invalid_request_error" if status == 400 else "server_error"
    return APIError(failure.message, None, failure.reason, status, kind)


def _joined(echoed: CompletionLogprobs, generated: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(tokens=echoed.tokens + generated.tokens,
                              token_logprobs=echoed.token_logprobs + generated.token_logprobs,
                              top_logprobs=echoed.top_logprobs + generated.top_logprobs,
                              text_offset=echoed.text_offset + generated.text_offset)


def _tool_reply(run: Run, index: int, text: str) -> list[ToolCall] | None:
    """A forced tool call's calls; None for a plain answer or a call cut short by
    max_tokens (then the text is returned as it is, with "length")."""
    plan = run.job.tools
    if plan is None or run.finish[index] != "stop":
        return None
    return [ToolCall(**call) for call in tool_calls(plan, text)]


async def complete(run: Run, first, request: Request, ident: str, model: str, engine: Engine):
    """The whole reply as one body (or an error response)."""
    texts = [""] * len(run.tickets)
    event = first
    while True:
        index, delta, ev = event
        if isinstance(ev, Failure):
            return error_response(failure_error(ev))
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
            calls = _tool_reply(run, i, text)
            if calls is not None:
                common["finish_reason"] = "tool_calls"
                message = ChatMessage(role="assistant", content=None, tool_calls=calls)
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
            extra.setdefault("usage", None)
        if chat:
            body = ChatCompletionChunk(id=ident, object="chat.completion.chunk", created=created,
                                       model=model, choices=choices, **extra)
        else:
            body = Completion(id=ident, object="text_completion", created=created, model=model,
                              choices=choices, **extra)
        return body.sse()

    held = [""] * len(run.tickets)  # a tool call's arguments, sent whole when complete
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
                yield f"data: {json.dumps(failure_error(ev).body())}\n\n"
            else:
                reason = ev.finish_reason
                extra = {"speculation": run.speculation(index)} if reason else {}
                if run.provenance and ev.record is not None:
                    extra["provenance"] = run.provenance[index].step(ev.record, ev.tokens,
                                                                     reason is not None)
                shown = run.deltas[index].take_logprobs(final=reason is not None)
                calls = None
                if run.job.tools is not None:
                    # The arguments stream as one piece, once the call is complete.
                    held[index] += delta
                    delta = held[index] if reason else ""
                    calls = _tool_reply(run, index, held[index]) if reason else None
                    if calls is not None:
                        calls = [c.model_copy(update={"index": j}) for j, c in enumerate(calls)]
                        delta, reason = "", "tool_calls"
                if delta or extra or shown or calls:
                    logprobs = run.choice_logprobs(index, shown, engine)
                    if not chat:
                        choice = CompletionChoice(index=index, text=delta, logprobs=logprobs,
                                                  finish_reason=reason, **extra)
                    else:
                        body = Delta(tool_calls=calls) if calls else \
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
