"""The EAGLE draft head (Li et al. 2024, "EAGLE: Speculative Sampling Requires
Rethinking Feature Uncertainty"): autoregression at the feature level.

Row t of the head reads the target's feature f_t (the hidden state that
predicted token t + 1) together with the embedding of that token x_{t+1}, so
the head knows which of the target's possible continuations was taken; one
target-shaped decoder layer with its own KV cache then predicts the next
feature f_{t+1}, and the target's own final norm and LM head turn it into
the distribution of token t + 2. Drafting k tokens feeds each predicted
feature back in as the next row's feature.

With several feature layers (EAGLE-3, Li et al. 2025) the real rows read a
learned projection of low, middle and high target layers instead of f_t alone,
while drafted rows still read the head's own prediction; training unrolls the
draft chain ("training-time test") so the layer sees both kinds of rows.

The predicted feature lives in the target's post-norm space: the decoder
output passes through the target's final norm, so it is directly comparable
to the target's last hidden state (HF index num_layers, after the norm).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .format import HeadConfig
from .native_layer import NativeLayer
from .packing import PackedLinears


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, [n, 1, head_dim] float32, at integer `positions` [n]."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = positions.to(device).float()[:, None] * inv_freq[None]  # [n, head_dim / 2]
    angles = torch.cat((angles, angles), dim=-1)[:, None]  # [n, 1, head_dim]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on [..., n, heads, head_dim] with rope_tables' cos and sin, in float32."""
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


