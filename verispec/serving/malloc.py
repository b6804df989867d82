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

A heap grows by what is asked plus the pad, and the pad's pages join the RSS only when
something first writes them. The event loop's heap (the main thread's) grows at start-up and
at the first requests (llguidance's tables, code compiled on first use), then hardly: its pad
stayed unwritten until the first burst whose short-lived objects reached that deep, minutes
into the traffic, and the RSS stepped up by most of the pad and stayed (trimming keeps the
pad). `keep_heap_top_resident`, run by the app from its start, faults that heap's free top in
every HEAP_TOP_EVERY seconds (`populate_heap_top`; little to do once it is resident), so the
RSS follows the heap's size rather than the deepest burst so far.

One arena (`M_ARENA_MAX`): left alone, glibc gives each thread that allocates an arena of its
own, and a thread arena grows in heaps of at most 64 MiB, each with its own pad. The scheduler
thread's KV caches and step tensors crossed that size as the live set moved, making and
dropping heaps: a new heap kept its pad resident (a floor step) and a block near a heap's top
held the free memory below it (a plateau). Set before the server starts its threads, the
limit puts every thread on the main heap, the one whose top is kept resident.
"""
from __future__ import annotations

import asyncio
import ctypes
import functools
import mmap

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8  # mallopt's (malloc.h)
MMAP_THRESHOLD = 32 << 20  # the ceiling glibc's adapted value reaches on 64-bit
TRIM_THRESHOLD = 4 << 20
TOP_PAD = 16 << 20  # a step's logits at 8 requests fit: trimming keeps this much
ARENA_MAX = 1  # every thread allocates from the main heap, whose top populate_heap_top keeps
_fixed = False  # whether this process set them
MADV_POPULATE_WRITE = 23  # Linux 5.14: fault pages in writable, leave what they hold
_TOP_HEADER = 2 * ctypes.sizeof(ctypes.c_size_t)  # a chunk's header: glibc keeps its size there
HEAP_TOP_EVERY = 10.0  # seconds between populate_heap_top calls, on the event loop


def fix_thresholds() -> bool:
    """Set the thresholds and the pad (which also stops glibc adapting them) and one arena,
    for the threads started after; False where the C library has no mallopt or refuses it
    (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                (M_TOP_PAD, TOP_PAD), (M_ARENA_MAX, ARENA_MAX))
    global _fixed
    _fixed = all([mallopt(parameter, value) for parameter, value in settings])
    return _fixed


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


@functools.cache
def _libc():
    """libc with mallinfo2, sbrk and madvise typed, or None without mallinfo2 (glibc < 2.33)."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        libc.mallinfo2.restype = _MallInfo2
    except AttributeError:
        return None
    libc.sbrk.restype = ctypes.c_void_p
    libc.sbrk.argtypes = [ctypes.c_ssize_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def populate_heap_top() -> bool:
    """Fault in the main heap's free top (its first pad and trim threshold's worth), its
    contents untouched: madvise(MADV_POPULATE_WRITE) over the pages past the top chunk's
    header. The main heap is the main thread's, where `verispec serve`'s event loop runs;
    call it once that heap has done its growing. False where it does nothing: thresholds
    not fixed in this process (`fix_thresholds`), no mallinfo2, or a kernel before 5.14."""
    libc = _libc()
    if not _fixed or libc is None:
        return False
    end = libc.sbrk(0)  # the main heap's end: its top chunk ends here
    top = end - libc.mallinfo2().keepcost  # keepcost: the main heap's top chunk's size
    first = (top + _TOP_HEADER + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
    last = min(end, first + TOP_PAD + TRIM_THRESHOLD)  # the top is used from its start
    return first < last and libc.madvise(first, last - first, MADV_POPULATE_WRITE) == 0


async def keep_heap_top_resident() -> None:
    """`populate_heap_top` now and every HEAP_TOP_EVERY seconds, for as long as the task
    runs; returns at once where the thresholds are not fixed in this process."""
    if not _fixed:
        return
    while True:
        populate_heap_top()
        await asyncio.sleep(HEAP_TOP_EVERY)
