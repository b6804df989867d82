"""Cost at scale: for each GGUF file (synthetic ones from scripts/synth_gguf.py),
plain ms per token, T(n)/T(1) and peak RSS for verispec quantized, verispec
dense bf16 (where it fits) and llama.cpp, a plot against model size, and the
end-to-end speedup each size's measured cost curve projects per workload.

The projection is what `verispec calc --alpha A --profile P` computes: the best
k for acceptance A on cost curve P. A is BORROWED: it is the acceptance that
`verispec bench` measured on the default 135M model (random weights have no
meaningful acceptance), so the projection says what the same drafts would give
on a model of that size's cost, not what a real model of that size accepts.

    python scripts/synth_gguf.py --size 0.5b        # and 1.5b, 3b, 8b
    python scripts/quant_scale.py --files /work/synth/synth-{0.5b,1.5b,3b}-Q4_K_M.gguf --threads 1,2 \\
        --alphas-from bench-results/<run>/results.json --out docs/results/quant_scale
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's verispec

from verispec.bench.calculator import optimal_k
from verispec.policy.economics import load_profile

HERE = Path(__file__).resolve().parent


def borrowed_alphas(results: Path, proposer: str) -> dict[str, float]:
    """workload -> alpha of `proposer` in a `verispec bench` results.json."""
    summary = json.loads(results.read_text())["summary"]
    found = {r["workload"]: r["alpha"] for r in summary if r["config"] == proposer and r["alpha"] is not None}
    if not found:
        configs = sorted({r["config"] for r in summary})
        sys.exit(f"quant_scale: no '{proposer}' rows with an acceptance in {results} (configs: {configs})")
    return found


def params(file: Path) -> float:
    import math

    from verispec.models.gguf_file import GGUFFile

    return sum(math.prod(t.shape) for t in GGUFFile(file).tensors.values()) / 1e9


def measure(file: Path, out: Path, threads: str, dense: bool, steps: int, ns: str) -> dict:
    stem = out / file.stem
    base = [sys.executable, str(HERE / "quant_speed.py"), "--model", str(file), "--threads", threads]
    if not dense:
        base.append("--no-dense")
    speed = subprocess.run(base + ["--steps", str(steps), "--ns", ns, "--repeats", "3",
                                   "--json", f"{stem}.speed.json",
                                   "--profile-out", f"{stem}.t{{threads}}.profile.json"],
                           text=True, capture_output=True)
    if speed.returncode:
        sys.exit(f"quant_scale: {file.name}: quant_speed failed:\n{speed.stderr[-2000:]}")
    print(speed.stdout, end="", flush=True)
    rss_base = [a if a != threads else threads.split(",")[0] for a in base]
    rss = subprocess.run(rss_base + ["--rss", "--json", f"{stem}.rss.json"], text=True, capture_output=True)
    if rss.returncode:
        sys.exit(f"quant_scale: {file.name}: RSS run failed:\n{rss.stderr[-2000:]}")
    print(rss.stdout, end="", flush=True)
    return {"speed": json.loads(Path(f"{stem}.speed.json").read_text()),
            "rss": json.loads(Path(f"{stem}.rss.json").read_text()),
            "profile": f"{stem}.t{{threads}}.profile.json"}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    names = {"quant": "verispec quantized", "dense": "verispec dense bf16", "llamacpp": "llama.cpp"}
    for threads in sorted({r["threads"] for r in rows}):
        mine = [r for r in rows if r["threads"] == threads]
        sizes = [r["params_b"] for r in mine]
        dash = "-" if threads == 1 else ":"
        for kind, marker in (("quant", "o"), ("dense", "s"), ("llamacpp", "^")):
            pts = [(s, r["ms"][kind]) for s, r in zip(sizes, mine) if kind in r["ms"]]
            if pts:
                left.plot(*zip(*pts), marker + dash, label=f"{names[kind]}, {threads} thread(s)")
        right.plot(sizes, [r["t8"] for r in mine], "o" + dash, label=f"T(8)/T(1), {threads} thread(s)")
        right.plot(sizes, [r["t4"] for r in mine], "s" + dash, label=f"T(4)/T(1), {threads} thread(s)")
    left.set(xscale="log", yscale="log", xlabel="parameters (billions)", ylabel="ms per token (plain decode)")
    left.legend(fontsize=7)
    right.set(xscale="log", xlabel="parameters (billions)", ylabel="verification cost, one-token steps")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[-1])
    p.add_argument("--files", nargs="+", type=Path, required=True, help="GGUF files, smallest first")
    p.add_argument("--alphas-from", type=Path, required=True, metavar="RESULTS_JSON",
                   help="a `verispec bench` results.json on the default model: the borrowed acceptance")
    p.add_argument("--proposer", default="ngram", help="the bench config whose acceptance is borrowed")
    p.add_argument("--threads", default="1", help="comma list, e.g. 1,2 (RSS at the first)")
    p.add_argument("--dense-max", type=float, default=1.6,
                   help="run the dense bf16 contender up to this many billion parameters (memory)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--ns", default="1,2,3,4,5,6,8,12,16", help="the n of T(n), a comma list")
    p.add_argument("--out", type=Path, default=Path("quant-scale"))
    p.add_argument("--add", action="store_true",
                   help="keep the other files' rows of an earlier --out/scale.json (same alphas)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    alphas = borrowed_alphas(args.alphas_from, args.proposer)
    rows = []
    for file in args.files:
        size = params(file)
        print(f"== {file.name}: {size:.2f}B parameters", flush=True)
        m = measure(file, args.out, args.threads, size <= args.dense_max, args.steps, args.ns)
        for threads, t in m["speed"]["threads"].items():
            # One thread: CPU time (the shared machine's load inflates wall time several-fold).
            curve = {int(n): v for n, v in t["quant_tn_cpu_ms" if int(threads) == 1 else "quant_tn_ms"].items()}
            cost = load_profile(m["profile"].replace("{threads}", str(threads)))
            projected = {w: optimal_k(a, cost, k_max=max(curve) - 1) for w, a in alphas.items()}
            rows.append({"file": file.name, "params_b": size, "threads": int(threads), "ms": t["decode_ms"],
                         "cpu_ms": t.get("decode_cpu_ms", {}),
                         "bound_ms": t["quant_bound_ms"], "curve": {n: v / curve[1] for n, v in curve.items()},
                         "t4": curve[4] / curve[1], "t8": curve[8] / curve[1],
                         "rss": {r["kind"]: r["decode_peak_mib"] for r in m["rss"]["rss"]},
                         "file_mib": m["rss"]["file_mib"],
                         "projected": {w: {"k": o.k, "speedup": o.speedup} for w, o in projected.items()}})
    earlier = args.out / "scale.json"
    if args.add and earlier.exists():
        done = {(r["file"], r["threads"]) for r in rows}
        rows += [r for r in json.loads(earlier.read_text())["rows"] if (r["file"], r.get("threads", 1)) not in done]
        rows.sort(key=lambda r: (r.get("threads", 1), r["params_b"]))
    (args.out / "scale.json").write_text(json.dumps({"alphas": alphas, "proposer": args.proposer,
                                                     "threads": args.threads, "rows": rows}, indent=1) + "\n")
    plot(rows, args.out / "scale.png")
    print("\nplain decode; bound = the quantized weight bytes of a token over the read bandwidth "
          "measured in the same run; RSS = peak while decoding (MiB, first thread count)")
    print("| file | params | threads | file MiB | quant ms | dense ms | llama.cpp ms | llama.cpp / quant "
          "| same, CPU time | quant bound reached | T(2) | T(4) | T(8) | T(16) (/T(1)) | RSS quant | RSS dense "
          "| RSS llama.cpp |")
    print("|" + "---|" * 17)
    for r in rows:
        ms = r["ms"]
        cells = [f"{ms[k]:.1f}" if k in ms else "-" for k in ("quant", "dense", "llamacpp")]
        ratio = f"{ms['llamacpp'] / ms['quant']:.2f}x" if "llamacpp" in ms else "-"
        cpu = r.get("cpu_ms", {})
        ratio += f" | {cpu['llamacpp'] / cpu['quant']:.2f}x" if "llamacpp" in cpu else " | -"
        rss = [str(r["rss"].get(k, "-")) for k in ("quant", "dense", "llamacpp")]
        curve = r.get("curve", {})
        tn = [f"{curve[str(n)] if str(n) in curve else curve.get(n, float('nan')):.2f}" for n in (2, 4, 8, 16)]
        reached = f"{r['bound_ms'] / ms['quant']:.0%}" if "bound_ms" in r else "-"
        print(f"| {r['file']} | {r['params_b']:.2f}B | {r.get('threads', 1)} | {r['file_mib']} | "
              + " | ".join(cells) + f" | {ratio} | {reached} | " + " | ".join(tn) + " | " + " | ".join(rss) + " |")
    workloads = sorted(alphas)
    print(f"\nprojected speedup over plain decoding (best k), BORROWED acceptance of '{args.proposer}' "
          "on the default 135M model")
    print("| file | threads | " + " | ".join(f"{w} (alpha {alphas[w]:.2f})" for w in workloads) + " |")
    print("|" + "---|" * (len(workloads) + 2))
    for r in rows:
        print(f"| {r['file']} | {r.get('threads', 1)} | " + " | ".join(
            f"{r['projected'][w]['speedup']:.2f}x (k={r['projected'][w]['k']})" for w in workloads) + " |")
    print(f"\nwrote {args.out / 'scale.json'} and {args.out / 'scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
