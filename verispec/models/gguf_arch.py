"""GGUF architectures beyond the Llama layout: what llama.cpp reads from the
metadata (or hard-codes) for Phi-3, Gemma 2 and Gemma 3, as config.json fields,
and Gemma's tensors as native weights.

Sources of each fact (llama.cpp's llama-model.cpp and convert_hf_to_gguf.py):
- phi3: q/k/v in one `attn_qkv` tensor and gate/up in one `ffn_up` (gate first),
  as transformers' qkv_proj / gate_up_proj; `phi3.attention.sliding_window` is the
  window of every layer; LongRoPE files carry rope_factors_long/short tensors,
  which the native backend does not implement.
- gemma2 / gemma3: the converter stores every RMSNorm weight as 1 + w (so the
  float32 values are already Gemma's scale); embeddings are tied; the attention
  scale is head_dim^-0.5 except on the 27B models (46 and 62 layers), where it is
  (hidden / heads)^-0.5; layer i slides iff i % pattern < pattern - 1, with
  pattern 2 (Gemma 2) and 6 (Gemma 3) unless the file says otherwise; Gemma 3's
  local layers use RoPE base 10000 and its global ones the file's freq_base (and
  its linear scaling, where given); Gemma 2 soft-caps with the file's
  attn/final_logit_softcapping.
"""
from __future__ import annotations

from pathlib import Path

import torch

from verispec.models.gemma import GemmaNorms, ScaledEmbedding, parse_gemma
from verispec.models.llama_weights import LayerWeights, ModelWeights

# GGUF general.architecture -> transformers model_type
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                 "gemma2": "gemma2", "gemma3": "gemma3_text"}
GEMMA_ARCHS = ("gemma2", "gemma3")
_SWA_PATTERN = {"gemma2": 2, "gemma3": 6}
_BIG_GEMMA_LAYERS = {"gemma2": 46, "gemma3": 62}  # the 27B models: scale by hidden / heads
GEMMA3_LOCAL_ROPE_BASE = 10000.0


def arch_config(gf, arch: str, get, config: dict) -> dict:
    """`config` (hf_config's Llama-layout fields) completed for `arch`."""
    if arch == "phi3":
        if "rope_factors_long.weight" in gf.tensors or "rope_factors_short.weight" in gf.tensors:
            raise ValueError("the native backend does not implement Phi-3's LongRoPE "
                             "(rope_factors_long/short in the file)")
        window = get("attention.sliding_window", None, required=False)
        if window:
            config["sliding_window"] = int(window)
        return config
    if arch not in GEMMA_ARCHS:
        return config
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    pattern = get("attention.sliding_window_pattern", None, required=False)
    if isinstance(pattern, list):  # newer files: one flag per layer
        sliding = [bool(p) for p in pattern]
    else:
        period = int(pattern or _SWA_PATTERN[arch])
        sliding = [i % period < period - 1 for i in range(layers)]
    scalar = (config["hidden_size"] // heads if layers == _BIG_GEMMA_LAYERS[arch]
              else config["head_dim"])
    config.update(
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        sliding_window=int(get("attention.sliding_window")),
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        query_pre_attn_scalar=scalar)
    if arch == "gemma2":
        config["attn_logit_softcapping"] = get("attn_logit_softcapping", None, required=False)
        config["final_logit_softcapping"] = get("final_logit_softcapping", None, required=False)
        return config
    full = {"rope_type": "default", "rope_theta": config["rope_theta"]}
    if "rope_scaling" in config:
        full = {**config.pop("rope_scaling"), "rope_theta": config["rope_theta"]}
    config["rope_parameters"] = {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_ROPE_BASE}}
    return config


def parse_arch(config: dict):
    """(LlamaSpec, GemmaSpec or None) of a config hf_config wrote."""
    from verispec.models.llama_config import parse_config

    if config["model_type"] in ("gemma2", "gemma3_text"):
        return parse_gemma(config)
    return parse_config(config), None


def layer_names(arch: str) -> dict[str, list[str]]:
    """The GGUF tensors (without blk.N.) of the fused q/k/v and gate/up groups."""
    if arch == "phi3":
        return {"qkv": ["attn_qkv"], "gate_up": ["ffn_up"]}
    return {"qkv": ["attn_q", "attn_k", "attn_v"], "gate_up": ["ffn_gate", "ffn_up"]}


def load_gemma_gguf(b, spec) -> tuple[ModelWeights, list[GemmaNorms]]:
    """Gemma 2/3 weights from a GGUF file through gguf_weights' builder `b`."""
    heads, kv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    inter, hidden = spec.intermediate_size, spec.hidden_size

    def norm(name: str, n: int) -> torch.Tensor:
        return b.dense(name, (n,), torch.float32)  # already 1 + w (the converter added 1)

    embed, head = b.embedding()
    scale = hidden ** 0.5
    if embed.packed is not None:
        embed = ScaledEmbedding(None, scale, packed=embed.packed, shape=embed.shape, fmt=embed.format,
                                dtype=b.dtype)
    else:
        embed = ScaledEmbedding(embed.weight, scale)
    layers, norms = [], []
    for i in range(spec.num_layers):
        p = f"blk.{i}."
        qk_norm = None
        if spec.qk_norm:
            qk_norm = torch.cat([norm(p + "attn_q_norm.weight", hd)[None].expand(heads, -1),
                                 norm(p + "attn_k_norm.weight", hd)[None].expand(kv, -1)])
        layers.append(LayerWeights(
            attn_norm=norm(p + "attn_norm.weight", hidden),
            qkv=b.linear([p + f"attn_{n}.weight" for n in "qkv"], [heads * hd, kv * hd, kv * hd],
                         hidden, None),
            qk_norm=qk_norm,
            o=b.linear([p + "attn_output.weight"], [hidden], heads * hd, None),
            mlp_norm=norm(p + "ffn_norm.weight", hidden),
            gate_up=b.linear([p + "ffn_gate.weight", p + "ffn_up.weight"], [inter, inter], hidden, None),
            down=b.linear([p + "ffn_down.weight"], [hidden], inter, None)))
        norms.append(GemmaNorms(norm(p + "post_attention_norm.weight", hidden),
                                norm(p + "post_ffw_norm.weight", hidden)))
    weights = ModelWeights(embedding=embed, layers=layers, norm=norm("output_norm.weight", hidden),
                           lm_head=head, fingerprint_parts=b.parts,
                           weights_kind=b.kind, source=Path(b.gf.path))
    return weights, norms

