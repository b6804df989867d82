"""step.py MODEL THREADS STEPS ROWS: median ms of STEPS forwards of ROWS rows after a 200-token fill."""
import sys, time, gc, torch, statistics as st
from verispec.models.loading import load_target
model, threads, steps, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
target = load_target(model, dtype="bf16", weights="quant-i8").target
ctx = 200
cache = target.new_cache(ctx + steps + rows + 8)
toks = list(range(1000, 1000 + ctx + steps + rows + 8))
gc.collect(); gc.freeze()
walls = []
with torch.inference_mode():
    target.forward(torch.tensor(toks[:ctx]), cache, num_logits=1)
    for i in range(steps):
        t = time.perf_counter()
        target.forward(torch.tensor(toks[ctx + i:ctx + i + rows]), cache)
        walls.append(time.perf_counter() - t)
        cache.truncate(ctx + i + 1)
print(f"{1e3 * st.median(walls):.3f}")
