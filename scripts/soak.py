"""Soak test: mixed traffic against `verispec serve` for a long run, every reply checked.

    python scripts/soak.py --minutes 30 --out docs/results/soak    # the report's run
    python scripts/soak.py --minutes 2 --out /tmp/soak              # a development run

Starts `verispec serve` on the default model (or uses --url), runs every request
template alone first (its solo reply), then for --minutes keeps --clients clients
busy with a random mix: chat and completions, streamed and not, greedy and sampled
(seeded and unseeded), JSON-schema response formats, forced tool
calls, stop strings and predicted outputs; a tenth of the streamed requests hang up
after their first chunk, and every --burst-every seconds a burst of requests larger
than the batch and the queue together arrives at once. Every reply is checked: a
greedy one must equal its solo reply, a JSON-schema reply
must validate, a tool call's arguments must validate, a predicted reply must also
equal the same request's solo reply without the prediction, every reply id must be
new. Every 2 s the server's RSS and its /metrics gauges are sampled. After the traffic,
once every client has finished, the gauges are read until they are 0 (the drained
sample), and the idle RSS at the end is read SETTLE_SECONDS later (the settled sample,
the one the RSS goal uses; the RSS in between is sampled every half second). The records
go to OUT/soak.json; scripts/soak_report.py turns them into the report and the plot.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import jsonschema

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_report import write_report  # noqa: E402
from soak_templates import Template, templates  # noqa: E402

GAUGES = ("queue_depth", "running_requests", "kv_caches")
# The live set (KV caches, a step's tensors) moves the RSS by tens of MiB within seconds:
# a minute's mean needs many samples to be the minute's, not the moments' (soak_rss.md).
SAMPLE_EVERY = 2.0  # seconds
# The gauges read 0 as soon as the scheduler frees the last request, while its reply may
# still be on its way out and its step's last buffers not yet freed: the end sample of an
# idle server is read a few seconds later, when the server has had time to settle (several
# of its idle loop's turns and 2.5 sampling periods), the same wait in every run.
SETTLE_SECONDS = 5.0
SETTLE_EVERY = 0.5  # seconds between the RSS readings while it settles
# uvicorn closes a connection idle for 5 s (its timeout_keep_alive) and httpx keeps one for
# 5 s by default: a request sent on a connection just as the server closes it meets a reset,
# unread and unanswered, and counted as lost though the server never saw it
# (docs/notebook/soak_rss.md, round 3). The client drops idle connections well before.
KEEPALIVE_EXPIRY = 2.0  # seconds


@dataclass
class Record:
    template: str
    start: float  # seconds since the soak began
    latency: float
    status: int | None  # None: no HTTP status came back
    outcome: str  # ok, mismatch, invalid, rejected (429), disconnected, error, lost
    detail: str = ""


@dataclass
class Sample:
    at: float
    rss_mb: float | None
    gauges: dict = field(default_factory=dict)
    load: float | None = None  # the machine's 1-minute load average (other tenants included)


class Soak:
    def __init__(self, url: str, pid: int | None, seed: int) -> None:
        self.url, self.pid = url, pid
        self.random = random.Random(seed)
        self.records: list[Record] = []
        self.samples: list[Sample] = []
        self.solo: dict[str, object] = {}
        self.ids: set[str] = set()
        self.began = time.monotonic()

    # -- one request ------------------------------------------------------------
    async def send(self, client: httpx.AsyncClient, template: Template, hang_up: bool = False,
                   record: bool = True) -> object:
        """Send a template's request; check and record its reply; return what it said."""
        start = time.monotonic()
        status, outcome, detail, said = None, "lost", "", None
        try:
            hung = False
            if template.stream:
                status, said, hung = await self._stream(client, template, hang_up)
            else:
                response = await client.post(template.route, json=template.body)
                status = response.status_code
                said = response.json() if status == 200 else response.text
            outcome, detail = ("disconnected", "") if hung else self.judge(template, status, said)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            detail = f"{type(exc).__name__}: {exc}"
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # a reply of the wrong shape
            outcome, detail = "invalid", f"{type(exc).__name__}: {exc}"
        if record:
            self.records.append(Record(template.name, start - self.began,
                                       time.monotonic() - start, status, outcome, detail[:300]))
        return said

    async def _stream(self, client, template: Template, hang_up: bool):
        """(status, reply folded from the chunks, hung up early)."""
        async with client.stream("POST", template.route, json=template.body) as response:
            if response.status_code != 200:
                return response.status_code, (await response.aread()).decode(), False
            chunks = []
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return 200, fold(chunks, template.chat), False
                chunks.append(json.loads(line[6:]))
                if hang_up and any(choice_text(c, template.chat) for c in chunks):
                    return 200, None, True  # leaving the block closes the connection
            return 200, {"error": "the stream ended without [DONE]"}, False

    def judge(self, template: Template, status: int, said) -> tuple[str, str]:
        if status == 429:
            return "rejected", ""
        if status != 200:
            return ("error" if status >= 500 else "invalid"), f"{status}: {str(said)[:200]}"
        if "error" in said:
            return "error", json.dumps(said["error"])[:200]
        reply_id = said.get("id")
        if reply_id in self.ids:
            return "mismatch", f"reply id {reply_id} seen before"
        self.ids.add(reply_id)
        answer = answers(said, template.chat)
        if template.deterministic and template.name in self.solo \
                and answer != self.solo[template.name]:
            return "mismatch", f"{answer!r:.120} != solo {self.solo[template.name]!r:.120}"
        for text, calls, finish in answer:
            if template.schema is not None and finish == "stop":
                try:
                    jsonschema.validate(json.loads(text), template.schema)
                except (ValueError, jsonschema.ValidationError) as exc:
                    return "invalid", f"schema: {exc}"[:200]
            if template.tool_schema is not None and finish == "tool_calls":
                try:
                    for call in calls:
                        jsonschema.validate(json.loads(call[1]), template.tool_schema)
                except (ValueError, jsonschema.ValidationError) as exc:
                    return "invalid", f"tool arguments: {exc}"[:200]
            if template.stop and any(s in text for s in template.stop):
                return "invalid", "a stop string reached the reply"
        if template.prediction and "completion_tokens_details" not in (said.get("usage") or {}):
            return "invalid", "no completion_tokens_details for a predicted reply"
        return "ok", ""

    # -- the run ---------------------------------------------------------------
    async def solo_runs(self, client, pool: list[Template]) -> None:
        """Each deterministic template alone, and each predicted one without its
        prediction: the lossless law says all of them are the same reply."""
        for template in pool:
            if not template.deterministic:
                continue
            said = await self.send(client, template, record=False)
            assert isinstance(said, dict) and "choices" in said, (template.name, said)
            self.solo[template.name] = answers(said, template.chat)
            if template.prediction:
                plain = await self.send(client, template.without_prediction(), record=False)
                if answers(plain, template.chat) != self.solo[template.name]:
                    raise SystemExit(f"{template.name}: the predicted reply differs from the "
                                     "reply without the prediction")
        self.ids.clear()

    async def client_loop(self, client, pool: list[Template], deadline: float,
                          hang_up_share: float) -> None:
        while time.monotonic() < deadline:
            template = self.random.choice(pool)
            hang = template.stream and self.random.random() < hang_up_share
            await self.send(client, template, hang_up=hang)

    async def bursts(self, client, pool, deadline: float, every: float, size: int) -> None:
        short = [t for t in pool if not t.stream and t.short]
        while time.monotonic() + every < deadline:
            await asyncio.sleep(every)
            burst = [self.random.choice(short) for _ in range(size)]
            await asyncio.gather(*(self.send(client, t) for t in burst))

    async def sampler(self, client, stop: asyncio.Event, every: float = SAMPLE_EVERY) -> None:
        while not stop.is_set():
            await self.sample(client)
            try:
                await asyncio.wait_for(stop.wait(), timeout=every)
            except asyncio.TimeoutError:
                pass

    async def sample(self, client, keep: bool = True) -> Sample:
        text = (await client.get("/metrics")).text
        gauges = {name: gauge(text, name) for name in GAUGES}
        sample = Sample(time.monotonic() - self.began, rss_mb(self.pid), gauges, load_average())
        if keep:
            self.samples.append(sample)
        return sample

    async def drain(self, client, timeout: float = 120.0) -> Sample:
        """The gauges once the server has nothing left (or after `timeout`)."""
        end = time.monotonic() + timeout
        while True:
            sample = await self.sample(client)
            if not any(sample.gauges.values()) or time.monotonic() > end:
                return sample
            await asyncio.sleep(1.0)

    async def settle(self, client, seconds: float) -> tuple[Sample, list[Sample]]:
        """The idle server `seconds` after it drained: (that sample with the gauges, the
        RSS readings on the way)."""
        drained = time.monotonic()
        on_the_way = []
        while time.monotonic() - drained < seconds:
            await asyncio.sleep(min(SETTLE_EVERY, seconds - (time.monotonic() - drained)))
            on_the_way.append(Sample(time.monotonic() - self.began, rss_mb(self.pid)))
        return await self.sample(client, keep=False), on_the_way


