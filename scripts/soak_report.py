"""The soak test's report (scripts/soak.py): per minute the requests, their p50 and
p99 latency, the server's RSS and the KV/queue gauges; the outcomes over the run;
the goals checked; a plot of latency, RSS and gauges over time.

    python scripts/soak_report.py OUT/soak.json     # rewrite OUT/soak.md and OUT/soak.png
"""
from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np

WARM_UP_SHARE = 1 / 6  # the first sixth of the run (5 min of 30) is warm-up for the RSS goal
RSS_BAND = 0.05  # goal: RSS within 5% after warm-up
# The RSS goal: over the whole minutes of traffic after the warm-up, (max - min) / min of
# the per-minute mean RSS is within RSS_BAND, and the RSS once the server is idle at the
# end is no higher than the highest of those minutes. The idle end is not held to the band:
# a server that gives its requests' memory back when they finish ends lower, and should.
# The idle end is the settled sample (scripts/soak.py: every client finished, the gauges
# at 0, then a fixed wait); the drained sample, at the first instant the gauges read 0, is
# reported beside it. A run recorded before the settled sample existed has only the drained
# one, and is judged by it.


def per_minute(result: dict) -> list[dict]:
    """One row per minute of traffic (requests by their start)."""
    minutes = max(1, math.ceil(result["traffic_seconds"] / 60))
    rows = []
    for m in range(minutes):
        mine = [r for r in result["records"] if m * 60 <= r["start"] < (m + 1) * 60]
        done = [r["latency"] for r in mine if r["outcome"] in ("ok", "mismatch", "invalid")]
        samples = [s for s in result["samples"] if m * 60 <= s["at"] < (m + 1) * 60]
        rss = [s["rss_mb"] for s in samples if s["rss_mb"] is not None]
        row = {"minute": m + 1, "requests": len(mine), "answered": len(done),
               "p50": float(np.percentile(done, 50)) if done else None,
               "p99": float(np.percentile(done, 99)) if done else None,
               "rss_mb": float(np.mean(rss)) if rss else None,
               "rejected": sum(r["outcome"] == "rejected" for r in mine)}
        for name in ("queue_depth", "running_requests", "kv_caches"):
            values = [s["gauges"][name] for s in samples]
            row[name] = max(values) if values else None
        rows.append(row)
    return rows


