# Issue 40 attention round 4: like bench.py, but each call cycles over LAYERS caches (a whole model's), so
# long contexts read their keys and values from L3 as in a forward; variants interleaved in one process.
import sys, time, statistics, torch, mini
torch.set_num_threads(1)
names = sys.argv[1].split(",")
mods = {n: mini.build(n) for n in names}
shapes = {"135M": (9, 3, 64, 30), "1.5B": (12, 2, 128, 28), "8B": (32, 8, 128, 32)}
sel = sys.argv[2].split(",")
ctxs = [int(c) for c in sys.argv[3].split(",")]
ns = [int(n) for n in sys.argv[4].split(",")] if len(sys.argv) > 4 else [1, 8]
gen = torch.Generator().manual_seed(0)
for s in sel:
    heads, kv, hd, layers = shapes[s]
    for ctx in ctxs:
        caches = [torch.randn(2, kv, ctx + 32, hd, generator=gen).bfloat16() for _ in range(layers)]
        line = []
        for n in ns:
            q = torch.randn(n, heads, hd, generator=gen).bfloat16()
            rc = torch.zeros(n, dtype=torch.long)
            rl = torch.arange(ctx + 1, ctx + 1 + n)
            t = {m: [] for m in names}
            for _ in range(9):
                for m in names:
                    t0 = time.perf_counter()
                    for c in caches:
                        mods[m].attend_repeat(q, [c], rc, rl, None, 1)
                    t[m].append((time.perf_counter() - t0) / layers)
            med = {m: statistics.median(t[m]) * 1e6 for m in names}
            line.append(f"n={n}: " + " ".join(f"{m}={med[m]:.1f}" for m in names) +
                        ("" if len(names) < 2 else f" ({med[names[1]] / med[names[0]]:.3f})"))
        print(f"{s} ctx={ctx} us/layer  " + " | ".join(line), flush=True)
