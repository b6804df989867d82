"""Drive a running OpenAI-compatible server at a fixed concurrency for a bounded time.

`concurrency` client threads each send one streamed chat request after the
other (prompts round-robin) until `duration` seconds have passed, then finish
what they started. Reported: requests, errors, output tokens per second over
the whole run, request latency and time to first token (p50/p99), and the
server's own speculation numbers (tau, acceptance) from each response.
Only the standard library is used, so the driver adds no client overhead of
its own worth measuring.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import numpy as np


@dataclass(frozen=True)
class LoadConfig:
    url: str  # the server's base URL, e.g. http://127.0.0.1:8000
    concurrency: int = 4
    duration: float = 30.0  # seconds during which new requests start
    max_tokens: int = 64
    temperature: float = 0.0
    model: str | None = None  # None: the first model the server lists
    speculation: dict | None = None  # sent as the request's `speculation` object
    prompts: tuple[tuple[dict, ...], ...] = ()  # chat conversations; empty: `workload`'s
    workload: str = "chat"  # bench workloads (comma list or all) when no prompts are given
    timeout: float = 600.0  # per request

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.duration <= 0 or self.max_tokens < 1:
            raise ValueError("need concurrency >= 1, duration > 0 and max_tokens >= 1")


@dataclass
class Sample:
    ok: bool
    latency: float
    ttft: float | None = None
    tokens: int = 0
    tau: float | None = None
    drafted: int = 0
    accepted: int = 0
    error: str = ""


@dataclass
class LoadReport:
    config: LoadConfig
    wall: float
    samples: list[Sample] = field(default_factory=list)

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    def summary(self) -> dict:
        ok = self.ok
        latency = np.array([s.latency for s in ok]) if ok else np.zeros(1)
        ttft = np.array([s.ttft for s in ok if s.ttft is not None] or [0.0])
        tokens = sum(s.tokens for s in ok)
        drafted = sum(s.drafted for s in ok)
        taus = [s.tau for s in ok if s.tau]
        return {
            "concurrency": self.config.concurrency, "requests": len(ok),
            "errors": len(self.samples) - len(ok), "wall_s": round(self.wall, 3),
            "tokens_per_s": round(tokens / self.wall, 2) if self.wall > 0 else 0.0,
            "requests_per_s": round(len(ok) / self.wall, 3) if self.wall > 0 else 0.0,
            "latency_p50_s": round(float(np.percentile(latency, 50)), 4),
            "latency_p99_s": round(float(np.percentile(latency, 99)), 4),
            "ttft_p50_s": round(float(np.percentile(ttft, 50)), 4),
            "ttft_p99_s": round(float(np.percentile(ttft, 99)), 4),
            "tau": round(float(np.mean(taus)), 3) if taus else 0.0,
            "acceptance": round(sum(s.accepted for s in ok) / drafted, 4) if drafted else 0.0,
            "first_errors": sorted({s.error for s in self.samples if not s.ok})[:3],
        }


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlparse(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    return cls(parts.hostname, parts.port, timeout=timeout), parts.path.rstrip("/")


def first_model(url: str) -> str:
    conn, base = _connection(url, 30)
    conn.request("GET", f"{base}/v1/models")
    data = json.loads(conn.getresponse().read())
    conn.close()
    return data["data"][0]["id"]


def one_request(config: LoadConfig, model: str, messages: tuple[dict, ...]) -> Sample:
    body = {"model": model, "messages": list(messages), "max_tokens": config.max_tokens,
            "temperature": config.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if config.speculation:
        body["speculation"] = config.speculation
    start = time.perf_counter()
    sample = Sample(ok=False, latency=0.0)
    try:
        conn, base = _connection(config.url, config.timeout)
        conn.request("POST", f"{base}/v1/chat/completions", json.dumps(body).encode(),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            sample.error = f"HTTP {response.status}: {response.read()[:200].decode(errors='replace')}"
            return sample
        done = False
        while True:
            line = response.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                done = True
                break
            event = json.loads(payload)
            if "error" in event:
                sample.error = event["error"].get("message", "error event")
                return sample
            if sample.ttft is None and any(c.get("delta", {}).get("content")
                                           for c in event.get("choices", [])):
                sample.ttft = time.perf_counter() - start
            if event.get("usage"):
                sample.tokens = event["usage"]["completion_tokens"]
                spec = event.get("speculation") or {}
                sample.tau = spec.get("tau")
                sample.drafted, sample.accepted = spec.get("drafted", 0), spec.get("accepted", 0)
        conn.close()
        sample.ok = done
        if not done:
            sample.error = "the stream ended without [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as exc:
        sample.error = f"{type(exc).__name__}: {exc}"
    finally:
        sample.latency = time.perf_counter() - start
    return sample


def workload_prompts(spec: str) -> tuple[tuple[dict, ...], ...]:
    from verispec.bench.workloads import load_workload, parse_workloads

    return tuple(p.messages for name in parse_workloads(spec) for p in load_workload(name))


def run_load(config: LoadConfig) -> LoadReport:
    model = config.model or first_model(config.url)
    prompts = config.prompts or workload_prompts(config.workload)
    samples: list[Sample] = []
    lock = threading.Lock()
    counter = iter(range(1 << 62))
    start = time.perf_counter()
    deadline = start + config.duration

    def worker() -> None:
        while time.perf_counter() < deadline:
            with lock:
                index = next(counter)
            sample = one_request(config, model, prompts[index % len(prompts)])
            with lock:
                samples.append(sample)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(config.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(config.duration + config.timeout)
    return LoadReport(config, time.perf_counter() - start, samples)


def format_row(summary: dict, label: str = "") -> str:
    return (f"{label}concurrency={summary['concurrency']} requests={summary['requests']} "
            f"errors={summary['errors']} tok/s={summary['tokens_per_s']:.1f} "
            f"latency p50/p99={summary['latency_p50_s']:.3f}/{summary['latency_p99_s']:.3f}s "
            f"ttft p50/p99={summary['ttft_p50_s']:.3f}/{summary['ttft_p99_s']:.3f}s "
            f"tau={summary['tau']:.2f} acceptance={100 * summary['acceptance']:.1f}%")
