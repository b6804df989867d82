"""Several requests' rows in one native forward (NativeLlama.forward_batch): each
matmul takes every row together, each row attends to its own request's cache.

A mixin of NativeLlama, kept apart from the single-request forward in llama.py;
it uses that class's tables, weights and kernels. Row-invariant kernels make
item i's output bit-equal to forward(item i) alone.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from verispec import kernels
from verispec.models.base import BatchItem, ForwardOutput
from verispec.models.llama_attention import RowPlan
from verispec.models.llama_config import rotate
from verispec.models.llama_weights import LayerWeights
from verispec.models.llama_window import local_rows, needs_pieces, slots


class BatchedRows:
    @torch.inference_mode()
    def forward_batch(self, items: Sequence[BatchItem]) -> list[ForwardOutput]:
        """All requests' rows go through each matmul together; each row attends to
        its own request's cache. Row-invariant kernels make item i's output bit-equal
        to forward(item i) alone (in float32 only with batch_invariant, where the
        matmuls run on fixed row tiles)."""
        if not self.row_kernels:
            return super().forward_batch(items)
        if not items:
            return []
        items = [BatchItem(it.tokens.to(self.device), it.cache, it.positions, it.mask,
                           it.num_logits, tuple(it.hidden_layers)) for it in items]
        if len({id(it.cache) for it in items}) < len(items):
            raise ValueError("each item of a batch needs its own cache")
        for it in items:
            self._check(it.tokens, it.cache, it.positions, it.mask, it.num_logits, it.hidden_layers)
        if any(needs_pieces(it.cache, it.tokens.shape[0]) for it in items):
            return super().forward_batch(items)  # the long prefill goes in pieces
        starts: list[int] = []
        try:
            for it in items:
                starts.append(it.cache.reserve(it.tokens.shape[0]))
            slotted = [slots(self._arange, it.cache, start, it.tokens.shape[0], it.positions, it.mask)
                       for it, start in zip(items, starts)]
            return self._run_rows(
                [BatchItem(it.tokens, it.cache, pos, mask, it.num_logits, it.hidden_layers)
                 for it, (_, pos, mask) in zip(items, slotted)], [slot for slot, _, _ in slotted])
        except BaseException:
            for it, start in zip(items, starts):
                it.cache.truncate(start)
            raise

    def _run_rows(self, items: list[BatchItem], starts: list[int]) -> list[ForwardOutput]:
        sizes = [it.tokens.shape[0] for it in items]
        offsets = [sum(sizes[:i]) for i in range(len(items))]
        tokens = torch.cat([it.tokens for it in items]) if len(items) > 1 else items[0].tokens
        positions = torch.cat([
            it.positions.to(self.device) if it.positions is not None else self._arange[s:s + n]
            for it, s, n in zip(items, starts, sizes)])
        tables = self._row_tables(positions)
        plan = RowPlan.build([(s, n, it.mask) for it, s, n in zip(items, starts, sizes)])
        plans = [plan] * self.num_layers
        layer_starts = [starts] * self.num_layers  # per layer, each request's first new slot
        if self._sliding:
            local = [local_rows(self._arange, self.spec.sliding_window, it.cache, s, n,
                                it.positions, it.mask) for it, s, n in zip(items, starts, sizes)]
            local_plan = RowPlan.build([(rows.start, n, rows.mask) for rows, n in zip(local, sizes)])
            plans = [local_plan if slides else plan for slides in self._sliding]
            local_starts = [rows.start for rows in local]
            layer_starts = [local_starts if slides else starts for slides in self._sliding]
        wanted = set().union(*(it.hidden_layers for it in items))
        last = self.num_layers
        x, captured = self._through_layers(
            tokens, wanted,
            lambda index, layer, x: self._row_layer(layer, index, x, items, layer_starts[index],
                                                    offsets, *tables[index], plans[index]))
        counts = [n if it.num_logits is None else it.num_logits for it, n in zip(items, sizes)]
        head_rows = torch.cat([torch.arange(o + n - c, o + n) for o, n, c in zip(offsets, sizes, counts)])
        if last in wanted:
            captured[last] = self._norm(x, self.weights.norm)
            head_in = captured[last][head_rows]
        else:
            head_in = self._norm(x[head_rows], self.weights.norm)
        logits = (self._head(head_in) if head_in.shape[0] else
                  torch.empty(0, self.vocab_size, dtype=torch.float32, device=self.device))
        outputs, done = [], 0
        for it, o, n, c in zip(items, offsets, sizes, counts):
            hidden = tuple(captured[layer][o:o + n] for layer in it.hidden_layers)
            outputs.append(ForwardOutput(logits=logits[done:done + c], hidden=hidden))
            done += c
        return outputs

    def _row_tables(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the RoPE (cos, sin) [rows, head_dim] of the rows' positions."""
        return [(self._cos[positions], self._sin[positions])] * self.num_layers

    def _store_rows(self, index: int, new_kv: torch.Tensor, items: list[BatchItem],
                    starts: list[int], offsets: list[int]) -> list[torch.Tensor]:
        """new_kv [2, kv_heads, rows, head_dim] into each request's cache slots of layer
        `index`; returns those layers' [2, kv_heads, slots, head_dim] buffers."""
        layer_kv = []
        for it, start, offset in zip(items, starts, offsets):
            n = it.tokens.shape[0]
            kv = it.cache.kv[index]
            kv[:, :, start:start + n] = new_kv[:, :, offset:offset + n]
            layer_kv.append(kv)
        return layer_kv

    def _rows_qkv(self, w: LayerWeights, index: int, x: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, items: list[BatchItem], starts, offsets):
        """The rows' rotated queries [rows, heads, hd], and the layer's keys and values
        with the rows' own stored (every architecture's attention input, by ops)."""
        rows = x.shape[0]
        heads, kv_heads, head_dim = self._heads, self._kv_heads, self._head_dim
        qkv = self._linear(w.qkv, self._norm(x, w.attn_norm)).view(rows, heads + 2 * kv_heads, head_dim)
        qk = qkv[:, : heads + kv_heads]
        if w.qk_norm is not None:
            qk = self._norm(qk, w.qk_norm)
        qk = rotate(qk, cos[:, None], sin[:, None])  # tables broadcast over heads
        new_kv = torch.cat((qk[:, heads:], qkv[:, heads + kv_heads:]), dim=1)  # [rows, 2 kv, hd]
        new_kv = new_kv.view(rows, 2, kv_heads, head_dim).permute(1, 2, 0, 3)  # [2, kv, rows, hd]
        return qk[:, :heads], self._store_rows(index, new_kv, items, starts, offsets)

    def _row_layer(self, w: LayerWeights, index: int, x: torch.Tensor, items: list[BatchItem],
                   starts: list[int], offsets: list[int], cos: torch.Tensor, sin: torch.Tensor,
                   plan: RowPlan) -> torch.Tensor:
        if self._fused and self._fused_args[index] is not None:
            return kernels.decoder_layer(
                x, self._fused_args[index],
                [self._heads, self._kv_heads, self._head_dim, self.spec.intermediate_size],
                self.spec.rms_eps, cos, sin, [it.cache.kv[index] for it in items],
                plan.row_cache, plan.row_slot, plan.row_len, plan.row_index)
        queries, layer_kv = self._rows_qkv(w, index, x, cos, sin, items, starts, offsets)
        out = plan.attend(queries, layer_kv)  # [rows, heads * head_dim]
        x = x + self._linear(w.o, out)
        gate_up = self._linear(w.gate_up, self._norm(x, w.mlp_norm))
        inter = gate_up.shape[-1] // 2
        return x + self._linear(w.down, F.silu(gate_up[:, :inter]) * gate_up[:, inter:])
