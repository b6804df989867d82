"""A quantized self-draft: the target's own decoder layers cast at load to a
4- or 8-bit GGUF block format and run by the same kernels (IPEX-LLM's and
ML-SpecQD's self-speculation). It needs no training and agrees with the target
most of the time; the verifier keeps the output the target's own whatever it
proposes, so it is lossless by construction.

The draft shares the target's embedding, final norm, LM head, layer norms and
biases; only the layer matrices are new, in the chosen format (about a quarter
of bf16's bytes for Q4_0). Values are re-read from where the target's weights
came from (safetensors or the GGUF file), since the target keeps only packs.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from verispec import kernels
from verispec.models.llama_weights import LayerWeights, Linear, ModelWeights


class _DenseSource:
    """float32 matrices by transformers name, from a safetensors folder or a GGUF file."""

    def __init__(self, source: Path, spec) -> None:
        self.source = Path(source)
        if self.source.is_file():
            from verispec.models.gguf_file import GGUFFile
            from verispec.models.gguf_weights import _Builder

            self.gguf = _Builder(GGUFFile(self.source), spec, False, torch.float32,
                                 torch.device("cpu"))
        else:
            self.gguf = None
            index = self.source / "model.safetensors.index.json"
            if index.exists():
                self.shards = json.loads(index.read_text())["weight_map"]
            else:
                from safetensors import safe_open

                with safe_open(str(self.source / "model.safetensors"), "pt") as fh:
                    self.shards = {k: "model.safetensors" for k in fh.keys()}

    def get(self, key: str) -> torch.Tensor:
        if self.gguf is not None:
            from verispec.models.gguf_weights import gguf_name

            name = gguf_name(key)
            return self.gguf.dense(name, self.gguf.gf.tensors[name].shape)
        from safetensors import safe_open

        with safe_open(str(self.source / self.shards[key]), "pt") as fh:
            return fh.get_tensor(key).float()


def _quantized(weights: list[torch.Tensor], fmt: str, bias: torch.Tensor | None) -> Linear:
    import gguf

    qtype = gguf.GGMLQuantizationType[fmt]
    matrix = torch.cat(weights).float().numpy()
    rows, cols = matrix.shape
    raw = gguf.quants.quantize(matrix, qtype)  # [rows, bytes per row] uint8
    packed = kernels.pack_quant(torch.from_numpy(np.ascontiguousarray(raw)), int(qtype), rows, cols)
    return Linear.from_pack(packed, rows, cols, bias, fmt)


def quantized_draft_weights(target, fmt: str, num_layers: int) -> ModelWeights:
    """The draft's weights: `target`'s first `num_layers` layers in `fmt`, the rest shared."""
    import gguf

    weights: ModelWeights = target.weights
    qtype = gguf.GGMLQuantizationType[fmt]
    if not kernels.available() or int(qtype) not in kernels.quant_types():
        raise ValueError(f"quant:{fmt} needs verispec's kernels with {fmt} blocks, which this "
                         f"machine does not build")
    if target.dtype != torch.bfloat16 or target.device.type != "cpu":
        raise ValueError(f"quant:{fmt} drafts a bf16 CPU target; this one is {target.dtype} on "
                         f"{target.device}")
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    spec = target.spec
    if spec.hidden_size % block or spec.intermediate_size % block:
        raise ValueError(f"quant:{fmt} needs layer widths that are multiples of {block}")
    if weights.source is None:
        raise ValueError(f"{target.name} does not say where its weights came from")
    source = _DenseSource(weights.source, spec)
    fused = spec.model_type == "phi3"  # q/k/v and gate/up stored as one matrix each
    layers = []
    for i, old in enumerate(weights.layers[:num_layers]):
        p = f"model.layers.{i}."
        get = source.get
        qkv = ([get(p + "self_attn.qkv_proj.weight")] if fused else
               [get(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
        gate_up = ([get(p + "mlp.gate_up_proj.weight")] if fused else
                   [get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
        layers.append(LayerWeights(
            attn_norm=old.attn_norm,
            qkv=_quantized(qkv, fmt, old.qkv.bias),
            qk_norm=old.qk_norm,
            o=_quantized([get(p + "self_attn.o_proj.weight")], fmt, old.o.bias),
            mlp_norm=old.mlp_norm,
            gate_up=_quantized(gate_up, fmt, old.gate_up.bias),
            down=_quantized([get(p + "mlp.down_proj.weight")], fmt, old.down.bias),
        ))
    return ModelWeights(embedding=weights.embedding, layers=layers, norm=weights.norm,
                        lm_head=weights.lm_head, fingerprint_parts=[], weights_kind="quant",
                        source=weights.source)


def quantized_draft(target, fmt: str, num_layers: int | None = None):
    """A self-draft: the native `target`'s first `num_layers` layers (all by default)
    cast to the GGUF block format `fmt`, sharing the embedding, norms and LM head.
    It lives here, not on the model, because it reads the model's source file."""
    layers = num_layers or target.num_layers
    if not 1 <= layers <= target.num_layers:
        raise ValueError(f"quant:{fmt}:L needs 1 <= L <= {target.num_layers} for {target.name}, "
                         f"got {layers}")
    weights = quantized_draft_weights(target, fmt, layers)
    cut = f"[:{layers}]" if layers < target.num_layers else ""
    return target._sibling(weights, f"{target.name}~{fmt}{cut}", layers)
