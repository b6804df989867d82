"""verispec on Ray Serve: many replicas behind one OpenAI-compatible endpoint.

    serve run verispec.serving.ray_app:build_app model=default replicas=2
    serve deploy examples/ray_serve.yaml          # on a running cluster
    verispec serve --ray --replicas 2             # the same, from the CLI

Two deployments. `VerispecReplica` holds one model, its continuous-batching
scheduler and guard, and the single-process FastAPI app of `server.py`, which
it runs in-process for every request (`ray_bridge.call_asgi`): routes,
validation, OpenAI error bodies and SSE events are that app's, unchanged.
`VerispecIngress` is the HTTP entry: a FastAPI app that relays each request to
a replica through a streaming deployment handle, routed by prefix affinity
(`ray_router`), and answers /health and /metrics for all replicas at once.

When a replica dies, its requests in flight end cleanly: a non-streamed one
with a 503 OpenAI error, a stream with an error event and `data: [DONE]`.
Requests still waiting at the router are routed to the replicas left, and
Serve starts a replacement.
"""
import argparse
import asyncio
import json
import threading
from typing import Literal, Optional, Union

import ray
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.config import RequestRouterConfig
from ray.serve.exceptions import BackPressureError, ReplicaUnavailableError
from starlette.exceptions import HTTPException as StarletteHTTPException

from verispec.serving import ray_bridge
from verispec.serving.malloc import ARENA_MAX, keep_heap_top_resident
from verispec.serving.protocol import APIError
from verispec.serving.ray_router import affinity_key

APP_NAME = "verispec"
_DIED = (RayActorError, ActorUnavailableError, ReplicaUnavailableError)


class RayAppArgs(BaseModel):
    """The application's arguments (`args:` in the config YAML, key=value after
    `serve run ...:build_app`); the `verispec serve` flags of the same names."""
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = "default"
    dtype: str = "auto"
    device: str = "auto"
    backend: str = "auto"
    batch_invariant: bool = False
    weights: str = "auto"
    served_model_name: Optional[str] = None
    proposer: str = "auto"
    k: Union[int, str] = "auto"
    k_max: int = 8
    tree: int = 0
    draft: Optional[str] = None
    profile: Optional[str] = None
    guard_window: int = 16
    max_num_seqs: int = 8
    max_queue: int = 64
    shutdown_timeout: float = 30.0
    # Ray side. A YAML `deployments:` entry for VerispecReplica overrides these.
    replicas: Union[int, str] = 1  # N, or "MIN:MAX" to autoscale
    target_ongoing_requests: Optional[float] = None  # autoscaling target; default max_num_seqs
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0  # 1 on a GPU cluster: one GPU per replica
    threads: Optional[int] = None  # torch threads per replica; default its CPUs
    max_ongoing_requests: Optional[int] = None  # per replica; default 2 * max_num_seqs
    max_queued_requests: Optional[int] = None  # waiting at the router; default max_queue
    routing: Literal["affinity", "pow2"] = "affinity"
    prefix_chars: int = 256  # prompts sharing this many leading characters share a replica
    imbalance: int = 4  # in-flight requests by which load overrides affinity
    ingress_cpus: float = 0.0

    def spec_namespace(self) -> argparse.Namespace:
        return argparse.Namespace(**self.model_dump())

    def replica_range(self) -> tuple[int, int]:
        text = str(self.replicas)
        low, _, high = text.partition(":")
        try:
            lo, hi = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"replicas must be N or MIN:MAX, got {text!r}") from None
        if not 0 <= lo <= hi or hi < 1:
            raise ValueError(f"replicas must satisfy 0 <= MIN <= MAX, MAX >= 1, got {text!r}")
        return lo, hi


def _scheduler_config(settings: RayAppArgs):
    from verispec.policy.economics import load_profile
    from verispec.serving.scheduler import SchedulerConfig

    return SchedulerConfig(max_num_seqs=settings.max_num_seqs, max_queue=settings.max_queue,
                           profile=load_profile(settings.profile) if settings.profile else None,
                           guard_window=settings.guard_window)


