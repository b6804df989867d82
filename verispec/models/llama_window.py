"""Sliding-window attention on the native backend: the mask each row sees, and
the coordinates of a `WindowKVCache` that has shifted its oldest positions out.

A row at position p sees a key at position q iff the caller's mask (or the
causal one) allows it and p - q < window, as in transformers' sliding mask.
Committed slots hold positions in order, new rows hold the positions given (a
tree node's depth), so the keys a row sees, and their order, are those it sees
decoded alone: row invariance, hence bit-exact speculation, holds past the window.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from verispec.models.base import ForwardOutput


def window_mask(arange: torch.Tensor, window: int, start: int, n: int,
                positions: torch.Tensor | None, mask: torch.Tensor | None,
                offset: int = 0) -> torch.Tensor:
    """[n, start + n] bool over slots for n new rows at slot `start`; slot s holds
    position offset + s (`arange` is the model's position index on its device)."""
    rows = (arange[offset + start:offset + start + n] if positions is None
            else positions.to(arange.device))
    if mask is None:
        mask = arange[None, : start + n] <= arange[start:start + n, None]
    else:
        mask = mask.to(device=arange.device, dtype=torch.bool)
    held = torch.cat((arange[offset:offset + start], rows))  # each slot's position
    return mask & (rows[:, None] - held[None, :] < window)


@dataclass
class LocalRows:
    """Where a block's rows sit in the sliding layers' buffers, and what they see there."""
    start: int  # the local slot of the first new row
    mask: torch.Tensor  # [n, start + n] bool over local slots: causal or caller's, and in window


def local_rows(arange: torch.Tensor, window: int, cache, start: int, n: int,
               positions: torch.Tensor | None, mask: torch.Tensor | None) -> LocalRows:
    """`start` and `mask` in the cache's own coordinates (after `slots`) -> the local
    layers'. A MixedKVCache's local part has shifted `local_offset` positions
    further than its global part; a WindowKVCache's layers all share one offset."""
    shift = getattr(cache, "local_offset", 0)
    if mask is not None and shift:
        mask = mask[:, shift:]  # the dropped positions are outside every row's window
    return LocalRows(start - shift, window_mask(arange, window, start - shift, n, positions, mask,
                                                getattr(cache, "offset", 0) + shift))


def needs_pieces(cache, n: int) -> bool:
    """A block too long for a bounded sliding-window cache's room (it goes in pieces)."""
    block = getattr(cache, "block", None)
    return block is not None and n > block


def slots(arange: torch.Tensor, cache, start: int, n: int, positions: torch.Tensor | None,
          mask: torch.Tensor | None):
    """A block reserved at position `start`: the slot it starts at, its positions and
    its mask's columns in slots (they differ from positions once a WindowKVCache shifted)."""
    offset = getattr(cache, "offset", 0)
    if not offset:
        return start, positions, mask
    if positions is None:
        positions = arange[start:start + n]
    if mask is not None:
        mask = mask[:, offset:]  # the dropped positions are outside every row's window
    return start - offset, positions, mask


def forward_pieces(model, tokens: torch.Tensor, cache, positions, mask,
                   num_logits, hidden_layers) -> ForwardOutput:
    """A prefill longer than a Window/MixedKVCache's block, as consecutive causal pieces."""
    if positions is not None or mask is not None:
        raise ValueError(f"a block of {tokens.shape[0]} positions with a mask exceeds this "
                         f"sliding-window cache's block of {cache.block}")
    n = tokens.shape[0]
    num_logits = n if num_logits is None else num_logits
    parts = []
    for a in range(0, n, cache.block):
        b = min(n, a + cache.block)
        wanted = max(0, b - max(a, n - num_logits))
        parts.append(model.forward(tokens[a:b], cache, num_logits=wanted,
                                   hidden_layers=hidden_layers))
    hidden = tuple(torch.cat([p.hidden[i] for p in parts]) for i in range(len(hidden_layers)))
    return ForwardOutput(logits=torch.cat([p.logits for p in parts]), hidden=hidden)
