"""The HF backend's per-request cache: a transformers DynamicCache whose
rollback is a cut to an absolute length, also on sliding-window layers.

transformers' own sliding layer keeps window - 1 positions and cannot be
rolled back once the window is full (mlx-lm #1109 shipped the same class of
bug: a cache that cannot be trimmed keeps rejected state). Here a sliding
layer is a `WindowLayer`: it keeps every position in [base, length), where
base trails the length by the window plus `slack` positions, so any rollback
of up to `slack` positions finds the keys plain decoding would have. Its
attention mask is built by `window_masks` from absolute positions, so chains,
trees and prefills longer than the window all see exactly the keys each row
would see alone.

Invariant: slot s < start (committed) holds position s on every layer; a
sliding layer stores slot s at index s - base.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

# Positions kept past a sliding window: the deepest rollback (a draft block, a
# tree's depth) a sliding layer supports. A deeper one raises, never misreads.
DEFAULT_SLACK = 256


class WindowLayer(DynamicLayer):
    """A sliding-window layer's keys and values for slots [base, base + stored)."""

    is_sliding = True

    def __init__(self, window: int) -> None:
        super().__init__()
        self.window = int(window)
        self.base = 0

    def get_seq_length(self) -> int:
        stored = 0 if not self.is_initialized or self.keys.numel() == 0 else self.keys.shape[-2]
        return self.base + stored

    def get_max_length(self) -> int:
        return -1

    def drop_before(self, slot: int) -> None:
        """Forget slots < slot (no-op when none are stored)."""
        cut = slot - self.base
        if cut > 0 and self.is_initialized:
            self.keys = self.keys[..., cut:, :].contiguous()
            self.values = self.values[..., cut:, :].contiguous()
            self.base = slot

    def cut_to(self, length: int) -> None:
        if length < self.base + self.window - 1 and self.base > 0:
            raise ValueError(
                f"cannot roll a sliding-window cache back to {length}: it keeps positions from "
                f"{self.base} on, and the next token needs the {self.window - 1} before it "
                f"(rollbacks deeper than the cache's slack are not supported)")
        if self.is_initialized:
            self.keys = self.keys[..., : length - self.base, :]
            self.values = self.values[..., : length - self.base, :]

    def reset(self) -> None:
        super().reset()
        self.base = 0


class HFCache:
    """A DynamicCache whose rollback is a cut to an absolute length."""

    def __init__(self, config, slack: int = DEFAULT_SLACK) -> None:
        self.kv = DynamicCache(config=config)
        self.slack = int(slack)
        windows = set()
        for index, layer in enumerate(self.kv.layers):
            if type(layer) is DynamicSlidingWindowLayer:
                windows.add(int(layer.sliding_window))
                self.kv.layers[index] = WindowLayer(layer.sliding_window)
        if len(windows) > 1:
            raise ValueError(f"sliding layers with different windows {sorted(windows)} "
                             "are not supported")
        self.window = windows.pop() if windows else None
        self.mixed = self.window is not None and any(
            not isinstance(layer, WindowLayer) for layer in self.kv.layers)

    @property
    def length(self) -> int:
        return self.kv.get_seq_length()

    def _windows(self) -> list[WindowLayer]:
        return [layer for layer in self.kv.layers if isinstance(layer, WindowLayer)]

    @property
    def base(self) -> int:
        """The first slot every sliding layer still holds (0 without sliding layers)."""
        return min((layer.base for layer in self._windows()), default=0)

    def before_forward(self) -> None:
        """Drop sliding slots no query can reach, keeping `slack` positions for rollbacks."""
        if self.window is None:
            return
        keep_from = self.length - (self.window - 1) - self.slack
        # Amortized: trim only once a whole `slack` more has piled up.
        if keep_from - self.base >= self.slack:
            for layer in self._windows():
                layer.drop_before(keep_from)

    def truncate(self, length: int) -> None:
        extra = self.length - length
        if extra <= 0:
            return
        for layer in self.kv.layers:
            if isinstance(layer, WindowLayer):
                layer.cut_to(length)
            elif layer.is_initialized and layer.get_seq_length() > length:
                # A negative argument removes that many positions in every transformers
                # release that has crop(); a positive one means different things across them.
                layer.crop(length - layer.get_seq_length())

    @torch.inference_mode()
    def compact(self, start: int, keep: torch.Tensor) -> None:
        """Keep positions [0, start) and then the positions in `keep`, in order.

        `keep` holds absolute positions, strictly increasing, all in [start,
        length). Afterwards position start + j holds what keep[j] held and
        length == start + len(keep): the contract of StaticKVCache.compact.

        Tree verification calls this once a path is accepted: the path's nodes
        were forwarded at RoPE positions start + depth, so the compacted cache
        equals one built by forwarding the kept tokens alone as a chain.
        """
        keep = keep.flatten().to(torch.long)
        length = self.length
        count = keep.numel()
        if not 0 <= start <= length:
            raise ValueError(f"compact start {start} outside the cached range [0, {length}]")
        if start < self.base:
            raise ValueError(f"compact start {start} is before the kept sliding window ({self.base})")
        if count:
            lo, hi = int(keep[0]), int(keep[-1])
            if lo < start or hi >= length:
                raise ValueError(f"compact keeps positions in [{lo}, {hi}], outside [{start}, {length})")
            if count > 1 and not bool((keep[1:] > keep[:-1]).all()):
                raise ValueError("compact needs strictly increasing positions")
        if count and int(keep[-1]) - int(keep[0]) == count - 1 and int(keep[0]) == start:
            self.truncate(start + count)
            return
        for layer in self.kv.layers:
            if not layer.is_initialized:
                continue
            offset = layer.base if isinstance(layer, WindowLayer) else 0
            index = (keep - offset).to(layer.keys.device)
            lo = start - offset
            # Advanced indexing gathers into a fresh tensor before the write, so
            # sources the write overlaps are read first.
            layer.keys[..., lo:lo + count, :] = layer.keys[..., index, :]
            layer.values[..., lo:lo + count, :] = layer.values[..., index, :]
            layer.keys = layer.keys[..., : lo + count, :]
            layer.values = layer.values[..., : lo + count, :]


def window_masks(cache: HFCache, positions: torch.Tensor, mask: torch.Tensor | None):
    """The attention mask(s) for n new rows at `positions` against `cache`.

    `mask`: [n, length + n] bool over slots (True = may attend), or None for
    causal. Returns None where the caller's mask (or transformers' causal one)
    is right as it is: no sliding layers. Otherwise a [1, 1, n, kv] bool mask,
    or for models with both layer kinds a dict by transformers' layer type.

    A row at position p sees slot s iff the base mask allows it and
    p - position(s) < window: what transformers' sliding mask gives plain
    decoding. Committed slots hold their own position; new slots hold the
    positions given, so a tree node's window is counted along its own path.
    """
    if cache.window is None:
        return None
    n = positions.shape[0]
    start = cache.length
    device = positions.device
    if mask is None:
        mask = torch.ones(n, start + n, dtype=torch.bool, device=device).tril(start)
    slot_positions = torch.cat([torch.arange(start, device=device), positions])  # [start + n]
    base = cache.base
    near = positions[:, None] - slot_positions[None, base:] < cache.window  # [n, start + n - base]
    sliding = (mask[:, base:] & near)[None, None]
    if not cache.mixed:
        return sliding
    return {"sliding_attention": sliding, "full_attention": mask[None, None]}
