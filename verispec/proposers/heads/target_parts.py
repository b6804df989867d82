"""The pieces of a target that a trained head borrows: its token embeddings,
final norm and LM head, read from the loaded target and never copied into the
head's file, so a head stays a few megabytes and always decodes through the
exact output layer it was trained against.

Both backends expose them: the native Llama forward through its weight
structs, transformers through the module tree. `describe_target` collects the
architecture facts a head's own decoder layer copies (heads, head size, RoPE
base) so a head built for a target attends like a layer of that target.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from verispec.models.base import TargetModel


@dataclass(frozen=True)
class TargetInfo:
    architecture: str  # config model_type, e.g. "llama"
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope_theta: float


@dataclass
class TargetParts:
    """Shared, frozen views of the target's input and output layers."""
    embed: torch.Tensor  # [vocab, hidden], the target's own embedding matrix
    norm_weight: torch.Tensor  # [hidden], the final RMSNorm's weight
    rms_eps: float
    lm_head: Callable[[torch.Tensor], torch.Tensor]  # [rows, hidden] -> [rows, vocab]
    lm_weight: torch.Tensor | None  # [vocab, hidden] when readable as a plain matrix
    dtype: torch.dtype
    device: torch.device
    # token ids [n] -> a Linear over those LM-head rows in the target's own GGUF
    # blocks, where the target runs them quantized (quant_lm_rows); else None
    quant_rows: Callable[[torch.Tensor], object] | None = None

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        # The native backend's RMSNorm: normalize in float32, round once, then
        # scale, as transformers' LlamaRMSNorm does.
        return F.rms_norm(x, (x.shape[-1],), eps=self.rms_eps) * self.norm_weight.to(x.dtype)

    def lm_rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """LM-head rows of `token_ids` ([n] -> [n, hidden]): the sparse logits
        of training and a reduced draft vocabulary read only these."""
        if self.lm_weight is None:
            raise ValueError("this target's LM head is packed for its matmul kernel and its "
                             "rows cannot be read; load the target in fp32 to train a head")
        return self.lm_weight[token_ids.to(self.lm_weight.device)]


def describe_target(target: TargetModel) -> TargetInfo:
    spec = getattr(target, "spec", None)
    if spec is not None:  # NativeLlama
        return TargetInfo(spec.model_type, target.num_layers, target.hidden_size,
                          target.vocab_size, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                          spec.intermediate_size, spec.rms_eps, spec.rope.theta)
    config = getattr(target, "config", None)
    if config is None:
        raise ValueError(f"{target.name}: heads need a native or transformers target")
    heads = int(config.num_attention_heads)
    rope = dict(getattr(config, "rope_parameters", None) or {})
    theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    return TargetInfo(str(config.model_type), target.num_layers, target.hidden_size,
                      target.vocab_size, heads,
                      int(getattr(config, "num_key_value_heads", None) or heads),
                      int(getattr(config, "head_dim", None) or target.hidden_size // heads),
                      int(config.intermediate_size), float(getattr(config, "rms_norm_eps", 1e-6)),
                      theta)


def target_parts(target: TargetModel) -> TargetParts:
    weights = getattr(target, "weights", None)
    if weights is not None:  # NativeLlama: fused weight structs
        spec = target.spec
        head = weights.lm_head
        if spec.tie_embeddings:
            lm_weight = weights.embed
        else:
            lm_weight = None if (head.kernel or head.packed) else head.weight
        return TargetParts(weights.embed, weights.norm, spec.rms_eps, _native_head(head),
                           lm_weight, target.dtype, target.device, quant_lm_rows(target))
    model = getattr(target, "model", None)
    if model is None or not hasattr(model, "get_output_embeddings"):
        raise ValueError(f"{target.name}: heads need a native or transformers target")
    norm = model.base_model.norm
    eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
    head = model.get_output_embeddings()
    return TargetParts(model.get_input_embeddings().weight.detach(), norm.weight.detach(), eps,
                       lambda x: F.linear(x, head.weight.detach()), head.weight.detach(),
                       target.dtype, target.device)


def _native_head(head) -> Callable[[torch.Tensor], torch.Tensor]:
    # The AMX kernel takes 2-D bf16 rows only; heads call it with [rows, hidden].
    return lambda x: head(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)


def quant_lm_rows(target) -> Callable[[torch.Tensor], object] | None:
    """For a target whose LM head runs GGUF blocks in the kernels (the default
    model's tied Q8_0 embedding): ids -> a Linear over just those rows, in the
    same blocks, re-read from the file, on the target's own path. Every output
    of either path depends on its own row of blocks and x alone
    (kernels/quant_i8.h), so the draft rows' logits are bit-identical to the
    target head's logits of those ids: with `--weights quant` they are also the
    dense bf16 rows', with `quant-i8` they are the integer path's. About half
    the bytes read per draft token for Q8_0."""
    from verispec import kernels

    weights = target.weights
    head, source = weights.lm_head, weights.source
    if (not getattr(head, "kernel", False) or not kernels.is_quantized(head.weight)
            or source is None or not source.is_file()):
        return None
    int8 = kernels.is_int8(head.weight)

    def rows(token_ids: torch.Tensor):
        from verispec.models.gguf_file import GGUFFile
        from verispec.models.llama_weights import Linear

        gf = GGUFFile(source)
        name = "token_embd.weight" if target.spec.tie_embeddings else "output.weight"
        info = gf.tensors[name]
        raw = torch.from_numpy(gf.raw(name)[token_ids.cpu().numpy()])  # [n, bytes per row], a copy
        part = [(raw, info.ggml_type, raw.shape[0])]
        packed = (kernels.pack_quant_i8(part, head.in_features) if int8 else
                  kernels.pack_quant_cat(part, head.in_features))
        gf.close()
        return Linear.from_pack(packed, raw.shape[0], head.in_features, None, head.format)

    return rows
