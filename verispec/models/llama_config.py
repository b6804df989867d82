"""The architecture facts the native Llama-family backend needs, read from an HF
config.json, and the RoPE tables they imply.

Supported: llama, mistral, qwen2 (biases on q/k/v), qwen3 (RMSNorm on each
query and key head before RoPE). RoPE types: default, linear, llama3. Anything
else fails here, at load time, with a message naming the unsupported field.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3")
_ROPE_TYPES = ("default", "linear", "llama3", "freq_factors")


@dataclass(frozen=True)
class RopeSpec:
    theta: float
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # kind "freq_factors": a GGUF's rope_freqs tensor, one divisor per frequency,
    # as llama.cpp applies it (Llama 3.1 files carry their scaling this way).
    freq_factors: tuple[float, ...] | None = None


@dataclass(frozen=True)
class LlamaSpec:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    max_position: int
    rope: RopeSpec
    tie_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    sliding_window: int | None  # None: full attention at every length
    # Per layer, True where it attends to the last sliding_window positions only
    # (Mistral: every layer; Qwen2: those from max_window_layers on); () without a window.
    sliding_layers: tuple[bool, ...] = ()

    @property
    def max_context(self) -> int:
        return self.max_position


def supports(config: dict) -> bool:
    """True when `config` (a parsed config.json) describes a model this backend runs."""
    try:
        parse_config(config)
    except ValueError:
        return False
    return True


def parse_config(config: dict) -> LlamaSpec:
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_TYPES:
        raise ValueError(f"native backend runs {', '.join(SUPPORTED_TYPES)}, gemma2, gemma3_text; "
                         f"got model_type {model_type!r}")
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"native backend needs hidden_act silu, got {act!r}")
    if config.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("native backend does not implement partial_rotary_factor")
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    head_dim = config.get("head_dim") or hidden // heads
    window = config.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not config.get("use_sliding_window", False):
        window = None
    attention_bias = bool(config.get("attention_bias", False))
    num_layers = int(config["num_hidden_layers"])
    sliding: tuple[bool, ...] = ()
    if window:
        types = config.get("layer_types")
        if isinstance(types, list) and len(types) == num_layers:
            sliding = tuple(kind == "sliding_attention" for kind in types)
        elif model_type == "qwen2":
            first = int(config.get("max_window_layers", num_layers))
            sliding = tuple(i >= first for i in range(num_layers))
        else:
            sliding = (True,) * num_layers
        if not any(sliding):
            window, sliding = None, ()
    return LlamaSpec(
        model_type=model_type,
        vocab_size=int(config["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(config["intermediate_size"]),
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        max_position=int(config.get("max_position_embeddings", 2048)),
        rope=_rope_spec(config),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(config.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        sliding_window=int(window) if window else None,
        sliding_layers=sliding,
    )


def _rope_spec(config: dict) -> RopeSpec:
    # transformers 5 writes rope_parameters; older configs have rope_theta + rope_scaling.
    params = dict(config.get("rope_parameters") or {})
    scaling = config.get("rope_scaling") or {}
    merged = {**scaling, **params}
    kind = merged.get("rope_type") or merged.get("type") or "default"
    if kind not in _ROPE_TYPES:
        raise ValueError(f"native backend implements RoPE types {', '.join(_ROPE_TYPES)}; "
                         f"this config asks for {kind!r}")
    if merged.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("native backend does not implement partial_rotary_factor")
    theta = float(merged.get("rope_theta", config.get("rope_theta", 10000.0)))
    if kind == "default":
        return RopeSpec(theta=theta)
    if kind == "freq_factors":
        return RopeSpec(theta=theta, kind=kind, freq_factors=tuple(float(f) for f in merged["factors"]))
    original = merged.get("original_max_position_embeddings") or config.get(
        "max_position_embeddings", 8192)
    return RopeSpec(theta=theta, kind=kind, factor=float(merged["factor"]),
                    low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
                    high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
                    original_max_position=int(original))


def inverse_frequencies(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """[head_dim // 2] float32, the same expression, op for op, as transformers'
    RoPE init functions, so the tables match HF bit for bit."""
    steps = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim
    inv_freq = 1.0 / (rope.theta ** steps)
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "freq_factors":
        factors = torch.tensor(rope.freq_factors, dtype=torch.float32)
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope_freqs has {factors.numel()} factors; head_dim {head_dim} needs "
                             f"{inv_freq.numel()}")
        return inv_freq / factors
    if rope.kind == "llama3":
        # Llama 3.1 frequency-dependent interpolation (transformers' _compute_llama3_parameters).
        old = rope.original_max_position
        low_wavelen = old / rope.low_freq_factor
        high_wavelen = old / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


def rope_tables(rope: RopeSpec, head_dim: int, length: int,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin, each [length, head_dim] in `dtype`.

    HF rotates with rotate_half(x) = cat(-x2, x1). We rotate with x's halves
    swapped, so the sign moves into the table: sin_signed = cat(-sin, sin). The
    products are the same numbers (negation is exact), so results match HF in every dtype.
    """
    inv_freq = inverse_frequencies(rope, head_dim)
    positions = torch.arange(length, dtype=torch.int64).float()
    freqs = positions[:, None] * inv_freq[None, :]  # [length, head_dim // 2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    half = head_dim // 2
    signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return cos.to(dtype), signed.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """RoPE on [rows, heads, head_dim]: x * cos + swap_halves(x) * sin_signed, with
    the two products rounded separately as in HF's apply_rotary_pos_emb."""
    rows, heads, head_dim = x.shape
    swapped = x.view(rows, heads, 2, head_dim // 2).flip(2).view(rows, heads, head_dim)
    return x * cos + swapped * sin_signed
