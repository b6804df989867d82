# Issue 40 attention round 3: att1.py HEADS KV_HEADS HEAD_DIM CONTEXT ROWS -> median us per layer of kernels.attend over 30 caches (the package build on PYTHONPATH).
import sys, time, statistics as st, torch
from verispec import kernels
torch.set_num_threads(1)
heads, kvh, hd, ctx, n, layers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), 30
caches = [torch.randn(2, kvh, ctx + 32, hd).bfloat16() for _ in range(layers)]
q = torch.randn(n, heads, hd).bfloat16()
rc = torch.zeros(n, dtype=torch.long); rl = torch.arange(ctx + 1, ctx + 1 + n, dtype=torch.long)
ts = []
for rep in range(41):
    t = time.perf_counter()
    for c in caches: kernels.attend(q, [c], rc, rl)
    ts.append(time.perf_counter() - t)
print(f"{st.median(ts)*1e6/layers:.2f}")
