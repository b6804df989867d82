"""An EAGLE head's decoder layer as one native call (kernels.decoder_layer),
the fused bf16 kernel every layer of a native target runs.

Why: a one-row draft step in eager PyTorch is some thirty small ops (norms,
RoPE, the cache write, SDPA, residuals), and at one row their dispatch costs
as much as the layer's memory-bound matmuls. The kernel does the same math in
a few loops over the weights the head already packed for its matmuls.

The math is the head's: the same RMSNorm, fused q/k/v, RoPE at each row's own
position, attention over the head's cache (under the tree mask when one is
given), residuals and SwiGLU MLP. Roundings follow the target's bf16 layer
instead of the eager head's (RoPE from bf16 tables, its two products rounded
apart; the kernel's attention), a difference of bf16 rounding in what the head
proposes. What the head proposes never changes the output: the verifier keeps
the target's tokens whatever it drafts.
"""
from __future__ import annotations

import torch

from verispec import kernels
from verispec.models.llama_attention import RowPlan


class NativeLayer:
    """The kernel's arguments for one head, built once per packed head."""

    def __init__(self, head) -> None:
        packed = head._packed
        none = torch.empty(0, dtype=torch.bfloat16)
        self.weights = [head.attn_norm.detach().contiguous(), packed["qkv"].weight, none, none,
                        packed["o"].weight, head.mlp_norm.detach().contiguous(),
                        packed["gate_up"].weight, packed["down"].weight]
        config = head.config
        self.dims = [head.heads, head.kv_heads, head.head_dim, config.intermediate_size]
        self.eps = float(config.rms_eps)
        self._head = head
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None  # bf16 [size, head_dim]

    @staticmethod
    def usable(head) -> bool:
        """Whether the kernel can run this head: bf16 on CPU with every matmul on a
        kernel pack, and a head shape the kernel's attention takes (as NativeLlama)."""
        packed = getattr(head, "_packed", {})
        names = ("fc", "qkv", "o", "gate_up", "down")
        return (head.attn_norm.dtype == torch.bfloat16 and head.attn_norm.device.type == "cpu"
                and kernels.available() and all(n in packed and packed[n].kernel for n in names)
                and head.head_dim % 16 == 0 and (head.head_dim <= 128 or head.head_dim == 256)
                and head.heads // head.kv_heads <= 16)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """bf16 cos and signed sin [n, head_dim] at `positions`, from the head's float32
        table. The kernel rotates with x's halves swapped, so rotate_half's sign lives
        in the table (models/llama_config.rope_tables): sin_signed = cat(-sin, sin)."""
        self._head._rope(positions)  # grows the head's table to cover the positions
        cos, sin = (t[:, 0] for t in self._head._rope_cache)  # [size, head_dim] float32
        if self._tables is None or self._tables[0].shape[0] != cos.shape[0]:
            half = cos.shape[1] // 2
            signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
            self._tables = (cos.to(torch.bfloat16).contiguous(),
                            signed.to(torch.bfloat16).contiguous())
        index = positions.to(torch.long)
        return self._tables[0][index], self._tables[1][index]

    def step(self, x: torch.Tensor, positions: torch.Tensor, cache,
             mask: torch.Tensor | None) -> torch.Tensor:
        """x [n, hidden] bf16 (the fc output) at `positions` after the cache's rows;
        mask [n, L + n] or None (causal in feed order). Writes the rows' keys and
        values into the cache and returns the layer's outputs [n, hidden]."""
        n = x.shape[0]
        start = cache.reserve(n)
        cos, sin = self._rope(positions)
        if mask is None:
            row_slot = torch.arange(start, start + n)
            row_len, row_index = row_slot + 1, None
            row_cache = torch.zeros(n, dtype=torch.long)
        else:
            plan = RowPlan.build([(start, n, mask)])
            row_cache, row_slot, row_len, row_index = (plan.row_cache, plan.row_slot,
                                                       plan.row_len, plan.row_index)
        out = kernels.decoder_layer(x.contiguous(), self.weights, self.dims, self.eps, cos, sin,
                                    [cache.kv], row_cache, row_slot, row_len, row_index)
        cache.length = start + n
        return out
