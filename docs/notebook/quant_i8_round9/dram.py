# Issue 40 round 9: one Q4_K/Q6_K matrix packed COUNT times (COUNT x its size > the 300 MiB L3 streams it from DRAM), 1 and 8 rows per call.
import sys, os, time, statistics as st, torch, numpy as np
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main/tests/kernels")
from gguf_support import Q, random_blocks
from verispec import kernels
torch.set_num_threads(int(os.environ.get("T", "1")))
qt = getattr(Q, sys.argv[1]); out, inp = int(sys.argv[2]), int(sys.argv[3]); count = int(sys.argv[4])
raw = random_blocks(qt, out, inp, np.random.default_rng(0), scale=0.05).reshape(-1)
packs = [kernels.pack_quant_i8([(torch.from_numpy(raw), int(qt), out)], inp) for _ in range(count)]
mb = packs[0].numel() * packs[0].element_size() / 1e6
for n in (1, 8, 1, 8):
    x = torch.randn(n, inp).bfloat16()
    for p in packs: kernels.linear(x, p, out)
    ts = []
    for rep in range(3):
        t = time.perf_counter()
        for p in packs: kernels.linear(x, p, out)
        ts.append((time.perf_counter() - t) / count)
    tm = st.median(ts)
    print(f"{sys.argv[1]} {out}x{inp} x{count} ({mb:.0f} MB each) n={n}: {tm*1e6:.0f} us per matrix, {mb/tm/1e3:.1f} GB/s")
