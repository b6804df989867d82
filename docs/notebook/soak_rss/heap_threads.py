"""Which threads grow and shrink glibc's heaps, from an strace of a probed server:

    strace -f --seccomp-bpf -e trace=mprotect,madvise,mmap,munmap,brk -tt -o OUT/strace.txt \
        python3 docs/notebook/soak_rss/probe.py OUT/probe.jsonl -- serve ...
    python3 docs/notebook/soak_rss/heap_threads.py OUT/strace.txt OUT/probe.maps.jsonl [HH:MM:SS]

Per thread (named from the probe's dumps), from HH:MM:SS on: brk calls (the main heap grows
or is trimmed), thread heaps made (an mmap of HEAP_MAX or twice it, PROT_NONE, to align a new
64 MiB heap), grown (mprotect read-write inside such a heap) and shrunk (madvise DONTNEED
there), and the MiB grown and shrunk.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict

HEAP_MAX = 64 << 20
LINE = re.compile(r"^(\d+) (\S+) (\w+)\((0x[0-9a-f]+|NULL), (\d+), ([A-Z_|]+)")


def names(dumps: str) -> dict[str, str]:
    out: dict[str, str] = {}
    with open(dumps, encoding="utf-8") as fh:
        for line in fh:
            out.update(json.loads(line).get("threads", {}))
    return out


def main(trace: str, dumps: str, since: str = "") -> None:
    counts: dict[str, Counter] = defaultdict(Counter)
    heaps: set[int] = set()
    with open(trace, encoding="utf-8", errors="replace") as fh:
        for raw in fh:
            if raw.split(" ", 2)[1:2] < [since]:
                continue
            tid = raw.split(" ", 1)[0]
            if " brk(0x" in raw:
                counts[tid]["brk"] += 1
                continue
            match = LINE.match(raw)
            if not match:
                continue
            _, _, call, address, size, flags = match.groups()
            size = int(size)
            if call == "mmap" and address == "NULL" and flags == "PROT_NONE" \
                    and size in (HEAP_MAX, 2 * HEAP_MAX):
                counts[tid]["heaps made"] += 1
                continue
            start = int(address, 16) if address != "NULL" else 0
            base = start - start % HEAP_MAX
            if call == "mprotect" and flags == "PROT_READ|PROT_WRITE" and size < HEAP_MAX:
                counts[tid]["grown"] += 1
                counts[tid]["MiB grown"] += size / 2**20
                heaps.add(base)
            elif call == "madvise" and flags == "MADV_DONTNEED" and base in heaps:
                counts[tid]["shrunk"] += 1
                counts[tid]["MiB shrunk"] += size / 2**20
    who = names(dumps)
    for tid, count in sorted(counts.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"{tid} {who.get(tid, '?')}: " + ", ".join(
            f"{key} {value:.0f}" for key, value in sorted(count.items())))


if __name__ == "__main__":
    main(*sys.argv[1:])
