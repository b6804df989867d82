"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration
Framework with Multiple Decoding Heads").

Head j (1..K) reads the target's last hidden state f_t, the one that predicted
token t + 1, and guesses token t + 1 + j, so one pass over K small residual
blocks drafts K tokens at once. Each head is a stack of residual blocks
x + SiLU(W x + b) followed by the target's LM head, shared rather than
copied (Medusa-1 copies it per head; sharing keeps the file ~1 MB per head).

Zero-initialized blocks are the identity, so an untrained head starts out
repeating the target's own next-token prediction (the paper's initialization);
`randomize` gives the useless random head the equality tests need.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from verispec.proposers.heads.format import HeadConfig
from verispec.proposers.heads.packing import PackedLinears


class MedusaHead(nn.Module, PackedLinears):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.blocks = nn.ModuleList(
            nn.ModuleList(nn.Linear(h, h) for _ in range(config.medusa_layers))
            for _ in range(config.num_medusa))
        for layer in self.layers():
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def layers(self) -> list[nn.Linear]:
        return [layer for head in self.blocks for layer in head]

    def randomize(self, generator: torch.Generator, scale: float = 1.0) -> "MedusaHead":
        with torch.no_grad():
            for layer in self.layers():
                fan_in = layer.weight.shape[1]
                layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator)
                                   * scale / fan_in ** 0.5)
                layer.bias.copy_(torch.randn(layer.bias.shape, generator=generator) * scale)
        return self

    def pack(self) -> None:
        """Inference in bf16 on CPU: packed kernels (see packing.py)."""
        self.pack_linears([f"blocks.{i}.{j}" for i in range(len(self.blocks))
                           for j in range(self.config.medusa_layers)])

    def forward(self, feature: torch.Tensor) -> torch.Tensor:
        """[..., hidden] -> [num_medusa, ..., hidden]: head j's input to the LM head."""
        outputs = []
        for i, head in enumerate(self.blocks):
            x = feature
            for j in range(len(head)):
                x = x + F.silu(self.linear(f"blocks.{i}.{j}", x))
            outputs.append(x)
        return torch.stack(outputs)
