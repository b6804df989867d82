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
    python scripts/quant_scale.py --files /work/synth/synth-{0.5b,1.5b,3b}-Q4_K_M.gguf \\
        --alphas-from bench-results/<run>/results.json --out docs/results/quant_scale
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's verispec

from verispec.economics import load_profile, optimal_k  # noqa: E402

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


def measure(file: Path, out: Path, threads: str, dense: bool, steps: int, max_n: int) -> dict:
    stem = out / file.stem
    base = [sys.executable, str(HERE / "quant_speed.py"), "--model", str(file), "--threads", threads]
    if not dense:
        base.append("--no-dense")
    speed = subprocess.run(base + ["--steps", str(steps), "--max-n", str(max_n), "--repeats", "3",
                                   "--json", f"{stem}.speed.json", "--profile-out", f"{stem}.profile.json"],
                           text=True, capture_output=True)
    if speed.returncode:
        sys.exit(f"quant_scale: {file.name}: quant_speed failed:\n{speed.stderr[-2000:]}")
    print(speed.stdout, end="", flush=True)
    rss = subprocess.run(base + ["--rss", "--json", f"{stem}.rss.json"], text=True, capture_output=True)
    if rss.returncode:
        sys.exit(f"quant_scale: {file.name}: RSS run failed:\n{rss.stderr[-2000:]}")
    print(rss.stdout, end="", flush=True)
    return {"speed": json.loads(Path(f"{stem}.speed.json").read_text()),
            "rss": json.loads(Path(f"{stem}.rss.json").read_text()),
            "profile": f"{stem}.profile.json"}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    sizes = [r["params_b"] for r in rows]
    for kind, style in (("quant", "o-"), ("dense", "s--"), ("llamacpp", "^-")):
        pts = [(s, r["ms"][kind]) for s, r in zip(sizes, rows) if kind in r["ms"]]
        if pts:
            left.plot(*zip(*pts), style, label={"quant": "verispec quantized", "dense": "verispec dense bf16",
                                               "llamacpp": "llama.cpp"}[kind])
    left.set(xscale="log", yscale="log", xlabel="parameters (billions)", ylabel="ms per token (plain decode)")
    left.legend()
    right.plot(sizes, [r["t8"] for r in rows], "o-", label="T(8)/T(1)")
    right.plot(sizes, [r["t4"] for r in rows], "s-", label="T(4)/T(1)")
    right.set(xscale="log", xlabel="parameters (billions)", ylabel="verification cost, one-token steps")
    right.legend()
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
    p.add_argument("--threads", default="1")
    p.add_argument("--dense-max", type=float, default=1.6,
                   help="run the dense bf16 contender up to this many billion parameters (memory)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--max-n", type=int, default=12)
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
        m = measure(file, args.out, args.threads, size <= args.dense_max, args.steps, args.max_n)
        t = next(iter(m["speed"]["threads"].values()))
        curve = {int(n): v for n, v in t["quant_tn_ms"].items()}
        cost = load_profile(m["profile"])
        projected = {w: optimal_k(a, cost, k_max=args.max_n - 1) for w, a in alphas.items()}
        rows.append({"file": file.name, "params_b": size, "ms": t["decode_ms"],
                     "t4": curve[4] / curve[1], "t8": curve[8] / curve[1],
                     "rss": {r["kind"]: r["decode_peak_mib"] for r in m["rss"]["rss"]},
                     "file_mib": m["rss"]["file_mib"],
                     "projected": {w: {"k": o.k, "speedup": o.speedup} for w, o in projected.items()}})
    earlier = args.out / "scale.json"
    if args.add and earlier.exists():
        done = {r["file"] for r in rows}
        rows += [r for r in json.loads(earlier.read_text())["rows"] if r["file"] not in done]
        rows.sort(key=lambda r: r["params_b"])
    (args.out / "scale.json").write_text(json.dumps({"alphas": alphas, "proposer": args.proposer,
                                                     "threads": args.threads, "rows": rows}, indent=1) + "\n")
    plot(rows, args.out / "scale.png")
    print(f"\nplain decode, {args.threads} thread(s); RSS = peak while decoding (MiB)")
    print("| file | params | file MiB | quant ms | dense ms | llama.cpp ms | llama.cpp / quant | T(4)/T(1) "
          "| T(8)/T(1) | RSS quant | RSS dense | RSS llama.cpp |")
    print("|" + "---|" * 12)
    for r in rows:
        ms = r["ms"]
        cells = [f"{ms[k]:.1f}" if k in ms else "-" for k in ("quant", "dense", "llamacpp")]
        ratio = f"{ms['llamacpp'] / ms['quant']:.2f}x" if "llamacpp" in ms else "-"
        rss = [str(r["rss"].get(k, "-")) for k in ("quant", "dense", "llamacpp")]
        print(f"| {r['file']} | {r['params_b']:.2f}B | {r['file_mib']} | " + " | ".join(cells)
              + f" | {ratio} | {r['t4']:.2f} | {r['t8']:.2f} | " + " | ".join(rss) + " |")
    workloads = sorted(alphas)
    print(f"\nprojected speedup over plain decoding (best k), BORROWED acceptance of '{args.proposer}' "
          "on the default 135M model")
    print("| file | " + " | ".join(f"{w} (alpha {alphas[w]:.2f})" for w in workloads) + " |")
    print("|" + "---|" * (len(workloads) + 1))
    for r in rows:
        print(f"| {r['file']} | " + " | ".join(
            f"{r['projected'][w]['speedup']:.2f}x (k={r['projected'][w]['k']})" for w in workloads) + " |")
    print(f"\nwrote {args.out / 'scale.json'} and {args.out / 'scale.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
