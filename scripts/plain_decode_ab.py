"""Plain greedy decoding's time per token on the default model for one checkout, the check
behind a before/after timing: run it for each checkout in its own process, alternating.

    python scripts/plain_decode_ab.py CHECKOUT THREADS

prints the checkout, backend, weights and the median of 5 runs of 96 tokens: wall
milliseconds per token, and with THREADS=1 CPU milliseconds per token too.
"""
from __future__ import annotations

import statistics
import sys
import time


def main() -> int:
    root, threads = sys.argv[1], int(sys.argv[2])
    sys.path.insert(0, root)
    import torch

    torch.set_num_threads(threads)
    import verispec
    from verispec.api import Engine
    from verispec.config import SamplingParams, SpecConfig

    if not verispec.__file__.startswith(root):
        raise SystemExit(f"imported {verispec.__file__}, not the checkout {root}")
    engine = Engine()
    ids = engine.encode("Write a short story about a lighthouse keeper who finds a strange "
                        "bottle.", chat=True)
    sampling, spec = SamplingParams(max_new_tokens=96), SpecConfig("none", k=0)
    engine.generate(ids, sampling, spec)  # warm-up
    wall, cpu = [], []
    for _ in range(5):
        w, c = time.perf_counter(), time.process_time()
        engine.generate(ids, sampling, spec)
        wall.append((time.perf_counter() - w) / 96 * 1000)
        cpu.append((time.process_time() - c) / 96 * 1000)
    line = f"{root} {engine.backend} {engine.weights} wall {statistics.median(wall):.2f} ms/token"
    print(line + (f", cpu {statistics.median(cpu):.2f} ms/token" if threads == 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
