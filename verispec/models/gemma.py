"""Gemma 2 and Gemma 3 (text) on the native backend.

The decoder is Llama's with Gemma's changes, each as in transformers'
modeling_gemma2/3: RMSNorm multiplies by (1 + weight) in float32 before the
cast; embeddings are scaled by sqrt(hidden) in the model dtype; GeGLU (tanh
gelu) MLP; a norm after attention and one before and one after the MLP; scores
scaled by query_pre_attn_scalar^-0.5; Gemma 2 soft-caps attention scores and
the final logits; Gemma 3 normalizes q and k and gives its local (sliding)
layers their own RoPE base. Local/global layers follow `layer_types`, the
window through `llama_window.window_mask`.

Where verispec's kernels run (bf16 or fp32 on AVX-512/AMX), Gemma takes the
Llama path: the attention kernel with Gemma's score scale and soft-cap, several
requests' rows in one forward (llama_batch), and in bf16 one fused C++ call
per layer (kernels/gemma_layer.cpp). Each row is computed alone in a fixed
order, so a position's bits are the same alone, in a block, a tree or a batch,
and greedy speculation is bit-exact; `batch_invariant` adds fixed fp32 matmul
tiles as for Llama. Without the kernels, the PyTorch path below runs attention
row by row (batches request by request) and `batch_invariant` is refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from verispec import kernels
from verispec.models.llama import DEFAULT_CACHE_LIMIT, NativeLlama
from verispec.models.llama_attention import AttentionMask
from verispec.models.llama_config import LlamaSpec, _rope_spec, rope_tables, rotate
from verispec.models.llama_weights import (
    Embedding,
    LayerWeights,
    Linear,
    ModelWeights,
    _digest_part,
    _layer_index,
    _read_tensors,
    read_config,
    read_eos_ids,
)

GEMMA_TYPES = ("gemma2", "gemma3_text")


@dataclass(frozen=True)
class GemmaSpec:
    scaling: float  # query_pre_attn_scalar ** -0.5
    attn_softcap: float | None  # Gemma 2: scores -> tanh(scores / c) * c
    final_softcap: float | None  # Gemma 2: logits -> tanh(logits / c) * c
    local_rope: object | None  # Gemma 3: RoPE of the sliding layers (a RopeSpec)


def parse_gemma(config: dict) -> tuple[LlamaSpec, GemmaSpec]:
    model_type = config.get("model_type")
    if model_type not in GEMMA_TYPES:
        raise ValueError(f"not a Gemma text model: {model_type!r}")
    act = config.get("hidden_activation") or config.get("hidden_act")
    if act != "gelu_pytorch_tanh":
        raise ValueError(f"native Gemma needs hidden_activation gelu_pytorch_tanh, got {act!r}")
    layers = int(config["num_hidden_layers"])
    types = config.get("layer_types") or []
    if len(types) != layers or set(types) - {"sliding_attention", "full_attention"}:
        raise ValueError("native Gemma needs layer_types of sliding/full attention per layer")
    window = config.get("sliding_window")
    sliding = tuple(kind == "sliding_attention" for kind in types) if window else ()
    params = config.get("rope_parameters") or {}
    local = None
    if "full_attention" in params:  # Gemma 3: one RoPE per layer type
        rope = _rope_spec({**config, "rope_parameters": params["full_attention"], "rope_scaling": None})
        local = _rope_spec({**config, "rope_parameters": params["sliding_attention"],
                            "rope_scaling": None})
    else:
        rope = _rope_spec(config)
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    spec = LlamaSpec(
        model_type=model_type, vocab_size=int(config["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]), num_layers=layers, num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or hidden // heads),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_position=int(config.get("max_position_embeddings", 8192)), rope=rope,
        tie_embeddings=True, qkv_bias=bool(config.get("attention_bias", False)),
        o_bias=bool(config.get("attention_bias", False)), mlp_bias=False,
        qk_norm=model_type == "gemma3_text", sliding_window=int(window) if window else None,
        sliding_layers=sliding)
    gemma = GemmaSpec(scaling=float(config.get("query_pre_attn_scalar", spec.head_dim)) ** -0.5,
                      attn_softcap=config.get("attn_logit_softcapping"),
                      final_softcap=config.get("final_logit_softcapping"), local_rope=local)
    return spec, gemma


class ScaledEmbedding(Embedding):
    """Token rows times sqrt(hidden), the scale rounded to the model dtype as in HF;
    the rows dense or, from a GGUF file, a kernel pack."""

    def __init__(self, weight: torch.Tensor | None, scale: float, packed: torch.Tensor | None = None,
                 shape: tuple[int, int] | None = None, fmt: str = "bf16",
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(weight, packed, shape, fmt)
        self.scale = torch.tensor(scale).to(dtype or weight.dtype)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return super().__call__(ids) * self.scale


@dataclass
class GemmaNorms:
    post_attention: torch.Tensor  # [hidden] float32, 1 + weight
    post_feedforward: torch.Tensor


def load_gemma_weights(folder: Path, spec: LlamaSpec, dtype: torch.dtype,
                       device: torch.device) -> tuple[ModelWeights, list[GemmaNorms]]:
    raw = _read_tensors(folder)
    tensors = {k: v.to(device) for k, v in raw.items()}
    del raw
    parts = [(k, _layer_index(k), _digest_part(v)) for k, v in tensors.items()]

    def take(key: str) -> torch.Tensor:
        if key not in tensors:
            raise ValueError(f"checkpoint lacks {key}; is it a {spec.model_type} model?")
        return tensors[key]

    def norm(key: str) -> torch.Tensor:
        return 1.0 + take(key).float()  # Gemma's RMSNorm scales by (1 + w), in float32

    def matrix(key: str) -> torch.Tensor:
        return take(key).to(dtype)

    layers, norms = [], []
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        qkv = torch.cat([matrix(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
        qkv_bias = (torch.cat([matrix(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
                    if spec.qkv_bias else None)
        qk_norm = None
        if spec.qk_norm:
            qk_norm = torch.cat([norm(p + "self_attn.q_norm.weight")[None].expand(spec.num_heads, -1),
                                 norm(p + "self_attn.k_norm.weight")[None].expand(spec.num_kv_heads, -1)])
        gate_up = torch.cat([matrix(p + "mlp.gate_proj.weight"), matrix(p + "mlp.up_proj.weight")])
        layers.append(LayerWeights(
            attn_norm=norm(p + "input_layernorm.weight"), qkv=Linear(qkv, qkv_bias), qk_norm=qk_norm,
            o=Linear(matrix(p + "self_attn.o_proj.weight"),
                     matrix(p + "self_attn.o_proj.bias") if spec.o_bias else None),
            mlp_norm=norm(p + "pre_feedforward_layernorm.weight"), gate_up=Linear(gate_up),
            down=Linear(matrix(p + "mlp.down_proj.weight"))))
        norms.append(GemmaNorms(norm(p + "post_attention_layernorm.weight"),
                                norm(p + "post_feedforward_layernorm.weight")))
    # safetensors' save_model keeps one name of a tied pair, sometimes lm_head's
    # (verispec's own GGUF conversion writes Gemma that way).
    embed = matrix("model.embed_tokens.weight" if "model.embed_tokens.weight" in tensors
                   else "lm_head.weight")
    weights = ModelWeights(embedding=ScaledEmbedding(embed, spec.hidden_size ** 0.5), layers=layers,
                           norm=norm("model.norm.weight"), lm_head=Linear(embed),
                           fingerprint_parts=parts, source=Path(folder))
    return weights, norms


class NativeGemma(NativeLlama):
    def __init__(self, spec: LlamaSpec, gemma: GemmaSpec, weights: ModelWeights,
                 norms: list[GemmaNorms], dtype: torch.dtype, device: torch.device,
                 eos_token_ids: frozenset[int], name: str, num_layers: int | None = None,
                 batch_invariant: bool = False, cache_limit: int = DEFAULT_CACHE_LIMIT) -> None:
        super().__init__(spec, weights, dtype, device, eos_token_ids, name, num_layers,
                         batch_invariant, cache_limit)
        if batch_invariant and not self.row_kernels:
            raise ValueError("--batch-invariant needs verispec's kernels for Gemma on the native "
                             "backend (its PyTorch attention has no fixed-tile variant)")
        self.gemma = gemma
        self.norms = norms
        self._softcap = float(gemma.attn_softcap or 0.0)
        self._fused_args = [_fused_gemma(layer, norms[i]) if args is not None else None
                            for i, (layer, args) in enumerate(zip(self.layers, self._fused_args))]
        self._local_tables = None
        if gemma.local_rope is not None:
            self._local_tables = tuple(t.to(device) for t in rope_tables(
                gemma.local_rope, spec.head_dim, self.max_context, dtype))
        self._local = None

    @classmethod
    def from_dir(cls, folder, dtype: torch.dtype = torch.float32, device="cpu",
                 batch_invariant: bool = False, cache_limit: int = DEFAULT_CACHE_LIMIT):
        folder = Path(folder)
        config = read_config(folder)
        spec, gemma = parse_gemma(config)
        device = torch.device(device)
        weights, norms = load_gemma_weights(folder, spec, dtype, device)
        name = config.get("_name_or_path") or folder.name
        return cls(spec, gemma, weights, norms, dtype, device, read_eos_ids(folder, config),
                   name=f"native:{Path(str(name)).name or folder.name}",
                   batch_invariant=batch_invariant, cache_limit=cache_limit)

    def _sibling(self, weights: ModelWeights, name: str, num_layers: int) -> "NativeGemma":
        draft = NativeGemma(self.spec, self.gemma, weights, self.norms, self.dtype, self.device,
                            self.eos_token_ids, name=name, num_layers=num_layers,
                            batch_invariant=self.batch_invariant, cache_limit=self.cache_limit)
        draft.window_block = self.window_block
        return draft

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return (F.rms_norm(x.float(), (x.shape[-1],), eps=self.spec.rms_eps) * weight).to(x.dtype)

    def _head(self, x: torch.Tensor) -> torch.Tensor:
        logits = super()._head(x)
        cap = self.gemma.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _run(self, tokens, cache, start, positions, mask, num_logits, hidden_layers):
        if self._local_tables is not None:
            n = tokens.shape[0]
            index = self._arange[start:start + n] if positions is None else positions.to(self.device)
            cos, sin = self._local_tables
            self._local = (cos[index][:, None], sin[index][:, None])
        return super()._run(tokens, cache, start, positions, mask, num_logits, hidden_layers)

    def _row_tables(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        tables = super()._row_tables(positions)
        if self._local_tables is None:
            return tables
        cos, sin = self._local_tables
        local = (cos[positions], sin[positions])
        return [local if self._sliding and self._sliding[i] else t for i, t in enumerate(tables)]

    def _row_layer(self, w: LayerWeights, index: int, x: torch.Tensor, items, starts, offsets,
                   cos: torch.Tensor, sin: torch.Tensor, plan) -> torch.Tensor:
        """Several requests' rows through one layer on the kernels (llama_batch's contract)."""
        if self._fused and self._fused_args[index] is not None:
            return kernels.gemma_layer(
                x, self._fused_args[index],
                [self._heads, self._kv_heads, self._head_dim, self.spec.intermediate_size],
                self.spec.rms_eps, self.gemma.scaling, self._softcap, cos, sin,
                [it.cache.kv[index] for it in items], plan.row_cache, plan.row_slot, plan.row_len,
                plan.row_index)
        queries, layer_kv = self._rows_qkv(w, index, x, cos, sin, items, starts, offsets)
        out = plan.attend(queries, layer_kv, self.gemma.scaling, self._softcap)
        return self._mlp(w, index, x, out)

    def _mlp(self, w: LayerWeights, index: int, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The layer after attention: post-attention norm, residual, GeGLU MLP between its norms."""
        norms = self.norms[index]
        x = x + self._norm(self._linear(w.o, out), norms.post_attention)
        gate_up = self._linear(w.gate_up, self._norm(x, w.mlp_norm))
        inter = gate_up.shape[-1] // 2
        act = F.gelu(gate_up[:, :inter], approximate="tanh") * gate_up[:, inter:]
        return x + self._norm(self._linear(w.down, act), norms.post_feedforward)

    def _layer(self, w: LayerWeights, index: int, x: torch.Tensor, cache, cos: torch.Tensor,
               sin: torch.Tensor, attn_mask: AttentionMask, start: int, n: int) -> torch.Tensor:
        rows = x.shape[0]
        heads, kv_heads, head_dim = self._heads, self._kv_heads, self._head_dim
        sliding = bool(self._sliding) and self._sliding[index]
        qkv = self._linear(w.qkv, self._norm(x, w.attn_norm)).view(rows, heads + 2 * kv_heads, head_dim)
        qk = qkv[:, : heads + kv_heads]
        if w.qk_norm is not None:
            qk = self._norm(qk, w.qk_norm)
        if sliding and self._local is not None:
            cos, sin = self._local
        qk = rotate(qk, cos, sin)
        new_kv = torch.cat((qk[:n, heads:], qkv[:n, heads + kv_heads:]), dim=1)
        layer_kv = cache.kv[index]  # [2, kv_heads, capacity, head_dim]
        layer_kv[:, :, start:start + n] = new_kv.view(n, 2, kv_heads, head_dim).permute(1, 2, 0, 3)
        keys, values = layer_kv[0], layer_kv[1]
        q = qk[:, :heads]
        if attn_mask.visible is not None:
            outs = []
            for i, seen in enumerate(attn_mask.visible):
                k, v = ((keys[:, :seen], values[:, :seen]) if isinstance(seen, int)
                        else (keys[:, seen], values[:, seen]))
                outs.append(self._attend(q[i:i + 1], k, v, None))
            out = torch.cat(outs)
        else:
            out = self._attend(q, keys[:, : start + n], values[:, : start + n], attn_mask.sdpa)
        return self._mlp(w, index, x, out)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """q [rows, heads, hd], keys/values [kv, end, hd], mask [groups * rows, end] or None."""
        rows, heads, head_dim = q.shape
        kv_heads = keys.shape[0]
        groups = heads // kv_heads
        folded = q.reshape(rows, kv_heads, groups, head_dim).permute(1, 2, 0, 3)
        folded = folded.reshape(kv_heads, groups * rows, head_dim)
        cap = self.gemma.attn_softcap
        if cap is None:
            out = F.scaled_dot_product_attention(folded[None], keys[None], values[None],
                                                 attn_mask=mask, scale=self.gemma.scaling)[0]
        else:
            scores = (folded @ keys.transpose(-1, -2)) * self.gemma.scaling  # [kv, g * rows, end]
            scores = torch.tanh(scores / cap) * cap
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            out = scores.softmax(-1, dtype=torch.float32).to(q.dtype) @ values
        return out.view(kv_heads, groups, rows, head_dim).permute(2, 0, 1, 3).reshape(
            rows, heads * head_dim)


def _fused_gemma(w: LayerWeights, norms: GemmaNorms) -> list[torch.Tensor]:
    """A layer's tensors in the order kernels.gemma_layer takes them."""
    none = torch.empty(0, dtype=torch.float32)
    qk_norm = w.qk_norm.contiguous() if w.qk_norm is not None else none
    bias = w.qkv.bias if w.qkv.bias is not None else torch.empty(0, dtype=torch.bfloat16)
    return [w.attn_norm.contiguous(), w.qkv.weight, bias, qk_norm, w.o.weight,
            norms.post_attention.contiguous(), w.mlp_norm.contiguous(), w.gate_up.weight,
            w.down.weight, norms.post_feedforward.contiguous()]


def native_class(config: dict):
    """The native model class for a config.json, or ValueError with the reason it has none."""
    from verispec.models.llama_config import parse_config

    if config.get("model_type") in GEMMA_TYPES:
        parse_gemma(config)
        return NativeGemma
    parse_config(config)
    return NativeLlama
