# Attention round 5: the score sweep run twice per (row, head, block) in a timing-only build (dbl.cpp: the kernel
# with DBL set computing block_scores a second time, NOVAL skipping the value sweep); the difference is what one
# score loop costs inside the kernel.
import os, sys, statistics, torch, subprocess
os.chdir("/work/scratch/at5"); sys.path.insert(0, ".")
import mini
torch.set_num_threads(1)
m = mini.build("dbl")
heads, kv, hd = 12, 2, 128
gen = torch.Generator().manual_seed(0)
ctx = 256
cache = torch.randn(2, kv, ctx + 32, hd, generator=gen).bfloat16()
os.environ["NOVAL"] = "1"
for n in (1, 8):
    q = torch.randn(n, heads, hd, generator=gen).bfloat16()
    rc = torch.zeros(n, dtype=torch.long); rl = torch.arange(ctx + 1, ctx + 1 + n)
    res = {0: [], 1: []}
    for _ in range(9):
        for v in (0, 1):
            if v: os.environ["DBL"] = "1"
            else: os.environ.pop("DBL", None)
            res[v].append(m.attend_repeat(q, [cache], rc, rl, None, 100) * 1e6)
    one, two = statistics.median(res[0]), statistics.median(res[1])
    units = n * heads * ((ctx + 1 + n + 15) // 16)
    print(f"n={n}: scores once {one:.1f} us, twice {two:.1f} us: one more score loop = {(two - one) * 1e3 / units:.1f} ns per (row, head, block); whole phase {one * 1e3 / units:.1f} ns per unit")
