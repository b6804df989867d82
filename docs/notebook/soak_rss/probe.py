"""`verispec serve` with a memory probe beside it: where the soak's RSS goes.

    PYTHONPATH=$PWD python docs/notebook/soak_rss/probe.py OUT.jsonl -- serve --model default ...

Every 2 s one JSON line: the process's RSS (anon and file), glibc's mallinfo2 (bytes in
use, free inside the heaps, mmapped), the number of malloc arenas (malloc_info's heaps),
threads, the live KV caches' bytes (every cache the scheduler holds), the global suffix
store's bytes and shape (outputs, live tokens, index entries, stream slots, anchor keys),
and Python's allocated blocks, from the moment `verispec serve` sets its malloc settings
(`fix_thresholds`). Every 10 s the line also splits the anonymous memory by
where it lives (`maps()`): glibc's heaps (each heap's size against its resident pages),
CPython's object arenas (from `_PyObject_DebugMallocStats`), thread stacks, libraries'
writable data and the other anonymous maps by size; every 60 s every anonymous map goes
to OUT.maps.jsonl, to diff the maps around a step, with every thread's id and name (to
read an strace of the server by thread). With PROBE_TRACEMALLOC=1, tracemalloc runs
and every 60 s a line lists the 12 source lines whose Python allocations grew most since
the first snapshot. With PROBE_TRIM=1 the probe calls malloc_trim(0) before each sample
and times it.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import sys
import threading
import time
import tracemalloc

import verispec.serving.malloc as malloc_module
import verispec.serving.scheduler as scheduler_module
from verispec.cli.main import main

LIBC = ctypes.CDLL("libc.so.6")
SCHEDULERS: list = []


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


LIBC.mallinfo2.restype = MallInfo2
LIBC.open_memstream.restype = ctypes.c_void_p
LIBC.fclose.argtypes = [ctypes.c_void_p]
LIBC.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]


def status() -> dict:
    out = {}
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                out[key] = int(line.split()[1])
    return out


def c_text(write) -> str:
    """What a C function that prints to a FILE * wrote."""
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = LIBC.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    write(stream)
    LIBC.fclose(stream)
    text = ctypes.string_at(buf, size.value).decode()
    LIBC.free(buf)
    return text


PY_STATS = ctypes.pythonapi._PyObject_DebugMallocStats
PY_STATS.argtypes = [ctypes.c_void_p]
HEAP_MAX = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: a thread arena's heaps are aligned to it


def python_arenas() -> dict:
    """pymalloc's arenas (1 MiB maps for objects of 512 bytes or less) and its bytes."""
    text = c_text(PY_STATS)
    number = lambda label: int(re.search(rf"# {label} += +([\d,]+)", text)[1].replace(",", ""))
    return {"py_arenas": number("arenas allocated current"),
            "py_arenas_high": number("arenas highwater mark"),
            "py_block_bytes": number("bytes in allocated blocks")}


def smaps() -> list[dict]:
    """Every map of the process: start, end, perms, name, Rss and Anonymous bytes."""
    out, current = [], None
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as fh:
        for line in fh:
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                start, end = (int(x, 16) for x in head[0].split("-"))
                current = {"start": start, "end": end, "perms": head[1],
                           "name": head[5] if len(head) > 5 else ""}
                out.append(current)
            elif head[0] in ("Rss:", "Anonymous:", "AnonHugePages:"):
                current[head[0][:-1]] = int(head[1]) * 1024
    return out


def maps(vmas: list[dict]) -> dict:
    """Anonymous resident bytes by owner. glibc's heaps: [heap] (the main arena) and the
    read-write maps that start on a 64 MiB boundary (a thread arena's heap; the unused rest
    of its 64 MiB is a PROT_NONE map, merged with its neighbour's when that is one too);
    stacks: a read-write map right above a PROT_NONE guard of under 1 MiB."""
    out = {"heap_rss": 0, "main_heap_size": 0, "main_heap_rss": 0, "stack_rss": 0,
           "lib_anon": 0, "huge": 0}
    by_size = {"anon_lt1m": 0, "anon_1m": 0, "anon_2_8m": 0, "anon_8_32m": 0, "anon_ge32m": 0}
    previous = None
    for vma in vmas:
        anon, size = vma.get("Anonymous", 0), vma["end"] - vma["start"]
        out["huge"] += vma.get("AnonHugePages", 0)
        if vma["name"] == "[heap]":
            out["heap_rss"] += anon
            out["main_heap_size"] += size
            out["main_heap_rss"] += anon
        elif vma["name"].startswith("/"):
            out["lib_anon"] += anon
        elif vma["perms"] == "rw-p" and vma["start"] % HEAP_MAX == 0 and size <= HEAP_MAX:
            out["heap_rss"] += anon
        elif vma["perms"] == "rw-p" and previous and previous["perms"] == "---p" \
                and previous["end"] == vma["start"] and not previous["name"] \
                and previous["end"] - previous["start"] < 1 << 20:
            out["stack_rss"] += anon
        elif anon:
            key = ("anon_lt1m" if size < 1 << 20 else "anon_1m" if size < 2 << 20 else
                   "anon_2_8m" if size <= 8 << 20 else "anon_8_32m" if size < 32 << 20
                   else "anon_ge32m")
            by_size[key] += anon
        previous = vma
    return {**out, **by_size}


