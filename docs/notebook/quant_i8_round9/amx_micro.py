# Issue 40 round 9, on the AMX K-quant prototype (amx_kquant_prototype.diff, which reads VS_NOAMX per matmul): one matrix, VPDPBUSD and AMX alternating in one process.
import sys, os, time, statistics as st, torch, numpy as np
sys.path.insert(0, "/work/amx/tests"); sys.path.insert(0, "/work/amx/tests/kernels")
from gguf_support import Q, random_blocks
from verispec import kernels
torch.set_num_threads(1)
qt = getattr(Q, sys.argv[1]); out, inp = int(sys.argv[2]), int(sys.argv[3]); rows = [int(r) for r in sys.argv[4].split(",")]
raw = random_blocks(qt, out, inp, np.random.default_rng(0), scale=0.05).reshape(-1)
packed = kernels.pack_quant_i8([(torch.from_numpy(raw), int(qt), out)], inp)
for n in rows:
    x = torch.randn(n, inp).bfloat16()
    res = {}
    for v in ("1", "0"):
        os.environ["VS_NOAMX"] = v
        for _ in range(3): kernels.linear(x, packed, out)
        ts = []
        for _ in range(15):
            t = time.perf_counter(); kernels.linear(x, packed, out); ts.append(time.perf_counter() - t)
        res[v] = st.median(ts)
    print(f"{sys.argv[1]} {out}x{inp} n={n}: vnni {res['1']*1e6:.0f} us, amx {res['0']*1e6:.0f} us, amx/vnni {res['0']/res['1']:.3f}")
