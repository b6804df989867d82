import sys, time, gc, torch
from verispec.models.loading import load_target
model, threads, steps, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
target = load_target(model, dtype="bf16", weights="quant-i8").target
cache = target.new_cache(300); toks = list(range(1000, 1300))
gc.collect(); gc.freeze()
with torch.inference_mode():
    target.forward(torch.tensor(toks[:256]), cache, num_logits=1)
    x = torch.tensor(toks[256:256 + rows])
    for i in range(20): target.forward(x, cache); cache.truncate(256)
    open("/tmp/r7_ready", "w").write("1")
    t = time.perf_counter()
    for i in range(steps):
        target.forward(x, cache); cache.truncate(256)
    print(f"rows {rows}: {1e3*(time.perf_counter()-t)/steps:.3f} ms/step")
