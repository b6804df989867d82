"""Native CPU kernels, built on first use; see build.py for the fallback rules.

`pack(weight)` repacks a bf16 [out, in] matrix once; `linear(x, packed, out,
bias)` then computes x @ weight.T (+ bias) for bf16 x [n, in], with a row's
bits independent of n, of the other rows and of the thread count.
`attend(q, caches, row_cache, row_len, row_index)` is attention whose
result for a row depends only on that row's query and visible keys (see
attention.cpp). `available()` says whether the kernel can be used; when it is False callers
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


def attend(q: torch.Tensor, caches: list[torch.Tensor], row_cache: torch.Tensor,
           row_len: torch.Tensor, row_index: torch.Tensor | None = None) -> torch.Tensor:
    """q [rows, heads, head_dim] (bf16 or float32, contiguous); caches: per request
    [2, kv_heads, capacity, head_dim]; row r sees keys [0, row_len[r]) of
    caches[row_cache[r]], or, when row_index[r, 0] >= 0, the cache indices
    row_index[r, :row_len[r]] -> [rows, heads * head_dim]."""
    return _require().attend(q, caches, row_cache, row_len, row_index)


def decoder_layer(x: torch.Tensor, weights: list[torch.Tensor], dims: list[int], eps: float,
                  cos: torch.Tensor, sin: torch.Tensor, caches: list[torch.Tensor],
                  row_cache: torch.Tensor, row_slot: torch.Tensor, row_len: torch.Tensor,
                  row_index: torch.Tensor | None = None) -> torch.Tensor:
    """One bf16 decoder layer (see layer.cpp). weights: attn_norm, packed qkv, qkv bias
    or empty, qk_norm [heads + kv_heads, head_dim] or empty, packed o, mlp_norm, packed
    gate_up, packed down; dims: heads, kv_heads, head_dim, intermediate; cos/sin
    [rows, head_dim]; row r's key and value go to slot row_slot[r] of caches[row_cache[r]]."""
    return _require().decoder_layer(x, weights, dims, eps, cos, sin, caches, row_cache, row_slot,
                                    row_len, row_index)
