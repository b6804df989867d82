"""`verispec bench --concurrency 1,2,4,8,16` and `verispec bench --server URL`:
throughput and latency per concurrency for plain decoding (`none`), a fixed k,
and adaptive k (chosen per step from the cost curve, shrinking under load).

Without --server, the model is loaded here and served in-process on a free
loopback port, so the numbers include HTTP and streaming like a real client's.
All three modes are sent to the same server as per-request `speculation`
settings, interleaved per concurrency level, so they share its warm state and
the machine's conditions. With `--rounds R` each level runs the rotation R
times; a cell is the median over rounds, and the ratio column is the median of
the per-round ratios to `none` (paired, so drift between rounds cancels).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verispec.cli.args import engine_from
from verispec.serving.load import LoadConfig, format_row, run_load


@dataclass(frozen=True)
class Mode:
    label: str
    speculation: dict


CONTROL = "none again"


def modes(proposer: str, k: int, control: bool = False) -> list[Mode]:
    """`control` adds a second `none`: its ratio to the first is an A/A comparison,
    the noise band of this run, against which "adaptive is not slower" is read."""
    listed = [Mode("none", {"proposer": "none"}),
              Mode(f"{proposer} k={k}", {"proposer": proposer, "k": k}),
              Mode(f"{proposer} adaptive", {"proposer": proposer, "k": "auto"})]
    return listed + [Mode(CONTROL, {"proposer": "none"})] if control else listed


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"--concurrency takes a comma list of whole numbers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise ValueError(f"--concurrency levels must be >= 1, got {text!r}")
    return levels


def combine(rounds: list[dict]) -> dict:
    """One cell from its rounds' summaries: medians of the numbers, errors summed."""
    cell = {key: float(np.median([r[key] for r in rounds])) for key, value in rounds[0].items()
            if isinstance(value, (int, float)) and key not in ("errors", "requests")}
    cell["errors"] = sum(r["errors"] for r in rounds)
    cell["requests"] = sum(r["requests"] for r in rounds)
    cell["rounds"] = rounds
    return cell


def round_ratios(results: dict[str, dict[int, dict]], label: str, level: int) -> list[float]:
    """This mode's throughput over none's, round by round (paired)."""
    pairs = zip(results[label][level]["rounds"], next(iter(results.values()))[level]["rounds"])
    return [m["tokens_per_s"] / b["tokens_per_s"] if b["tokens_per_s"] else np.nan
            for m, b in pairs]


def ratio_to_none(results: dict[str, dict[int, dict]], label: str, level: int) -> float:
    """Median over rounds of this mode's throughput over none's in the same round."""
    return float(np.median(round_ratios(results, label, level)))


