"""T(1) and T(8) of one model: interleaved (as cost_curve) against back-to-back, GC frozen."""
import sys, time, statistics, torch, gc
sys.path.insert(0, '.')
from verispec.models.loading import load_target
torch.set_num_threads(1)
target = load_target(sys.argv[1], dtype="bf16", weights="quant-i8").target
ctx = 200
toks = list(range(1000, 1300))
cache = target.new_cache(ctx + 20)
gc.collect(); gc.freeze()
def step(n):
    t = time.perf_counter(); target.forward(torch.tensor(toks[ctx:ctx + n]), cache); dt = time.perf_counter() - t
    cache.truncate(ctx); return 1e3 * dt
with torch.inference_mode():
    target.forward(torch.tensor(toks[:ctx]), cache, num_logits=1)
    for _ in range(3): step(1); step(8)
    for rnd in range(2):
        inter = {1: [], 8: []}
        for _ in range(9):
            for n in (1, 8): inter[n].append(step(n))
        b2b = {n: [step(n) for _ in range(9)] for n in (1, 8)}
        m = lambda v: statistics.median(v)
        print(f"interleaved T1 {m(inter[1]):.2f} T8 {m(inter[8]):.2f} ratio {m(inter[8])/m(inter[1]):.3f} | "
              f"back-to-back T1 {m(b2b[1]):.2f} T8 {m(b2b[8]):.2f} ratio {m(b2b[8])/m(b2b[1]):.3f}")
