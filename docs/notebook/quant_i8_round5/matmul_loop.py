"""One packed K-quant (or 32-weight) matrix, n rows, timed in a loop on one thread: the
third-fastest of 20 batches, us per call. For A/B between two checkouts' kernels.

    python matmul_loop.py CHECKOUT FORMAT ROWS [CALLS] [OUTxIN] [v256]

With a sixth argument the AVX-VNNI module runs the same pack."""
import sys, time, torch, numpy as np
root = sys.argv[1]; sys.path.insert(0, root); sys.path.insert(0, root + "/scripts")
import gguf
from verispec import kernels
from quant_kernel_speed import random_raw
torch.set_num_threads(1)
rng = np.random.default_rng(0)
name = sys.argv[2]; n = int(sys.argv[3]); out, inp = (512, 4096) if len(sys.argv) < 6 else tuple(map(int, sys.argv[5].split("x")))
raw = torch.from_numpy(random_raw(name, out, inp, rng))
packed = kernels.pack_quant_i8([(raw, int(gguf.GGMLQuantizationType[name]), out)], inp)
x = torch.randn(n, inp).bfloat16()
lin = kernels.linear
if len(sys.argv) > 6:
    v256 = kernels.i8_backend("avx-vnni")
    lin = lambda x, p, o: v256.linear(x, p, o, None)
for _ in range(100): lin(x, packed, out)
reps = int(sys.argv[4]) if len(sys.argv) > 4 else 20000
best = []
for _ in range(20):
    t = time.perf_counter()
    for _ in range(reps // 20): lin(x, packed, out)
    best.append((time.perf_counter() - t) / (reps // 20))
best.sort(); dt = best[2]
print(f"{name} n={n}: {dt*1e6:.1f} us, {dt*3.9e9/(out*inp):.4f} cycles/weight")
