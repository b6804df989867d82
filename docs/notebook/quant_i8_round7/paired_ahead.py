"""paired_ahead.py MODEL THREADS ROWS BLOCKS A B: VS_AHEAD=A and B bytes alternating every 8 forwards in one process."""
import sys, os, time, gc, torch, statistics as st
from verispec.models.loading import load_target
model, threads, rows, blocks, A, B = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
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
        for mode in (A, B) if b % 2 == 0 else (B, A):
            os.environ["VS_AHEAD"] = mode
            ws = []
            for i in range(8):
                t = time.perf_counter(); target.forward(x, cache); ws.append(time.perf_counter() - t)
                cache.truncate(ctx)
            med[mode] = st.median(ws); per[mode] += ws
        ratios.append(med[A] / med[B])
print(f"{os.path.basename(model)} t={threads} rows={rows}: ahead {A} {1e3*st.median(per[A]):.2f} ms, ahead {B} {1e3*st.median(per[B]):.2f} ms; paired {A}/{B} median {st.median(ratios):.3f} (q1 {sorted(ratios)[len(ratios)//4]:.3f} q3 {sorted(ratios)[3*len(ratios)//4]:.3f}, {len(ratios)} pairs)")
