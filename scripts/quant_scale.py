"""Plain decoding at scale, verispec against llama.cpp, each in a process of its own:
for each GGUF file (synthetic ones from scripts/synth_gguf.py, or `default`), at each
thread count, ms per decoded token by wall time, peak RSS, and verispec's T(n)/T(1) in
wall and CPU time; a plot against model size; optionally the end-to-end speedup each
size's curve projects per workload.

Each round runs, per thread count, one verispec child (load, prefill --context tokens,
decode --steps tokens one forward each, then one n-token forward per n of --ns, rolled
back) and one `llama-bench -p 0 -n STEPS -d CONTEXT` (the same depth and token count),
back to back, in an order that alternates between rounds. The comparison is llama.cpp's
time over verispec's within each round, the median over --repeats rounds with their range;
each engine's own figures are medians over the rounds. A token's time is the mean over the
steps of one run. Run it alone on the machine (cpulock -x): both are
timed by the wall clock. llama-bench comes from scripts/build_llama_cpp.sh
(verispec.bench.llamaserver.find_tool) or --llama-bench.

The projection (--alphas-from) is what `verispec calc --alpha A --profile P` computes:
the best k for acceptance A on the measured wall-time curve. A is BORROWED from a
`verispec bench` run on the default 135M model (random weights have no acceptance of
their own): it says what the same drafts would give at that size's cost, not what a
real model of that size accepts.

    /work/bin/cpulock -x -- python scripts/quant_scale.py --files default \\
        synth/synth-0.5b-Q4_K_M.gguf --out docs/results/quant_scale
    /work/bin/cpulock -x -- python scripts/quant_scale.py --add --files \\
        synth/synth-8b-Q4_K_M.gguf --steps 16 --out docs/results/quant_scale
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's verispec

HERE = Path(__file__).resolve()


def verispec_child(model: str, threads: int, weights: str, context: int, steps: int,
                   ns: list[int], curve_repeats: int) -> dict:
    """Runs in a fresh process: plain decode wall and CPU ms per token, the n-token
    forward's cost per n (median of `curve_repeats`, interleaved over n), and the peak
    RSS (MiB)."""
    import torch
    from quant_speed import cost_curve  # scripts/, beside this file

    from verispec.bench.collector import frozen_heap
    from verispec.models.loading import load_target

    torch.set_num_threads(threads)
    loaded = load_target(model, dtype="bf16", weights=weights)
    target = loaded.target
    tokens = list(range(1000, 1000 + context + steps + max(ns) + 1))
    cache = target.new_cache(context + steps + max(ns) + 2)
    with torch.inference_mode(), frozen_heap():
        target.forward(torch.tensor(tokens[:context]), cache, num_logits=1)
        target.forward(torch.tensor([tokens[context]]), cache)  # one untimed step
        wall, cpu = time.perf_counter(), time.process_time()
        for token in tokens[context + 1:context + 1 + steps]:
            target.forward(torch.tensor([token]), cache)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        curve_cpu: dict = {}
        curve = cost_curve(target, tokens, context + 1 + steps, ns, curve_repeats, curve_cpu,
                           cache=cache)
    return {"weights": getattr(loaded, "weights", weights), "ms": 1e3 * wall / steps,
            "cpu_ms": 1e3 * cpu / steps, "tn_ms": curve, "tn_cpu_ms": curve_cpu,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def spawn_measured(cmd: list[str]) -> tuple[str, float]:
    """stdout of `cmd` and its peak RSS in MiB: the child is reaped here (wait4), so the
    rusage is that child's own."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        from verispec.bench.llamaserver import exit_text

        sys.exit(f"quant_scale: {' '.join(cmd[:3])}... {exit_text(proc.returncode)}:\n{err[-2000:]}")
    return out, usage.ru_maxrss / 1024


def measure_verispec(model: str, threads: int, args) -> dict:
    cmd = [sys.executable, str(HERE), "--child", model, "--threads", str(threads),
           "--weights", args.weights, "--context", str(args.context), "--steps", str(args.steps),
           "--ns", args.ns, "--curve-repeats", str(args.curve_repeats)]
    out, _ = spawn_measured(cmd)
    result = json.loads(out.strip().splitlines()[-1])
    for key in ("tn_ms", "tn_cpu_ms"):  # JSON made the n strings
        result[key] = {int(n): v for n, v in result[key].items()}
    return result


def measure_llamacpp(gguf: Path, threads: int, args) -> dict:
    cmd = [str(args.llama_bench), "-m", str(gguf), "-p", "0", "-n", str(args.steps), "-d",
           str(args.context), "-t", str(threads), "-r", "1", "-o", "json"]
    out, rss = spawn_measured(cmd)
    test = json.loads(out)[0]
    return {"ms": test["samples_ns"][0] / 1e6 / args.steps, "rss_mib": rss,
            "build": f"{test.get('build_commit', '?')} b{test.get('build_number', '?')}",
            "cpu_info": test.get("cpu_info")}


