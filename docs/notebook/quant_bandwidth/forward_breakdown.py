# Ran at commit 15569a3 (2026-12-01); kept as a record, not maintained: modules may have moved since.
import sys, time, statistics, torch
sys.path.insert(0, sys.argv[2])
from verispec import kernels
from verispec.models.native_gguf import native_from_gguf
torch.set_num_threads(1)
m = native_from_gguf(sys.argv[1], torch.bfloat16, quant=True, quiet=True)
lins = []
for layer in m.layers:
    for name in ("qkv", "o", "gate_up", "down"):
        lin = getattr(layer, name)
        for p in getattr(lin, "parts", [lin]):
            lins.append((name, p))
lins.append(("lm_head", m.weights.lm_head))
print("kernel flags", {n: getattr(l, "kernel", None) for n, l in [(n, getattr(m.layers[0], n)) for n in ("qkv","o","gate_up","down")]},
      {n: getattr(m.layers[0], n).format for n in ("qkv","o","gate_up","down")})
xs = {}
def tmat():
    tot = {}
    for name, p in lins:
        x = xs.setdefault(p.in_features, torch.randn(1, p.in_features).bfloat16())
        t0 = time.thread_time(); kernels.linear(x, p.weight, p.out_features); dt = time.thread_time() - t0
        tot[name] = tot.get(name, 0) + dt
    return tot
cache = m.new_cache(400)
m.forward(torch.arange(1000, 1200), cache, num_logits=1)
fw, mats = [], []
for i in range(8):
    t0 = time.thread_time(); m.forward(torch.tensor([1300 + i]), cache); fw.append(time.thread_time() - t0)
    mats.append(tmat())
print("forward ms (thread time) median", statistics.median(fw) * 1e3)
for k in mats[0]:
    print(k, "ms", statistics.median(d[k] for d in mats) * 1e3)
print("sum matmuls", statistics.median(sum(d.values()) for d in mats) * 1e3)