def heap_sizes() -> list[int]:
    """Each malloc arena's size (malloc_info's `system current`), main arena first."""
    text = c_text(lambda stream: LIBC.malloc_info(0, stream))
    return [int(x) for x in re.findall(r'<heap nr="\d+">.*?<system type="current" size="(\d+)"',
                                      text, re.S)]


def threads() -> dict:
    """Every thread of the process, its id (as strace and /proc name it) to its name: the
    Python thread's name where it is one, else the kernel's (comm)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as fh:
                out[tid] = names.get(int(tid), fh.read().strip())
        except OSError:  # the thread ended
            pass
    return out


def live_kv_bytes() -> int:
    total = 0
    for scheduler in SCHEDULERS:
        for cache in list(scheduler._caches):
            total += sum(t.numel() * t.element_size() for t in vars(cache).values()
                         if hasattr(t, "element_size"))
    return total


def suffix_store() -> dict:
    """The Engine's global suffix store: StoreStats (bytes, outputs, live tokens, index
    entries), its stream's slots and its anchor dicts' keys."""
    out = {"store": 0, "store_requests": 0, "store_tokens": 0, "store_entries": 0,
           "store_slots": 0, "store_keys": 0}
    for scheduler in SCHEDULERS:
        store = scheduler.build.__self__.suffix_store
        stats = store.stats()
        shape = store.read(lambda index: (getattr(index, "size", len(index.tokens)),
                                          sum(len(d) for d in index.newest.values())))
        for key, value in zip(out, (stats.memory_bytes, stats.requests, stats.tokens,
                                    stats.index_entries, *shape)):
            out[key] += value
    return out


def probe(path: str, every: float = 2.0) -> None:
    began, first, last_trace, last_maps, last_dump = time.monotonic(), None, 0.0, -1e9, -1e9
    dump = open(path.replace(".jsonl", "") + ".maps.jsonl", "w", encoding="utf-8")
    with open(path, "w", encoding="utf-8") as fh:
        while True:
            trim_ms = None
            if os.environ.get("PROBE_TRIM"):
                t0 = time.perf_counter()
                LIBC.malloc_trim(0)
                trim_ms = 1000 * (time.perf_counter() - t0)
            info = LIBC.mallinfo2()
            line = {"t": round(time.monotonic() - began, 1), **status(),
                    "in_use": info.uordblks, "free_in_heaps": info.fordblks,
                    "heaps": info.arena, "mmapped": info.hblkhd, "mmaps": info.hblks,
                    "kv": live_kv_bytes(), **suffix_store(),
                    "py_blocks": sys.getallocatedblocks(), "trim_ms": trim_ms}
            sizes = heap_sizes()
            line.update(arenas=len(sizes), main_heap=sizes[0] if sizes else 0)
            if line["t"] - last_maps >= 10:
                last_maps = line["t"]
                t0 = time.perf_counter()
                vmas = smaps()
                line.update(maps(vmas), **python_arenas(), heap_list=sizes)
                line["maps_ms"] = round(1000 * (time.perf_counter() - t0), 1)
                if line["t"] - last_dump >= 60:
                    last_dump = line["t"]
                    dump.write(json.dumps({"t": line["t"], "threads": threads(), "vmas": [
                        v for v in vmas if v.get("Anonymous") or not v["name"]]}) + "\n")
                    dump.flush()
            if tracemalloc.is_tracing() and line["t"] - last_trace >= 60:
                snap = tracemalloc.take_snapshot()
                last_trace = line["t"]
                if first is None:
                    first = snap
                else:
                    top = snap.compare_to(first, "lineno")[:12]
                    line["traced"] = tracemalloc.get_traced_memory()[0]
                    line["top"] = [str(s) for s in top]
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            time.sleep(every)


def run() -> int:
    out, argv = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    original = scheduler_module.Scheduler.__init__

    def recorded(self, *args, **kwargs):
        original(self, *args, **kwargs)
        SCHEDULERS.append(self)

    scheduler_module.Scheduler.__init__ = recorded
    if os.environ.get("PROBE_TRACEMALLOC"):
        tracemalloc.start(4)
    fix_thresholds = malloc_module.fix_thresholds

    def then_probe() -> bool:
        # The probe's thread starts after the server's malloc settings, as the server's own
        # threads do: started before them, it would own an arena that those threads then
        # share (glibc hands a thread an existing arena once M_ARENA_MAX are made).
        fixed = fix_thresholds()
        threading.Thread(target=probe, args=(out,), daemon=True).start()
        return fixed

    malloc_module.fix_thresholds = then_probe
    return main(argv)


if __name__ == "__main__":
    sys.exit(run())
