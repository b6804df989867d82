"""Load a Llama-family safetensors checkpoint into fused, matmul-ready weights.

q/k/v become one [q + 2 kv, hidden] matrix and gate/up one [2 inter, hidden]
matrix, so each layer runs four matmuls. bf16 matrices on a CPU with AMX are
packed once into the tile layout of verispec's own kernel (verispec/kernels),
which streams each weight once for up to 16 rows and sums every output in a
fixed order, so a row's result never depends on the other rows in the call.
Elsewhere they are prepacked into oneDNN's blocked layout: an unpacked bf16
F.linear reorders its weight on every call, which roughly doubles the cost of
a one-row decode; for rows <= 32 that packed product is row-invariant too.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from verispec import kernels
from verispec.models.llama_config import LlamaSpec


def _can_pack(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.bfloat16
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class Linear:
    """y = x @ W.T + b for x of shape [rows, in].

    bf16 on CPU runs verispec's AMX kernel (verispec.kernels) when it builds: it
    streams the weight once for up to 16 rows (oneDNN's one-row bf16 product
    reaches about half the memory bandwidth) and is row-invariant for any row
    count. Otherwise oneDNN's packed product, else F.linear.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 pack: bool = True) -> None:
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.kernel = pack and _can_pack(weight) and kernels.available()
        self.packed = pack and _can_pack(weight) and not self.kernel
        if self.kernel:
            self.weight = kernels.pack(weight)
        elif self.packed:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)
        else:
            self.weight = weight.contiguous()
        self.format = "bf16" if weight.dtype == torch.bfloat16 else str(weight.dtype).split(".")[-1]

    @classmethod
    def from_pack(cls, packed: torch.Tensor, out_features: int, in_features: int,
                  bias: torch.Tensor | None, fmt: str) -> "Linear":
        """A Linear over a weight already packed by the kernels (pack_quant, pack_quant_i8)."""
        lin = cls.__new__(cls)
        lin.out_features, lin.in_features = out_features, in_features
        lin.bias, lin.kernel, lin.packed, lin.weight, lin.format = bias, True, False, packed, fmt
        return lin

    @property
    def row_invariant(self) -> bool:
        """Whether a row's result is independent of the other rows and their count.
        True for the AMX kernel (by construction) and oneDNN's packed bf16 kernels
        (checked for 1..64 and 200 rows); plain fp32 GEMMs only keep a row's bits
        when the row count is fixed."""
        return self.kernel or self.packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel and x.dtype == torch.bfloat16 and x.dim() == 2:
            return kernels.linear(x, self.weight, self.out_features, self.bias)
        if self.kernel:
            raise ValueError(f"Linear with a kernel-packed weight needs bf16 [rows, in], "
                             f"got {x.dtype} {tuple(x.shape)}")
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """self(x).float(): the same values, written as float32 by the kernel where it runs."""
        if self.kernel and x.dtype == torch.bfloat16 and x.dim() == 2:
            return kernels.linear_float(x, self.weight, self.out_features, self.bias)
        return self(x).float()


class StackedLinear:
    """Several Linears over the same input whose outputs are concatenated: a fused
    matrix (q/k/v, gate/up) whose parts come in different block formats. Each
    output column is its own dot product, so the result equals the fused matrix's."""

    def __init__(self, parts: list[Linear]) -> None:
        self.parts = parts
        self.in_features = parts[0].in_features
        self.out_features = sum(p.out_features for p in parts)
        self.kernel = False  # not one packed matrix: the fused C++ layer cannot take it
        self.packed = False
        self.format = "+".join(dict.fromkeys(p.format for p in parts))

    @property
    def row_invariant(self) -> bool:
        return all(p.row_invariant for p in self.parts)

    @property
    def bias(self) -> torch.Tensor | None:
        if all(p.bias is None for p in self.parts):
            return None
        return torch.cat([p.bias for p in self.parts])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self(x).float()


class Embedding:
    """Token rows: a dense [vocab, hidden] matrix, or a kernel pack read by
    kernels.embedding (the GGUF blocks, dequantized row by row)."""

    def __init__(self, weight: torch.Tensor | None = None, packed: torch.Tensor | None = None,
                 shape: tuple[int, int] | None = None, fmt: str = "bf16") -> None:
        self.weight, self.packed, self.format = weight, packed, fmt
        self.shape = tuple(weight.shape) if weight is not None else shape

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.embedding(ids, self.weight)
        return kernels.embedding(self.packed, ids)

    def matrix(self) -> torch.Tensor:
        """[vocab, hidden] dense; a packed table is expanded once, on first use
        (heads and training read rows by index)."""
        if self.weight is None:
            self.weight = kernels.embedding(self.packed, torch.arange(self.shape[0]))
        return self.weight


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [hidden]
    qkv: Linear | StackedLinear  # [(heads + 2 kv_heads) * head_dim, hidden]
    qk_norm: torch.Tensor | None  # [heads + kv_heads, head_dim], qwen3 only
    o: Linear  # [hidden, heads * head_dim]
    mlp_norm: torch.Tensor  # [hidden]
    gate_up: Linear | StackedLinear  # [2 * intermediate, hidden]
    down: Linear  # [hidden, intermediate]


