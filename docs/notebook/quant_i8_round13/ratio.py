# Issue 40 round 13: T(1) and T(8) of the integer path in one process, in alternating blocks
# (context 256, one thread), medians: python ratio.py SECONDS BLOCKS [MODEL]
import statistics
import sys
import time

import torch

from verispec.models.loading import load_target

torch.set_num_threads(1)
secs, blocks = float(sys.argv[1]), int(sys.argv[2])
target = load_target(sys.argv[3] if len(sys.argv) > 3 else None, weights="quant-i8").target
ctx = 256
ids = [1000 + (i * 7919) % 30000 for i in range(ctx + 64)]
cache = target.new_cache()
times = {1: [], 8: []}
with torch.inference_mode():
    target.forward(torch.tensor(ids[:ctx]), cache, num_logits=1)
    for b in range(blocks):
        for rows in (1, 8):
            feed = torch.tensor(ids[ctx:ctx + rows])
            end, n, t0 = time.time() + secs, 0, time.perf_counter()
            while time.time() < end:
                target.forward(feed, cache)
                cache.truncate(ctx)
                n += 1
            times[rows].append((time.perf_counter() - t0) / n * 1e3)
t1, t8 = statistics.median(times[1]), statistics.median(times[8])
print(f"T1 {t1:.3f} T8 {t8:.3f} ratio {t8 / t1:.3f}", flush=True)
