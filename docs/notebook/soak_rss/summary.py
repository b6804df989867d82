"""Per minute of a probed run (probe.py's lines): RSS and where it sits, in MiB.

    python docs/notebook/soak_rss/summary.py /work/scratch/soak_rss/LABEL/probe.jsonl
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict

import numpy as np

MIB = 1 << 20
COLUMNS = (("VmRSS", 1024), ("RssAnon", 1024), ("heaps", 1), ("in_use", 1),
           ("free_in_heaps", 1), ("mmapped", 1), ("kv", 1), ("store", 1))


def main(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        lines = [json.loads(x) for x in fh]
    by_minute = defaultdict(list)
    for line in lines:
        by_minute[int(line["t"] // 60)].append(line)
    print("minute | RSS mean (min-max) | anon | heaps | in use | free in heaps | mmapped | "
          "live KV | suffix store | arenas | threads | py blocks (k)")
    for minute, rows in sorted(by_minute.items()):
        cells = []
        for key, scale in COLUMNS:
            values = np.array([r.get(key, 0) for r in rows], dtype=float) * scale / MIB
            cells.append(f"{values.mean():.0f} ({values.min():.0f}-{values.max():.0f})"
                         if key == "VmRSS" else f"{values.mean():.0f}")
        cells += [str(max(r["arenas"] for r in rows)), str(max(r["Threads"] for r in rows)),
                  f"{np.mean([r['py_blocks'] for r in rows]) / 1000:.0f}"]
        print(f"{minute + 1} | " + " | ".join(cells))
        for row in rows:
            if "top" in row:
                print(f"  traced {row['traced'] / MIB:.1f} MiB; grew most:")
                print("\n".join("    " + s for s in row["top"]))


if __name__ == "__main__":
    main(sys.argv[1])