def unroll_mask(length: int, step: int, device: torch.device) -> torch.Tensor:
    """[length, (step + 1) * length] bool: who row t of unroll step `step` may attend.

    The row belongs to the draft chain anchored at a = t - step: at inference
    the head would see the real rows <= a (block 0) and the chain's own earlier
    rows a + 1 .. t, computed in unroll steps 1..step (block i holds step i's
    keys, and the chain's row there is a + i). Training every anchor at once
    this way is EAGLE-3's training-time test.
    """
    t = torch.arange(length, device=device)[:, None]
    s = torch.arange(length, device=device)[None, :]
    blocks = [s <= t - step] + [s == t - step + i for i in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


class HeadCache:
    """The head's own keys and values, one row per fed position, in feed order.

    Rows carry their RoPE position in the key, so a gap (positions the head
    never saw) needs no bookkeeping; rollback keeps the first `length` rows.
    The buffer has the target cache's layout, [2, kv_heads, capacity, head_dim],
    so the native decoder-layer kernel writes and attends over it directly.
    """

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, capacity: int = 256) -> None:
        self.kv = torch.empty(2, num_kv_heads, capacity, head_dim, dtype=dtype, device=device)
        self.length = 0

    @property
    def keys(self) -> torch.Tensor:
        """[capacity, kv_heads, head_dim], rows past `length` unset."""
        return self.kv[0].transpose(0, 1)

    @property
    def values(self) -> torch.Tensor:
        return self.kv[1].transpose(0, 1)

    def reserve(self, n: int) -> int:
        """Room for n more rows; returns the first one's index (the length is unchanged)."""
        end = self.length + n
        if end > self.kv.shape[2]:
            grown = self.kv.new_empty(*self.kv.shape[:2], max(end, 2 * self.kv.shape[2]),
                                      self.kv.shape[3])
            grown[:, :, : self.length] = self.kv[:, :, : self.length]
            self.kv = grown
        return self.length

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store [n, kv_heads, head_dim] rows; return every stored row, [kv_heads, L + n, head_dim]."""
        start = self.reserve(keys.shape[0])
        end = start + keys.shape[0]
        self.kv[0, :, start:end] = keys.transpose(0, 1)
        self.kv[1, :, start:end] = values.transpose(0, 1)
        self.length = end
        return self.kv[0, :, :end], self.kv[1, :, :end]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)


class EagleHead(nn.Module, PackedLinears):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        h, heads, kv, dim = (config.hidden_size, config.num_heads, config.num_kv_heads,
                             config.head_dim)
        self.heads, self.kv_heads, self.head_dim = heads, kv, dim
        self.fuse = (nn.Linear(len(config.feature_layers) * h, h, bias=False)
                     if config.fused else None)
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.attn_norm = nn.Parameter(torch.ones(h))
        self.qkv = nn.Linear(h, (heads + 2 * kv) * dim, bias=False)
        self.o = nn.Linear(heads * dim, h, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(h))
        self.gate_up = nn.Linear(h, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, h, bias=False)
        self._rope_cache: tuple[torch.Tensor, torch.Tensor] | None = None  # not in state_dict
        self._fused: NativeLayer | None = None  # step()'s layer as one kernel call, once packed

    def pack(self, native: bool = True, quant: str | None = None) -> None:
        """Inference in bf16 on CPU: packed kernels for step() (see packing.py), and
        with `native` the decoder layer as one kernel call where it can run
        (native_layer.py); native=False keeps the eager layer. `quant`: the
        matrices in that GGUF block format (PackedLinears.pack_linears)."""
        self.pack_linears([n for n in ("fuse", "fc", "qkv", "o", "gate_up", "down")
                           if getattr(self, n) is not None], quant)
        if not native or not NativeLayer.usable(self):
            self._fused = None
        elif self._fused is None or self._fused.weights[1] is not self._packed["qkv"].weight:
            self._fused = NativeLayer(self)

    def target_feature(self, hidden: tuple[torch.Tensor, ...] | list[torch.Tensor]) -> torch.Tensor:
        """The row feature from the target's requested layers (config.feature_layers order)."""
        if self.fuse is None:
            return hidden[0]
        return self.linear("fuse", torch.cat(list(hidden), dim=-1))

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), eps=self.config.rms_eps) * weight

    def _attention_inputs(self, feature: torch.Tensor, embeds: torch.Tensor,
                          positions: torch.Tensor):
        """Row input x and its rotated q [.., n, H, d], k and v [.., n, KV, d]."""
        x = self.linear("fc", torch.cat((feature, embeds.to(feature.dtype)), dim=-1))
        qkv = self.linear("qkv", self._norm(x, self.attn_norm))
        qkv = qkv.view(*qkv.shape[:-1], self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=-2)
        cos, sin = self._rope(positions)
        return x, apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of a table grown on demand: a draft step then indexes instead of
        recomputing the angles (a tenth of its time at one row). Every entry is
        elementwise in its position, so a row equals rope_tables at that position."""
        # Sized from the positions where they are given (the host, in drafting), then
        # moved: asking a GPU for their maximum would wait for it every draft step.
        need = int(positions.max()) + 1 if positions.numel() else 0
        positions = positions.to(self.fc.weight.device, non_blocking=True)
        cache = self._rope_cache
        if cache is None or cache[0].shape[0] < need or cache[0].device != positions.device:
            size = max(need, 2 * (0 if cache is None else cache[0].shape[0]), 512)
            self._rope_cache = rope_tables(torch.arange(size), self.head_dim,
                                           self.config.rope_theta, positions.device)
        cos, sin = self._rope_cache
        return cos[positions], sin[positions]

    def _fused_step(self, feature: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                    cache: HeadCache, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.linear("fc", torch.cat((feature, embeds.to(feature.dtype)), dim=-1))
        return self._fused.step(x, positions, cache, mask)

    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        x = x + self.linear("o", attended)
        gate, up = self.linear("gate_up", self._norm(x, self.mlp_norm)).chunk(2, dim=-1)
        return x + self.linear("down", F.silu(gate) * up)

    def step(self, feature: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
             cache: HeadCache, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Feed n rows ([n, hidden] each) after the L cached ones; returns the
        decoder outputs [n, hidden], before the target's final norm.

        mask: [n, L + n] bool, True = may attend. None is causal in feed order;
        drafted tree rows pass one that shows each row only the real rows, its
        ancestors and itself (verispec.proposers.tree_drafting.FedRows).
        """
        n = feature.shape[0]
        total = cache.length + n
        if mask is not None and tuple(mask.shape) != (n, total):
            raise ValueError(f"mask must be [{n}, {total}], got {tuple(mask.shape)}")
        if self._fused is not None:
            return self._fused_step(feature, embeds, positions, cache, mask)
        x, q, k, v = self._attention_inputs(feature, embeds, positions)
        keys, values = cache.append(k, v)  # [KV, L + n, d]
        if mask is not None:
            mask = mask.to(x.device)
        elif n > 1:
            # Rows arrive in position order, so causality is a triangle over the new rows.
            mask = torch.ones(n, total, dtype=torch.bool, device=x.device).tril(total - n)
        attended = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[None], values[None],
            attn_mask=mask, enable_gqa=True)  # [1, H, n, d]
        return self._finish(x, attended[0].transpose(0, 1).reshape(n, -1))

    def unrolled(self, feature: torch.Tensor, embeds: torch.Tensor, depth: int,
                 final_norm) -> list[torch.Tensor]:
        """Training forward over [B, T] rows, unrolled `depth` draft steps.

        Step 0 reads the target's features; step j reads, at row t, step
        j - 1's prediction at row t - 1, i.e. the feature a chain anchored at
        t - j would have drafted. Every step's row t predicts f_{t+1}; rows
        t < j have no anchor and must be left out of the loss.
        Returns the predicted (post-norm) features of each step, [B, T, hidden].
        """
        length = feature.shape[1]
        positions = torch.arange(length, device=feature.device)
        predictions: list[torch.Tensor] = []
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for step in range(depth):
            if step:
                feature = F.pad(predictions[-1][:, :-1], (0, 0, 1, 0))
            x, q, k, v = self._attention_inputs(feature, embeds, positions)
            keys.append(k)
            values.append(v)
            attended = F.scaled_dot_product_attention(
                q.transpose(1, 2), torch.cat(keys, dim=1).transpose(1, 2),
                torch.cat(values, dim=1).transpose(1, 2),
                attn_mask=unroll_mask(length, step, feature.device), enable_gqa=True)
            out = self._finish(x, attended.transpose(1, 2).flatten(2))
            predictions.append(final_norm(out))
        return predictions
