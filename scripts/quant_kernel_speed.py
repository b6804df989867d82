"""Micro-benchmark of verispec's matmul kernel: dense bf16 and each GGUF block
format, ms per matmul at real model shapes, for n = 1..32 rows. A format named
FMT-i8 (Q8_0-i8, Q4_1-i8, Q4_0-i8) is the integer path (pack_quant_i8, --weights
quant-i8); FMT-v256 is the same packs on the integer path's AVX-VNNI module, the
256-bit kernels of CPUs without AVX-512 (kernels.i8_backend).

Each (shape, format) gets enough distinct weight copies to exceed the last-level
cache (`--working-set`), so every product streams its weight from DRAM as in a
real forward. Formats and row counts are interleaved within each repeat and the
median over repeats is reported, with GB/s of weight bytes and the bound set by
the measured stream bandwidth (torch.sum over a float32 buffer, same threads).

    python scripts/quant_kernel_speed.py --threads 2
    python scripts/quant_kernel_speed.py --threads 1 --models 135M --formats Q4_1,Q4_1-i8,Q8_0,Q8_0-i8
    python scripts/quant_kernel_speed.py --threads 1 --rows 1,4,8 --formats Q4_1-i8,Q4_1-v256
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from verispec import kernels  # noqa: E402

FORMATS = ["BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0"]
# name -> [(matrix, out, in)]: SmolLM2-135M (the default model), a Qwen2.5-1.5B-like and a
# Llama-3.1-8B-like layer.
SHAPES = {
    "135M": [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536),
             ("lm_head", 49152, 576)],
    "1.5B": [("qkv", 2048, 1536), ("o", 1536, 1536), ("gate_up", 17920, 1536), ("down", 1536, 8960)],
    "8B": [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)],
}
HALF_FIELDS = {"Q8_0": (0, 2), "Q4_0": (0, 2), "Q5_0": (0, 2), "Q4_1": (0, 4), "Q5_1": (0, 4),
               "Q4_K": (0, 4), "Q5_K": (0, 4), "Q6_K": (208, 210)}


def random_raw(fmt: str, out: int, inp: int, rng: np.random.Generator) -> np.ndarray:
    """Valid GGUF blocks: random quants and sub-scales, small random fp16 scales."""
    qtype = gguf.GGMLQuantizationType[fmt]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(out * inp // block, size), dtype=np.uint8)
    lo, hi = HALF_FIELDS[fmt]
    blocks[:, lo:hi] = rng.normal(0, 0.02, (blocks.shape[0], (hi - lo) // 2)).astype(np.float16).view(np.uint8)
    return blocks.reshape(-1)


def _block_format(fmt: str) -> str:
    return fmt.removesuffix("-i8").removesuffix("-v256")


def weight_bytes(fmt: str, out: int, inp: int) -> int:
    fmt = _block_format(fmt)
    if fmt == "BF16":
        return out * inp * 2
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt]]
    return out * inp // block * size


def make_packs(fmt: str, out: int, inp: int, working_set: int, rng) -> list[torch.Tensor]:
    copies = max(1, -(-working_set // weight_bytes(fmt, out, inp)))
    if fmt == "BF16":
        return [kernels.pack((torch.randn(out, inp) * 0.02).bfloat16()) for _ in range(copies)]
    base = _block_format(fmt)
    qtype = int(gguf.GGMLQuantizationType[base])
    raw = torch.from_numpy(random_raw(base, out, inp, rng))
    if base != fmt:
        return [kernels.pack_quant_i8([(raw, qtype, out)], inp) for _ in range(copies)]
    return [kernels.pack_quant(raw, qtype, out, inp) for _ in range(copies)]


def stream_gbps(threads: int, size: int = 1 << 30) -> float:
    buf = torch.ones(size // 4)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - start)
    return size / statistics.median(times) / 1e9


CLOCK = time.perf_counter


def time_packs(packs, x, out, fused_rows: int | None = None, linear=kernels.linear) -> float:
    """ms per matmul, cycling through the copies once; fused_rows=0 times the
    buffered quantized path."""
    default = kernels.quant_fused_rows()
    if fused_rows is not None:
        kernels.quant_fused_rows(fused_rows)
    try:
        start = CLOCK()
        for packed in packs:
            linear(x, packed, out)
        return (CLOCK() - start) / len(packs) * 1e3
    finally:
        kernels.quant_fused_rows(default)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", default="1,2,4,8,16,32")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--models", default="135M,1.5B", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--buffered", action="store_true",
                        help="also time each block format with the fused pass off ('Q4_0/buf')")
    parser.add_argument("--working-set", type=int, default=96 << 20, help="bytes of weights per (shape, format)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time the thread's CPU (with --threads 1: robust to other processes' load)")
    args = parser.parse_args()
    if args.cpu_time:
        if args.threads != 1:
            sys.exit("--cpu-time counts the calling thread only: use it with --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    if not kernels.available():
        sys.exit("verispec kernels unavailable on this machine")
    v256 = kernels.i8_backend("avx-vnni")
    if v256 is None and any(f.endswith("-v256") for f in args.formats.split(",")):
        sys.exit("the integer path's AVX-VNNI module is unavailable on this machine")
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    formats = args.formats.split(",")
    gbps = stream_gbps(args.threads)
    print(f"# isa {kernels.isa()}, {args.threads} threads, stream read {gbps:.1f} GB/s, "
          f"median of {args.repeats} interleaved repeats")
    print("| model | matrix | format | MB | bound ms | " + " | ".join(f"n={n} ms" for n in rows)
          + " | n=1 GB/s |")
    print("|" + "---|" * (6 + len(rows)))
    rng = np.random.default_rng(0)
    totals: dict[tuple[str, str], list[float]] = {}
    counted: dict[tuple[str, str], int] = {}
    for model in args.models.split(","):
        for matrix, out, inp in SHAPES[model]:
            # A K-quant needs in % 256 == 0 (ggml then stores such a tensor in another type).
            fits = [f for f in formats if f == "BF16" or inp % gguf.GGML_QUANT_SIZES[
                gguf.GGMLQuantizationType[_block_format(f)]][0] == 0]
            packs = {fmt: make_packs(fmt, out, inp, args.working_set, rng) for fmt in fits}
            if args.buffered:
                fits += [f + "/buf" for f in fits if f != "BF16" and _block_format(f) == f]
                packs.update({f: packs[f[:-4]] for f in fits if f.endswith("/buf")})
            xs = {n: torch.randn(n, inp).bfloat16() for n in rows}
            samples = {(fmt, n): [] for fmt in fits for n in rows}
            linears = {f: v256.linear if f.endswith("-v256") else kernels.linear for f in fits}
            for fmt in fits:  # warm-up: page in every copy
                time_packs(packs[fmt], xs[1], out, linear=linears[fmt])
            for _ in range(args.repeats):
                for fmt in fits:
                    for n in rows:
                        samples[fmt, n].append(time_packs(packs[fmt], xs[n], out,
                                                          0 if fmt.endswith("/buf") else None, linears[fmt]))
            for fmt in fits:
                mb = weight_bytes(fmt.removesuffix("/buf"), out, inp) / 1e6
                ms = [statistics.median(samples[fmt, n]) for n in rows]
                scale = 30 if matrix != "lm_head" else 1  # layers of the 135M model
                if model == "135M":
                    acc = totals.setdefault((model, fmt), [0.0] * len(rows))
                    totals[model, fmt] = [a + scale * m for a, m in zip(acc, ms)]
                    counted[model, fmt] = counted.get((model, fmt), 0) + 1
                print(f"| {model} | {matrix} [{out}, {inp}] | {fmt} | {mb:.2f} | {mb / gbps:.3f} | "
                      + " | ".join(f"{m:.3f}" for m in ms) + f" | {mb / ms[0]:.1f} |")
            del packs
    # Formats that fit every matrix (a K-quant does not fit in_features 576).
    for (model, fmt), ms in totals.items():
        if counted[model, fmt] == len(SHAPES[model]):
            ratio = f"T(8)/T(1) {ms[rows.index(8)] / ms[0]:.2f}" if 8 in rows else ""
            print(f"| {model} | all matmuls of a token (30 layers + head) | {fmt} | | | "
                  + " | ".join(f"{m:.2f}" for m in ms) + f" | {ratio} |")


if __name__ == "__main__":
    main()
