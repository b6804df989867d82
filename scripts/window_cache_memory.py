"""KV-cache bytes of real Gemma shapes at long contexts: one full cache for every
layer against verispec's MixedKVCache (local layers keep window - 1 + 2 * block
positions, global layers all). Allocates the buffers and sums them; prints a table.

    PYTHONPATH=. python scripts/window_cache_memory.py
"""
from __future__ import annotations

import torch

from verispec.step.kv_cache import MixedKVCache, StaticKVCache

# name, layers, local:global period, kv heads, head_dim, window, context (from the configs)
SHAPES = [("Gemma-2-2B", 26, 2, 4, 256, 4096, 8192), ("Gemma-3-1B", 26, 6, 1, 256, 512, 32768),
          ("Gemma-3-4B", 34, 6, 4, 256, 1024, 32768)]
BLOCK = 256  # NativeLlama's default window_block


def mib(cache) -> float:
    parts = [cache.full.kv, cache.local.kv] if isinstance(cache, MixedKVCache) else [cache.kv]
    return sum(t.numel() * t.element_size() for t in parts) / 2 ** 20


def main() -> None:
    print("| model | context | full cache MiB | mixed cache MiB | ratio |\n|---|---|---|---|---|")
    for name, layers, period, kv, head_dim, window, context in SHAPES:
        sliding = tuple(i % period < period - 1 for i in range(layers))
        full = mib(StaticKVCache(layers, kv, head_dim, context, torch.bfloat16))
        mixed = mib(MixedKVCache(sliding, kv, head_dim, context, window, BLOCK, torch.bfloat16))
        print(f"| {name} | {context} | {full:.0f} | {mixed:.0f} | {full / mixed:.1f}x |")


if __name__ == "__main__":
    main()
