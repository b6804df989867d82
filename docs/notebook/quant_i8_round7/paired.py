"""paired.py MODEL THREADS ROWS BLOCKS VAR A B: one process alternates the environment variable
VAR between A and B every 8 forwards (BLOCKS pairs), on a throwaway build whose kernel reads VAR
once per matmul call (round 7 ran VS_NTA, VS_DYN, VS_IL and VS_LEG at 0/1, and VS_AHEAD at byte
distances). Prints each value's median and the paired median of A's time over B's."""
import sys, os, time, gc, torch, statistics as st
from verispec.models.loading import load_target
model, threads, rows, blocks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
var, A, B = sys.argv[5], sys.argv[6], sys.argv[7]
torch.set_num_threads(threads)
target = load_target(model, dtype="bf16", weights="quant-i8").target
ctx = 200
cache = target.new_cache(ctx + rows + 16)
toks = list(range(1000, 1000 + ctx + rows + 16))
gc.collect(); gc.freeze()
ratios, per = [], {A: [], B: []}
with torch.inference_mode():
    target.forward(torch.tensor(toks[:ctx]), cache, num_logits=1)
    x = torch.tensor(toks[ctx:ctx + rows])
    for b in range(blocks):
        med = {}
        for value in (A, B) if b % 2 == 0 else (B, A):
            os.environ[var] = value
            ws = []
            for i in range(8):
                t = time.perf_counter(); target.forward(x, cache); ws.append(time.perf_counter() - t)
                cache.truncate(ctx)
            med[value] = st.median(ws); per[value] += ws
        ratios.append(med[A] / med[B])
q = sorted(ratios)
print(f"{os.path.basename(model)} t={threads} rows={rows}: {var}={A} {1e3*st.median(per[A]):.2f} ms, {var}={B} "
      f"{1e3*st.median(per[B]):.2f} ms; paired {A}/{B} median {st.median(ratios):.3f} "
      f"(q1 {q[len(q)//4]:.3f} q3 {q[3*len(q)//4]:.3f}, {len(q)} pairs)")
