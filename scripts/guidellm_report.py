"""Read a guidellm JSON report (guidellm 0.8's `--output kind=json`) into table cells:
one row per benchmark (concurrency level), medians of the successful requests. Plain
JSON reading, so it needs neither guidellm nor its environment."""
from __future__ import annotations

import json
from pathlib import Path


def _median(metrics: dict, name: str) -> float:
    return float(metrics[name]["successful"]["median"])


def rows(path: str | Path) -> list[list[str]]:
    """[streams, successful/errored requests, request latency s, TTFT ms, ITL ms,
    output tokens/s] per benchmark in the report."""
    report = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for bench in report["benchmarks"]:
        strategy = bench["config"]["strategy"]
        metrics = bench["metrics"]
        totals = metrics["request_totals"]
        out.append([str(strategy.get("streams", strategy.get("type_"))),
                    f"{totals['successful']} ok / {totals['errored']} errored",
                    f"{_median(metrics, 'request_latency'):.2f}",
                    f"{_median(metrics, 'time_to_first_token_ms'):.0f}",
                    f"{_median(metrics, 'inter_token_latency_ms'):.1f}",
                    f"{float(metrics['output_tokens_per_second']['successful']['mean']):.1f}"])
    return out
