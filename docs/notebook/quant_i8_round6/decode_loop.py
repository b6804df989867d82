"""decode_loop.py MODEL THREADS STEPS [ROWS]: load, fill 200 tokens, then STEPS forwards of ROWS rows."""
import sys, time, torch
sys.path.insert(0, '.')
from verispec.models.loading import load_target
model, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = int(sys.argv[4]) if len(sys.argv) > 4 else 1
torch.set_num_threads(threads)
target = load_target(model, dtype="bf16", weights="quant-i8").target
ctx = 200
cache = target.new_cache(ctx + steps * rows + 8)
toks = list(range(1000, 1000 + ctx + steps * rows + 8))
with torch.inference_mode():
    target.forward(torch.tensor(toks[:ctx]), cache, num_logits=1)
    pos = ctx
    times = []
    for i in range(steps):
        t = time.perf_counter()
        target.forward(torch.tensor(toks[pos:pos + rows]), cache)
        times.append(time.perf_counter() - t)
        if rows > 1:
            cache.truncate(pos + 1)
        pos += 1 if rows > 1 else rows
times_raw = list(times); times.sort()
import statistics as st; q=[1e3*times[int(len(times)*f)] for f in (0,.1,.25,.5,.75,.9)]; print(" ".join(f"{x:.2f}" for x in q))
print("first 40:", " ".join(f"{1e3*t:.1f}" for t in times_raw[:40]))
print("mean first 32:", f"{1e3*sum(times_raw[1:33])/32:.2f}")
