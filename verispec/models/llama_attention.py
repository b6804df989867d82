"""Grouped-query attention against a static KV cache.

Query heads that share a key/value head are folded into extra query rows
([kv_heads, groups * rows, head_dim]), so one SDPA call serves a GQA layer with
no repeated keys or values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verispec import kernels

ROW_TILE = 8  # query rows per tile in batch-invariant mode; forwards pad n up to a multiple
ROWWISE_MAX = 64  # blocks up to this many rows attend row by row (decode and verification)
KEY_TILE = 64  # keys per tile in batch-invariant mode; the cache buffer is padded to a multiple


@dataclass
class AttentionMask:
    sdpa: torch.Tensor | None = None  # [groups * rows, end] bool, True = may attend; None = all
    tiled: torch.Tensor | None = None  # [rows, key_tiles * KEY_TILE] bool, invariant mode only
    blocked: torch.Tensor | None = None  # True = masked, laid out like invariant_attend's scores
    # Row-by-row mode: per real row, the number of visible keys when they are a
    # prefix of the cache, else the visible key indices (a tree row).
    visible: list[int | torch.Tensor] | None = None

    @staticmethod
    def build(mask: torch.Tensor | None, start: int, n: int, rows: int, groups: int,
              device: torch.device, invariant: bool, rowwise: bool = False) -> "AttentionMask":
        """The mask for `rows` query rows, of which the first n are real, at cache
        indices [start, start + n). `mask` is the caller's [n, start + n] or None for causal."""
        end = start + n
        if mask is None and n == 1 and rows == 1:
            return AttentionMask(sdpa=None)
        if rowwise and not invariant and n <= ROWWISE_MAX:
            return AttentionMask(visible=_visible_keys(mask, start, n, device))
        if mask is None:
            keys = torch.arange(end, device=device)
            mask = keys[None, :] <= keys[start:, None]  # [n, end]
        else:
            mask = mask.to(device=device, dtype=torch.bool)
        if rows > n:
            # Pad rows see only key 0, so their softmax is finite; their outputs are discarded.
            pad = torch.zeros(rows - n, end, dtype=torch.bool, device=device)
            pad[:, 0] = True
            mask = torch.cat((mask, pad))
        if not invariant:
            return AttentionMask(sdpa=mask.repeat(groups, 1))
        width = -(-end // KEY_TILE) * KEY_TILE
        tiled = F.pad(mask, (0, width - end))  # [rows, width]; keys >= end are stale, never seen
        blocked = (~tiled).view(rows // ROW_TILE, ROW_TILE, width // KEY_TILE, KEY_TILE)
        blocked = blocked.permute(0, 2, 1, 3)[:, :, None].expand(-1, -1, groups, -1, -1)
        blocked = blocked.reshape(rows // ROW_TILE, width // KEY_TILE, groups * ROW_TILE, KEY_TILE)
        return AttentionMask(tiled=tiled, blocked=blocked)


def _visible_keys(mask: torch.Tensor | None, start: int, n: int,
                  device: torch.device) -> list[int | torch.Tensor]:
    if mask is None:
        return [start + i + 1 for i in range(n)]
    visible: list[int | torch.Tensor] = []
    for row in mask.to(device=device, dtype=torch.bool):
        index = row.nonzero().flatten()
        count = index.shape[0]
        prefix = count > 0 and int(index[-1]) == count - 1
        visible.append(count if prefix else index)
    return visible


def rowwise_attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   mask: AttentionMask) -> torch.Tensor:
    """Each row attends alone to exactly the keys it sees, in cache order.

    SDPA picks its blocking from the query and key lengths, so inside a block a
    row's output differs from the same row decoded alone (measured: 0.56 logit
    max-abs in bf16 at 6 rows on the default model). One call per row with the
    same key tensor plain decoding would use makes each row's output identical
    to plain decoding, bit for bit, at the price of n small calls per layer.
    """
    outs = []
    for i, seen in enumerate(mask.visible):
        if isinstance(seen, int):
            k, v = keys[:, :seen], values[:, :seen]
        else:
            k, v = keys[:, seen], values[:, seen]
        outs.append(attend(q[i:i + 1], k, v, AttentionMask(sdpa=None)))
    return torch.cat(outs)


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
           mask: AttentionMask) -> torch.Tensor:
    """q [rows, heads, head_dim], keys/values [kv_heads, end, head_dim] -> [rows, heads * head_dim]."""
    rows, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    groups = heads // kv_heads
    folded = q.reshape(rows, kv_heads, groups, head_dim).permute(1, 2, 0, 3)
    folded = folded.reshape(kv_heads, groups * rows, head_dim)
    # 4-D inputs: the CPU flash kernel only takes [batch, heads, rows, dim]; 3-D
    # inputs fall back to the unfused math path, several times slower.
    out = F.scaled_dot_product_attention(folded[None], keys[None], values[None], attn_mask=mask.sdpa)
    return out.view(kv_heads, groups, rows, head_dim).permute(2, 0, 1, 3).reshape(rows, heads * head_dim)


def invariant_attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                     mask: AttentionMask) -> torch.Tensor:
    """Attention whose result for a row does not depend on the other rows or on n.

    SDPA picks its blocking from the query and key lengths, so one row's output
    changes with the size of the block around it. Here every matmul, reduction
    and elementwise op runs on fixed-size tiles instead: ROW_TILE query rows (times
    the head group) against KEY_TILE keys, tiles aligned to key index 0. A row's
    softmax uses the exact global max (max is order-free), so tiles past its last
    visible key contribute exact zeros to every sum. Math is float32 throughout.

    q [rows, heads, head_dim] with rows a multiple of ROW_TILE; keys/values
    [kv_heads, >= mask.tiled width, head_dim] -> [rows, heads * head_dim].
    """
    rows, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    groups = heads // kv_heads
    row_tiles, width = rows // ROW_TILE, mask.tiled.shape[1]
    key_tiles = width // KEY_TILE
    scale = head_dim ** -0.5
    # [kv, row_tiles, 1, groups * ROW_TILE, hd]: the head group and a tile of rows fold into rows.
    folded = (q.float() * scale).view(row_tiles, ROW_TILE, kv_heads, groups, head_dim)
    folded = folded.permute(2, 0, 3, 1, 4).reshape(kv_heads, row_tiles, 1, groups * ROW_TILE, head_dim)
    k = keys[:, :width].float().view(kv_heads, 1, key_tiles, KEY_TILE, head_dim)
    v = values[:, :width].float().view(kv_heads, 1, key_tiles, KEY_TILE, head_dim)
    scores = folded @ k.transpose(-1, -2)  # [kv, row_tiles, key_tiles, groups * ROW_TILE, KEY_TILE]
    scores.masked_fill_(mask.blocked, float("-inf"))
    peak = scores.amax(dim=(2, 4), keepdim=True)
    probs = (scores - peak).exp_()
    total = probs.sum(dim=4).sum(dim=2)  # [kv, row_tiles, groups * ROW_TILE]
    out = (probs @ v).sum(dim=2) / total[..., None]  # [kv, row_tiles, groups * ROW_TILE, hd]
    out = out.view(kv_heads, row_tiles, groups, ROW_TILE, head_dim).permute(1, 3, 0, 2, 4)
    return out.reshape(rows, heads * head_dim).to(q.dtype)


