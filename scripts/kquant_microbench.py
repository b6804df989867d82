"""Microbenchmark of the integer path's K-quant matmul (kernels/quant_i8_k.cpp): one
[out, in] Q4_K and one Q6_K matrix (default 4096 x 14336, a Llama-3.1-8B ffn_down),
n = 1..16 rows, one thread, against the bf16 path (the exact dequantization) on the
same blocks.

Measured in the same run, on the same thread:
- the weights' streaming bandwidth: an AVX-512 read of the very pack bytes (a
  C helper compiled here with gcc), which bounds the one-row time from below;
- the core's clock: a chain of dependent register adds (one cycle each), to give
  cycles per weight (ms x clock / weights).

Each matrix is copied until the copies exceed the last-level cache, so every product
streams its weights from DRAM; paths and row counts interleave in each repeat, and
the tables give medians.

    python scripts/kquant_microbench.py --repeats 7
    python scripts/kquant_microbench.py --shape 4096x4096 --rows 1,2,4,8 --formats Q4_K
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quant_kernel_speed import random_raw  # noqa: E402
from verispec import kernels  # noqa: E402

HELPER = r"""
#include <immintrin.h>
#include <stdint.h>
#include <stddef.h>
/* XOR of every 64-byte line of p[0, bytes): a read stream, prefetched 8 KiB ahead with
   the hint the K-quant kernels use on this CPU (STREAM_HINT, set where it is compiled). */
uint64_t read_stream(const uint8_t* p, size_t bytes) {
  __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    _mm_prefetch((const char*)p + i + 8192, STREAM_HINT);
    _mm_prefetch((const char*)p + i + 8192 + 64, STREAM_HINT);
    a = _mm512_xor_si512(a, _mm512_loadu_si512(p + i));
    b = _mm512_xor_si512(b, _mm512_loadu_si512(p + i + 64));
  }
  return (uint64_t)_mm512_reduce_add_epi64(_mm512_xor_si512(a, b));
}
/* 100 dependent adds of a register per iteration: 100 cycles of the core's clock. Not adds
   of an immediate, which recent Intel cores fold at rename (a chain of them read 15.9 GHz on an
   Emerald Rapids Xeon). */
uint64_t add_chain(uint64_t iterations) {
  uint64_t x = 0, one = 1;
  for (uint64_t i = 0; i < iterations; ++i) {
    __asm__ volatile(
#define A10 "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t" \
            "add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\t"
        A10 A10 A10 A10 A10 A10 A10 A10 A10 A10 : "+r"(x) : "r"(one));
  }
  return x;
}
"""


def helper() -> ctypes.CDLL:
    folder = Path(tempfile.mkdtemp(prefix="kquant-bench-"))
    (folder / "helper.c").write_text(HELPER)
    hint = {"nta": "_MM_HINT_NTA", "t1": "_MM_HINT_T1"}.get(kernels.i8_stream_hint(), "_MM_HINT_T0")
    subprocess.run(["gcc", "-O2", "-mavx512f", "-shared", "-fPIC", f"-DSTREAM_HINT={hint}", "-o",
                    str(folder / "helper.so"), str(folder / "helper.c")], check=True)
    lib = ctypes.CDLL(str(folder / "helper.so"))
    lib.read_stream.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.read_stream.restype = ctypes.c_uint64
    lib.add_chain.argtypes = [ctypes.c_uint64]
    lib.add_chain.restype = ctypes.c_uint64
    return lib


def clock_ghz(lib: ctypes.CDLL) -> float:
    iterations = 2_000_000
    times = []
    for _ in range(7):
        start = time.perf_counter()
        lib.add_chain(iterations)
        times.append(time.perf_counter() - start)
    return iterations * 100 / statistics.median(times) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="4096x14336", help="out x in")
    parser.add_argument("--formats", default="Q4_K,Q6_K")
    parser.add_argument("--rows", default=",".join(str(n) for n in range(1, 17)))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--working-set", type=int, default=96 << 20, help="bytes of weights per format")
    parser.add_argument("--no-bf16", action="store_true", help="skip the bf16 path")
    args = parser.parse_args()
    if not kernels.available() or not kernels.quant_i8_types():
        sys.exit("needs verispec's kernels and AVX-512-VNNI")
    torch.set_num_threads(1)
    out, inp = (int(v) for v in args.shape.split("x"))
    rows = [int(r) for r in args.rows.split(",")]
    lib = helper()
    ghz = clock_ghz(lib)
    rng = np.random.default_rng(0)
    weights = out * inp
    print(f"# {out} x {inp}, 1 thread, core clock {ghz:.2f} GHz (dependent adds), "
          f"median of {args.repeats} interleaved repeats; every product streams from DRAM")
    for fmt in args.formats.split(","):
        qtype = int(gguf.GGMLQuantizationType[fmt])
        raw = torch.from_numpy(random_raw(fmt, out, inp, rng))
        copies = max(2, -(-args.working_set // raw.numel()))
        paths = {"int8": [kernels.pack_quant_i8([(raw, qtype, out)], inp) for _ in range(copies)]}
        if not args.no_bf16:
            paths["bf16"] = [kernels.pack_quant(raw, qtype, out, inp) for _ in range(copies)]
        xs = {n: torch.randn(n, inp).bfloat16() for n in rows}
        stream = []
        samples = {(p, n): [] for p in paths for n in rows}
        for packs in paths.values():  # page everything in
            for packed in packs:
                kernels.linear(xs[1], packed, out)
        for _ in range(args.repeats):
            start = time.perf_counter()
            for packed in paths["int8"]:
                lib.read_stream(packed.data_ptr(), packed.numel())
            stream.append((time.perf_counter() - start) / copies)
            for name, packs in paths.items():
                for n in rows:
                    start = time.perf_counter()
                    for packed in packs:
                        kernels.linear(xs[n], packed, out)
                    samples[name, n].append((time.perf_counter() - start) / copies)
        pack_bytes = paths["int8"][0].numel()
        read_ms = statistics.median(stream) * 1e3
        print(f"\n## {fmt}: {raw.numel() / 1e6:.1f} MB in the file, {pack_bytes / 1e6:.1f} MB packed; "
              f"read stream {read_ms:.3f} ms ({pack_bytes / read_ms / 1e6:.1f} GB/s, "
              f"{read_ms * 1e-3 * ghz * 1e9 / weights:.4f} cycles/weight)\n")
        names = list(paths)
        print("| n | " + " | ".join(f"{p} ms | {p} T(n)/T(1) | {p} cycles/weight" for p in names)
              + " | int8 / read stream |")
        print("|---|" + "---|---|---|" * len(names) + "---|")
        for n in rows:
            cells = []
            for name in names:
                ms = statistics.median(samples[name, n]) * 1e3
                one = statistics.median(samples[name, rows[0]]) * 1e3
                cells.append(f"{ms:.3f} | {ms / one:.2f} | {ms * 1e-3 * ghz * 1e9 / weights:.4f}")
            ms8 = statistics.median(samples["int8", n]) * 1e3
            print(f"| {n} | " + " | ".join(cells) + f" | {ms8 / read_ms:.2f} |")
        del paths


if __name__ == "__main__":
    main()
