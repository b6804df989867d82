"""Where a probed run's anonymous memory lives, one row per maps reading (every 10 s) or per
minute, in MiB: glibc's heaps (their size and the pages of them resident; the difference is
heap that was never touched or was given back inside), CPython's object arenas, thread
stacks, libraries' writable data, other anonymous maps by size, and malloc's mmapped blocks.

    python docs/notebook/soak_rss/maps_summary.py OUT/LABEL/probe.jsonl [--every]
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict

MIB = 1 << 20
COLUMNS = ("VmRSS", "RssAnon", "heaps", "heap_rss", "untouched", "in_use", "py_arenas",
           "stack_rss", "lib_anon", "anon_lt1m", "anon_1m", "anon_2_8m", "anon_8_32m",
           "anon_ge32m", "mmapped", "kv")


def row(line: dict) -> dict:
    out = {key: line.get(key, 0) / MIB for key in COLUMNS}
    out["VmRSS"], out["RssAnon"] = line["VmRSS"] / 1024, line["RssAnon"] / 1024
    out["untouched"] = (line["heaps"] - line["heap_rss"]) / MIB
    out["py_arenas"] = line["py_arenas"]  # 1 MiB each
    return out


def main(path: str, every: bool) -> None:
    with open(path, encoding="utf-8") as fh:
        lines = [json.loads(x) for x in fh]
    lines = [x for x in lines if "heap_rss" in x]
    print("t | " + " | ".join(COLUMNS) + " | heaps (per arena)")
    if every:
        for line in lines:
            cells = row(line)
            print(f"{line['t']:.0f} | " + " | ".join(f"{cells[k]:.0f}" for k in COLUMNS)
                  + " | " + " ".join(f"{x / MIB:.0f}" for x in line["heap_list"]))
        return
    by_minute = defaultdict(list)
    for line in lines:
        by_minute[int(line["t"] // 60)].append(row(line))
    for minute, rows in sorted(by_minute.items()):
        print(f"{minute + 1} | " + " | ".join(
            f"{sum(r[k] for r in rows) / len(rows):.0f}" for k in COLUMNS))


if __name__ == "__main__":
    main(sys.argv[1], "--every" in sys.argv)
