# gc_probe.py MODEL: full-collection cost after a load, then GC collections during 100 one-row decode steps (1 thread)
import sys, time, gc, torch
sys.path.insert(0, '.')
from verispec.models.loading import load_target
torch.set_num_threads(1)
target = load_target(sys.argv[1], dtype="bf16", weights="quant-i8").target
print("objects tracked:", len(gc.get_objects()))
for gen in (0, 1, 2):
    t = time.perf_counter(); gc.collect(gen); print(f"collect({gen}) {1e3*(time.perf_counter()-t):.2f} ms")
stats0 = [s['collections'] for s in gc.get_stats()]
cache = target.new_cache(400)
toks = list(range(1000, 1400))
with torch.inference_mode():
    target.forward(torch.tensor(toks[:200]), cache, num_logits=1)
    stats0 = [s['collections'] for s in gc.get_stats()]
    for i in range(100):
        target.forward(torch.tensor([toks[200 + i]]), cache)
print("collections per 100 steps:", [s['collections'] - a for s, a in zip(gc.get_stats(), stats0)])