@dataclass
class ModelWeights:
    embedding: Embedding  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden]
    lm_head: Linear  # [vocab, hidden]
    # (checkpoint key, layer index or None, digest input) for weights_fingerprint;
    # kept instead of the unfused tensors, which are freed after fusing.
    fingerprint_parts: list[tuple[str, int | None, bytes]]
    weights_kind: str = "dense"  # "dense", "quant" (GGUF blocks in the kernels) or "quant-i8"
    source: "Path | None" = None  # where the weights were read, for a quantized self-draft

    @property
    def embed(self) -> torch.Tensor:
        """[vocab, hidden] dense token embeddings (heads and training index it)."""
        return self.embedding.matrix()


def read_config(folder: Path) -> dict:
    return json.loads((Path(folder) / "config.json").read_text())


def read_eos_ids(folder: Path, config: dict) -> frozenset[int]:
    ids: set[int] = set()
    sources = [config]
    gen = Path(folder) / "generation_config.json"
    if gen.exists():
        sources.append(json.loads(gen.read_text()))
    for source in sources:
        eos = source.get("eos_token_id")
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(e) for e in eos)
    return frozenset(ids)


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").exists():
        shards = ["model.safetensors"]
    else:
        raise ValueError(f"{folder} has no model.safetensors (or index); the native backend "
                         f"reads safetensors only")
    tensors: dict[str, torch.Tensor] = {}
    for shard in shards:
        tensors.update(load_file(str(folder / shard)))
    return tensors


def _digest_part(tensor: torch.Tensor) -> bytes:
    """64 values of a weight for the fingerprint, on any device (HFModel hashes the
    same sample, so both backends agree)."""
    flat = tensor.detach().flatten()
    return flat[:: max(1, flat.numel() // 64)][:64].float().cpu().numpy().tobytes()


def fingerprint(parts: list[tuple[str, int | None, bytes]], num_layers: int) -> str:
    digest = hashlib.sha256()
    for key, layer, data in sorted(parts, key=lambda p: p[0]):
        if layer is None or layer < num_layers:
            digest.update(key.encode())
            digest.update(data)
    return digest.hexdigest()[:16]


def _layer_index(key: str) -> int | None:
    parts = key.split(".")
    if len(parts) > 2 and parts[0] == "model" and parts[1] == "layers":
        return int(parts[2])
    return None


def load_weights(folder: Path, spec: LlamaSpec, dtype: torch.dtype,
                 device: torch.device) -> ModelWeights:
    raw = _read_tensors(folder)
    # Tied checkpoints store the shared matrix under either name (safetensors'
    # save_model keeps one of the aliases), so fill in whichever is missing.
    if spec.tie_embeddings and "model.embed_tokens.weight" not in raw and "lm_head.weight" in raw:
        raw["model.embed_tokens.weight"] = raw["lm_head.weight"]
    if "lm_head.weight" not in raw or spec.tie_embeddings:
        raw["lm_head.weight"] = raw["model.embed_tokens.weight"]
    tensors = {k: v.to(device=device, dtype=dtype) for k, v in raw.items()
               if not k.endswith("rotary_emb.inv_freq")}
    del raw
    parts = [(k, _layer_index(k), _digest_part(v)) for k, v in tensors.items()]

    def take(key: str) -> torch.Tensor:
        if key not in tensors:
            raise ValueError(f"checkpoint lacks {key}; is it a {spec.model_type} model?")
        return tensors.pop(key)

    def maybe(key: str, wanted: bool) -> torch.Tensor | None:
        return take(key) if wanted else None

    layers = []
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        # Phi-3 checkpoints store q/k/v and gate/up already fused, in the same order.
        fused = spec.model_type == "phi3"
        qkv_w = (take(p + "self_attn.qkv_proj.weight") if fused
                 else torch.cat([take(p + f"self_attn.{n}_proj.weight") for n in "qkv"]))
        qkv_b = (torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
                 if spec.qkv_bias else None)
        qk_norm = None
        if spec.qk_norm:
            qk_norm = torch.cat([take(p + "self_attn.q_norm.weight")[None].expand(spec.num_heads, -1),
                                 take(p + "self_attn.k_norm.weight")[None].expand(spec.num_kv_heads, -1)])
        gate_up_w = (take(p + "mlp.gate_up_proj.weight") if fused
                     else torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")]))
        gate_up_b = (torch.cat([take(p + "mlp.gate_proj.bias"), take(p + "mlp.up_proj.bias")])
                     if spec.mlp_bias else None)
        layers.append(LayerWeights(
            attn_norm=take(p + "input_layernorm.weight"),
            qkv=Linear(qkv_w, qkv_b),
            qk_norm=qk_norm,
            o=Linear(take(p + "self_attn.o_proj.weight"), maybe(p + "self_attn.o_proj.bias", spec.o_bias)),
            mlp_norm=take(p + "post_attention_layernorm.weight"),
            gate_up=Linear(gate_up_w, gate_up_b),
            down=Linear(take(p + "mlp.down_proj.weight"), maybe(p + "mlp.down_proj.bias", spec.mlp_bias)),
        ))
    embed = Embedding(take("model.embed_tokens.weight"))
    return ModelWeights(embedding=embed, layers=layers, norm=take("model.norm.weight"),
                        lm_head=Linear(take("lm_head.weight")), fingerprint_parts=parts,
                        source=Path(folder))
