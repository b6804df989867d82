"""Tiny GGUF files written by the tests with gguf.GGUFWriter, laid out as
llama.cpp's converter lays them out (q/k rows interleaved for llama), plus the
same weights as a transformers-order safetensors folder, dequantized: an
independent dense reference for the GGUF loader."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

Q = gguf.GGMLQuantizationType
QUANTIZABLE = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0}  # the gguf package quantizes these
# A Q4_K_M file's mix: v, down and the head in Q6_K, the rest Q4_K, the embedding Q8_0.
Q4_K_M = {"embed": Q.Q8_0, "head": Q.Q6_K, "q": Q.Q4_K, "k": Q.Q4_K, "v": Q.Q6_K, "o": Q.Q4_K,
          "gate": Q.Q4_K, "up": Q.Q4_K, "down": Q.Q6_K}
# Byte offsets of the fp16 scale fields in one block of the K-quants (d, dmin).
_K_SCALES = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,), Q.Q2_K: (80, 82), Q.Q3_K: (108,)}


@dataclass
class TinyShape:
    arch: str = "llama"
    vocab: int = 300  # not a multiple of 16 or of any block: ragged row tiles
    hidden: int = 256
    intermediate: int = 512  # two K-quant super-blocks along ffn_down's rows
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    tied: bool = False
    context: int = 256
    # Llama 3.1 RoPE scaling: a rope_freqs tensor in the file (as llama.cpp's
    # converter writes it), rope_scaling "llama3" in the reference's config.
    llama3_rope: bool = False
    window: int | None = None  # phi3, gemma2, gemma3: attention.sliding_window

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def random_blocks(qtype: Q, rows: int, cols: int, rng: np.random.Generator,
                  scale: float = 1.0) -> np.ndarray:
    """[rows, bytes] blocks of `qtype`: quantized random values where the gguf package
    can quantize, else random bits with small finite fp16 scales (K-quants)."""
    if qtype in QUANTIZABLE or qtype in (Q.F32, Q.F16, Q.BF16):
        values = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        return gguf.quants.quantize(values, qtype).view(np.uint8).reshape(rows, -1)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for offset in _K_SCALES[qtype]:
        d = (rng.uniform(0.2, 1.0, (rows, cols // block)) * scale / 16).astype(np.float16)
        raw[:, :, offset:offset + 2] = d.view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def _interleave(rows: int, heads: int) -> np.ndarray:
    """llama.cpp's permute as a row order: file_row[i] = hf_row[order[i]]."""
    return np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)


