"""verispec.serving.malloc: with fixed thresholds a freed heap top goes back to the system,
where glibc's adapted ones keep it (the soak's RSS saw-tooth, docs/notebook/soak_rss.md); a
heap's pad, faulted in at start, does not step the RSS up when a burst first reaches it."""
from __future__ import annotations

import platform
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from verispec.serving import malloc

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

# Frees a 31 MiB block (mmapped at first: glibc then adapts its thresholds to it), then
# allocates, touches and frees 30 MiB blocks; leaves in `kept` how many KiB the RSS kept.
# Plain ctypes: it runs in a child that imports neither torch nor verispec, and in a Ray
# replica (test_ray_serve.py).
KEPT_KIB = """
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]

def rss_kib():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))

before = rss_kib()
for size in (31 << 20, 30 << 20, 30 << 20):
    block = libc.malloc(size)
    libc.memset(block, 1, size)
    libc.free(block)
kept = rss_kib() - before
"""
# The module is loaded from its file so that the child imports neither torch nor verispec.
_CHILD = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("malloc", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
if sys.argv[2] == "fixed":
    assert module.fix_thresholds()
"""


def child(mode: str, check: str, name: str) -> str:
    """`check` run in a child after fix_thresholds (mode "fixed") or not; prints `name`."""
    done = subprocess.run([sys.executable, "-c", _CHILD + check + f"print({name})\n",
                           str(Path(malloc.__file__)), mode],
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


def kept_kib(mode: str) -> int:
    return int(child(mode, KEPT_KIB, "kept"))


def test_fixed_thresholds_give_a_freed_heap_top_back():
    assert kept_kib("adapted") >= 28 * 1024  # glibc's own behaviour: the 30 MiB stay
    assert kept_kib("fixed") < (malloc.TOP_PAD + malloc.TRIM_THRESHOLD) // 1024


# After the heap has grown (a long-lived 8 MiB block: the heap grows by it and the pad), a
# 12 MiB short-lived block is written and freed; prints how many KiB of RSS that kept, and
# what populate_heap_top returned.
_PAD_CHILD = """
import ctypes, importlib.util, sys
spec = importlib.util.spec_from_file_location("malloc", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def rss_kib():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))

if sys.argv[2] in ("fixed", "faulted"):
    assert module.fix_thresholds()
lasting = libc.malloc(8 << 20)
ctypes.memset(lasting, 1, 8 << 20)
faulted = module.populate_heap_top() if sys.argv[2].endswith("faulted") else None
before = rss_kib()
burst = libc.malloc(12 << 20)
ctypes.memset(burst, 1, 12 << 20)
libc.free(burst)
print(rss_kib() - before, faulted)
"""


def pad_kept_kib(mode: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-c", _PAD_CHILD, str(Path(malloc.__file__)), mode],
                          capture_output=True, text=True, check=True, timeout=60)
    kept, faulted = done.stdout.split()
    return int(kept), faulted


def test_a_heap_top_populated_at_start_keeps_a_later_burst_from_stepping_the_rss_up():
    # glibc's own behaviour with the pad: the burst's pages of it stay resident
    assert pad_kept_kib("fixed")[0] >= 10 * 1024
    assert pad_kept_kib("faulted") == (pytest.approx(0, abs=1024), "True")
    # without fixed thresholds there is no pad: nothing to do
    assert pad_kept_kib("adapted-faulted")[1] == "False"


def test_the_app_keeps_the_heap_top_resident_while_it_serves(monkeypatch):
    """The heap grows at the first requests too: the app populates its top again and again
    from its start, and stops when it stops; not at all without fixed thresholds."""
    import time

    from conftest import tiny_engine

    from verispec.serving import server

    calls = []
    monkeypatch.setattr(malloc, "populate_heap_top",
                        lambda: calls.append(threading.current_thread().name))
    monkeypatch.setattr(malloc, "HEAP_TOP_EVERY", 0.05)
    app = server.create_app(tiny_engine(), server.ServerConfig(("tiny",)))
    with server.ServerThread(app):
        time.sleep(0.5)
    assert calls == []  # thresholds not fixed in this process: nothing to keep
    monkeypatch.setattr(malloc, "_fixed", True)
    with server.ServerThread(server.create_app(tiny_engine(), server.ServerConfig(("tiny",)))):
        time.sleep(0.5)
        assert len(calls) >= 4 and set(calls) == {"verispec-http"}  # from the loop
    stopped = len(calls)
    time.sleep(0.2)
    assert len(calls) == stopped


# A thread started now allocates a block (below the mmap threshold, past the thread's cache
# of small blocks); leaves in `in_main` whether it came from the main heap (brk's). Plain
# ctypes, as KEPT_KIB: it runs in a Ray replica too.
IN_MAIN_HEAP = """
import ctypes, threading
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.sbrk.restype = ctypes.c_void_p
found = []
thread = threading.Thread(target=lambda: found.append(libc.malloc(64 << 10)))
thread.start()
thread.join()
in_main = found[0] < libc.sbrk(0)
libc.free(found[0])
"""


def in_main_heap(mode: str) -> str:
    return child(mode, IN_MAIN_HEAP, "in_main")


def test_threads_started_after_the_fix_allocate_from_the_main_heap():
    """One arena: the scheduler thread's KV caches and step tensors come from the heap whose
    top `populate_heap_top` keeps, not from a thread arena's 64 MiB heaps of their own."""
    assert in_main_heap("adapted") == "False"  # glibc's own: a thread arena per thread
    assert in_main_heap("fixed") == "True"
