"""The global suffix store's RSS as it fills, in a process with verispec serve's malloc
settings and a server's churn of large blocks beside it: a 30-minute soak's outputs,
replayed.

    python docs/notebook/soak_rss/store_rss.py OUTPUTS.npz [SUFFIX_STORE_PY]

OUTPUTS.npz is a `--suffix-cache` file saved by a probed soak (its real outputs); they are
replayed in order, cycling, each with 4 tokens replaced by random ids from the same outputs
(about the new anchors a minute that the probe counted from sampled replies), 290 outputs
standing for a minute of soak traffic. Between outputs, 8 live blocks of 2-14 MiB (a
step's KV caches and logits) are freed and replaced, touched, as requests come and go.
SUFFIX_STORE_PY: another suffix_store.py to load instead of verispec's (main's, to compare).
Every 2 simulated minutes, with the 8 blocks freed (the floor a server's RSS falls to when
idle): RSS, the store's StoreStats bytes, glibc's heap bytes and its free bytes in them.
"""
from __future__ import annotations

import ctypes
import importlib.util
import random
import sys

import numpy as np

from verispec.serving.malloc import fix_thresholds

OUTPUTS_A_MINUTE = 290
MINUTES = 30
LIBC = ctypes.CDLL(None)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]
LIBC.free.argtypes = [ctypes.c_void_p]
LIBC.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


LIBC.mallinfo2.restype = MallInfo2


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


def store_class(path: str | None):
    if path is None:
        from verispec.proposers.suffix_store import SuffixStore
        return SuffixStore
    spec = importlib.util.spec_from_file_location("other_suffix_store", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.SuffixStore


def main(outputs_path: str, store_path: str | None = None) -> None:
    fix_thresholds()
    rng = random.Random(0)
    with np.load(outputs_path) as data:
        flat, lengths = data["tokens"].tolist(), data["lengths"].tolist()
    starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    outputs = [flat[a:b] for a, b in zip(starts[:-1], starts[1:])]
    store = store_class(store_path)()
    live = [None] * 8
    base = rss_mib()
    print("minute | idle RSS MiB (from start) | store MiB (StoreStats) | heaps MiB | free in heaps MiB")
    for i in range(OUTPUTS_A_MINUTE * MINUTES):
        tokens = list(outputs[i % len(outputs)])
        for _ in range(4):
            tokens[rng.randrange(len(tokens))] = rng.choice(flat)
        slot = rng.randrange(len(live))
        LIBC.free(live[slot])  # free(NULL) does nothing
        size = rng.randint(2 << 20, 14 << 20)
        live[slot] = LIBC.malloc(size)
        LIBC.memset(live[slot], 1, size)
        store.add(tokens)
        if (i + 1) % (2 * OUTPUTS_A_MINUTE) == 0:
            for j, block in enumerate(live):
                LIBC.free(block)
                live[j] = None
            info = LIBC.mallinfo2()
            print(f"{(i + 1) // OUTPUTS_A_MINUTE} | {rss_mib() - base:.1f} | "
                  f"{store.stats().memory_bytes / 2**20:.1f} | {info.arena / 2**20:.0f} | "
                  f"{info.fordblks / 2**20:.0f}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