def markdown(results: dict[str, dict[int, dict]], levels: list[int]) -> str:
    labels = list(results)
    adaptive = next(m for m in labels if m.endswith("adaptive"))
    head = ["concurrency"] + [f"{m} tok/s" for m in labels] + [f"{m} p50/p99 s" for m in labels] \
        + [f"{adaptive} tau"] + [f"{m} / none" for m in labels[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in levels:
        rows = [results[m][c] for m in labels]
        lines.append("| " + " | ".join(
            [str(c)] + [f"{r['tokens_per_s']:.1f}" for r in rows]
            + [f"{r['latency_p50_s']:.2f}/{r['latency_p99_s']:.2f}" for r in rows]
            + [f"{results[adaptive][c]['tau']:.2f}"]
            + [f"{ratio_to_none(results, m, c):.2f}x" for m in labels[1:]]) + " |")
    if len(results[labels[0]][levels[0]]["rounds"]) > 1:
        # Medians hide the spread that decides "within noise": show every paired round.
        others = labels[1:]
        lines += ["", "Per-round ratios to `none`:", "",
                  "| concurrency | " + " | ".join(others) + " |", "|---|" + "---|" * len(others)]
        for c in levels:
            cells = [", ".join(f"{r:.2f}" for r in round_ratios(results, m, c)) for m in others]
            lines.append("| " + " | ".join([str(c)] + cells) + " |")
    errors = sum(r["errors"] for m in labels for r in results[m].values())
    if errors:
        lines.append(f"\n{errors} request(s) failed; see results.json")
    return "\n".join(lines) + "\n"


def plot(path: Path, results: dict[str, dict[int, dict]], levels: list[int]) -> Path:
    from verispec.bench.plots import plt, save_figure

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.6))
    for label, rows in results.items():
        left.plot(levels, [rows[c]["tokens_per_s"] for c in levels], marker="o", label=label)
        right.plot(levels, [rows[c]["latency_p50_s"] for c in levels], marker="o", label=label)
    for ax, title in ((left, "throughput (output tokens/s)"), (right, "latency p50 (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
    left.legend()
    return save_figure(fig, path)


def run(url: str, levels: list[int], mode_list: list[Mode], args) -> dict[str, dict[int, dict]]:
    rounds = getattr(args, "rounds", 1)
    results: dict[str, dict[int, dict]] = {m.label: {} for m in mode_list}
    # A short warm-up: first kernel shapes and the server's cost curve at small widths.
    run_load(LoadConfig(url, 1, min(3.0, args.duration), 8, workload=args.workload))
    for level in levels:
        seen: dict[str, list[dict]] = {m.label: [] for m in mode_list}
        for r in range(rounds):
            # Rotate the order each round, so no mode always follows the same one.
            for mode in mode_list[r % len(mode_list):] + mode_list[:r % len(mode_list)]:
                report = run_load(LoadConfig(url, level, args.duration, args.max_new_tokens,
                                             args.temperature, speculation=mode.speculation,
                                             workload=args.workload))
                summary = report.summary()
                seen[mode.label].append(summary)
                print(format_row(summary, f"[{mode.label} round {r + 1}/{rounds}] "),
                      file=sys.stderr, flush=True)
        for label, summaries in seen.items():
            results[label][level] = combine(summaries)
    return results


def cmd_bench_serving(args: argparse.Namespace) -> int:
    levels = parse_levels(args.concurrency or "1")
    if getattr(args, "rounds", 1) < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    speculative = [p for p in args.proposer.split(",") if p not in ("none", "")]
    proposer = speculative[0] if speculative else "ngram"
    if proposer.startswith("self:"):
        raise ValueError("--concurrency takes a registered proposer name (ngram, auto, ...); "
                         "serve a draft with `verispec serve --draft` and use --server")
    mode_list = modes(proposer, args.k, getattr(args, "control", False))
    out = Path(args.out or Path("bench-results") / time.strftime("serving-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    if args.server:
        results = run(args.server, levels, mode_list, args)
        env = {"server": args.server}
    else:
        from verispec.bench.runner import environment
        from verispec.serving.protocol import ServeDefaults
        from verispec.serving.scheduler import SchedulerConfig
        from verispec.serving.server import ServerConfig, ServerThread, create_app

        engine = engine_from(args)
        config = ServerConfig(("bench",), ServeDefaults(proposer=proposer, k=max(args.k, 8)),
                              SchedulerConfig(max_num_seqs=max(levels), max_queue=4 * max(levels)))
        with ServerThread(create_app(engine, config)) as server:
            results = run(server.url, levels, mode_list, args)
        env = environment(engine)
    table = markdown(results, levels)
    figure = plot(out / "serving.png", results, levels)
    (out / "results.json").write_text(json.dumps(
        {"environment": env, "levels": levels, "duration_s": args.duration,
         "rounds": getattr(args, "rounds", 1),
         "max_new_tokens": args.max_new_tokens, "workload": args.workload,
         "modes": {m.label: m.speculation for m in mode_list}, "results": results},
        indent=1, default=str) + "\n", encoding="utf-8")
    (out / "report.md").write_text(f"# verispec bench --concurrency\n\n{table}\n"
                                   f"![serving]({figure.name})\n", encoding="utf-8")
    print(table, end="")
    print(f"verispec bench: results in {out}/ (results.json, report.md, {figure.name})",
          file=sys.stderr)
    return 0