def gguf_file(model: str) -> Path:
    from verispec.models.loading import gguf_source

    path = gguf_source(model)
    if path is None:
        sys.exit(f"quant_scale: {model} is not a GGUF file (or `default`)")
    return path


def params_b(gguf: Path) -> float:
    import math

    from verispec.models.gguf_file import GGUFFile

    return sum(math.prod(t.shape) for t in GGUFFile(gguf).tensors.values()) / 1e9


def measure_file(model: str, args) -> list[dict]:
    gguf = gguf_file(model)
    size = params_b(gguf)
    print(f"== {gguf.name}: {size:.2f}B parameters, {gguf.stat().st_size / 2**20:.0f} MiB",
          flush=True)
    runs: dict[int, dict[str, list[dict]]] = {t: {"verispec": [], "llamacpp": []}
                                              for t in args.thread_list}
    for rnd in range(args.repeats):
        for threads in args.thread_list:
            order = ["verispec", "llamacpp"][::1 if rnd % 2 == 0 else -1]
            for who in order:
                result = (measure_verispec(model, threads, args) if who == "verispec"
                          else measure_llamacpp(gguf, threads, args))
                runs[threads][who].append(result)
                print(f"  round {rnd + 1} threads {threads} {who}: {result['ms']:.2f} ms/token",
                      flush=True)
    rows = []
    for threads, got in runs.items():
        v, ll = got["verispec"], got["llamacpp"]
        med = lambda rs, key: statistics.median(r[key] for r in rs)  # noqa: E731
        ns = sorted(v[0]["tn_ms"])
        tn = {n: statistics.median(r["tn_ms"][n] for r in v) for n in ns}
        tn_cpu = {n: statistics.median(r["tn_cpu_ms"][n] for r in v) for n in ns}
        rows.append({"file": gguf.name, "model": model, "params_b": size,
                     "file_mib": round(gguf.stat().st_size / 2**20), "threads": threads,
                     "weights": v[0]["weights"], "verispec_ms": med(v, "ms"),
                     "verispec_ms_all": [r["ms"] for r in v], "verispec_cpu_ms": med(v, "cpu_ms"),
                     "llamacpp_ms": med(ll, "ms"), "llamacpp_ms_all": [r["ms"] for r in ll],
                     "llamacpp_build": ll[0]["build"],
                     "verispec_rss_mib": round(max(r["rss_mib"] for r in v)),
                     "llamacpp_rss_mib": round(max(r["rss_mib"] for r in ll)),
                     "tn_ms": tn, "tn_cpu_ms": tn_cpu,
                     "curve": {n: tn[n] / tn[1] for n in ns},
                     "curve_cpu": {n: tn_cpu[n] / tn_cpu[1] for n in ns}})
        profile = args.out / f"{gguf.stem}.t{threads}.profile.json"
        profile.write_text(json.dumps({"n": ns, "seconds": [tn[n] / 1e3 for n in ns],
                                       "model": model, "threads": threads,
                                       "context": args.context, "clock": "wall"}) + "\n")
        rows[-1]["profile"] = profile.name
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for threads in sorted({r["threads"] for r in rows}):
        mine = sorted((r for r in rows if r["threads"] == threads), key=lambda r: r["params_b"])
        sizes = [r["params_b"] for r in mine]
        dash = "-" if threads == 1 else ":"
        left.plot(sizes, [r["verispec_ms"] for r in mine], "o" + dash,
                  label=f"verispec ({mine[0]['weights']}), {threads} thread(s)")
        left.plot(sizes, [r["llamacpp_ms"] for r in mine], "^" + dash,
                  label=f"llama.cpp, {threads} thread(s)")
        for n, marker in ((4, "s"), (8, "o")):
            pts = [(r["params_b"], r["curve"][n]) for r in mine if n in r["curve"]]
            if pts:
                right.plot(*zip(*pts), marker + dash, label=f"T({n})/T(1), {threads} thread(s)")
    left.set(xscale="log", yscale="log", xlabel="parameters (billions)",
             ylabel="ms per token (plain decode, wall)")
    left.legend(fontsize=7)
    right.set(xscale="log", xlabel="parameters (billions)",
              ylabel="verispec verification cost, wall (one-token steps)")
    right.legend(fontsize=7)
    sizes = sorted({r["params_b"] for r in rows})
    for ax in (left, right):
        ax.set_xticks(sizes, [f"{s:.2g}B" for s in sizes])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def round_ratios(row: dict) -> list[float]:
    """llama.cpp's time over verispec's in each round, the two run back to back: above 1,
    verispec decodes faster."""
    return [ll / v for ll, v in zip(row["llamacpp_ms_all"], row["verispec_ms_all"])]


