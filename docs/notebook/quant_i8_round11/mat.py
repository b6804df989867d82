# One Q4_K/Q6_K matrix (COUNT copies; >1 streams from DRAM), n rows, VS_WS=0 vs VAR interleaved per rep.
import sys, os, time, statistics as st, torch, numpy as np
sys.path.insert(0, "/work/main/tests"); sys.path.insert(0, "/work/main/tests/kernels")
from gguf_support import Q, random_blocks
from verispec import kernels
torch.set_num_threads(1)
qt = getattr(Q, sys.argv[1]); out, inp, count, n, var = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
raw = random_blocks(qt, out, inp, np.random.default_rng(0), scale=0.05).reshape(-1)
packs = [kernels.pack_quant_i8([(torch.from_numpy(raw), int(qt), out)], inp) for _ in range(count)]
x = torch.randn(n, inp).bfloat16()
res = {"0": [], var: []}; ratios = []
ys = {}
for rep in range(40):
    m = {}
    for v in (("0", var) if rep % 2 == 0 else (var, "0")):
        os.environ["VS_WS"] = v
        reps = max(1, 8 // count)
        for p in packs[:1]: ys[v] = kernels.linear(x, p, out)
        t = time.perf_counter()
        for _ in range(reps):
            for p in packs: kernels.linear(x, p, out)
        m[v] = (time.perf_counter() - t) / (count * reps); res[v].append(m[v])
    ratios.append(m[var] / m["0"])
q = sorted(ratios)
print(f"{sys.argv[1]} {out}x{inp} x{count} n={n}: main {1e6*st.median(res['0']):.0f} us, VS_WS={var} {1e6*st.median(res[var]):.0f} us; "
      f"paired {st.median(ratios):.3f} (q1 {q[len(q)//4]:.3f} q3 {q[3*len(q)//4]:.3f}); same: {torch.equal(ys['0'], ys[var])}")
