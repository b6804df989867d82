"""Where the one-row quantized matmul's time goes: GB/s of weight bytes at n = 1
for each format, with the weight resident in L2 (the kernel's compute ceiling:
no DRAM traffic) and streamed from DRAM at an 8B model's shapes, against the
read bandwidth of the same core (a float32 sum and a bf16 copy).

If the L2 figure is close to the DRAM one, the kernel is bound by its own
instructions (dequantization), not by memory; if it is well above, by the
memory system (reads in flight, prefetch).

    python scripts/quant_kernel_profile.py --threads 1 --repeats 7 --json out.json

Formats, places and repeats interleave; medians. Times are the thread's CPU time
(time.thread_time, so --threads 1 only): a memory stall counts, a descheduled
slice on this shared machine does not.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_kernel_speed import make_packs, weight_bytes  # noqa: E402

from verispec import kernels  # noqa: E402

FORMATS = ["BF16", "Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q5_0", "Q4_1", "Q4_0"]
# A Llama-3.1-8B layer's matrices (DRAM-streamed) and a 256 x 2048 block (L2: 0.1-1 MiB).
STREAMED = [("gate_up", 28672, 4096), ("down", 4096, 14336)]
RESIDENT = (256, 2048)


def read_gbps(size: int = 1 << 30) -> dict[str, float]:
    """Read bandwidth of this thread count: a float32 sum, and a copy (read + write)."""
    src = torch.ones(size // 4)
    dst = torch.empty(size // 2, dtype=torch.bfloat16)
    half = src[: size // 8].view(torch.bfloat16)
    sums, copies = [], []
    for _ in range(5):
        start = time.perf_counter()
        src.sum()
        sums.append(time.perf_counter() - start)
        start = time.perf_counter()
        dst[: half.numel()].copy_(half)
        copies.append(time.perf_counter() - start)
    return {"sum": size / statistics.median(sums) / 1e9,
            "copy_read": (size // 2) / statistics.median(copies) / 1e9}


def time_resident(packed, x, out: int, calls: int) -> float:
    start = time.thread_time()
    for _ in range(calls):
        kernels.linear(x, packed, out)
    return (time.thread_time() - start) / calls


def time_streamed(packs, x, out: int) -> float:
    start = time.thread_time()
    for packed in packs:
        kernels.linear(x, packed, out)
    return (time.thread_time() - start) / len(packs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--calls", type=int, default=400, help="resident products per sample")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not kernels.available():
        sys.exit("verispec kernels unavailable on this machine")
    torch.set_num_threads(args.threads)
    import numpy as np

    rng = np.random.default_rng(0)
    formats = args.formats.split(",")
    out_r, in_r = RESIDENT
    resident = {f: make_packs(f, out_r, in_r, 0, rng)[0] for f in formats}
    streamed = {(f, m): make_packs(f, o, i, 96 << 20, rng) for f in formats for m, o, i in STREAMED}
    xs = {i: torch.randn(1, i).bfloat16() for i in {in_r, *(i for _, _, i in STREAMED)}}
    samples: dict[tuple[str, str], list[float]] = {}
    for f in formats:  # warm-up, page in
        time_resident(resident[f], xs[in_r], out_r, 10)
        for m, o, i in STREAMED:
            time_streamed(streamed[f, m], xs[i], o)
    bandwidth = read_gbps()
    for _ in range(args.repeats):
        for f in formats:
            seconds = time_resident(resident[f], xs[in_r], out_r, args.calls)
            samples.setdefault((f, "L2"), []).append(weight_bytes(f, out_r, in_r) / seconds / 1e9)
            for m, o, i in STREAMED:
                seconds = time_streamed(streamed[f, m], xs[i], o)
                samples.setdefault((f, m), []).append(weight_bytes(f, o, i) / seconds / 1e9)
    places = ["L2"] + [m for m, _, _ in STREAMED]
    table = {f: {p: statistics.median(samples[f, p]) for p in places} for f in formats}
    print(f"# isa {kernels.isa()}, {args.threads} thread(s), n = 1, GB/s of weight bytes (median of "
          f"{args.repeats}); read bandwidth: sum {bandwidth['sum']:.1f} GB/s, "
          f"copy {bandwidth['copy_read']:.1f} GB/s read")
    print("| format | L2-resident [256, 2048] | " + " | ".join(f"DRAM {m} [{o}, {i}]" for m, o, i in STREAMED)
          + " | DRAM / L2 |")
    print("|" + "---|" * (len(places) + 2))
    for f in formats:
        row = table[f]
        dram = statistics.mean(row[m] for m, _, _ in STREAMED)
        print(f"| {f} | " + " | ".join(f"{row[p]:.1f}" for p in places) + f" | {dram / row['L2']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "isa": kernels.isa(),
                                         "read_gbps": bandwidth, "gbps": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
