"""paired.py MODEL THREADS ROWS BLOCKS: one process alternates VS_NTA=0 and 1 every 8 forwards, on a
throwaway build whose kernel reads the variable on every call (round 7 also ran VS_DYN and VS_IL
this way); the labels "static" and "dynamic" are the variable at 0 and at 1."""
import sys, os, time, gc, torch, statistics as st
from verispec.models.loading import load_target
model, threads, rows, blocks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
target = load_target(model, dtype="bf16", weights="quant-i8").target
ctx = 200
cache = target.new_cache(ctx + rows + 16)
toks = list(range(1000, 1000 + ctx + rows + 16))
gc.collect(); gc.freeze()
ratios, per = [], {"0": [], "1": []}
with torch.inference_mode():
    target.forward(torch.tensor(toks[:ctx]), cache, num_logits=1)
    x = torch.tensor(toks[ctx:ctx + rows])
    for b in range(blocks):
        med = {}
        for mode in ("0", "1") if b % 2 == 0 else ("1", "0"):
            os.environ["VS_NTA"] = mode
            ws = []
            for i in range(8):
                t = time.perf_counter(); target.forward(x, cache); ws.append(time.perf_counter() - t)
                cache.truncate(ctx)
            med[mode] = st.median(ws); per[mode] += ws
        ratios.append(med["0"] / med["1"])
print(f"{os.path.basename(model)} t={threads} rows={rows}: static {1e3*st.median(per['0']):.2f} dynamic {1e3*st.median(per['1']):.2f} ms; paired static/dynamic median {st.median(ratios):.3f} (q1 {sorted(ratios)[len(ratios)//4]:.3f} q3 {sorted(ratios)[3*len(ratios)//4]:.3f}, {len(ratios)} pairs)")
