"""What the Ray Serve app needs besides Ray's own pieces: calling the
single-process FastAPI app inside a replica, and one /metrics for every replica.

`call_asgi` runs an HTTP request through an ASGI app in this process and
yields the response as it is sent (start, then body chunks), so that a replica
serves exactly what `verispec serve` serves: the same routes, validation, error
bodies and SSE events, from the same code.

Metrics are aggregated at the ingress rather than through Ray's metrics export:
that export needs each node's metrics agent scraped by a Prometheus that knows
the cluster, whereas one scrape of the ingress should show the same metric
names as a single-process server. Each replica pushes its `ServingMetrics`
state to a `MetricsHub` actor every `PUSH_SECONDS`; the ingress renders the
sum plus per-replica series. A replica silent for `STALE_SECONDS` is dropped
(its counters leave the sum: Prometheus reads that as a counter reset).
"""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Sequence

import ray
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from verispec.serving.metrics import Gauges, ServingMetrics, exposition

PUSH_SECONDS = 0.5
STALE_SECONDS = 3.0
HUB_NAMESPACE = "verispec"


async def call_asgi(app, method: str, path: str, query: bytes,
                    headers: Sequence[tuple[bytes, bytes]], body: bytes) -> AsyncIterator:
    """Yield `(status, headers)` and then each body chunk of `app`'s response.
    Closing the generator (the caller went away) reports a disconnect to the
    app and cancels it, which cancels the request's scheduler tickets."""
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": method, "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": query, "root_path": "",
             "headers": [(bytes(k), bytes(v)) for k, v in headers],
             "client": ("127.0.0.1", 0), "server": ("verispec-replica", 0)}
    task = asyncio.ensure_future(app(scope, receive, sent.put))
    try:
        while True:
            getter = asyncio.ensure_future(sent.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                task.result()  # raises what the app raised
                raise RuntimeError("the app returned without completing its response")
            message = getter.result()
            if message["type"] == "http.response.start":
                yield message["status"], [(bytes(k), bytes(v)) for k, v in message["headers"]]
            elif message["type"] == "http.response.body":
                # Chunks already sent travel as one item: each item of a Ray stream is
                # a remote object with its own round trip, and events stay whole.
                chunks, more = [bytes(message.get("body", b""))], message.get("more_body", False)
                while more and not sent.empty():
                    message = sent.get_nowait()
                    chunks.append(bytes(message.get("body", b"")))
                    more = message.get("more_body", False)
                if any(chunks):
                    yield b"".join(chunks)
                if not more:
                    return
    finally:
        gone.set()
        if not task.done():
            task.cancel()


@ray.remote(num_cpus=0)
class MetricsHub:
    """The latest `ServingMetrics.state()` and gauges of each replica."""

    def __init__(self) -> None:
        self.reports: dict[str, tuple[float, dict, tuple[int, int, int]]] = {}

    def put(self, replica: str, state: dict, gauges: tuple[int, int, int]) -> None:
        self.reports[replica] = (time.monotonic(), state, gauges)

    def drop(self, replica: str) -> None:
        self.reports.pop(replica, None)

    def fresh(self) -> dict[str, tuple[dict, tuple[int, int, int]]]:
        now = time.monotonic()
        for replica in [r for r, (t, _, _) in self.reports.items() if now - t > STALE_SECONDS]:
            del self.reports[replica]
        return {r: (state, gauges) for r, (_, state, gauges) in self.reports.items()}


def hub_name(app_name: str) -> str:
    return f"metrics-hub:{app_name}"


def get_hub(app_name: str, create: bool):
    """The app's hub: the ingress creates it (so it lives as long as an ingress
    does), replicas only look it up; None when it does not exist yet."""
    if create:
        return MetricsHub.options(name=hub_name(app_name), namespace=HUB_NAMESPACE,
                                  get_if_exists=True, max_concurrency=64).remote()
    try:
        return ray.get_actor(hub_name(app_name), namespace=HUB_NAMESPACE)
    except ValueError:
        return None


def render_cluster(reports: dict[str, tuple[dict, tuple[int, int, int]]]) -> str:
    """Prometheus text: the single-process metrics summed over replicas, then
    per-replica series labelled `replica`."""
    states = [state for state, _ in reports.values()]
    gauges = [g for _, g in reports.values()]
    total = Gauges(*(sum(g[i] for g in gauges) for i in range(3)))
    families = ServingMetrics.merged(states).families(total)
    p = "verispec"
    families.append(GaugeMetricFamily(
        f"{p}_replicas", f"Replicas that reported in the last {STALE_SECONDS:g} s.",
        value=len(reports)))
    per = [("replica_running_requests", GaugeMetricFamily, "Requests in a replica's running "
            "batch.", lambda s, g: g[1]),
           ("replica_queue_depth", GaugeMetricFamily, "Requests waiting in a replica's queue.",
            lambda s, g: g[0]),
           ("replica_generation_tokens", CounterMetricFamily, "Tokens a replica committed.",
            lambda s, g: s["generated_tokens"]),
           ("replica_steps", CounterMetricFamily, "Batched target forwards of a replica.",
            lambda s, g: s["steps"])]
    for name, kind, help_text, value in per:
        family = kind(f"{p}_{name}", help_text, labels=["replica"])
        for r, (s, g) in sorted(reports.items()):
            family.add_metric([r], value(s, g))
        families.append(family)
    ended = CounterMetricFamily(f"{p}_replica_requests", "Requests a replica ended, by outcome.",
                                labels=["replica", "outcome"])
    for r, (s, _) in sorted(reports.items()):
        for o, n in sorted(s["requests"].items()):
            ended.add_metric([r, o], n)
    families.append(ended)
    return exposition(families)
