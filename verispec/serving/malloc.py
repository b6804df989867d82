"""glibc's malloc set for a long-running server: `verispec serve` calls `fix_thresholds`
at start-up.

Left alone, glibc adapts two thresholds as the process frees memory: freeing a block
that was mmapped raises the mmap threshold to that block's size (up to 32 MiB on 64-bit),
and the trim threshold to twice that. A server's steps and KV caches allocate and free
blocks of every size up to tens of MiB, so both thresholds climb: the large blocks then
come from the heaps, and a heap's free top goes back to the system only once tens of
MiB lie free there at once, then grows again. The RSS saw-tooths by that much, with no
memory leaked (docs/notebook/soak_rss.md). Fixed values keep the large blocks in the heaps
as the adapted ones do (an mmap per step's logits would fault its pages in every step),
give a heap's free top back once a few MiB lie there, and keep a pad at the top that a
step's short-lived tensors reuse rather than fault in again.
"""
from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # mallopt's parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # the ceiling glibc's adapted value reaches on 64-bit
TRIM_THRESHOLD = 4 << 20
TOP_PAD = 16 << 20  # a step's logits at 8 requests fit: trimming keeps this much


def fix_thresholds() -> bool:
    """Set the thresholds and the pad (which also stops glibc adapting them); False where
    the C library has no mallopt or refuses it (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                (M_TOP_PAD, TOP_PAD))
    return all([mallopt(parameter, value) for parameter, value in settings])
