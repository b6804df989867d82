import sys, gc, torch, cProfile, pstats
from verispec.models.loading import load_target
model = sys.argv[1]
torch.set_num_threads(1)
target = load_target(model, dtype="bf16", weights="quant-i8").target
cache = target.new_cache(300); toks = list(range(1000, 1300))
gc.collect(); gc.freeze()
with torch.inference_mode():
    target.forward(torch.tensor(toks[:200]), cache, num_logits=1)
    x = torch.tensor(toks[200:201])
    def loop():
        for i in range(300):
            target.forward(x, cache); cache.truncate(200)
    cProfile.run("loop()", "/tmp/r7.prof")
pstats.Stats("/tmp/r7.prof").sort_stats("tottime").print_stats(25)
