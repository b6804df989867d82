"""Round 4: where a default-model forward's time goes at n rows on quant-i8, 1 thread.
Times the whole forward, the 30 layers' four matmuls, the LM head and 30 attend calls
alone, each as its median; `other` is the rest (norms, RoPE, SiLU, the host).

    OMP_NUM_THREADS=1 python docs/notebook/quant_i8_round4/parts.py [default|FILE.gguf]
"""
import sys, time, statistics, torch
from verispec import kernels
from verispec.models.loading import load_target
torch.set_num_threads(1)
src = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "default" else None
t = load_target(src, weights="quant-i8").target
ctx = 256
ids = list(range(1000, 1300))
cache = t.new_cache()
t.forward(torch.tensor(ids[:ctx]), cache, num_logits=1)
feed = torch.tensor(ids[ctx:ctx + 16])
H, KV, HD, hid = t._heads, t._kv_heads, t._head_dim, t.spec.hidden_size
inter = t.spec.intermediate_size
def tm(fn, reps=30):
    for _ in range(3): fn()
    s = []
    for _ in range(reps):
        a = time.perf_counter(); fn(); s.append(time.perf_counter() - a)
    return statistics.median(s) * 1e3
def step(n):
    t.forward(feed[:n], cache); cache.truncate(ctx)
res = {}
for n in (1, 4, 8, 9):
    x = torch.randn(n, hid).bfloat16()
    xi = torch.randn(n, inter).bfloat16()
    xa = torch.randn(n, H * HD).bfloat16()
    def mm():
        for L in t.layers:
            kernels.linear(x, L.qkv.weight, (H + 2 * KV) * HD)
            kernels.linear(xa, L.o.weight, hid)
            kernels.linear(x, L.gate_up.weight, 2 * inter)
            kernels.linear(xi, L.down.weight, hid)
    head = t.weights.lm_head
    def hd(): head(x)
    def hdf(): head(x).float()
    q = torch.randn(n, H, HD).bfloat16()
    caches = [cache.kv[0]]
    rc = torch.zeros(n, dtype=torch.int64); rl = torch.arange(ctx + 1, ctx + n + 1, dtype=torch.int64)
    def att():
        for _ in range(t.num_layers): kernels.attend(q, caches, rc, rl)
    full = tm(lambda: step(n))
    parts = dict(full=full, layers_mm=tm(mm, 15), head=tm(hd), head_float=tm(hdf), attend=tm(att))
    parts["other"] = full - parts["layers_mm"] - parts["head_float"] - parts["attend"]
    res[n] = parts
    print(n, " ".join(f"{k}={v:.3f}" for k, v in parts.items()), flush=True)
