"""The static path's KV caches and the host side of its padded step.

Every request's cache is one of a few buffers of one fixed size, kept by the model
and reused: a CUDA graph reads and writes fixed addresses, so a graph captured for
a buffer serves every later request that gets the same buffer, and a fixed size
keeps every attention reduction the same length whatever the request. Each buffer
has `width` spare slots past its capacity, where a step's padding rows write.

`stage` turns one block of up to `width` rows into the step's inputs: the tokens,
positions and slots padded to `width` rows, and the keys each row sees, over the
whole buffer. Padding rows repeat the last token and see only keys no real row
needs, so their outputs are discarded and nothing they write is ever read.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from ..kv_cache import StaticKVCache


class SlabCache(StaticKVCache):
    """A StaticKVCache over one of a `SlabPool`'s buffers; the buffer returns to the
    pool when the cache is dropped. `slab` names the buffer (and its graphs)."""

    def __init__(self, pool: "SlabPool", slab: int) -> None:
        self.capacity = pool.capacity
        self.kv = pool.buffers[slab]
        self.slab = slab
        self._length = 0
        weakref.finalize(self, pool.free.append, slab)


class SlabPool:
    """KV buffers [layers, 2, kv_heads, capacity + spare, head_dim], taken and returned
    by requests; a buffer is allocated only when every earlier one is in use."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int, spare: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.shape = (num_layers, 2, kv_heads, capacity + spare, head_dim)
        self.capacity = capacity
        self.dtype, self.device = dtype, device
        self.buffers: list[torch.Tensor] = []
        self.free: list[int] = []

    @property
    def slots(self) -> int:
        return self.shape[3]

    def take(self) -> SlabCache:
        if self.free:
            return SlabCache(self, self.free.pop())
        # Zeros, not empty: a masked key's score is replaced by -inf, but its value is
        # still multiplied by a zero weight, and garbage bits could be NaN. A normal
        # tensor even when asked for under inference mode (the self-check): rollback and
        # tree compaction write to it outside.
        with torch.inference_mode(False):
            buffer = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        self.buffers.append(buffer)
        return SlabCache(self, len(self.buffers) - 1)


@dataclass
class Staged:
    """One padded step's inputs on the host, laid out as the step's device buffers."""
    ints: torch.Tensor  # int64: tokens [w], positions [w], slots [w], the chain's draft
    # count [1], then each row's tail slots [w, 2w] (`tail_slots`)
    masks: torch.Tensor  # [kinds, w, slots + 2w] bool: keys each row sees, in the buffer and
    # in its tail (all layers; then the sliding layers')


def stage(tokens: torch.Tensor, start: int, positions: torch.Tensor | None,
          mask: torch.Tensor | None, width: int, slots: int, window: int | None,
          pin: bool = False) -> Staged:
    """Rows `tokens` [n <= width] at cache slots start.., `positions` [n] (None: the
    slots), `mask` [n, start + n] over slots (None: causal); `window` for the second
    mask of sliding layers (a key at position q is seen from position p iff p - q < window).
    `pin`: in page-locked memory, so the copy to the GPU does not wait for it.

    Where a row's keys sit in its attention sums must not depend on the block it is
    in: a tree row's ancestors are scattered among its siblings' slots, where decoding
    its path alone finds them one after another. So each row's keys are numbered in
    order, the committed ones (slot q is key q) and then its visible block slots, and
    split at `base`, a multiple of the width a tile below its own key's number: keys
    before `base` are read where they lie in the buffer (committed, seen by every row),
    the rest (at most 2 * width) are gathered into the row's own tail, in order. The
    split and the tail depend on the row's keys only, not on its neighbours."""
    n = tokens.shape[0]
    tail = 2 * width
    padded = torch.empty(width, dtype=torch.long)
    padded[:n] = tokens
    padded[n:] = tokens[-1]
    row_slots = torch.arange(start, start + width)
    pos = row_slots.clone()
    if positions is not None:
        pos[:n] = positions
    pos[n:] = pos[n - 1]  # a padding row's position only has to be in the RoPE table
    keys = torch.arange(start + width)
    # Padding rows see the keys up to their own slot: real rows' and their own.
    visible = keys[None, :] <= row_slots[:, None]  # [width, start + width]
    if mask is not None:
        visible[:n] = False
        visible[:n, : start + n] = mask
    kinds = [visible]
    if window is not None:
        key_pos = torch.cat((keys[:start], pos))  # slot q holds q; block slot start + j, pos[j]
        kinds.append(visible & (pos[:, None] - key_pos[None, :] < window))
    block = visible[:, start:]  # [width, width]: the block slots each row sees
    last = start + block.sum(1) - 1  # the number of the row's own key
    base = ((torch.div(last, width, rounding_mode="floor") - 1).clamp(min=0) * width)
    numbers = base[:, None] + torch.arange(tail)[None, :]  # [width, tail]
    ordered = torch.sort((~block).to(torch.uint8), dim=1, stable=True).indices + start
    in_block = ordered.gather(1, (numbers - start).clamp(0, width - 1))
    tail_slots = torch.where(numbers < start, numbers, in_block)
    in_tail = numbers <= last[:, None]
    masks = []
    for seen in kinds:
        shared = torch.zeros(width, slots + tail, dtype=torch.bool)
        shared[:, :start] = seen[:, :start] & (keys[None, :start] < base[:, None])
        shared[:, slots:] = in_tail & seen.gather(1, tail_slots)
        masks.append(shared)
    ints = torch.cat((padded, pos, row_slots, torch.tensor([n - 1]), tail_slots.flatten()))
    masks = torch.stack(masks)
    if pin:
        ints, masks = ints.pin_memory(), masks.pin_memory()
    return Staged(ints, masks)