def write_tiny_gguf(path: Path, types: dict[str, Q] | Q = Q.Q8_0, shape: TinyShape = TinyShape(),
                    seed: int = 0, reference: Path | None = None, vocab_strings: bool = False,
                    corrupt_shape: str | None = None, eos: int | None = 1,
                    tokenizer=None) -> Path:
    """A random-weight model in GGUF. `types` maps a tensor kind (embed, head, q, k,
    v, o, gate, up, down) to its block type, or gives one for all. `reference`:
    also write the dequantized weights, transformers' order, as a safetensors
    folder. `corrupt_shape`: give that tensor kind one row too many. `tokenizer`:
    a callable that writes the tokenizer metadata (it is given the writer)."""
    rng = np.random.default_rng(seed)
    kinds = ("embed", "head", "q", "k", "v", "o", "gate", "up", "down")
    types = {k: types for k in kinds} if isinstance(types, Q) else {k: Q.Q8_0 for k in kinds} | types
    s = shape
    writer = gguf.GGUFWriter(str(path), s.arch)
    writer.add_block_count(s.layers)
    writer.add_context_length(s.context)
    writer.add_embedding_length(s.hidden)
    writer.add_feed_forward_length(s.intermediate)
    writer.add_head_count(s.heads)
    writer.add_head_count_kv(s.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(GEMMA3_GLOBAL_BASE if s.arch == "gemma3" else 10000.0)
    writer.add_rope_dimension_count(s.head_dim)
    if s.window:
        writer.add_sliding_window(s.window)
    if s.arch in GEMMAS:
        writer.add_key_length(s.head_dim)
        writer.add_value_length(s.head_dim)
    if s.arch == "gemma2":
        writer.add_attn_logit_softcapping(50.0)
        writer.add_final_logit_softcapping(30.0)
    if s.llama3_rope:
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(s.head_dim))
    if eos is not None:
        writer.add_eos_token_id(eos)
    if vocab_strings:
        writer.add_tokenizer_model("gpt2")
        writer.add_token_list([f"t{i}" for i in range(s.vocab)])
    if tokenizer is not None:
        tokenizer(writer)
    dense: dict[str, torch.Tensor] = {}
    qkv_out = {"q": s.heads * s.head_dim, "k": s.kv_heads * s.head_dim, "v": s.kv_heads * s.head_dim}

    def matrix(name: str, hf: str, kind: str, rows: int, cols: int, heads: int | None = None):
        rows_written = rows + (kind == corrupt_shape)
        raw = random_blocks(types[kind], rows_written, cols, rng, scale=0.5 if kind == "embed" else 1.0)
        values = gguf.quants.dequantize(raw, types[kind]).reshape(rows_written, cols)
        dense[hf] = torch.from_numpy(np.array(values[:rows], dtype=np.float32))
        if heads is not None and s.arch == "llama":
            raw = raw[_interleave(rows_written, heads)] if kind != corrupt_shape else raw
        writer.add_tensor(name, raw, raw_dtype=types[kind])

    def vector(name: str, hf: str, n: int):
        values = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        # llama.cpp's Gemma converter stores a norm weight w as 1 + w; transformers
        # subtracts the 1 back (exact in float32 for values in [0.5, 2]).
        dense[hf] = torch.from_numpy(values - np.float32(1.0) if s.arch in GEMMAS and "norm" in name
                                     else values.copy())
        writer.add_tensor(name, values)

    def fused(name: str, hf: str, kinds: list[str], rows: list[int], cols: int):
        """Phi-3's attn_qkv / ffn_up: parts of one block type stacked by rows."""
        raws = [random_blocks(types[kinds[0]], r, cols, rng) for r in rows]
        raw = np.concatenate(raws)
        dense[hf] = torch.from_numpy(np.array(gguf.quants.dequantize(raw, types[kinds[0]]).reshape(
            sum(rows), cols), dtype=np.float32))
        writer.add_tensor(name, raw, raw_dtype=types[kinds[0]])

    matrix("token_embd.weight", "model.embed_tokens.weight", "embed", s.vocab, s.hidden)
    for i in range(s.layers):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        vector(p + "attn_norm.weight", h + "input_layernorm.weight", s.hidden)
        if s.arch == "phi3":
            fused(p + "attn_qkv.weight", h + "self_attn.qkv_proj.weight", ["q", "k", "v"],
                  list(qkv_out.values()), s.hidden)
        for n, heads in (("q", s.heads), ("k", s.kv_heads), ("v", None)) if s.arch != "phi3" else ():
            matrix(p + f"attn_{n}.weight", h + f"self_attn.{n}_proj.weight", n, qkv_out[n], s.hidden, heads)
            if s.arch == "qwen2":
                vector(p + f"attn_{n}.bias", h + f"self_attn.{n}_proj.bias", qkv_out[n])
        if s.arch in ("qwen3", "gemma3"):
            vector(p + "attn_q_norm.weight", h + "self_attn.q_norm.weight", s.head_dim)
            vector(p + "attn_k_norm.weight", h + "self_attn.k_norm.weight", s.head_dim)
        matrix(p + "attn_output.weight", h + "self_attn.o_proj.weight", "o", s.hidden, s.hidden)
        if s.arch in GEMMAS:
            vector(p + "post_attention_norm.weight", h + "post_attention_layernorm.weight", s.hidden)
            vector(p + "ffn_norm.weight", h + "pre_feedforward_layernorm.weight", s.hidden)
            vector(p + "post_ffw_norm.weight", h + "post_feedforward_layernorm.weight", s.hidden)
        else:
            vector(p + "ffn_norm.weight", h + "post_attention_layernorm.weight", s.hidden)
        if s.arch == "phi3":
            fused(p + "ffn_up.weight", h + "mlp.gate_up_proj.weight", ["gate", "up"],
                  [s.intermediate] * 2, s.hidden)
        else:
            matrix(p + "ffn_gate.weight", h + "mlp.gate_proj.weight", "gate", s.intermediate, s.hidden)
            matrix(p + "ffn_up.weight", h + "mlp.up_proj.weight", "up", s.intermediate, s.hidden)
        matrix(p + "ffn_down.weight", h + "mlp.down_proj.weight", "down", s.hidden, s.intermediate)
    vector("output_norm.weight", "model.norm.weight", s.hidden)
    if not s.tied and s.arch not in GEMMAS:  # Gemma ties its embeddings
        matrix("output.weight", "lm_head.weight", "head", s.vocab, s.hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if reference is not None:
        _write_reference(reference, dense, s, eos)
    return path


GEMMAS = ("gemma2", "gemma3")
GEMMA3_GLOBAL_BASE = 1_000_000.0
# The layers that slide, as llama.cpp derives them: i % pattern < pattern - 1.
_PATTERN = {"gemma2": 2, "gemma3": 6}

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}


