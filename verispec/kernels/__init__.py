"""Native CPU kernels, built on first use; see build.py for the fallback rules.

`pack(weight)` repacks a bf16 [out, in] matrix once; `linear(x, packed, out,
bias)` then computes x @ weight.T (+ bias) for bf16 x [n, in], with a row's
bits independent of n, of the other rows and of the thread count.
`available()` says whether the kernel can be used; when it is False callers
must take their ordinary path.
"""
from __future__ import annotations

import threading

import torch

_lock = threading.Lock()
_module = None
_tried = False


def _get():
    global _module, _tried
    if not _tried:
        with _lock:
            if not _tried:
                from .build import build

                _module = build()
                _tried = True
    return _module


def available() -> bool:
    return _get() is not None


def _require():
    module = _get()
    if module is None:
        raise RuntimeError("the bf16 kernel is unavailable; check available() first")
    return module


def pack(weight: torch.Tensor) -> torch.Tensor:
    return _require().pack(weight)


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    return _require().linear(x, packed, out_features, bias)
