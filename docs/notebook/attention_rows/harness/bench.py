# Issue 40, ran at attn8 on main 749eff8 from a scratch folder holding main's attention.cpp as old.cpp and variants as <name>.cpp.
import sys, statistics, torch, mini
torch.set_num_threads(1)
names = sys.argv[1].split(",")
mods = {n: mini.build(n) for n in names}
shapes = {"135M": (9, 3, 64), "1.5B": (12, 2, 128), "8B": (32, 8, 128)}
sel = sys.argv[2].split(",") if len(sys.argv) > 2 else list(shapes)
ctxs = [int(c) for c in sys.argv[3].split(",")] if len(sys.argv) > 3 else [256, 1024]
ns = [1, 2, 4, 8, 9, 16]
gen = torch.Generator().manual_seed(0)
for s in sel:
    heads, kv, hd = shapes[s]
    for ctx in ctxs:
        cache = (torch.randn(2, kv, ctx + 32, hd, generator=gen)).bfloat16()
        line = []
        for n in ns:
            q = torch.randn(n, heads, hd, generator=gen).bfloat16()
            rc = torch.zeros(n, dtype=torch.long)
            rl = torch.arange(ctx + 1, ctx + 1 + n)
            reps = max(20, int(3000 / n / (ctx / 256) / (heads / 9) / (hd / 64)))
            t = {m: [] for m in names}
            for _ in range(7):
                for m in names:
                    t[m].append(mods[m].attend_repeat(q, [cache], rc, rl, None, reps))
            med = {m: statistics.median(t[m]) * 1e6 for m in names}
            line.append(f"n={n}: " + " ".join(f"{m}={med[m]:.1f}" for m in names) +
                        ("" if len(names) < 2 else f" ({med[names[1]] / med[names[0]]:.3f})"))
        print(f"{s} ctx={ctx} us/call  " + " | ".join(line), flush=True)