def llama3_rope_factors(head_dim: int, theta: float = 10000.0) -> np.ndarray:
    """llama.cpp's converter's rope_freqs for LLAMA3_ROPE: one divisor per frequency."""
    r = LLAMA3_ROPE
    old = r["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / r["low_freq_factor"], old / r["high_freq_factor"]
    factors = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim):
        wavelen = 2 * np.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(r["factor"])
        else:
            smooth = (old / wavelen - r["low_freq_factor"]) / (r["high_freq_factor"] - r["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / r["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


def _write_reference(folder: Path, dense: dict[str, torch.Tensor], s: TinyShape,
                     eos: int | None) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(dense, str(folder / "model.safetensors"))
    config = {"model_type": s.arch, "vocab_size": s.vocab, "hidden_size": s.hidden,
              "intermediate_size": s.intermediate, "num_hidden_layers": s.layers,
              "num_attention_heads": s.heads, "num_key_value_heads": s.kv_heads,
              "head_dim": s.head_dim, "rms_norm_eps": float(np.float32(1e-5)),  # GGUF's float32
              "max_position_embeddings": s.context,
              "rope_theta": 10000.0, "tie_word_embeddings": s.tied, "hidden_act": "silu",
              "eos_token_id": eos}
    if s.llama3_rope:
        config["rope_scaling"] = LLAMA3_ROPE
    if s.window:
        config["sliding_window"] = s.window
    if s.arch in GEMMAS:
        period = _PATTERN[s.arch]
        config.update(model_type="gemma2" if s.arch == "gemma2" else "gemma3_text",
                      hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=s.head_dim,
                      tie_word_embeddings=True, pad_token_id=None, bos_token_id=None,
                      layer_types=["sliding_attention" if i % period < period - 1 else "full_attention"
                                   for i in range(s.layers)])
        if s.arch == "gemma2":
            config.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
        else:
            config.update(final_logit_softcapping=None, attn_logit_softcapping=None,
                          rope_parameters={"full_attention": {"rope_type": "default",
                                                              "rope_theta": GEMMA3_GLOBAL_BASE},
                                           "sliding_attention": {"rope_type": "default",
                                                                 "rope_theta": 10000.0}})
    if s.arch == "phi3":
        config.update(pad_token_id=None, bos_token_id=None)
    (folder / "config.json").write_text(json.dumps(config))


def write_tiny_kquant(path: Path, vocab: int, seed: int = 7) -> Path:
    """A tiny Q4_K_M model (K-quants need rows of 256 values), with a Q5_0 embedding so
    that a 32-weight format sits beside the K-quants as in real files; no EOS."""
    shape = TinyShape(vocab=vocab, hidden=256, intermediate=512, layers=2, context=512)
    return write_tiny_gguf(path, Q4_K_M | {"embed": Q.Q5_0}, shape, seed=seed, eos=None)
