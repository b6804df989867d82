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

    def pack_linears(self, names: list[str], quant: str | None = None) -> None:
        """`quant` (a GGUF block format, e.g. "Q8_0"): the matrices in those blocks
        for the kernels, a quarter to a half of bf16's bytes per draft step; the
        head then computes an approximation of its trained function (what it
        proposes changes, never what the verifier emits)."""
        from verispec.models.llama_weights import Linear

        first = self.get_submodule(names[0]).weight
        key = (first.dtype, first.device, first.data_ptr(), quant)
        if getattr(self, "_packed", {}).get("key") == key:
            return
        # Packs stay per format, so requests of a shared head that switch formats
        # (a bench interleaving configs) do not quantize again each time.
        kept = self.__dict__.setdefault("_packs", {})
        if key in kept:
            self._packed = kept[key]
            return
        packed: dict = {"key": key}
        if first.dtype == torch.bfloat16 and first.device.type == "cpu":
            for name in names:
                layer: nn.Linear = self.get_submodule(name)
                bias = None if layer.bias is None else layer.bias.detach()
                packed[name] = (_quantized(layer.weight.detach(), bias, quant) if quant
                                else Linear(layer.weight.detach(), bias))
        kept[key] = self._packed = packed

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        packed = getattr(self, "_packed", {}).get(name) if x.dim() == 2 else None
        if packed is not None:
            return packed(x.contiguous())
        return self.get_submodule(name)(x)


def _quantized(weight: torch.Tensor, bias: torch.Tensor | None, fmt: str):
    import gguf
    import numpy as np

    from verispec import kernels
    from verispec.models.llama_weights import Linear

    qtype = gguf.GGMLQuantizationType[fmt]
    if not kernels.available() or int(qtype) not in kernels.quant_types():
        raise ValueError(f"head weights in {fmt} need verispec's kernels with {fmt} blocks")
    rows, cols = weight.shape
    raw = gguf.quants.quantize(weight.float().numpy(), qtype)  # [rows, bytes per row] uint8
    packed = kernels.pack_quant(torch.from_numpy(np.ascontiguousarray(raw)), int(qtype), rows, cols)
    return Linear.from_pack(packed, rows, cols, bias, fmt)