def goals(result: dict, rows: list[dict]) -> dict:
    outcomes = Counter(r["outcome"] for r in result["records"])
    statuses = Counter(r["status"] for r in result["records"])
    server_errors = sum(n for status, n in statuses.items() if status and status >= 500)
    traffic = rows[:max(1, int(result["traffic_seconds"] // 60))]
    warm = math.ceil(len(traffic) * WARM_UP_SHARE)
    rss = [r["rss_mb"] for r in traffic[warm:] if r["rss_mb"] is not None]
    spread = (max(rss) - min(rss)) / min(rss) if rss else None
    end_rss = result["final"]["rss_mb"]
    flat = spread is not None and spread <= RSS_BAND and end_rss is not None \
        and end_rss <= max(rss)
    final = result["final"]["gauges"]
    return {
        "zero 5xx": server_errors == 0,
        "zero lost or mixed-up replies": outcomes["lost"] == 0 and outcomes["mismatch"] == 0,
        "every reply valid": outcomes["invalid"] == 0 and outcomes["error"] == 0,
        f"RSS flat within {RSS_BAND:.0%} after warm-up": flat,
        "gauges back to 0 at the end": not any(final.values()),
        "_rss_spread": spread, "_rss_minutes": (warm + 1, len(traffic)),
        "_rss_range": (min(rss), max(rss)) if rss else None, "_end_rss": end_rss,
        "_drained_rss": (result.get("drained") or {}).get("rss_mb"),
        "_outcomes": dict(outcomes), "_statuses": dict(statuses),
        "_server_errors": server_errors, "_final": final,
    }


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def load_line(result: dict) -> str:
    """The machine's load over the run: a soak is a reliability run, not a timing, and
    latencies mean little without it."""
    loads = [x["load"] for x in result["samples"] if x.get("load") is not None]
    text = (f"machine load (1-minute average, {result.get('cpus', '?')} CPUs): median "
            f"{np.median(loads):.2f}, max {max(loads):.2f}" if loads else "machine load: unknown")
    note = result["settings"].get("note")
    return text + (f"; {note}" if note else "")


def end_sample_text(result: dict, checked: dict) -> str:
    """How the idle end was read, and what it read."""
    end = _cell(checked["_end_rss"], ".0f")
    if "settle_seconds" not in result:
        return (f"idle at the end: {end} MiB, read as soon as the gauges read 0 (goal: no "
                "higher than that maximum)")
    return (f"idle at the end: {end} MiB, read {result['settle_seconds']:g} s after every "
            "client had finished and the gauges first read 0 (goal: no higher than that "
            f"maximum); at that first instant (the drained sample, not used for the goal): "
            f"{_cell(checked['_drained_rss'], '.0f')} MiB")


def markdown(result: dict, rows: list[dict], checked: dict) -> str:
    s = result["settings"]
    lines = [f"soak: {s['minutes']:g} min, {s['clients']} steady clients, a burst of "
             f"{s['burst']} every {s['burst_every']:g} s, {s['hang_up']:.0%} of streams hung "
             f"up, max_num_seqs {s['max_num_seqs']}, max_queue {s['max_queue']}; "
             f"{len(result['records'])} requests over {len(result['templates'])} templates", "",
             load_line(result), "", "| goal | result |", "|---|---|"]
    lines += [f"| {goal} | {'PASS' if met else '**FAIL**'} |" for goal, met in checked.items()
              if not goal.startswith("_")]
    spread, (first, last) = checked["_rss_spread"], checked["_rss_minutes"]
    low, high = checked["_rss_range"] or (None, None)
    lines += ["", f"outcomes: {checked['_outcomes']}; HTTP statuses: {checked['_statuses']}; "
              f"gauges at the end: {checked['_final']}", "",
              f"RSS after warm-up: the per-minute mean RSS (sampled every "
              f"{result.get('sample_every', 10):g} s) over minutes {first}-{last} of traffic "
              f"spans {_cell(low, '.0f')}-{_cell(high, '.0f')} MiB, a spread (max - min) / min "
              f"of {_cell(spread and 100 * spread, '.2f')}% (goal {RSS_BAND:.0%}); "
              + end_sample_text(result, checked), "",
              "| minute | requests | answered | 429 | p50 s | p99 s | RSS MiB | queue max | "
              "running max | KV caches max |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['minute']} | {r['requests']} | {r['answered']} | {r['rejected']} | "
                     f"{_cell(r['p50'], '.2f')} | {_cell(r['p99'], '.2f')} | "
                     f"{_cell(r['rss_mb'], '.0f')} | {_cell(r['queue_depth'], '.0f')} | "
                     f"{_cell(r['running_requests'], '.0f')} | {_cell(r['kv_caches'], '.0f')} |")
    bad = [r for r in result["records"] if r["outcome"] in ("mismatch", "invalid", "error", "lost")]
    if bad:
        lines += ["", "first failures:"] + [f"- {r['template']} at {r['start']:.0f}s: "
                                            f"{r['outcome']} {r['detail']}" for r in bad[:10]]
    return "\n".join(lines) + "\n"


def plot(result: dict, rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, mem, gauge) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    minutes = [r["minute"] for r in rows]
    lat.plot(minutes, [r["p50"] for r in rows], marker="o", label="p50")
    lat.plot(minutes, [r["p99"] for r in rows], marker="o", label="p99")
    lat.set_ylabel("latency (s)")
    lat.legend()
    samples = result["samples"]
    at = [s["at"] / 60 for s in samples]
    mem.plot(at, [s["rss_mb"] for s in samples])
    for name, marker in (("drained", "x"), ("final", "o")):
        if name in result and "settle_seconds" in result:
            mem.plot(result[name]["at"] / 60, result[name]["rss_mb"], marker, label=
                     "idle end: " + ("drained" if name == "drained" else "settled"))
    if "settle_seconds" in result:
        mem.legend()
    mem.set_ylabel("server RSS (MiB)")
    for name in ("queue_depth", "running_requests", "kv_caches"):
        gauge.plot(at, [s["gauges"][name] for s in samples], label=name)
    gauge.set_ylabel("gauge")
    gauge.set_xlabel("minute of traffic")
    gauge.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(result: dict, out: Path) -> str:
    rows = per_minute(result)
    checked = goals(result, rows)
    text = markdown(result, rows, checked)
    (out / "soak.md").write_text(text, encoding="utf-8")
    plot(result, rows, out / "soak.png")
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="soak.json from scripts/soak.py")
    path = Path(p.parse_args().results)
    print(write_report(json.loads(path.read_text(encoding="utf-8")), path.parent))


if __name__ == "__main__":
    main()