class VerispecReplica:
    """One model, one scheduler thread, the single-process app; pushes its metrics."""

    def __init__(self, settings: dict) -> None:
        import torch

        from verispec.cli.args import engine_from
        from verispec.serving.malloc import fix_thresholds
        from verispec.serving.protocol import serve_defaults
        from verispec.serving.server import ServerConfig, create_app

        fix_thresholds()  # as `verispec serve` does, before the model loads
        s = RayAppArgs(**settings)
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        torch.set_num_threads(s.threads or max(1, int(cpus)))
        defaults = serve_defaults(s.spec_namespace())
        engine = engine_from(s.spec_namespace())
        if defaults.draft:
            engine.load_draft(defaults.draft)
        names = tuple(dict.fromkeys(n for n in (s.served_model_name, s.model,
                                                engine.target.name) if n))
        self.app = create_app(engine, ServerConfig(names, defaults, _scheduler_config(s),
                                                   s.shutdown_timeout))
        self.scheduler = self.app.state.scheduler
        self.shutdown_timeout = s.shutdown_timeout
        context = serve.get_replica_context()
        self.app_name, self.name = context.app_name, context.replica_id.unique_id
        self._stop = threading.Event()
        self._pusher = threading.Thread(target=self._push, name="verispec-metrics-push",
                                        daemon=True)
        self._pusher.start()
        self._heap_top: Optional[asyncio.Task] = None  # ends with the replica's process

    def _keep_heap_top(self) -> None:
        """Start `keep_heap_top_resident` on the replica's loop, once: Ray Serve calls the
        app without its lifespan, which starts it in `verispec serve`."""
        if self._heap_top is None:
            self._heap_top = asyncio.get_running_loop().create_task(keep_heap_top_resident())

    def _push(self) -> None:
        hub = None
        while not self._stop.wait(ray_bridge.PUSH_SECONDS):
            try:
                hub = hub or ray_bridge.get_hub(self.app_name, create=False)
                if hub is not None:
                    g = self.scheduler.gauges()
                    ray.get(hub.put.remote(self.name, self.app.state.metrics.state(),
                                           (g.queued, g.running, g.live_caches)), timeout=10)
            except Exception:  # the hub died with its ingress: look it up again
                hub = None

    async def forward(self, method: str, path: str, query: bytes, headers: list, body: bytes,
                      affinity: Optional[str] = None):
        """The app's response to one request: (status, headers), then body chunks;
        the headers name this replica (x-verispec-replica). `affinity` is for the router."""
        self._keep_heap_top()
        parts = ray_bridge.call_asgi(self.app, method, path, query, headers, body)
        try:
            status, sent = await parts.__anext__()
            yield status, sent + [(b"x-verispec-replica", self.name.encode())]
            async for chunk in parts:
                yield chunk
        finally:
            await parts.aclose()  # cancelled by the caller: the app sees a disconnect

    def check_health(self) -> None:
        if not self.scheduler.alive():
            raise RuntimeError("the scheduler thread stopped")

    def __del__(self) -> None:
        # Serve calls this on graceful shutdown: running requests get shutdown_timeout.
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
            self.scheduler.close(self.shutdown_timeout)


_ingress = FastAPI(title="verispec (Ray Serve)")


def _error(message: str, code: Optional[str], status: int,
           kind: str = "server_error") -> JSONResponse:
    return JSONResponse(APIError(message, None, code, status, kind).body(), status_code=status)


@_ingress.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException):
    return _error(str(exc.detail), None, exc.status_code, "invalid_request_error")


@_ingress.exception_handler(Exception)
async def _internal_error(request: Request, exc: Exception):
    return _error(f"internal error: {type(exc).__name__}: {exc}", None, 500)


def _died(exc: BaseException) -> str:
    return f"the replica serving this request died ({type(exc).__name__}); retry"


def _relay_error(exc: BaseException) -> APIError:
    if isinstance(exc, _DIED):
        return APIError(_died(exc), None, "replica_died", 503, "server_error")
    return APIError(f"internal error: {type(exc).__name__}: {exc}", None, None, 500,
                    "server_error")


async def _events(stream):
    try:
        async for chunk in stream:
            yield chunk
    except Exception as exc:
        # Whole events only were relayed, so this one parses: the client sees an error.
        yield f"data: {json.dumps(_relay_error(exc).body())}\n\ndata: [DONE]\n\n".encode()
    finally:
        stream.cancel()  # a no-op when it ended; frees the replica's tickets when the client left


