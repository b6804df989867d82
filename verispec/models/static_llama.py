"""The native Llama forward as one fixed-shape step: the CUDA path.

Every forward runs as steps of exactly `width` rows (a block of n rows is padded up,
a longer one goes in pieces) against a cache buffer of one fixed size, in plain
torch ops. Plain decoding and verification then run the same kernels on the same
shapes, and a row's result cannot depend on how many real rows share its step: the
one-row decode and row i of a verify block are the same computation. That is the
row invariance bf16 speculation needs to be bit-exact on a GPU, where no kernel of
ours computes each row alone (on CPU verispec's kernels do, `llama.py`).

The step, in order, as transformers' eager Llama: RMSNorm in float32 (F.rms_norm)
times the weight; q/k/v in one matmul; RoPE; the new keys and values written to
their slots before attention; eager attention, bf16 matmuls and a float32 softmax,
each row's keys laid out by `static_cache.stage` so that they sit where the row
decoded alone has them (a tree row sees exactly its ancestors, in order); the MLP;
the final norm and the LM head in the model dtype; then the greedy verdict on the
device (ForwardOutput.greedy). On CUDA the
step is captured once per cache buffer in a CUDA graph (`step_graphs`), and the
matmuls run under cuBLAS's batch-invariant settings (`cuda_setup`).

The same code runs on CPU (graphs aside), which is how the tests cover it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from .base import ForwardOutput
from .llama import NativeLlama
from .llama_config import rotate
from .llama_weights import LayerWeights, ModelWeights
from .static_cache import SlabCache, SlabPool, Staged, stage
from .step_graphs import StepGraphs

DEFAULT_WIDTH = 32  # rows per step: k + 1 <= 32 verifies in one step


@dataclass
class StepOut:
    logits: torch.Tensor  # [width, vocab] float32
    greedy: torch.Tensor  # [1 + width] int64: accepted chain drafts, then each row's argmax
    hidden: tuple[torch.Tensor, ...]  # per requested layer [width, hidden]


class StaticLlama(NativeLlama):
    """A NativeLlama whose every forward is `width`-row steps on pooled fixed-size
    caches (see the module docstring). `row_check` holds the start-up self-check's
    result on CUDA (`row_check.check_rows`), which `Engine` reads before it speculates."""

    def __init__(self, spec, weights: ModelWeights, dtype: torch.dtype, device: torch.device,
                 eos_token_ids: frozenset[int], name: str, num_layers: int | None = None,
                 cache_limit: int = 4096, width: int = DEFAULT_WIDTH,
                 graphs: bool | None = None) -> None:
        super().__init__(spec, weights, dtype, device, eos_token_ids, name, num_layers,
                         batch_invariant=False, cache_limit=cache_limit)
        # Batches run request by request (TargetModel.forward_batch): each is one step.
        self.row_kernels = self.fuses_batches = self._fused = False
        self.width = int(width)
        self.max_context = min(spec.max_context, cache_limit)
        self.pool = SlabPool(self.num_layers, self._kv_heads, self._head_dim, self.max_context,
                             self.width, dtype, device)
        self._window = spec.sliding_window if self._sliding else None
        kinds = 2 if self._window is not None else 1
        # The step's inputs, on the device; a captured graph reads exactly these tensors.
        tail = 2 * self.width
        self._ints = torch.zeros(3 * self.width + 1 + self.width * tail, dtype=torch.long,
                                 device=device)
        self._masks = torch.zeros(kinds, self.width, self.pool.slots + tail, dtype=torch.bool,
                                  device=device)
        self._rows = torch.arange(self.width, device=device)
        self._pin = device.type == "cuda" and torch.cuda.is_available()
        use_graphs = device.type == "cuda" if graphs is None else graphs
        self.graphs = StepGraphs(self._step) if use_graphs else None
        self.row_check = None

    @classmethod
    def from_native(cls, model: NativeLlama, width: int = DEFAULT_WIDTH,
                    graphs: bool | None = None) -> "StaticLlama":
        return cls(model.spec, model.weights, model.dtype, model.device, model.eos_token_ids,
                   model.name, model.num_layers, model.cache_limit, width, graphs)

    def new_cache(self, capacity: int | None = None) -> SlabCache:
        if capacity is not None and capacity > self.max_context:
            raise ValueError(f"cache capacity {capacity} exceeds {self.name}'s static cache of "
                             f"{self.max_context} positions")
        cache = self.pool.take()
        cache.capacity = min(cache.capacity, self.max_context)  # a copy may have less context
        return cache

    def _sibling(self, weights: ModelWeights, name: str, num_layers: int) -> "StaticLlama":
        return StaticLlama(self.spec, weights, self.dtype, self.device, self.eos_token_ids, name,
                           num_layers, self.cache_limit, self.width, self.graphs is not None)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: SlabCache, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, num_logits: int | None = None,
                hidden_layers: Sequence[int] = ()) -> ForwardOutput:
        """As NativeLlama.forward. A block of at most `width` rows whose logits are all
        asked for also returns the greedy verdict (ForwardOutput.greedy)."""
        if not isinstance(cache, SlabCache) or cache.kv.data_ptr() != self.pool.buffers[
                cache.slab].data_ptr():
            raise ValueError(f"{self.name} runs on caches from its own new_cache()")
        tokens = tokens.to("cpu")
        n = tokens.shape[0]
        self._check(tokens, cache, positions, mask, num_logits, hidden_layers)
        num_logits = n if num_logits is None else num_logits
        hidden_layers = tuple(hidden_layers)
        start = cache.reserve(n)
        try:
            pieces = []
            for a in range(0, n, self.width):
                b = min(n, a + self.width)
                piece_mask = None if mask is None else mask[a:b, : start + b].to("cpu", torch.bool)
                piece_pos = None if positions is None else positions[a:b].to("cpu")
                staged = stage(tokens[a:b], start + a, piece_pos, piece_mask, self.width,
                               self.pool.slots, self._window, self._pin)
                out = self._run(staged, cache.slab, hidden_layers)
                # Copied out now: the next step (a graph's replay) overwrites its outputs.
                rows, wanted = b - a, max(0, b - max(a, n - num_logits))
                pieces.append(ForwardOutput(out.logits[rows - wanted:rows].clone(),
                                            tuple(h[:rows].clone() for h in out.hidden),
                                            out.greedy[:rows + 1].clone()))
        except BaseException:
            cache.truncate(start)
            raise
        if len(pieces) == 1:
            whole = pieces[0]
            if num_logits < n:
                whole.greedy = None  # the verdict reads every row's logits
            return whole
        return ForwardOutput(torch.cat([p.logits for p in pieces]),
                             tuple(torch.cat([p.hidden[i] for p in pieces])
                                   for i in range(len(hidden_layers))))

    def _run(self, staged: Staged, slab: int, hidden_layers: tuple[int, ...]) -> StepOut:
        self._ints.copy_(staged.ints, non_blocking=True)
        self._masks.copy_(staged.masks, non_blocking=True)
        if self.graphs is not None:
            return self.graphs.run(slab, self.pool.buffers[slab], hidden_layers)
        return self._step(self.pool.buffers[slab], hidden_layers)

    def _step(self, kv: torch.Tensor, hidden_layers: tuple[int, ...]) -> StepOut:
        """One `width`-row step on the inputs in self._ints / self._masks, reading and
        writing the buffer `kv`. No host sync: it is what a CUDA graph captures."""
        width = self.width
        tokens = self._ints[:width]
        positions = self._ints[width:2 * width]
        row_slots = self._ints[2 * width:3 * width]
        drafts = self._ints[3 * width:3 * width + 1]
        tail_slots = self._ints[3 * width + 1:].view(width, 2 * width)
        cos, sin = self._cos[positions][:, None], self._sin[positions][:, None]
        blocked = ~self._masks  # [kinds, width, slots]
        wanted = set(hidden_layers)
        x, captured = self._through_layers(
            tokens, wanted,
            lambda index, layer, x: self._static_layer(
                layer, kv[index], x, cos, sin, row_slots, tail_slots,
                blocked[1 if self._sliding and self._sliding[index] else 0]))
        x = self._norm(x, self.weights.norm)
        captured[self.num_layers] = x
        logits = self.weights.lm_head(x).float()  # the model dtype's head, no float32 GEMM
        argmax = logits.argmax(-1)  # the first maximal index on ties, on CPU and CUDA alike
        matched = (argmax[:-1] == tokens[1:]) & (self._rows[:-1] < drafts)
        accepted = matched.long().cumprod(0).sum(0, keepdim=True)
        return StepOut(logits, torch.cat((accepted, argmax)),
                       tuple(captured[layer] for layer in hidden_layers))

    def _static_layer(self, w: LayerWeights, layer_kv: torch.Tensor, x: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor, row_slots: torch.Tensor,
                      tail_slots: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        heads, kv_heads, head_dim = self._heads, self._kv_heads, self._head_dim
        qkv = w.qkv(self._norm(x, w.attn_norm)).view(rows, heads + 2 * kv_heads, head_dim)
        qk = qkv[:, : heads + kv_heads]
        if w.qk_norm is not None:
            qk = self._norm(qk, w.qk_norm)
        qk = rotate(qk, cos, sin)
        new_kv = torch.cat((qk[:, heads:], qkv[:, heads + kv_heads:]), dim=1)  # [rows, 2 kv, hd]
        layer_kv.index_copy_(2, row_slots, new_kv.view(rows, 2, kv_heads, head_dim).permute(1, 2, 0, 3))
        out = _attend(qk[:, :heads], layer_kv[0], layer_kv[1], tail_slots, blocked)
        x = x + w.o(out)
        gate_up = w.gate_up(self._norm(x, w.mlp_norm))
        inter = gate_up.shape[-1] // 2
        return x + w.down(F.silu(gate_up[:, :inter]) * gate_up[:, inter:])


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, tail_slots: torch.Tensor,
            blocked: torch.Tensor) -> torch.Tensor:
    """Eager attention of a step's rows in the layout `static_cache.stage` describes:
    one score per buffer slot (the committed keys before each row's split, by one
    matmul for all rows), then one per key of the row's own tail (gathered, in order);
    one float32 softmax over both; the two value products added in float32.

    q [rows, heads, hd]; keys, values [kv_heads, slots, hd]; tail_slots [rows, tail];
    blocked [rows, slots + tail] (True = not seen) -> [rows, heads * hd]."""
    rows, heads, head_dim = q.shape
    kv_heads, slots = keys.shape[0], keys.shape[1]
    groups = heads // kv_heads
    scale = head_dim ** -0.5
    q = q.reshape(rows, kv_heads, groups, head_dim)
    folded = q.permute(1, 2, 0, 3).reshape(kv_heads, groups * rows, head_dim)
    shared = torch.matmul(folded, keys.transpose(1, 2)).view(kv_heads, groups, rows, slots)
    tail_keys, tail_values = keys[:, tail_slots], values[:, tail_slots]  # [kv, rows, tail, hd]
    by_row = q.permute(1, 0, 2, 3)  # [kv, rows, groups, hd]
    own = torch.matmul(by_row, tail_keys.transpose(2, 3)).permute(0, 2, 1, 3)  # [kv, g, rows, tail]
    scores = (torch.cat((shared, own), dim=-1) * scale).masked_fill(blocked, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(probs[..., :slots].reshape(kv_heads, groups * rows, slots), values)
    out = out.view(kv_heads, groups, rows, head_dim).permute(2, 0, 1, 3).float()
    tail_out = torch.matmul(probs[..., slots:].permute(0, 2, 1, 3), tail_values)  # [kv, rows, g, hd]
    out = out + tail_out.permute(1, 0, 2, 3).float()
    return out.to(q.dtype).reshape(rows, heads * head_dim)
