"""realloc.py MODEL THREADS: decode 48 steps, then move every packed weight to fresh memory
(clone), decode 48 more; again. Does a process's 2-thread regime follow its memory?"""
import sys, os, time, gc, torch, statistics as st
from verispec.models.loading import load_target
model, threads = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(threads)
target = load_target(model, dtype="bf16", weights="quant-i8").target
cache = target.new_cache(230); toks = list(range(1000, 1230))
gc.collect(); gc.freeze()
def run(k=48):
    w = []
    for i in range(k):
        t = time.perf_counter(); target.forward(x, cache); w.append(time.perf_counter() - t); cache.truncate(200)
    return 1e3 * st.median(w)
def realloc():
    for args in target._fused_args:
        for i, t in enumerate(args):
            if t.dtype == torch.uint8 and t.numel() > 1 << 16:
                args[i] = t.clone()
    h = target.weights.lm_head
    h.weight = h.weight.clone()
    gc.collect()
with torch.inference_mode():
    target.forward(torch.tensor(toks[:200]), cache, num_logits=1)
    x = torch.tensor(toks[200:201])
    out = [run()]
    for i in range(3):
        realloc(); out.append(run())
print(" -> ".join(f"{v:.1f}" for v in out))
