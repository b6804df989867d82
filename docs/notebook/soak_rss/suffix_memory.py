"""The global suffix store's memory as outputs arrive: the default bounds (4096 outputs,
2^18 tokens), outputs of 30-150 random ids under 3000, every 1000 outputs its StoreStats and
tracemalloc's traced bytes.

    python docs/notebook/soak_rss/suffix_memory.py
"""
import random
import sys
import tracemalloc

from verispec.proposers.suffix_store import SuffixStore

tracemalloc.start()
store = SuffixStore()
rng = random.Random(0)
for i in range(1, 6001):
    store.add([rng.randint(0, 2999) for _ in range(rng.randint(30, 150))])
    if i % 1000 == 0:
        stats = store.stats()
        print(f"{i} outputs: {stats.requests} kept, {stats.tokens} tokens, {stats.index_entries} "
              f"index entries, {stats.memory_bytes / 2**20:.1f} MiB (StoreStats), "
              f"{tracemalloc.get_traced_memory()[0] / 2**20:.1f} MiB traced, "
              f"{sys.getallocatedblocks()} Python blocks")
