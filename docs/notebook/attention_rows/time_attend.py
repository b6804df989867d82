"""Time verispec.kernels.attend on verification blocks of n rows, one thread (issue 40, ran at attn8 on main 749eff8).

Row r of a block sees context + r + 1 keys of one bf16 cache, as the rows of a
verification block do. The kernels are those of the checkout on PYTHONPATH, so
two checkouts are compared by running this once per checkout and then --compare:

  OMP_NUM_THREADS=1 PYTHONPATH=/work/main python3 time_attend.py --out main.json
  OMP_NUM_THREADS=1 PYTHONPATH=$PWD python3 time_attend.py --out branch.json
  python3 time_attend.py --compare main.json branch.json

Each figure is the median over rounds of the mean time of a burst of calls.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

SHAPES = {"135M": (9, 3, 64), "1.5B": (12, 2, 128), "8B": (32, 8, 128)}  # heads, kv heads, head_dim
ROWS = (1, 2, 4, 8, 9, 16)


def measure(contexts: list[int], rounds: int) -> dict[str, float]:
    import torch

    from verispec import kernels

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    result = {}
    for shape, (heads, kv_heads, head_dim) in SHAPES.items():
        for context in contexts:
            cache = torch.randn(2, kv_heads, context + max(ROWS), head_dim, generator=gen).bfloat16()
            for n in ROWS:
                q = torch.randn(n, heads, head_dim, generator=gen).bfloat16()
                row_cache = torch.zeros(n, dtype=torch.long)
                row_len = torch.arange(context + 1, context + 1 + n)
                calls = max(10, int(2000 * 256 * 64 * 9 / (n * context * head_dim * heads)))
                kernels.attend(q, [cache], row_cache, row_len)
                times = []
                for _ in range(rounds):
                    start = time.perf_counter()
                    for _ in range(calls):
                        kernels.attend(q, [cache], row_cache, row_len)
                    times.append((time.perf_counter() - start) / calls)
                result[f"{shape} ctx={context} n={n}"] = statistics.median(times) * 1e6
    return result


def compare(before_path: str, after_path: str) -> str:
    before = json.load(open(before_path))
    after = json.load(open(after_path))
    lines = ["| shape, context | " + " | ".join(f"n={n}" for n in ROWS) + " |",
             "|---|" + "---|" * len(ROWS)]
    for key in dict.fromkeys(k.rsplit(" n=", 1)[0] for k in before):
        cells = [f"{before[f'{key} n={n}']:.1f} -> {after[f'{key} n={n}']:.1f} "
                 f"({after[f'{key} n={n}'] / before[f'{key} n={n}']:.2f})" for n in ROWS]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the medians (microseconds per call) here as JSON")
    parser.add_argument("--contexts", default="256,1024")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="print a before -> after (ratio) table of two --out files")
    args = parser.parse_args()
    if args.compare:
        print(compare(*args.compare))
        return
    result = measure([int(c) for c in args.contexts.split(",")], args.rounds)
    text = json.dumps(result, indent=1)
    if args.out:
        open(args.out, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
