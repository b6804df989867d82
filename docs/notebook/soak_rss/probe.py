"""`verispec serve` with a memory probe beside it: where the soak's RSS goes.

    PYTHONPATH=$PWD python docs/notebook/soak_rss/probe.py OUT.jsonl -- serve --model default ...

Every 2 s one JSON line: the process's RSS (anon and file), glibc's mallinfo2 (bytes in
use, free inside the heaps, mmapped), the number of malloc arenas (malloc_info's heaps),
threads, the live KV caches' bytes (every cache the scheduler holds), the global suffix
store's bytes and shape (outputs, live tokens, index entries, stream slots, anchor keys),
and Python's allocated blocks. With PROBE_TRACEMALLOC=1, tracemalloc runs
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


def arenas() -> int:
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = LIBC.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    LIBC.malloc_info(0, stream)
    LIBC.fclose(stream)
    text = ctypes.string_at(buf, size.value).decode()
    LIBC.free(buf)
    return len(re.findall(r"<heap nr=", text))


def status() -> dict:
    out = {}
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile", "Threads"):
                out[key] = int(line.split()[1])
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
    began, first, last_trace = time.monotonic(), None, 0.0
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
                    "arenas": arenas(), "kv": live_kv_bytes(), **suffix_store(),
                    "py_blocks": sys.getallocatedblocks(), "trim_ms": trim_ms}
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
    threading.Thread(target=probe, args=(out,), daemon=True).start()
    return main(argv)


if __name__ == "__main__":
    sys.exit(run())
