"""Where a probed run's anonymous memory lives, from probe.py's dump of the maps (one a
minute), in MiB: the main heap (the event loop's: its size, its resident pages and the
difference, pages it holds that were never written), the thread arenas' heaps, CPython's
object arenas (1 MiB each, from its own count), thread stacks, libraries' writable data, the
other anonymous maps by size, and the RSS and live KV caches at the nearest 2-s sample.

    PYTHONPATH=$PWD python docs/notebook/soak_rss/maps_summary.py OUT/LABEL/probe.jsonl
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe import maps  # noqa: E402

MIB = 1 << 20
COLUMNS = ("main_heap_size", "main_heap_rss", "unwritten", "thread_heaps", "stack_rss",
           "lib_anon", "anon_lt1m", "anon_1m", "anon_2_8m", "anon_8_32m", "anon_ge32m")


def main(path: str) -> None:
    with open(path, encoding="utf-8") as fh:
        lines = [json.loads(x) for x in fh]
    dumps = Path(path.replace(".jsonl", "") + ".maps.jsonl").read_text(encoding="utf-8")
    print("t s | RSS | live KV | py arenas | " + " | ".join(COLUMNS))
    for dump in map(json.loads, dumps.splitlines()):
        near = min(lines, key=lambda x: abs(x["t"] - dump["t"]))
        arenas = min((x for x in lines if "py_arenas" in x), default={"py_arenas": 0},
                     key=lambda x: abs(x["t"] - dump["t"]))["py_arenas"]
        split = maps(dump["vmas"])
        split["unwritten"] = split["main_heap_size"] - split["main_heap_rss"]
        split["thread_heaps"] = split["heap_rss"] - split["main_heap_rss"]
        print(f"{dump['t']:.0f} | {near['VmRSS'] / 1024:.0f} | {near['kv'] / MIB:.0f} | {arenas} | "
              + " | ".join(f"{split[key] / MIB:.0f}" for key in COLUMNS))


if __name__ == "__main__":
    main(sys.argv[1])
