"""The OpenAI-compatible HTTP server: FastAPI routes over one `Scheduler`.

Routes: POST /v1/completions and /v1/chat/completions (JSON, or server-sent
events ending with `data: [DONE]` when stream is true), GET /v1/models,
/health, /metrics (Prometheus text) and the playground page (/playground).

A request is validated completely (`protocol.build_job`) before anything is
queued; each of its choices becomes one scheduler `Ticket`, whose events the
scheduler thread hands to this event loop with `call_soon_threadsafe`. When
the client goes away (the stream is cancelled, or a non-streamed request sees
the disconnect), the tickets are cancelled and the scheduler frees their KV
caches at its next step boundary.
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..api import Engine, TextDeltas
from ..metrics import Stats
from . import playground
from . import logprobs as lp_format
from .metrics import ServingMetrics
from .protocol import APIError, Job, ServeDefaults, build_job
from .provenance import ChoiceProvenance
from .tools import tool_calls
from .scheduler import Failure, Progress, QueueFull, Scheduler, SchedulerClosed, SchedulerConfig, Ticket


@dataclass(frozen=True)
class ServerConfig:
    served_names: tuple[str, ...]  # model names a request may ask for; the first is listed
    defaults: ServeDefaults = field(default_factory=ServeDefaults)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    shutdown_timeout: float = 30.0  # seconds running requests get to finish on shutdown


_FAILURE_STATUS = {"invalid": 400, "shutdown": 503, "cancelled": 499, "error": 500}


def _error(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _failure_error(failure: Failure) -> APIError:
    status = _FAILURE_STATUS.get(failure.reason, 500)
    kind = "invalid_request_error" if status == 400 else "server_error"
    return APIError(failure.message, None, failure.reason, status, kind)


def speculation(stats: list[Stats], proposer: str) -> dict:
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    generated = sum(s.generated for s in stats)
    forwards = sum(s.target_forwards for s in stats)
    return {"proposer": proposer, "drafted": drafted, "accepted": accepted,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
            "tau": round(generated / forwards, 4) if forwards else 0.0,
            "target_forwards": forwards}


class _Run:
    """One HTTP request's choices in flight: tickets out, events back on this loop."""

    def __init__(self, job: Job, scheduler: Scheduler, engine: Engine) -> None:
        self.job, self.scheduler = job, scheduler
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.tickets: list[Ticket] = []
        self.deltas: list[TextDeltas] = []
        self.stats: list[Stats | None] = []
        self.finish: list[str | None] = []
        self.token_count: list[int] = []
        self.provenance: list[ChoiceProvenance] = []
        for prompt in job.prompts:
            for j in range(job.n):
                index = len(self.tickets)
                self.tickets.append(Ticket(prompt, job.choice_sampling(j), job.spec,
                                           self._sink(index)))
                self.deltas.append(TextDeltas(engine.decode, job.sampling.stop))
                self.stats.append(None)
                self.finish.append(None)
                self.token_count.append(0)
                if job.include_provenance:
                    self.provenance.append(ChoiceProvenance(engine.decode))
        self.open = len(self.tickets)

    def _sink(self, index: int):
        def push(event) -> None:  # on the scheduler thread
            self.loop.call_soon_threadsafe(self.events.put_nowait, (index, event))
        return push

    def submit(self) -> None:
        self.scheduler.submit(self.tickets)

    def cancel(self) -> None:
        for ticket in self.tickets:
            if not ticket.done:
                self.scheduler.cancel(ticket)

    async def next(self, request: Request | None = None) -> tuple[int, str, Progress | Failure]:
        """The next event as (choice index, text delta, event); watches for a
        disconnect while waiting when given the request."""
        while True:
            try:
                index, event = await asyncio.wait_for(self.events.get(), timeout=0.25)
                break
            except asyncio.TimeoutError:
                if request is not None and await request.is_disconnected():
                    raise ConnectionAbortedError("client disconnected") from None
        delta = ""
        if isinstance(event, Progress):
            final = event.finish_reason is not None
            delta = self.deltas[index].push(event.tokens, final, event.logprobs)
            self.stats[index] = event.stats
            self.token_count[index] += len(event.tokens)
            if final:
                self.finish[index] = event.finish_reason
                self.open -= 1
        else:
            self.open -= 1
        return index, delta, event

    @property
    def wants_logprobs(self) -> bool:
        return self.job.sampling.logprobs is not None

    async def prompt_logprobs(self, engine: Engine) -> None:
        """Echo's prompt logprobs, one target forward per prompt, off the event loop."""
        self.prompt_lps = []
        self.prompt_offsets = []
        for ids in self.job.prompts:
            self.prompt_lps.append(await asyncio.to_thread(
                engine.prompt_logprobs, ids, self.job.sampling.logprobs or 0))
            self.prompt_offsets.append([len(engine.decode(ids[:i])) for i in range(len(ids))])

    def choice_logprobs(self, index: int, shown, engine: Engine) -> dict | None:
        """A choice's (or a chunk's) logprobs object in the OpenAI shape of its route."""
        if not self.wants_logprobs:
            return None
        if self.job.chat:
            return lp_format.chat_logprobs(engine.token_text, shown)
        return lp_format.completion_logprobs(
            engine.token_text, shown,
            len(self.job.prompt_texts[index // self.job.n]) if self.job.echo else 0)

    def echo_logprobs(self, index: int, engine: Engine) -> dict | None:
        if not (self.wants_logprobs and self.job.echo):
            return None
        prompt = index // self.job.n
        return lp_format.completion_logprobs(
            engine.token_text, (), 0, self.prompt_lps[prompt], self.job.prompts[prompt],
            self.prompt_offsets[prompt])

    def usage(self) -> dict:
        prompt = sum(len(p) for p in self.job.prompts)
        completion = sum(self.token_count)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    def speculation(self, index: int | None = None) -> dict:
        chosen = self.stats if index is None else [self.stats[index]]
        return speculation([s for s in chosen if s is not None], self.job.spec.proposer)


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    """The ASGI app; its scheduler thread starts now and stops on shutdown."""
    metrics = ServingMetrics()
    scheduler = Scheduler(engine.target, engine.new_request, config.scheduler, metrics)
    created = int(time.time())
    model_name = config.served_names[0]

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.to_thread(scheduler.close, config.shutdown_timeout)

    app = FastAPI(title="verispec", lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.metrics = metrics

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return _error(APIError(str(exc.detail), None, None, exc.status_code))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        return _error(APIError(f"internal error: {type(exc).__name__}: {exc}", None, None, 500,
                               "server_error"))

    @app.get("/health")
    async def health():
        gauges = scheduler.gauges()
        return {"status": "ok", "running": gauges.running, "queued": gauges.queued}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(scheduler.gauges()),
                                 media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": model_name, "object": "model", "created": created, "owned_by": "verispec",
            "max_model_len": engine.target.max_context}]}

    async def generate(request: Request, chat: bool):
        raw = await request.body()
        try:
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                raise APIError("We could not parse the JSON body of your request: it is not "
                               "valid JSON.", None, "invalid_json") from None
            job = build_job(body, chat, engine, config.served_names, config.defaults)
        except APIError as exc:
            metrics.request_done("invalid")
            return _error(exc)
        run = _Run(job, scheduler, engine)
        if run.wants_logprobs and job.echo:
            await run.prompt_logprobs(engine)
        try:
            run.submit()
        except QueueFull as exc:
            return _error(APIError(str(exc), None, "queue_full", 429, "rate_limit_error"))
        except SchedulerClosed as exc:
            return _error(APIError(str(exc), None, "shutting_down", 503, "server_error"))
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        try:
            # Wait for the first event before answering: a request that fails
            # on admission still gets a proper status code, even when streamed.
            first = await run.next(request)
        except ConnectionAbortedError:
            run.cancel()
            return JSONResponse({}, status_code=499)
        except BaseException:
            run.cancel()
            raise
        if isinstance(first[2], Failure):
            run.cancel()
            return _error(_failure_error(first[2]))
        if job.stream:
            return StreamingResponse(_stream(run, first, ident, chat, model_name, engine),
                                     media_type="text/event-stream")
        try:
            return await _complete(run, first, request, ident, chat, model_name, engine)
        finally:
            run.cancel()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await generate(request, chat=True)

    playground.mount(app, engine, config)
    return app


async def _complete(run: _Run, first, request: Request, ident: str, chat: bool, model: str,
                    engine: Engine):
    texts = [""] * len(run.tickets)
    event = first
    while True:
        index, delta, ev = event
        if isinstance(ev, Failure):
            return _error(_failure_error(ev))
        texts[index] += delta
        if not run.open:
            break
        try:
            event = await run.next(request)
        except ConnectionAbortedError:
            return JSONResponse({}, status_code=499)
    choices = []
    for i, text in enumerate(texts):
        run.deltas[i].take_logprobs(final=True)
        logprobs = run.choice_logprobs(i, run.deltas[i].released, engine)
        choice: dict = {"index": i, "finish_reason": run.finish[i], "logprobs": logprobs,
                        "speculation": run.speculation(i)}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
            call = _tool_reply(run, i, text)
            if call is not None:
                choice["message"], choice["finish_reason"] = call
        else:
            echo = run.job.prompt_texts[i // run.job.n] if run.job.echo else ""
            choice["text"] = echo + text
            echoed = run.echo_logprobs(i, engine)
            if echoed is not None:
                choice["logprobs"] = {key: echoed[key] + logprobs[key] for key in logprobs}
        choices.append(choice)
    return {"id": ident, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": choices,
            "usage": run.usage(), "speculation": run.speculation()}


def _tool_reply(run: _Run, index: int, text: str) -> tuple[dict, str] | None:
    """A forced tool call's message and finish reason; None for a plain answer or a
    call cut short by max_tokens (then the text is returned as it is, with "length")."""
    plan = run.job.tools
    if plan is None or run.finish[index] != "stop":
        return None
    return ({"role": "assistant", "content": None, "tool_calls": tool_calls(plan, text)},
            "tool_calls")


async def _stream(run: _Run, first, ident: str, chat: bool, model: str, engine: Engine):
    created = int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    usage_field = {"usage": None} if run.job.include_usage else {}

    def chunk(choices: list[dict], **extra) -> str:
        body = {"id": ident, "object": kind, "created": created, "model": model,
                "choices": choices, **usage_field, **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    held = [""] * len(run.tickets)  # a tool call's arguments, sent whole when complete
    try:
        if chat:
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None}
                         for i in range(len(run.tickets))])
        elif run.job.echo:
            yield chunk([{"index": i, "text": run.job.prompt_texts[i // run.job.n],
                          "logprobs": run.echo_logprobs(i, engine), "finish_reason": None}
                         for i in range(len(run.tickets))])
        event = first
        while True:
            index, delta, ev = event
            if isinstance(ev, Failure):
                error = _failure_error(ev)
                yield f"data: {json.dumps(error.body())}\n\n"
            else:
                reason = ev.finish_reason
                extra = {"speculation": run.speculation(index)} if reason else {}
                if run.provenance and ev.record is not None:
                    extra["provenance"] = run.provenance[index].step(ev.record, ev.tokens,
                                                                     reason is not None)
                shown = run.deltas[index].take_logprobs(final=reason is not None)
                body = None
                if run.job.tools is not None:
                    # The arguments stream as one piece, once the call is complete.
                    held[index] += delta
                    delta = held[index] if reason else ""
                    call = _tool_reply(run, index, held[index]) if reason else None
                    if call is not None:
                        calls = [dict(c, index=j) for j, c in enumerate(call[0]["tool_calls"])]
                        body, delta, reason = {"delta": {"tool_calls": calls}}, "", call[1]
                if delta or extra or shown or body:
                    if body is None:
                        body = {"delta": {"content": delta} if delta else {}} if chat else \
                            {"text": delta}
                    logprobs = run.choice_logprobs(index, shown, engine)
                    yield chunk([{"index": index, **body, "logprobs": logprobs,
                                  "finish_reason": reason, **extra}])
            if not run.open:
                break
            event = await run.next()
        if run.job.include_usage:
            yield chunk([], usage=run.usage(), speculation=run.speculation())
        yield "data: [DONE]\n\n"
    finally:
        # Normal end: a no-op. Client gone (the response task is cancelled): free the KV now.
        run.cancel()


class ServerThread:
    """Serve an app from a background thread on a socket bound before start
    (port 0 = a free port, no race): for tests and in-process benchmarks."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="verispec-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server thread did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()


def serve(engine: Engine, config: ServerConfig, host: str, port: int,
          log_level: str = "info") -> None:
    """Run until interrupted; on SIGINT/SIGTERM running requests get
    `shutdown_timeout` seconds to finish, then the rest are cancelled."""
    import uvicorn

    uvicorn.run(create_app(engine, config), host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=int(config.shutdown_timeout))
