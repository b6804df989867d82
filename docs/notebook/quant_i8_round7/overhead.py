"""overhead.py MODEL THREADS STEPS: where a 1-row decode step's wall time goes on the main thread."""
import sys, time, gc, torch, statistics as st
from verispec import kernels
from verispec.models.loading import load_target
model, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
target = load_target(model, dtype="bf16", weights="quant-i8").target
acc = {"layer": 0.0, "head": 0.0}
orig_layer = kernels.decoder_layer
def timed_layer(*a, **k):
    t = time.perf_counter(); r = orig_layer(*a, **k); acc["layer"] += time.perf_counter() - t; return r
kernels.decoder_layer = timed_layer
orig_head = type(target)._head
def timed_head(self, x):
    t = time.perf_counter(); r = orig_head(self, x); acc["head"] += time.perf_counter() - t; return r
type(target)._head = timed_head
ctx = 200
cache = target.new_cache(ctx + steps + 8)
toks = list(range(1000, 1000 + ctx + steps + 8))
gc.collect(); gc.freeze()
walls, layers, heads = [], [], []
with torch.inference_mode():
    target.forward(torch.tensor(toks[:ctx]), cache, num_logits=1)
    for i in range(steps):
        acc["layer"] = acc["head"] = 0.0
        t = time.perf_counter()
        target.forward(torch.tensor(toks[ctx + i:ctx + i + 1]), cache)
        walls.append(time.perf_counter() - t); layers.append(acc["layer"]); heads.append(acc["head"])
m = lambda v: 1e3 * st.median(v)
rest = [w - l - h for w, l, h in zip(walls, layers, heads)]
print(f"{model} t={threads}: wall {m(walls):.2f} ms, layers {m(layers):.2f}, head {m(heads):.2f}, rest {m(rest):.3f} ms ({100*st.median(rest)/st.median(walls):.1f}%)")
