"""regime.py MODEL THREADS: per-process decode regime and what might explain it."""
import sys, os, time, gc, torch, statistics as st, threading
from verispec.models.loading import load_target
model, threads = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(threads)
target = load_target(model, dtype="bf16", weights="quant-i8").target
ctx, steps = 200, 96
cache = target.new_cache(ctx + steps + 8)
toks = list(range(1000, 1000 + ctx + steps + 8))
gc.collect(); gc.freeze()
def cpus():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        out[tid] = (f[36], int(f[11]) + int(f[12]))  # processor, utime+stime
    return out
walls = []
with torch.inference_mode():
    target.forward(torch.tensor(toks[:ctx]), cache, num_logits=1)
    before = cpus()
    for i in range(steps):
        t = time.perf_counter()
        target.forward(torch.tensor(toks[ctx + i:ctx + i + 1]), cache)
        walls.append(time.perf_counter() - t)
    after = cpus()
busy = {tid: (after[tid][0], after[tid][1] - before.get(tid, ("", 0))[1]) for tid in after if after[tid][1] - before.get(tid, ("", 0))[1] > 5}
huge = [l for l in open("/proc/self/smaps_rollup") if l.startswith(("AnonHugePages", "Rss"))]
print(f"median {1e3*st.median(walls):.2f} ms  first8 {' '.join(f'{1e3*w:.0f}' for w in walls[:8])}  last8 {' '.join(f'{1e3*w:.0f}' for w in walls[-8:])}  busy threads {busy}  {' '.join(h.split()[1] for h in huge)}")