def table(rows: list[dict]) -> str:
    lines = ["| file | params | threads | llama.cpp time / verispec's, median (rounds) "
             "| verispec ms (CPU ms) | llama.cpp ms "
             "| T(2) | T(4) | T(8) | T(16) | same in CPU time: T(4), T(8), T(16) "
             "| peak RSS verispec | llama.cpp |", "|" + "---|" * 13]
    for r in sorted(rows, key=lambda r: (r["threads"], r["params_b"])):
        c, cc = r["curve"], r["curve_cpu"]
        tn = " | ".join(f"{c[n]:.2f}" if n in c else "-" for n in (2, 4, 8, 16))
        cpu = ", ".join(f"{cc[n]:.2f}" if n in cc else "-" for n in (4, 8, 16))
        ratios = round_ratios(r)
        lines.append(f"| {r['file']} | {r['params_b']:.2f}B | {r['threads']} "
                     f"| **{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}) "
                     f"| {r['verispec_ms']:.1f} ({r['verispec_cpu_ms']:.1f}) | {r['llamacpp_ms']:.1f} "
                     f"| {tn} | {cpu} | {r['verispec_rss_mib']} MiB | {r['llamacpp_rss_mib']} MiB |")
    return "\n".join(lines)


def projection(rows: list[dict], results: Path, proposer: str, out: Path) -> str:
    from verispec.bench.calculator import optimal_k
    from verispec.policy.economics import load_profile

    summary = json.loads(results.read_text())["summary"]
    alphas = {r["workload"]: r["alpha"] for r in summary
              if r["config"] == proposer and r["alpha"] is not None}
    if not alphas:
        sys.exit(f"quant_scale: no '{proposer}' rows with an acceptance in {results}")
    work = sorted(alphas)
    lines = [f"projected speedup over plain decoding (best k), BORROWED acceptance of "
             f"'{proposer}' on the default 135M model", "",
             "| file | threads | " + " | ".join(f"{w} ({alphas[w]:.2f})" for w in work) + " |",
             "|" + "---|" * (len(work) + 2)]
    for r in sorted(rows, key=lambda r: (r["threads"], r["params_b"])):
        cost = load_profile(out / r["profile"])
        best = {w: optimal_k(alphas[w], cost, k_max=max(r["curve"]) - 1) for w in work}
        lines.append(f"| {r['file']} | {r['threads']} | " + " | ".join(
            f"{best[w].speedup:.2f}x (k={best[w].k})" for w in work) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[-1])
    p.add_argument("--files", nargs="+",
                   help="GGUF files, or default (the embedded model); without it, the tables "
                        "of --out/scale.json are printed again")
    p.add_argument("--threads", default="1,2", help="comma list (default 1,2)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; medians over them (default 3)")
    p.add_argument("--steps", type=int, default=32, help="decoded tokens per run (default 32)")
    p.add_argument("--context", type=int, default=200, help="tokens before decoding (default 200)")
    p.add_argument("--ns", default="1,2,3,4,5,6,8,12,16", help="the n of T(n), a comma list")
    p.add_argument("--curve-repeats", type=int, default=3,
                   help="timings of each n-token forward per run (default 3)")
    p.add_argument("--weights", default="auto", help="verispec's --weights (default auto)")
    p.add_argument("--llama-bench", type=Path, default=None, help="the llama-bench binary")
    p.add_argument("--alphas-from", type=Path, default=None, metavar="RESULTS_JSON",
                   help="a `verispec bench` results.json on the default model: the borrowed "
                        "acceptance of the projection (none without it)")
    p.add_argument("--proposer", default="ngram", help="the bench config whose acceptance is borrowed")
    p.add_argument("--out", type=Path, default=Path("quant-scale"))
    p.add_argument("--add", action="store_true",
                   help="keep the other files' rows of an earlier --out/scale.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    ns = sorted({1, *(int(n) for n in args.ns.split(","))})
    if args.child:
        print(json.dumps(verispec_child(args.child, int(args.threads), args.weights,
                                        args.context, args.steps, ns, args.curve_repeats)))
        return 0
    earlier = args.out / "scale.json"
    if not args.files and not earlier.exists():
        p.error(f"--files is required (no {earlier} to report on)")
    if args.files and args.llama_bench is None:
        from verispec.bench.llamaserver import BUILD_HINT, find_tool

        args.llama_bench = find_tool("llama-bench")
        if args.llama_bench is None:
            p.error(f"no llama-bench found: {BUILD_HINT}, or give --llama-bench PATH")
    args.thread_list = [int(t) for t in args.threads.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [row for model in args.files or [] for row in measure_file(model, args)]
    if (args.add or not args.files) and earlier.exists():
        done = {(r["file"], r["threads"]) for r in rows}
        rows += [r for r in json.loads(earlier.read_text())["rows"]
                 if (r["file"], r["threads"]) not in done]
    for r in rows:  # JSON keys are strings; the curves are read by int n
        for key in ("tn_ms", "tn_cpu_ms", "curve", "curve_cpu"):
            r[key] = {int(n): v for n, v in r[key].items()}
    earlier.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    plot(rows, args.out / "scale.png")
    print("\nplain decode by wall time: llama.cpp's ms per token over verispec's in each round "
          "(median, and the rounds' range), each engine's median ms per token; T(n) = verispec's "
          "n-token forward over its 1-token one, wall time\n")
    print(table(rows))
    if args.alphas_from:
        print("\n" + projection(rows, args.alphas_from, args.proposer, args.out))
    print(f"\nwrote {earlier} and {args.out / 'scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