def fold(chunks: list[dict], chat: bool) -> dict:
    """A stream's chunks as one reply: per choice the text, tool calls and finish reason."""
    out: dict = {"id": chunks[0]["id"] if chunks else None, "choices": {}, "usage": None}
    for chunk in chunks:
        if chunk.get("usage"):
            out["usage"] = chunk["usage"]
        for choice in chunk.get("choices", []):
            mine = out["choices"].setdefault(choice["index"], {"text": "", "calls": [],
                                                               "finish": None})
            mine["text"] += choice_text_one(choice, chat)
            for call in (choice.get("delta") or {}).get("tool_calls") or []:
                mine["calls"].append((call["function"]["name"], call["function"]["arguments"]))
            mine["finish"] = choice.get("finish_reason") or mine["finish"]
    return out


def choice_text_one(choice: dict, chat: bool) -> str:
    return ((choice.get("delta") or {}).get("content") or "") if chat else choice.get("text", "")


def choice_text(chunk: dict, chat: bool) -> str:
    return "".join(choice_text_one(c, chat) for c in chunk.get("choices", []))


def answers(said: dict, chat: bool) -> list:
    """[(text, tool calls, finish reason)] per choice, streamed or not."""
    choices = said["choices"]
    if isinstance(choices, dict):  # folded from a stream
        return [(c["text"], c["calls"], c["finish"]) for _, c in sorted(choices.items())]
    out = []
    for choice in sorted(choices, key=lambda c: c["index"]):
        if chat:
            message = choice["message"]
            calls = [(c["function"]["name"], c["function"]["arguments"])
                     for c in message.get("tool_calls") or []]
            out.append((message.get("content") or "", calls, choice["finish_reason"]))
        else:
            out.append((choice["text"], [], choice["finish_reason"]))
    return out


def gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"verispec_{name} "):
            return float(line.split()[1])
    return float("nan")


def rss_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            kb = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
        return kb / 1024
    except (OSError, StopIteration):
        return None


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def start_server(port: int, max_num_seqs: int, max_queue: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "verispec.cli", "serve", "--model", "default",
               "--port", str(port), "--max-num-seqs", str(max_num_seqs),
               "--max-queue", str(max_queue), "--log-level", "warning"]
    return subprocess.Popen(command, env=dict(os.environ))


async def wait_ready(url: str, server: subprocess.Popen | None, timeout: float = 600.0) -> None:
    end = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as client:
        while time.monotonic() < end:
            if server is not None and server.poll() is not None:
                raise SystemExit(f"verispec serve exited with {server.returncode}")
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(1.0)
    raise SystemExit("the server did not come up")


async def run(args: argparse.Namespace) -> dict:
    server = None if args.url else start_server(args.port, args.max_num_seqs, args.max_queue)
    url = args.url or f"http://127.0.0.1:{args.port}"
    try:
        await wait_ready(url, server)
        soak = Soak(url, server.pid if server else args.pid, args.seed)
        limits = httpx.Limits(max_connections=args.clients + args.burst + 8,
                              keepalive_expiry=KEEPALIVE_EXPIRY)
        async with httpx.AsyncClient(base_url=url, timeout=args.timeout, limits=limits) as client:
            pool = templates((await client.get("/v1/models")).json()["data"][0]["id"],
                             args.max_tokens)
            print(f"soak: {len(pool)} templates; solo runs", file=sys.stderr)
            await soak.solo_runs(client, pool)
            soak.began = time.monotonic()
            deadline = soak.began + 60 * args.minutes
            stop = asyncio.Event()
            sampling = asyncio.create_task(soak.sampler(client, stop))
            print(f"soak: {args.minutes} min of traffic", file=sys.stderr)
            await asyncio.gather(
                *(soak.client_loop(client, pool, deadline, args.hang_up) for _ in
                  range(args.clients)),
                soak.bursts(client, pool, deadline, args.burst_every, args.burst))
            traffic_end = time.monotonic() - soak.began
            drained = await soak.drain(client)
            stop.set()
            await sampling
            final, settling = await soak.settle(client, SETTLE_SECONDS)
        return {"settings": vars(args), "traffic_seconds": traffic_end, "cpus": os.cpu_count(),
                "sample_every": SAMPLE_EVERY, "settle_seconds": SETTLE_SECONDS,
                "templates": [t.describe() for t in pool],
                "records": [asdict(r) for r in soak.records],
                "samples": [asdict(s) for s in soak.samples], "drained": asdict(drained),
                "settling": [asdict(s) for s in settling], "final": asdict(final)}
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0, help="traffic duration (default 30)")
    p.add_argument("--out", required=True, help="folder for soak.json, soak.md and soak.png")
    p.add_argument("--url", default=None, help="a running server instead of starting one")
    p.add_argument("--pid", type=int, default=None, help="with --url: its pid, for the RSS")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--clients", type=int, default=6, help="steady clients (default 6)")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--max-queue", type=int, default=16)
    p.add_argument("--burst", type=int, default=40,
                   help="requests per burst, past batch + queue (default 40)")
    p.add_argument("--burst-every", type=float, default=90.0, help="seconds between bursts")
    p.add_argument("--hang-up", type=float, default=0.1,
                   help="share of streamed requests that disconnect mid-stream (default 0.1)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=None,
                   help="cap every request's max_tokens (a quick run; default: as written)")
    p.add_argument("--note", default="",
                   help="a line for the report, e.g. what else ran on the machine")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(run(args))
    (out / "soak.json").write_text(json.dumps(result) + "\n", encoding="utf-8")
    print(write_report(result, out))
    return result


if __name__ == "__main__":
    main()
