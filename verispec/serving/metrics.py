"""Server metrics, exposed through prometheus-client's text format.

Counters and histograms are updated by the scheduler thread and read by the
HTTP thread, so every update and every render holds one lock. Gauges that
describe the scheduler's state (queue depth, running requests, live KV
caches) are sampled at render time instead of being kept in sync. The values
live here as plain data, not in prometheus-client's own metric objects,
because replicas of a scaled-out server ship them to one process that sums
them (`state`, `merged`); prometheus-client renders them, as metric
families of a one-off collector (`exposition`).
"""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

TAU_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 8.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
K_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16)


@dataclass
class Histogram:
    bounds: Sequence[float]
    counts: list[int] = field(default_factory=list)  # per bound, not cumulative; last = +Inf
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def family(self, name: str, text: str) -> HistogramMetricFamily:
        buckets, running = [], 0
        for bound, count in zip([str(b) for b in self.bounds] + ["+Inf"], self.counts):
            running += count
            buckets.append((bound, running))
        return HistogramMetricFamily(name, text, buckets=buckets, sum_value=self.total)


def exposition(families: Iterable[Metric]) -> str:
    """Prometheus text (format 0.0.4) of metric families, by prometheus-client."""
    families = list(families)

    class _Once:
        def collect(self):
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once())
    return generate_latest(registry).decode()


@dataclass(frozen=True)
class Gauges:
    """The scheduler's state at render time."""
    queued: int
    running: int
    live_caches: int


class ServingMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[str, int] = {}  # by outcome: finished, cancelled, error, rejected
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.steps = 0
        self.guard_held = 0  # steps whose adaptive requests the guard kept from drafting
        self.tau = Histogram(TAU_BUCKETS)
        self.step_seconds = Histogram(STEP_BUCKETS)
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.draft_length = Histogram(K_BUCKETS)
        self.last_batch_size = 0

    def admitted(self, prompt_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens

    def request_done(self, outcome: str, tau: float | None = None) -> None:
        with self._lock:
            self.requests[outcome] = self.requests.get(outcome, 0) + 1
            if tau is not None and tau > 0:
                self.tau.observe(tau)

    def step(self, batch_size: int, seconds: float, ks: Sequence[int], emitted: int,
             drafted: int, accepted: int) -> None:
        with self._lock:
            self.steps += 1
            self.batch_size.observe(batch_size)
            self.step_seconds.observe(seconds)
            for k in ks:
                self.draft_length.observe(k)
            self.generated_tokens += emitted
            self.drafted += drafted
            self.accepted += accepted
            self.last_batch_size = batch_size

    def held_by_guard(self) -> None:
        with self._lock:
            self.guard_held += 1

    _COUNTERS = ("prompt_tokens", "generated_tokens", "drafted", "accepted", "steps",
                 "guard_held", "last_batch_size")
    _HISTOGRAMS = ("tau", "step_seconds", "batch_size", "draft_length")

    def state(self) -> dict:
        """A plain-data copy (picklable, JSON-able) that `merged` can sum: how
        replicas of a scaled-out server report to one /metrics."""
        with self._lock:
            out: dict = {"requests": dict(self.requests)}
            out.update({name: getattr(self, name) for name in self._COUNTERS})
            for name in self._HISTOGRAMS:
                hist = getattr(self, name)
                out[name] = {"counts": list(hist.counts), "total": hist.total, "n": hist.n}
            return out

    @classmethod
    def merged(cls, states: Sequence[dict]) -> "ServingMetrics":
        """The sum of several `state()`s; `last_batch_size` sums to the requests
        batched across all of them in their latest steps."""
        total = cls()
        for state in states:
            for outcome, count in state["requests"].items():
                total.requests[outcome] = total.requests.get(outcome, 0) + count
            for name in cls._COUNTERS:
                setattr(total, name, getattr(total, name) + state[name])
            for name in cls._HISTOGRAMS:
                hist, part = getattr(total, name), state[name]
                hist.counts = [a + b for a, b in zip(hist.counts, part["counts"])]
                hist.total += part["total"]
                hist.n += part["n"]
        return total

    def families(self, gauges: Gauges) -> list[Metric]:
        p = "verispec"
        with self._lock:
            requests = CounterMetricFamily(f"{p}_requests", "Requests by outcome.",
                                           labels=["outcome"])
            for outcome in sorted(set(self.requests) | {"finished", "cancelled", "error", "rejected"}):
                requests.add_metric([outcome], self.requests.get(outcome, 0))
            out: list[Metric] = [requests]
            rate = self.accepted / self.drafted if self.drafted else 0.0
            counters = [
                ("prompt_tokens", "Prompt tokens of admitted requests.", self.prompt_tokens),
                ("generation_tokens", "Tokens committed.", self.generated_tokens),
                ("draft_tokens", "Draft tokens verified.", self.drafted),
                ("accepted_tokens", "Draft tokens accepted.", self.accepted),
                ("steps", "Batched target forwards.", self.steps),
                ("guard_held_steps", "Steps whose adaptive requests the realized-rate guard "
                 "kept from drafting.", self.guard_held)]
            out += [CounterMetricFamily(f"{p}_{name}", text, value=value)
                    for name, text, value in counters]
            gauge_values = [
                ("acceptance_rate", "Accepted / drafted since start.", round(rate, 6)),
                ("queue_depth", "Requests waiting for a batch slot.", gauges.queued),
                ("running_requests", "Requests in the running batch.", gauges.running),
                ("batch_size", "Requests in the last step.", self.last_batch_size),
                ("kv_caches", "KV caches alive (running requests hold one each).",
                 gauges.live_caches)]
            out += [GaugeMetricFamily(f"{p}_{name}", text, value=value)
                    for name, text, value in gauge_values]
            out += [hist.family(f"{p}_{name}", text) for name, text, hist in (
                ("tau", "Tokens per target forward of each finished request.", self.tau),
                ("step_seconds", "Wall time of one batched step.", self.step_seconds),
                ("step_batch_size", "Requests per batched step.", self.batch_size),
                ("draft_length", "Draft length chosen per request and step.", self.draft_length))]
        return out

    def render(self, gauges: Gauges) -> str:
        return exposition(self.families(gauges))
