# Issue 40, ran at attn8 on main 749eff8 from a scratch folder holding main's attention.cpp as old.cpp and variants as <name>.cpp.
"""Bit-compare variant modules against old.cpp on many random shapes (row blocks, trees, caches, threads)."""
import sys, random, torch, mini
names = sys.argv[1].split(",")
old = mini.build("old")
mods = [mini.build(n) for n in names]
rnd = random.Random(0)
configs = [(9, 3, 64), (4, 2, 16), (8, 8, 48), (4, 1, 128), (4, 1, 256), (12, 2, 128), (32, 8, 128),
           (16, 1, 64), (2, 2, 32), (6, 1, 96), (3, 3, 64), (1, 1, 64), (2, 1, 256)]
checked = 0
for trial in range(int(sys.argv[2]) if len(sys.argv) > 2 else 300):
    heads, kv, hd = rnd.choice(configs)
    dtype = rnd.choice([torch.bfloat16, torch.bfloat16, torch.float32])
    cap = rnd.choice([17, 40, 100, 300])
    ncache = rnd.choice([1, 1, 2, 3])
    gen = torch.Generator().manual_seed(trial)
    scale_mag = rnd.choice([1.0, 4.0])
    caches = [(torch.randn(2, kv, cap, hd, generator=gen) * scale_mag).to(dtype) for _ in range(ncache)]
    rows = rnd.choice([1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 20])
    q = (torch.randn(rows, heads, hd, generator=gen) * scale_mag).to(dtype)
    row_cache = torch.tensor(sorted(rnd.randrange(ncache) for _ in range(rows)))
    start = rnd.randrange(1, cap)
    row_len = torch.tensor([min(cap, max(1, start + r + rnd.choice([0, 0, 0, -3, 5]))) for r in range(rows)])
    row_index = None
    if rnd.random() < 0.4:
        width = cap
        row_index = torch.full((rows, width), -1, dtype=torch.long)
        for r in range(rows):
            if rnd.random() < 0.8:
                n = int(row_len[r])
                ctx = rnd.randrange(0, n)
                tail = sorted(rnd.sample(range(ctx, cap), n - ctx)) if rnd.random() < 0.9 else sorted(rnd.sample(range(cap), n))
                keys = list(range(ctx)) + tail if len(tail) == n - ctx else tail
                row_index[r, :n] = torch.tensor(keys)
    scale = rnd.choice([0.0, 0.0, 0.3])
    softcap = rnd.choice([0.0, 0.0, 3.0])
    threads = rnd.choice([1, 2])
    torch.set_num_threads(threads)
    want = old.attend(q, caches, row_cache, row_len, row_index, scale, softcap)
    for name, m in zip(names, mods):
        got = m.attend(q, caches, row_cache, row_len, row_index, scale, softcap)
        if not torch.equal(got.view(torch.int16) if dtype == torch.bfloat16 else got.view(torch.int32),
                           want.view(torch.int16) if dtype == torch.bfloat16 else want.view(torch.int32)):
            bad = (got != want).reshape(rows, -1).any(1).nonzero().flatten().tolist()
            print("MISMATCH", name, trial, dict(heads=heads, kv=kv, hd=hd, dtype=dtype, rows=rows, lens=row_len.tolist(),
                  index=row_index is not None, scale=scale, softcap=softcap, threads=threads, bad_rows=bad))
            sys.exit(1)
    checked += 1
print("all equal:", checked, "cases")