@dataclass
class RowPlan:
    """Which keys each query row of a (possibly multi-request) forward may see,
    in the form verispec.kernels.attend takes."""
    row_cache: torch.Tensor  # [rows] int64: the row's request (index into the caches list)
    row_slot: torch.Tensor  # [rows] int64: the cache index the row's key and value go to
    row_len: torch.Tensor  # [rows] int64: visible key count
    row_index: torch.Tensor | None  # [rows, width] int64 visible cache indices, or -1 in
    # column 0 for a row that sees the prefix [0, row_len); None when every row does

    @staticmethod
    def build(segments: list[tuple[int, int, torch.Tensor | None]]) -> "RowPlan":
        """segments: per request (start, n, mask or None), rows in that order."""
        caches, lengths, masks, slots = [], [], [], []
        any_mask = any(mask is not None for _, _, mask in segments)
        for request, (start, n, mask) in enumerate(segments):
            caches.append(torch.full((n,), request, dtype=torch.long))
            slots.append(torch.arange(start, start + n))
            if mask is None:
                lengths.append(torch.arange(start + 1, start + n + 1))
                if any_mask:
                    masks.append(None)
                continue
            mask = mask.to(device="cpu", dtype=torch.bool)
            counts = mask.sum(1)
            if bool((counts == 0).any()):
                raise ValueError("every mask row must see at least one key (itself)")
            lengths.append(counts)
            masks.append(mask)
        row_index = None
        if any_mask:
            width = max(int(m.shape[1]) if m is not None else 1 for m in masks)
            parts = []
            for (start, n, _), mask in zip(segments, masks):
                part = torch.full((n, width), -1, dtype=torch.long)
                if mask is not None:
                    counts = mask.sum(1)
                    # A row whose visible keys are exactly a prefix needs no index list.
                    prefix = mask.long().cumprod(1).sum(1) == counts
                    order = torch.sort((~mask).to(torch.uint8), dim=1, stable=True).indices
                    tree_rows = (~prefix).nonzero().flatten()
                    part[tree_rows, : mask.shape[1]] = order[tree_rows]
                parts.append(part)
            row_index = torch.cat(parts)
        return RowPlan(torch.cat(caches), torch.cat(slots), torch.cat(lengths).to(torch.long),
                       row_index)

    def attend(self, q: torch.Tensor, layer_kv: list[torch.Tensor], scale: float = 0.0,
               softcap: float = 0.0) -> torch.Tensor:
        """q [rows, heads, head_dim]; layer_kv per request [2, kv_heads, slots, head_dim];
        scale and softcap as kernels.attend takes them (0: head_dim ** -0.5, no cap)."""
        return kernels.attend(q.contiguous(), layer_kv, self.row_cache, self.row_len, self.row_index,
                              scale, softcap)
