# Issue 40 round 12: the 32-weight kernels' speed with their weights hot in L1/L2 (one small
# matrix, many calls), in ps per weight for all n rows together: the default model's shapes.
# OMP_NUM_THREADS=1 python floor.py
import statistics as st
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "kernels")]
from gguf_support import Q, random_blocks  # noqa: E402

from verispec import kernels  # noqa: E402

torch.set_num_threads(1)
for name, out, inp in (("Q4_1", 1536, 576), ("Q4_1", 576, 1536), ("Q4_1", 192, 576), ("Q8_0", 1024, 576)):
    qt = getattr(Q, name)
    raw = random_blocks(qt, out, inp, np.random.default_rng(0), scale=0.05).reshape(-1)
    packed = kernels.pack_quant_i8([(torch.from_numpy(raw), int(qt), out)], inp)
    line = f"{name} {out}x{inp}:"
    for n in (1, 4, 8, 16):
        x = torch.randn(n, inp).bfloat16()
        times = []
        for _ in range(7):
            start = time.perf_counter()
            for _ in range(400):
                kernels.linear(x, packed, out)
            times.append((time.perf_counter() - start) / 400)
        line += f" n={n} {st.median(times) / (out * inp) * 1e12:.1f} ps/w"
    print(line, flush=True)
