"""A preallocated key/value cache whose rollback and compaction move data in place.

One buffer holds every layer: [layers, 2 (key, value), kv_heads, capacity, head_dim].
Keys and values of one layer sit next to each other, so a forward writes both
with a single copy, and a layer's keys for attention are a strided view, never
a concatenation. Nothing is allocated per decode step.

Invariant: cache indices [0, length) hold the keys and values of the tokens the
owner has committed (or is verifying), in the order they were forwarded; indices
>= length hold stale data that no forward may read unmasked.
"""
from __future__ import annotations

import torch


class StaticKVCache:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu", align: int = 1) -> None:
        """`capacity` positions may be stored; the buffer is rounded up to a multiple
        of `align` so readers of whole tiles stay in bounds (the extra slots are never claimed)."""
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        slots = -(-self.capacity // align) * align
        self.kv = torch.zeros(num_layers, 2, num_kv_heads, slots, head_dim,
                              dtype=dtype, device=device)
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    @property
    def num_layers(self) -> int:
        return self.kv.shape[0]

    def truncate(self, length: int) -> None:
        """Forget every position >= length; a no-op when length >= self.length."""
        if length < 0:
            raise ValueError(f"cannot truncate a cache to a negative length ({length})")
        self._length = min(self._length, int(length))

    def reserve(self, n: int) -> int:
        """Claim n slots after the current length and return where they start.

        Raises before anything is written, so a failed forward leaves the cache as it was.
        """
        start = self._length
        if start + n > self.capacity:
            raise ValueError(
                f"KV cache overflow: {start} cached + {n} new positions exceed its capacity "
                f"of {self.capacity}; create the cache with a larger capacity (at most the "
                f"model's max_context) or shorten the prompt / max_new_tokens")
        self._length = start + n
        return start

    def layer(self, index: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of layer `index`'s keys and values for cache indices [0, end)."""
        kv = self.kv[index, :, :, :end]  # [2, kv_heads, end, head_dim]
        return kv[0], kv[1]

    def compact(self, start: int, keep: torch.Tensor) -> None:
        """Keep only the cache indices in `keep` among those >= `start`.

        `keep` holds absolute cache indices, strictly increasing, all in
        [start, length). Afterwards cache index start + j holds what index keep[j]
        held, indices < start are untouched, and length == start + len(keep).

        This is what tree verification needs once a path is accepted: the path's
        nodes were forwarded at RoPE positions start + depth, so the compacted cache
        equals one built by forwarding the kept tokens alone as a chain.
        """
        # Checked on the host (the tree's indices come from there), then moved once:
        # on a GPU each check of a device tensor would be a sync.
        keep = keep.to(device="cpu", dtype=torch.long).flatten()
        count = keep.numel()
        if not 0 <= start <= self._length:
            raise ValueError(f"compact start {start} outside the cached range [0, {self._length}]")
        if count:
            lo, hi = int(keep[0]), int(keep[-1])
            if lo < start or hi >= self._length:
                raise ValueError(
                    f"compact keeps indices in [{lo}, {hi}], outside [{start}, {self._length})")
            if count > 1 and not bool((keep[1:] > keep[:-1]).all()):
                raise ValueError("compact needs strictly increasing indices")
            # index_select gathers into a fresh tensor first, so sources that the
            # write overlaps are read before they are overwritten.
            kept = self.kv.index_select(3, keep.to(self.kv.device, non_blocking=True))
            self.kv[:, :, :, start:start + count] = kept
        self._length = start + count


class WindowKVCache(StaticKVCache):
    """A StaticKVCache for a model whose every layer attends to a sliding window:
    it holds only the last window - 1 + 2 * block positions, so memory stays
    bounded however long the context grows.

    Slot s holds position offset + s, slots stay contiguous and in position
    order (the attention kernels' prefix and index contracts are unchanged);
    when a new block would not fit, the oldest positions are dropped by one
    shift that keeps window - 1 + block of them. `length` and every argument
    are positions, as for StaticKVCache. Invariant: a rollback of up to `block`
    positions, and any block of up to `block` new positions, find every key
    their rows can see.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, window: int,
                 block: int, dtype: torch.dtype, device: torch.device | str = "cpu",
                 align: int = 1) -> None:
        self.window, self.block = int(window), int(block)
        super().__init__(num_layers, num_kv_heads, head_dim, self.window - 1 + 2 * self.block,
                         dtype, device, align)
        self.offset = 0  # the position slot 0 holds

    @property
    def length(self) -> int:
        return self.offset + self._length

    def make_room(self, n: int) -> None:
        """Shift out the oldest positions if n more would not fit (n <= block)."""
        if n > self.block:
            raise ValueError(f"a block of {n} positions exceeds this sliding-window cache's "
                             f"block of {self.block}")
        if self._length + n <= self.capacity:
            return
        keep = self.window - 1 + self.block
        drop = self._length - keep
        self.kv[:, :, :, :keep] = self.kv[:, :, :, drop:self._length].clone()
        self.offset += drop
        self._length = keep

    def reserve(self, n: int) -> int:
        self.make_room(n)
        return self.offset + super().reserve(n)

    def truncate(self, length: int) -> None:
        if length < 0:
            raise ValueError(f"cannot truncate a cache to a negative length ({length})")
        if self.offset and length < self.offset + self.window - 1:
            raise ValueError(
                f"cannot roll a sliding-window cache back to {length}: it holds positions from "
                f"{self.offset} on and the next token needs the {self.window - 1} before it "
                f"(rollbacks deeper than its block of {self.block} are not supported)")
        self._length = min(self._length, int(length) - self.offset)

    def layer(self, index: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return super().layer(index, end - self.offset)

    def compact(self, start: int, keep: torch.Tensor) -> None:
        if start < self.offset:
            raise ValueError(f"compact start {start} is before the cached window ({self.offset})")
        super().compact(start - self.offset, keep.flatten().to(torch.long) - self.offset)


class MixedKVCache:
    """The cache of a model with both kinds of layer (Gemma 2/3's local and
    global layers, Qwen2 from `max_window_layers` on, any model with some
    sliding layers): the sliding layers in a WindowKVCache, bounded at
    window - 1 + 2 * block positions, the full-attention layers in a
    StaticKVCache of `capacity`, which they need since they see every position.

    Positions, `length` and every argument are as for StaticKVCache. The global
    layers' slot s holds position s (`offset` is 0); the local layers' slot s holds
    position `local_offset` + s. `kv[i]` is layer i's [2, kv_heads, slots, head_dim]
    buffer in its own coordinates. Invariant: both parts hold the same positions
    from the local part's offset on; a rollback or block of up to `block` positions
    finds every key its rows can see in either part.
    """

    offset = 0  # the coordinates of the global layers, and of every argument

    def __init__(self, sliding: tuple[bool, ...], num_kv_heads: int, head_dim: int, capacity: int,
                 window: int, block: int, dtype: torch.dtype, device: torch.device | str = "cpu",
                 align: int = 1) -> None:
        if all(sliding) or not any(sliding):
            raise ValueError("MixedKVCache needs both sliding and full-attention layers")
        self.sliding = tuple(bool(s) for s in sliding)
        self.full = StaticKVCache(self.sliding.count(False), num_kv_heads, head_dim, capacity,
                                  dtype, device, align)
        self.local = WindowKVCache(self.sliding.count(True), num_kv_heads, head_dim, window, block,
                                   dtype, device, align)
        self.window, self.block, self.capacity = self.local.window, self.local.block, self.full.capacity
        local, full = iter(self.local.kv), iter(self.full.kv)
        # Views: the local part shifts in place, so they stay valid.
        self.kv = [next(local) if s else next(full) for s in self.sliding]

    @property
    def length(self) -> int:
        return self.full.length

    @property
    def num_layers(self) -> int:
        return len(self.sliding)

    @property
    def local_offset(self) -> int:
        return self.local.offset

    def reserve(self, n: int) -> int:
        start = self.full.reserve(n)
        try:
            self.local.reserve(n)
        except BaseException:
            self.full.truncate(start)
            raise
        return start

    def truncate(self, length: int) -> None:
        self.local.truncate(length)  # raises first on a rollback deeper than the local part holds
        self.full.truncate(length)

    def compact(self, start: int, keep: torch.Tensor) -> None:
        self.local.compact(start, keep)
        self.full.compact(start, keep)

    def layer(self, index: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.kv[index][:, :, : end - (self.local_offset if self.sliding[index] else 0)]
        return kv[0], kv[1]
