"""The OpenAI-compatible HTTP server: FastAPI routes over one `Scheduler`.

Routes: POST /v1/completions and /v1/chat/completions (JSON, or server-sent
events ending with `data: [DONE]` when stream is true), GET /v1/models,
/health, /metrics (Prometheus text) and the playground page (/playground).
The request and response bodies are pydantic models (`requests`,
`responses`), so /docs and /openapi.json describe them.

FastAPI validates a body against its model before the route runs, and any
failure becomes OpenAI's error JSON with HTTP 400 (`errors.validation_error`);
`protocol.build_job` then checks it against the model and the server before
anything is queued. Each choice becomes one scheduler `Ticket` (`run.Run`).
When the client goes away (the stream is cancelled, or a non-streamed request
sees the disconnect), the tickets are cancelled and the scheduler frees their
KV caches at its next step boundary.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from verispec.api import Engine
from verispec.serving import conformance, playground
from verispec.serving.background import KEEP_ALIVE_SECONDS
from verispec.serving.background import ServerThread  # noqa: F401  (the tests' and benchmarks' entry)
from verispec.serving.errors import APIError, ErrorBody, validation_error
from verispec.serving.malloc import keep_heap_top_resident
from verispec.serving.metrics import ServingMetrics
from verispec.serving.protocol import Request as Body
from verispec.serving.protocol import ServeDefaults, build_job
from verispec.serving.replies import complete, error_response, failure_error, stream
from verispec.serving.requests import ChatRequest, CompletionRequest
from verispec.serving.responses import ChatCompletion, Completion
from verispec.serving.run import Run
from verispec.serving.scheduler import (
    Failure,
    QueueFull,
    Scheduler,
    SchedulerClosed,
    SchedulerConfig,
)

_BODIES = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatRequest}
_ERRORS = {400: {"model": ErrorBody}, 429: {"model": ErrorBody}, 503: {"model": ErrorBody}}


@dataclass(frozen=True)
class ServerConfig:
    served_names: tuple[str, ...]  # model names a request may ask for; the first is listed
    defaults: ServeDefaults = field(default_factory=ServeDefaults)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    shutdown_timeout: float = 30.0  # seconds running requests get to finish on shutdown


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    """The ASGI app; its scheduler thread starts now and stops on shutdown."""
    metrics = ServingMetrics()
    scheduler = Scheduler(engine.target, engine.new_request, config.scheduler, metrics)
    created = int(time.time())
    model_name = config.served_names[0]

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # the loop's heap: its pad resident once it has grown, not at a burst minutes later
        heap_top = asyncio.create_task(keep_heap_top_resident())
        yield
        heap_top.cancel()
        await asyncio.to_thread(scheduler.close, config.shutdown_timeout)

    # Not strict about the content type: a body sent without one is read as JSON.
    app = FastAPI(title="verispec", lifespan=lifespan, strict_content_type=False)
    app.state.scheduler = scheduler
    app.state.metrics = metrics

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        model = _BODIES.get(request.url.path)
        if model is not None:
            metrics.request_done("invalid")
        return error_response(validation_error(exc.errors(), model))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        return error_response(APIError(str(exc.detail), None, None, exc.status_code))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        return error_response(APIError(f"internal error: {type(exc).__name__}: {exc}", None, None,
                                       500, "server_error"))

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

    async def generate(body: Body, request: Request, response: Response, chat: bool):
        try:
            job = build_job(body, chat, engine, config.served_names, config.defaults)
        except APIError as exc:
            metrics.request_done("invalid")
            return error_response(exc)
        headers = {conformance.HEADER: ", ".join(job.ignored)} if job.ignored else {}
        response.headers.update(headers)
        run = Run(job, scheduler, engine)
        if run.wants_logprobs and job.echo:
            await run.prompt_logprobs(engine)
        try:
            run.submit()
        except QueueFull as exc:
            return error_response(APIError(str(exc), None, "queue_full", 429, "rate_limit_error"))
        except SchedulerClosed as exc:
            return error_response(APIError(str(exc), None, "shutting_down", 503, "server_error"))
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
            return error_response(failure_error(first[2], job))
        if job.stream:
            return StreamingResponse(stream(run, first, ident, model_name, engine),
                                     media_type="text/event-stream", headers=headers)
        try:
            return await complete(run, first, request, ident, model_name, engine)
        finally:
            run.cancel()

    @app.post("/v1/completions", response_model=Completion, response_model_exclude_unset=True,
              responses=_ERRORS)
    async def completions(body: CompletionRequest, request: Request, response: Response):
        return await generate(body, request, response, chat=False)

    @app.post("/v1/chat/completions", response_model=ChatCompletion,
              response_model_exclude_unset=True, responses=_ERRORS)
    async def chat_completions(body: ChatRequest, request: Request, response: Response):
        return await generate(body, request, response, chat=True)

    playground.mount(app, engine, config)
    return app


def serve(engine: Engine, config: ServerConfig, host: str, port: int,
          log_level: str = "info") -> None:
    """Run until interrupted; on SIGINT/SIGTERM running requests get
    `shutdown_timeout` seconds to finish, then the rest are cancelled."""
    import uvicorn

    uvicorn.run(create_app(engine, config), host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=int(config.shutdown_timeout), timeout_keep_alive=KEEP_ALIVE_SECONDS)
