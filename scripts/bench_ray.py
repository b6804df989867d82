#!/usr/bin/env python3
"""Ray Serve against one `verispec serve` process, side by side on one machine.

    python scripts/bench_ray.py --model default --rounds 3 --duration 12

Systems, all up at once and measured in interleaved rounds (shuffled order per
round), each cell the median over rounds:
  single  one process, 2 torch threads (OMP_NUM_THREADS=2), max_num_seqs 16
  r1      Ray, 1 replica of 2 threads: the same compute behind Serve, so the
          difference at concurrency 1 is Ray's overhead per request
  r2      Ray, 2 replicas of 1 thread each, prefix-affinity routing
  p2      as r2 with Ray's power-of-two-choices routing
Phases: overhead (single vs r1 at concurrency 1), scale (single vs r2 at each
--concurrency), routing (r2 vs p2 on chats that share 4 long system prompts).
Writes results.json and report.md under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SYSTEMS = ["You are a support agent for a cloud storage company. Answer briefly, cite the "
           "relevant plan (Free: 5 GB, Plus: 200 GB, Pro: 2 TB), never promise refunds, and "
           "end with one follow-up question. Policies: files in the trash are kept 30 days; "
           "shared links expire after 7 days unless the owner is on Pro; two-factor "
           "authentication is required for admins. ",
           "You are a code reviewer. For the snippet the user gives, list at most three "
           "issues, most severe first, each with a one-line fix. Style rules: PEP 8, type "
           "hints on public functions, no bare except, no mutable default arguments, "
           "f-strings over format(), pathlib over os.path, early returns over nesting. ",
           "You translate English into plain French for a travel phrase book. Keep sentences "
           "short, use the formal 'vous', add the pronunciation in brackets after each "
           "sentence, and mark any phrase that could be rude in Quebec with an asterisk. "
           "Numbers are written in words. Do not explain grammar unless asked. ",
           "You are a math tutor for twelve-year-olds. Explain each step in one sentence, "
           "use whole numbers where possible, check the answer by substituting it back, and "
           "finish with a similar practice problem without its solution. Never use algebra "
           "beyond one unknown. Units must appear in every intermediate result. "]
QUESTIONS = ["How do I recover a file I deleted last week?", "What does this do: x = [] * 3",
             "Where is the train station?", "What is 15% of 240?", "Can I share a folder?",
             "def f(a, l=[]): l.append(a); return l", "How much does a ticket cost?",
             "A train goes 60 km in 45 minutes; how fast is it?"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_health(url: str, replicas: int | None, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            body = json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())
            if replicas is None or body.get("replicas") == replicas:
                return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} did not become healthy in {timeout:.0f} s")


def shared_prefix_prompts() -> tuple[tuple[dict, ...], ...]:
    return tuple(({"role": "system", "content": SYSTEMS[i % 4]},
                  {"role": "user", "content": QUESTIONS[(i * 3) % len(QUESTIONS)]})
                 for i in range(32))


def measure(cells: dict, phase: str, systems: dict, levels: list[int], args,
            prompts=()) -> None:
    from verispec.serving.load import LoadConfig, format_row, run_load

    order = list(systems)
    for r in range(args.rounds):
        random.Random(r).shuffle(order)
        for level in levels:
            for name in order:
                summary = run_load(LoadConfig(systems[name], concurrency=level,
                                              duration=args.duration, max_tokens=args.max_tokens,
                                              prompts=prompts, workload=args.workload)).summary()
                cells.setdefault(phase, {}).setdefault(name, {}).setdefault(str(level), []) \
                    .append(summary)
                print(f"[{phase} round {r + 1}] {name:6s} " + format_row(summary), flush=True)


def median(rows: list[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def paired(a: list[dict], b: list[dict], key: str, ratio: bool = True) -> float:
    values = [(x[key] / y[key]) if ratio else (x[key] - y[key]) for x, y in zip(a, b) if y[key]]
    return statistics.median(values) if values else float("nan")


def report(cells: dict, args) -> str:
    lines = [f"`python scripts/bench_ray.py {' '.join(sys.argv[1:])}` — model {args.model}, "
             f"max_tokens {args.max_tokens}, {args.duration:g} s per cell, {args.rounds} "
             "interleaved rounds, medians (ratios: median of per-round ratios).", ""]
    if "overhead" in cells:
        single, r1 = cells["overhead"]["single"]["1"], cells["overhead"]["r1"]["1"]
        lines += ["Ray overhead per request at concurrency 1 (1 replica x 2 threads vs one "
                  "process x 2 threads):", "",
                  "| | single | Ray r1 | Ray - single |", "|---|---|---|---|"]
        for key, label in (("latency_p50_s", "latency p50 s"), ("ttft_p50_s", "TTFT p50 s"),
                           ("tokens_per_s", "tok/s")):
            lines.append(f"| {label} | {median(single, key):.3f} | {median(r1, key):.3f} | "
                         f"{paired(r1, single, key, ratio=False):+.3f} |")
        lines.append("")
    for phase, a, b, title in (("scale", "r2", "single", "2 Ray replicas x 1 thread vs one "
                                "process x 2 threads"),
                               ("routing", "r2", "p2", "prefix affinity vs power of two, chats "
                                "sharing 4 system prompts")):
        if phase not in cells:
            continue
        lines += [f"{title}:", "", f"| concurrency | {b} tok/s | {a} tok/s | {a}/{b} | "
                  f"{b} p50 / p99 s | {a} p50 / p99 s |", "|---|---|---|---|---|---|"]
        for level in cells[phase][a]:
            x, y = cells[phase][a][level], cells[phase][b][level]
            lines.append(f"| {level} | {median(y, 'tokens_per_s'):.1f} | "
                         f"{median(x, 'tokens_per_s'):.1f} | {paired(x, y, 'tokens_per_s'):.2f} | "
                         f"{median(y, 'latency_p50_s'):.2f} / {median(y, 'latency_p99_s'):.2f} | "
                         f"{median(x, 'latency_p50_s'):.2f} / {median(x, 'latency_p99_s'):.2f} |")
        lines.append("")
    errors = sum(row["errors"] for p in cells.values() for s in p.values() for rows in s.values()
                 for row in rows)
    lines.append(f"Errors across all cells: {errors}.")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--duration", type=float, default=12.0, help="seconds per cell")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--workload", default="chat", help="bench workload of the scale phase")
    ap.add_argument("--phases", default="overhead,scale,routing")
    ap.add_argument("--out", default="docs/results/ray_serve")
    args = ap.parse_args()
    phases = set(args.phases.split(","))
    levels = [int(x) for x in args.concurrency.split(",")]

    import ray
    from ray import serve

    from verispec.serving.ray_app import build_app

    single_port = free_port()
    single = subprocess.Popen(
        [sys.executable, "-m", "verispec.cli", "serve", "--model", args.model, "--port",
         str(single_port), "--max-num-seqs", "16", "--log-level", "warning"],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(REPO)})
    ray_port = free_port()
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": ray_port})
        base = {"model": args.model, "max_num_seqs": 8}
        apps = {"r1": {"replicas": 1, "replica_cpus": 2, "threads": 2},
                "r2": {"replicas": 2, "replica_cpus": 1, "threads": 1},
                "p2": {"replicas": 2, "replica_cpus": 1, "threads": 1, "routing": "pow2"}}
        wanted = ({"r1"} if "overhead" in phases else set()) | \
                 ({"r2"} if phases & {"scale", "routing"} else set()) | \
                 ({"p2"} if "routing" in phases else set())
        for name in sorted(wanted):
            serve.run(build_app({**base, **apps[name]}), name=name, route_prefix=f"/{name}",
                      blocking=False)
        urls = {name: f"http://127.0.0.1:{ray_port}/{name}" for name in wanted}
        urls["single"] = f"http://127.0.0.1:{single_port}"
        for name, url in urls.items():
            wait_health(url, None if name == "single" else apps[name]["replicas"])
        cells: dict = {}
        if "overhead" in phases:
            measure(cells, "overhead", {k: urls[k] for k in ("single", "r1")}, [1], args)
        if "scale" in phases:
            measure(cells, "scale", {k: urls[k] for k in ("single", "r2")}, levels, args)
        if "routing" in phases:
            measure(cells, "routing", {k: urls[k] for k in ("r2", "p2")},
                    [lv for lv in levels if lv > 1], args, prompts=shared_prefix_prompts())
    finally:
        serve.shutdown()
        ray.shutdown()
        single.terminate()
        single.wait(60)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "cells": cells}, indent=1))
    text = report(cells, args)
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
