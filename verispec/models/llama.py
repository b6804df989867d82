"""A native Llama-family target: fused weights, a static KV cache, and verispec's
row-invariant CPU kernels (SDPA where they are unavailable).

Numerics follow transformers' modeling_llama op for op where it matters:
RMSNorm normalizes in float32, casts back, then multiplies the weight; RoPE
tables are computed in float32 with HF's expression and cast to the model
dtype; every residual add and activation runs in the model dtype. In float32
the logits agree with HF within the tolerance tests/models/test_native.py asserts. In
bf16 the two backends are not bit-identical (their attention kernels round
differently), but each is as far from the float32 logits as the other: ordinary
bf16 noise.

Row invariance. A position's logits and cached keys/values are bit-identical
whether it is forwarded alone (plain decoding), inside a verification block, a
token tree or a batch of other requests, whenever verispec's CPU kernels run the
model: their matmul (bf16 or GGUF blocks, on AMX or AVX-512-BF16) and attention
(bf16 and fp32) compute each row alone in a fixed order. bf16 on the kernels is
therefore always invariant, at no cost. fp32 matmuls run padded to whole
ROW_TILEs (`_linear`), which keeps a row's bits independent of the row count on
the BLAS seen so far; `batch_invariant=True` makes that a guarantee (fixed
ROW_TILE-row tiles, whatever the library does) and covers CPUs without the
kernels (SDPA replaced by fixed tiles, see llama_attention.invariant_attend).

Hidden states follow HF's `output_hidden_states` index for index: 0 is the
token embeddings, l in [1, num_layers) is the output of decoder layer l, and
num_layers is the output of the last layer AFTER the final norm.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from verispec import kernels
from verispec.models.base import BatchItem, ForwardOutput, TargetModel
from verispec.models.llama_attention import (
    KEY_TILE,
    ROW_TILE,
    AttentionMask,
    attend,
    invariant_attend,
    rowwise_attend,
)
from verispec.models.llama_batch import BatchedRows
from verispec.models.llama_config import LlamaSpec, parse_config, rope_tables, rotate
from verispec.models.llama_config import supports as _supports
from verispec.models.llama_weights import (
    LayerWeights,
    Linear,
    ModelWeights,
    fingerprint,
    load_weights,
    read_config,
    read_eos_ids,
)
from verispec.models.llama_window import forward_pieces, local_rows, needs_pieces, slots
from verispec.step.kv_cache import MixedKVCache, StaticKVCache, WindowKVCache

DEFAULT_CACHE_LIMIT = 4096  # positions; bounds a request's cache memory when the model allows more
INVARIANT_SLICE = 128  # rows per piece of a long batch-invariant forward
# Sliding-window models: the largest block (prefill piece, verification block, tree) and
# rollback a WindowKVCache takes; it holds window - 1 + 2 * this many positions.
DEFAULT_WINDOW_BLOCK = 256


class NativeLlama(BatchedRows, TargetModel):
    def __init__(self, spec: LlamaSpec, weights: ModelWeights, dtype: torch.dtype,
                 device: torch.device, eos_token_ids: frozenset[int], name: str,
                 num_layers: int | None = None, batch_invariant: bool = False,
                 cache_limit: int = DEFAULT_CACHE_LIMIT) -> None:
        self.spec = spec
        self.weights = weights
        self.layers: list[LayerWeights] = weights.layers[: num_layers or spec.num_layers]
        self.num_layers = len(self.layers)
        self.hidden_size = spec.hidden_size
        self.vocab_size = weights.lm_head.out_features
        self.max_context = spec.max_context
        self.eos_token_ids = eos_token_ids
        self.dtype = dtype
        self.device = device
        self.name = name
        self.batch_invariant = batch_invariant
        self.cache_limit = cache_limit
        self._sliding = spec.sliding_layers[: self.num_layers] if any(
            spec.sliding_layers[: self.num_layers]) else ()
        self.window_block = DEFAULT_WINDOW_BLOCK
        self._heads, self._kv_heads, self._head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self._cos, self._sin = (t.to(device) for t in
                                rope_tables(spec.rope, spec.head_dim, self.max_context, dtype))
        self._arange = torch.arange(self.max_context, device=device)
        groups = spec.num_heads // spec.num_kv_heads
        # verispec's attention kernel (kernels/attention.cpp) computes each row alone
        # in a fixed order, so with it every forward is row-invariant by construction
        # (bf16 matmuls already are): plain decoding, verification, trees and batches
        # of requests all give a position the same bits. Without it (no AVX-512/AMX,
        # or an odd head size) the SDPA paths below keep the old guarantees.
        self.row_kernels = (device.type == "cpu" and dtype in (torch.bfloat16, torch.float32)
                            and spec.head_dim % 16 == 0
                            and (spec.head_dim <= 128 or spec.head_dim == 256)
                            and groups <= 16 and kernels.available())
        self.fuses_batches = self.row_kernels
        # bf16 with a layer's matmuls each on one kernel pack: that layer is one C++
        # call. A layer whose q/k/v or gate/up come in different GGUF block formats
        # (Q4_K_M files mix Q4_K and Q6_K) runs its matmuls one by one instead.
        fusable = [self.row_kernels and dtype == torch.bfloat16 and all(
            lin.kernel for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))
            for layer in self.layers]
        self._fused = any(fusable)
        self._fused_args = [_fused_weights(layer) if ok else None
                            for layer, ok in zip(self.layers, fusable)]

    @classmethod
    def from_dir(cls, folder: str | Path, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", batch_invariant: bool = False,
                 cache_limit: int = DEFAULT_CACHE_LIMIT) -> "NativeLlama":
        folder = Path(folder)
        config = read_config(folder)
        spec = parse_config(config)
        device = torch.device(device)
        weights = load_weights(folder, spec, dtype, device)
        name = config.get("_name_or_path") or folder.name
        return cls(spec, weights, dtype, device, read_eos_ids(folder, config),
                   name=f"native:{Path(str(name)).name or folder.name}",
                   batch_invariant=batch_invariant, cache_limit=cache_limit)

    @property
    def weights_kind(self) -> str:
        """"quant" when GGUF blocks run in the kernels ("quant-i8" on their integer
        path), else "dense"."""
        return self.weights.weights_kind

    @staticmethod
    def supports(config: dict) -> bool:
        return _supports(config)

    def new_cache(self, capacity: int | None = None) -> StaticKVCache:
        """An empty cache; capacity defaults to min(max_context, cache_limit)."""
        capacity = capacity or min(self.max_context, self.cache_limit)
        if capacity > self.max_context:
            raise ValueError(f"cache capacity {capacity} exceeds {self.name}'s max_context "
                             f"{self.max_context}")
        # Batch-invariant attention reads whole key tiles, so the buffer ends on a tile edge.
        align = KEY_TILE if self.batch_invariant else 1
        window = self.spec.sliding_window
        if self._sliding and capacity > window - 1 + 2 * self.window_block:
            # Sliding layers keep only their window plus room for a block; full ones keep all.
            if all(self._sliding):
                return WindowKVCache(self.num_layers, self._kv_heads, self._head_dim, window,
                                     self.window_block, self.dtype, self.device, align=align)
            return MixedKVCache(self._sliding, self._kv_heads, self._head_dim, capacity, window,
                                self.window_block, self.dtype, self.device, align=align)
        return StaticKVCache(self.num_layers, self._kv_heads, self._head_dim, capacity,
                             self.dtype, self.device, align=align)

    def truncated(self, num_layers: int) -> "NativeLlama":
        """The first `num_layers` decoder layers plus the final norm and LM head,
        sharing this model's weights (a layer-skip self-draft, no extra memory)."""
        if not 1 <= num_layers <= self.num_layers:
            raise ValueError(
                f"self:L needs 1 <= L <= {self.num_layers} for {self.name}, got {num_layers}")
        return self._sibling(self.weights, f"{self.name}[:{num_layers}]", num_layers)

    def _sibling(self, weights: ModelWeights, name: str, num_layers: int) -> "NativeLlama":
        """A model of this one's spec and settings over `weights` (a layer-skip or
        quantized self-draft); subclasses with more state override it."""
        draft = NativeLlama(self.spec, weights, self.dtype, self.device, self.eos_token_ids,
                            name=name, num_layers=num_layers, batch_invariant=self.batch_invariant,
                            cache_limit=self.cache_limit)
        draft.window_block = self.window_block
        return draft

    def weights_fingerprint(self) -> str:
        return fingerprint(self.weights.fingerprint_parts, self.num_layers)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: StaticKVCache,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        num_logits: int | None = None,
        hidden_layers: Sequence[int] = (),
    ) -> ForwardOutput:
        """Run n new positions against the cache and append them.

        num_logits=None returns logits for all n positions, 0 for none (a prefill
        that needs no distribution skips the LM head).
        """
        if needs_pieces(cache, tokens.shape[0]):
            return forward_pieces(self, tokens, cache, positions, mask, num_logits, hidden_layers)
        if self.row_kernels:
            return self.forward_batch([BatchItem(tokens, cache, positions, mask, num_logits,
                                                 tuple(hidden_layers))])[0]
        tokens = tokens.to(self.device)
        n = tokens.shape[0]
        self._check(tokens, cache, positions, mask, num_logits, hidden_layers)
        start = cache.reserve(n)
        num_logits = n if num_logits is None else num_logits
        try:
            slot, positions, mask = slots(self._arange, cache, start, n, positions, mask)
            if self.batch_invariant and mask is None and positions is None and n > INVARIANT_SLICE:
                return self._run_sliced(tokens, cache, slot, num_logits, tuple(hidden_layers))
            return self._run(tokens, cache, slot, positions, mask, num_logits, tuple(hidden_layers))
        except BaseException:
            cache.truncate(start)
            raise

    def _run_sliced(self, tokens: torch.Tensor, cache: StaticKVCache, start: int,
                    num_logits: int, hidden_layers: tuple[int, ...]) -> ForwardOutput:
        """A long causal forward as consecutive slices. Batch-invariant attention
        materializes [rows, keys] scores, so slicing bounds its memory; each row's
        result is independent of the slicing, which is the point of the mode."""
        n = tokens.shape[0]
        parts = []
        for a in range(0, n, INVARIANT_SLICE):
            b = min(n, a + INVARIANT_SLICE)
            wanted = max(0, b - max(a, n - num_logits))
            parts.append(self._run(tokens[a:b], cache, start + a, None, None, wanted, hidden_layers))
        hidden = tuple(torch.cat([p.hidden[i] for p in parts]) for i in range(len(hidden_layers)))
        return ForwardOutput(logits=torch.cat([p.logits for p in parts]), hidden=hidden)

    def _check(self, tokens, cache, positions, mask, num_logits, hidden_layers) -> None:
        if tokens.dim() != 1 or tokens.numel() == 0:
            raise ValueError(f"tokens must be a non-empty 1-D tensor, got shape {tuple(tokens.shape)}")
        n = tokens.shape[0]
        if cache.num_layers != self.num_layers:
            raise ValueError(f"cache has {cache.num_layers} layers, {self.name} has {self.num_layers}")
        if positions is not None and positions.shape != (n,):
            raise ValueError(f"positions must have shape ({n},), got {tuple(positions.shape)}")
        if mask is not None and tuple(mask.shape) != (n, cache.length + n):
            raise ValueError(f"mask must have shape ({n}, {cache.length + n}), got {tuple(mask.shape)}")
        if num_logits is not None and not 0 <= num_logits <= n:
            raise ValueError(f"num_logits must be in [0, {n}], got {num_logits}")
        bad = [layer for layer in hidden_layers if not 0 <= layer <= self.num_layers]
        if bad:
            raise ValueError(f"hidden layers {bad} outside [0, {self.num_layers}]")

    def _run(self, tokens: torch.Tensor, cache: StaticKVCache, start: int,
             positions: torch.Tensor | None, mask: torch.Tensor | None, num_logits: int,
             hidden_layers: tuple[int, ...]) -> ForwardOutput:
        n = tokens.shape[0]
        end = start + n
        if positions is None:
            cos, sin = self._cos[start:end], self._sin[start:end]  # [n, head_dim]
        else:
            positions = positions.to(self.device)
            cos, sin = self._cos[positions], self._sin[positions]
        rows = n
        if self.batch_invariant:
            # Fixed-size row blocks make every matmul see the same shapes whatever n is.
            rows = -(-n // ROW_TILE) * ROW_TILE
            tokens, cos, sin = (_pad_rows(t, rows) for t in (tokens, cos, sin))
        # Blocks attend row by row so verification equals plain decoding bit for
        # bit; with _linear's padded fp32 GEMMs this holds in fp32 too.
        groups = self._heads // self._kv_heads
        attn_mask = AttentionMask.build(mask, start, n, rows, groups, self.device,
                                        self.batch_invariant, rowwise=True)
        masks = [attn_mask] * self.num_layers
        starts = [start] * self.num_layers  # slot of the first new row, per layer
        if self._sliding:
            local = local_rows(self._arange, self.spec.sliding_window, cache, start, n, positions,
                               mask)
            local_mask = AttentionMask.build(local.mask, local.start, n, rows, groups, self.device,
                                             self.batch_invariant, rowwise=True)
            masks = [local_mask if slides else attn_mask for slides in self._sliding]
            starts = [local.start if slides else start for slides in self._sliding]
        cos, sin = cos[:, None], sin[:, None]  # [rows, 1, head_dim], broadcast over heads
        wanted = set(hidden_layers)
        last = self.num_layers
        x, captured = self._through_layers(
            tokens, wanted,
            lambda index, layer, x: self._layer(layer, index, x, cache, cos, sin, masks[index],
                                                starts[index], n))
        x = x[:n]
        if last in wanted:
            x = self._norm(x, self.weights.norm)
            captured[last] = x
            head_in = x[n - num_logits:]
        else:
            head_in = self._norm(x[n - num_logits:], self.weights.norm)
        if num_logits == 0:
            logits = torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device)
        else:
            logits = self._head(head_in)
        hidden = tuple(captured[layer][:n] for layer in hidden_layers)
        return ForwardOutput(logits=logits, hidden=hidden)

    def _through_layers(self, tokens: torch.Tensor, wanted: set[int], step
                        ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Embed, then run every decoder layer (`step(index, layer, x)`), keeping the
        hidden states in `wanted` below the last one (HF's index: 0 = embeddings);
        the caller takes the last one after the final norm."""
        x = self.weights.embedding(tokens)  # [rows, hidden]
        captured = {0: x} if 0 in wanted else {}
        for index, layer in enumerate(self.layers):
            x = step(index, layer, x)
            if index + 1 in wanted and index + 1 < self.num_layers:
                captured[index + 1] = x
        return x, captured

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, hidden] -> [rows, vocab] float32 logits."""
        head = self.weights.lm_head
        return head.logits(x) if head.row_invariant else self._linear(head, x).float()

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # F.rms_norm upcasts to float32 internally and rounds once, which is HF's
        # LlamaRMSNorm up to the weight multiply, done after the cast as HF does.
        return F.rms_norm(x, (x.shape[-1],), eps=self.spec.rms_eps) * weight

    def _layer(self, w: LayerWeights, index: int, x: torch.Tensor, cache: StaticKVCache,
               cos: torch.Tensor, sin: torch.Tensor, attn_mask: "AttentionMask",
               start: int, n: int) -> torch.Tensor:
        rows = x.shape[0]
        heads, kv_heads, head_dim = self._heads, self._kv_heads, self._head_dim
        qkv = self._linear(w.qkv, self._norm(x, w.attn_norm)).view(rows, heads + 2 * kv_heads, head_dim)
        qk = qkv[:, : heads + kv_heads]  # [rows, heads + kv_heads, head_dim]
        if w.qk_norm is not None:
            qk = self._norm(qk, w.qk_norm)
        qk = rotate(qk, cos, sin)
        # Keys and values of one layer are adjacent in the cache: one copy stores both.
        new_kv = torch.cat((qk[:n, heads:], qkv[:n, heads + kv_heads:]), dim=1)  # [n, 2 kv, hd]
        layer_kv = cache.kv[index]  # [2, kv_heads, capacity, head_dim]
        layer_kv[:, :, start:start + n] = new_kv.view(n, 2, kv_heads, head_dim).permute(1, 2, 0, 3)
        keys, values = layer_kv[0], layer_kv[1]
        q = qk[:, :heads]  # [rows, heads, head_dim]
        if self.batch_invariant:
            out = invariant_attend(q, keys, values, attn_mask)
        elif attn_mask.visible is not None:
            out = rowwise_attend(q, keys, values, attn_mask)
        else:
            out = attend(q, keys[:, : start + n], values[:, : start + n], attn_mask)
        x = x + self._linear(w.o, out)  # out: [rows, heads * head_dim]
        gate_up = self._linear(w.gate_up, self._norm(x, w.mlp_norm))  # [rows, 2 * intermediate]
        inter = gate_up.shape[-1] // 2
        return x + self._linear(w.down, F.silu(gate_up[:, :inter]) * gate_up[:, inter:])

    def _linear(self, lin: Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if lin.row_invariant or rows == ROW_TILE or (rows % ROW_TILE == 0 and not self.batch_invariant):
            return lin(x)
        # An fp32 GEMM is not row-invariant: MKL computes one row as a GEMV and the
        # rows past a multiple of 4 with a remainder kernel, each summing in another
        # order. Padded to whole ROW_TILEs, every row runs the full-width kernel, so
        # its bits no longer depend on the row count (checked for 1..400 rows at any
        # offset, 1 and 2 threads), which plain decoding == verification relies on.
        # batch_invariant goes further: fixed-shape tiles whatever the library does.
        padded = _pad_rows(x, -(-rows // ROW_TILE) * ROW_TILE)
        if not self.batch_invariant:
            return lin(padded)[:rows]
        return torch.cat([lin(tile) for tile in padded.split(ROW_TILE)])[:rows]


def _fused_weights(w: LayerWeights) -> list[torch.Tensor]:
    """A layer's tensors in the order kernels.decoder_layer takes them."""
    none = torch.empty(0, dtype=torch.bfloat16)
    qk_norm = w.qk_norm.contiguous() if w.qk_norm is not None else none
    bias = w.qkv.bias if w.qkv.bias is not None else none
    return [w.attn_norm.contiguous(), w.qkv.weight, bias, qk_norm, w.o.weight,
            w.mlp_norm.contiguous(), w.gate_up.weight, w.down.weight]


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """Pad dim 0 to `rows` by repeating the last row (any real value; pad rows are discarded)."""
    extra = rows - t.shape[0]
    if extra == 0:
        return t
    return torch.cat((t, t[-1:].expand(extra, *t.shape[1:])))
