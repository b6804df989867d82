"""Packed bf16 matmuls for a head's inference path.

A draft step is a handful of one-row matmuls. On CPU a plain bf16 F.linear
reorders its weight on every call, which would cost more than the product
itself; the native backend's `Linear` packs each weight once for its AMX
kernel (or oneDNN). Heads pack after their final `.to(dtype)`; training keeps
the nn.Linear modules, which remain the source of truth.
"""
from __future__ import annotations

import torch
import torch.nn as nn


class PackedLinears:
    """Mixin for an nn.Module: `pack(names)` once, then `linear(name, x)`."""

    _packed: dict

    def pack_linears(self, names: list[str]) -> None:
        from ..models.llama_weights import Linear

        first = self.get_submodule(names[0]).weight
        key = (first.dtype, first.device, first.data_ptr())
        if getattr(self, "_packed", {}).get("key") == key:
            return
        packed: dict = {"key": key}
        if first.dtype == torch.bfloat16 and first.device.type == "cpu":
            for name in names:
                layer: nn.Linear = self.get_submodule(name)
                bias = None if layer.bias is None else layer.bias.detach()
                packed[name] = Linear(layer.weight.detach(), bias)
        self._packed = packed

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        packed = getattr(self, "_packed", {}).get(name) if x.dim() == 2 else None
        if packed is not None:
            return packed(x.contiguous())
        return self.get_submodule(name)(x)
