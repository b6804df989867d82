"""Python's cyclic garbage collector kept out of timed loops.

Loading a model leaves about 230k container objects (torch's modules and functions
alone are 166k), and the first full collection after the load walks all of them:
110-140 ms on these machines (docs/notebook/quant_i8_kquant.md, round 6). One of
those landing inside a 32-step decode timing adds milliseconds to every token, on
verispec's side only. Frozen, everything alive at the start of the timing is left
out of every collection until it ends, which then walks only what the timed work
allocated; the frozen objects are unfrozen after, so nothing leaks.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
