# A loop of n-row forwards on the integer path at context 256, for perf: the default model, or
# the GGUF file MODEL. python loop.py ROWS SECONDS [MODEL]
import sys
import time

import torch

from verispec.models.loading import load_target

torch.set_num_threads(1)
rows, secs = int(sys.argv[1]), float(sys.argv[2])
target = load_target(sys.argv[3] if len(sys.argv) > 3 else None, weights="quant-i8").target
ctx = 256
ids = [1000 + (i * 7919) % 30000 for i in range(ctx + 64)]
cache = target.new_cache()
with torch.inference_mode():
    target.forward(torch.tensor(ids[:ctx]), cache, num_logits=1)
    feed = torch.tensor(ids[ctx:ctx + rows])
    end, n = time.time() + secs, 0
    while time.time() < end:
        target.forward(feed, cache)
        cache.truncate(ctx)
        n += 1
print(rows, "rows:", f"{secs / n * 1e3:.2f} ms a forward")
