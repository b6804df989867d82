"""verispec.serving.malloc: with fixed thresholds a freed heap top goes back to the system,
where glibc's adapted ones keep it (the soak's RSS saw-tooth, docs/notebook/soak_rss.md)."""
from __future__ import annotations

import platform
import subprocess
import sys
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
""" + KEPT_KIB + "print(kept)\n"


def kept_kib(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(Path(malloc.__file__)), mode],
                          capture_output=True, text=True, check=True, timeout=60)
    return int(done.stdout)


def test_fixed_thresholds_give_a_freed_heap_top_back():
    assert kept_kib("adapted") >= 28 * 1024  # glibc's own behaviour: the 30 MiB stay
    assert kept_kib("fixed") < (malloc.TOP_PAD + malloc.TRIM_THRESHOLD) // 1024