@serve.ingress(_ingress)
class VerispecIngress:
    def __init__(self, replicas, settings: dict) -> None:
        self.replicas = replicas.options(stream=True)
        self.settings = RayAppArgs(**settings)
        self.app_name = serve.get_replica_context().app_name
        self.hub = ray_bridge.get_hub(self.app_name, create=True)

    async def _reports(self) -> dict:
        try:
            return await asyncio.wait_for(self.hub.fresh.remote(), timeout=10)
        except Exception:  # the hub's owner (an ingress) died, or it is stuck: a new one
            self.hub = ray_bridge.get_hub(self.app_name, create=True)
            return {}

    @_ingress.get("/health")
    async def health(self):
        reports = await self._reports()
        gauges = [g for _, g in reports.values()]
        body = {"status": "ok" if reports else "unavailable", "replicas": len(reports),
                "running": sum(g[1] for g in gauges), "queued": sum(g[0] for g in gauges)}
        return JSONResponse(body, status_code=200 if reports else 503)

    @_ingress.get("/metrics")
    async def metrics(self):
        return Response(ray_bridge.render_cluster(await self._reports()),
                        media_type="text/plain; version=0.0.4")

    @_ingress.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._relay(request, chat=False)

    @_ingress.post("/v1/chat/completions")
    async def chat_completions(self, request: Request):
        return await self._relay(request, chat=True)

    @_ingress.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def other(self, request: Request, path: str):
        return await self._relay(request, chat=None)

    async def _relay(self, request: Request, chat: Optional[bool]):
        body = await request.body()
        key = None
        if chat is not None and self.settings.routing == "affinity":
            key = affinity_key(body, chat, self.settings.prefix_chars)
        path, root = request.scope["path"], request.scope.get("root_path", "")
        if root and path.startswith(root):  # an app deployed under a route_prefix
            path = path[len(root):] or "/"
        stream = self.replicas.forward.remote(
            request.method, path, request.url.query.encode(),
            list(request.headers.raw), body, affinity=key)
        try:
            status, headers = await stream.__anext__()
        except BackPressureError as exc:
            return _error(f"every replica is busy and the router queue is full ({exc}); "
                          "retry later", "queue_full", 429, "rate_limit_error")
        except _DIED as exc:
            return _error(_died(exc), "replica_died", 503)
        except BaseException:
            stream.cancel()
            raise
        kept = {k.decode(): v.decode() for k, v in headers
                if k.lower() not in (b"content-length", b"transfer-encoding")}
        if kept.get("content-type", "").startswith("text/event-stream"):
            return StreamingResponse(_events(stream), status_code=status, headers=kept)
        try:
            content = b"".join([chunk async for chunk in stream])
        except Exception as exc:
            error = _relay_error(exc)
            return JSONResponse(error.body(), status_code=error.status)
        finally:
            stream.cancel()
        return Response(content, status_code=status, headers=kept)


def build_app(args: Union[dict, RayAppArgs, None] = None) -> "serve.Application":
    """The Serve application for `serve run` / `serve deploy` / `serve.run`."""
    from verispec.serving.protocol import serve_defaults

    settings = args if isinstance(args, RayAppArgs) else RayAppArgs(**(args or {}))
    serve_defaults(settings.spec_namespace())  # refuse bad speculation flags before deploying
    _scheduler_config(settings)
    low, high = settings.replica_range()
    options: dict = {
        # One malloc arena, as fix_thresholds sets in `verispec serve`; in a replica Ray's own
        # threads have made arenas before __init__ runs, so only glibc's start-up reading of
        # the environment puts the scheduler thread on the main heap (merged with the job's).
        "ray_actor_options": {"num_cpus": settings.replica_cpus,
                              "num_gpus": settings.replica_gpus,
                              "runtime_env": {"env_vars": {"MALLOC_ARENA_MAX": str(ARENA_MAX)}}},
        "max_ongoing_requests": settings.max_ongoing_requests or 2 * settings.max_num_seqs,
        "max_queued_requests": (settings.max_queued_requests
                                if settings.max_queued_requests is not None
                                else settings.max_queue),
        "graceful_shutdown_timeout_s": settings.shutdown_timeout,
        "health_check_period_s": 2.0,
    }
    if low == high:
        options["num_replicas"] = high
    else:
        options["autoscaling_config"] = {
            "min_replicas": low, "max_replicas": high,
            "target_ongoing_requests": settings.target_ongoing_requests or settings.max_num_seqs}
    if settings.routing == "affinity":
        options["request_router_config"] = RequestRouterConfig(
            request_router_class="verispec.serving.ray_router.PrefixAffinityRouter",
            request_router_kwargs={"imbalance": settings.imbalance})
    replica = serve.deployment(VerispecReplica, name="VerispecReplica", **options)
    ingress = serve.deployment(VerispecIngress, name="VerispecIngress",
                               ray_actor_options={"num_cpus": settings.ingress_cpus},
                               max_ongoing_requests=100_000)
    plain = settings.model_dump()
    return ingress.bind(replica.bind(plain), plain)


app = build_app()


def serve_ray(args: argparse.Namespace) -> int:
    """`verispec serve --ray`: deploy on a local Ray cluster started here (or the
    one at --ray-address) and serve until interrupted; a cluster started here
    is shut down with every Ray process it started, a joined one keeps running
    and only loses this application."""
    import os
    import signal

    import ray

    import verispec

    fields = RayAppArgs.model_fields
    settings = RayAppArgs(**{k: v for k, v in vars(args).items()
                             if k in fields and v is not None})
    application = build_app(settings)
    if args.ray_address:
        ray.init(address=args.ray_address)
    else:
        # The replicas run this process's verispec, wherever it was imported from.
        source = os.path.dirname(os.path.dirname(os.path.abspath(verispec.__file__)))
        path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)
        ray.init(address="local", include_dashboard=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(application, name=APP_NAME, route_prefix="/", blocking=False)
        low, high = settings.replica_range()
        print(f"verispec serve --ray: {settings.model} on {low if low == high else f'{low}-{high}'} "
              f"replica(s), {settings.replica_cpus:g} CPU and {settings.replica_gpus:g} GPU each, "
              f"routing {settings.routing}, on http://{args.host}:{args.port}/v1", flush=True)
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        if args.ray_address:
            serve.delete(APP_NAME)
        else:
            serve.shutdown()
        ray.shutdown()
    return 0
