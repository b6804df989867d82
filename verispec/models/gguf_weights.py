"""A GGUF file's metadata as the native backend's config, and its tensors as
the native backend's fused weights, kept in their quantized blocks.

Names follow llama.cpp's tensor map (token_embd, blk.N.attn_q, ffn_gate, ...).
llama.cpp's converter permutes the rows of llama-architecture q and k weights
so that RoPE rotates adjacent pairs (convert_hf_to_gguf.py, LlamaModel.permute);
transformers undoes that on load, and so do we, by reordering whole rows. A
row is a sequence of independent blocks, so the reorder moves blocks and never
touches a value: the quantized rows stay exact.

Quantized weights go to kernels.pack_quant, whose product equals the dense
bf16 product on the gguf package's dequantization rounded to bf16, bit for
bit, or on the integer path (int8=True) to kernels.pack_quant_i8, llama.cpp's
arithmetic. A block type the kernels lack is dequantized to bf16 for that
tensor alone, with one note per type.
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from verispec import kernels
from verispec.models.gguf_arch import (
    ARCHITECTURES,
    arch_config,
    layer_names,
    load_gemma_gguf,
    parse_arch,
)
from verispec.models.gguf_file import GGUFError, GGUFFile
from verispec.models.llama_config import LlamaSpec
from verispec.models.llama_weights import (
    Embedding,
    LayerWeights,
    Linear,
    ModelWeights,
    StackedLinear,
    _digest_part,
)

_PERMUTED = ("llama",)  # architectures whose q/k rows llama.cpp interleaves
_FLOAT_TYPES = (0, 1, 30)  # F32, F16, BF16: loaded as they are
_HF_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
             "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
             "attn_qkv": "self_attn.qkv_proj", "post_attention_norm": "post_attention_norm",
             "post_ffw_norm": "post_feedforward_layernorm"}


def hf_config(gf: GGUFFile) -> dict:
    """The config.json transformers would write for this file (the fields the
    native backend reads). Raises ValueError for an architecture it does not run."""
    meta = gf.metadata
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"the native backend runs GGUF architectures {', '.join(ARCHITECTURES)}; "
                         f"{gf.path.name} is {arch!r}")

    def get(key: str, default=None, required: bool = True):
        value = meta.get(f"{arch}.{key}", default)
        if value is None and required:
            raise GGUFError(f"{gf.path.name}: GGUF metadata lacks {arch}.{key}")
        return value

    if "token_embd.weight" not in gf.tensors:
        raise GGUFError(f"{gf.path.name}: GGUF has no token_embd.weight tensor")
    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    if heads <= 0 or hidden <= 0:
        raise GGUFError(f"{gf.path.name}: corrupt GGUF metadata ({heads} heads, hidden {hidden})")
    head_dim = int(get("attention.key_length", hidden // heads))
    rotary = int(get("rope.dimension_count", head_dim))
    config = {
        "model_type": ARCHITECTURES[arch],
        "vocab_size": int(gf.tensors["token_embd.weight"].shape[0]),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in gf.tensors,
        "attention_bias": "blk.0.attn_output.bias" in gf.tensors,
        "mlp_bias": "blk.0.ffn_gate.bias" in gf.tensors,
        "partial_rotary_factor": rotary / head_dim,
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "_name_or_path": gf.path.stem,
    }
    scaling = get("rope.scaling.type", "none", required=False)
    if scaling not in ("none", "linear"):
        raise ValueError(f"the native backend does not implement GGUF RoPE scaling {scaling!r}")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear",
                                  "factor": float(get("rope.scaling.factor"))}
    if "rope_freqs.weight" in gf.tensors:
        # Llama 3.1 stores its RoPE scaling as per-frequency factors, not as metadata.
        if scaling != "none":
            raise ValueError(f"a GGUF with both rope_freqs and RoPE scaling {scaling!r}")
        config["rope_scaling"] = {"rope_type": "freq_factors",
                                  "factors": gf.dequantize("rope_freqs.weight").reshape(-1).tolist()}
    return arch_config(gf, arch, get, config)


class _Builder:
    """Turns GGUF tensors into Linear / Embedding objects, recording fingerprint
    samples and the formats that fell back to dense."""

    def __init__(self, gf: GGUFFile, spec: LlamaSpec, quant: bool, dtype: torch.dtype,
                 device: torch.device, int8: bool = False) -> None:
        self.gf, self.spec, self.quant, self.dtype, self.device = gf, spec, quant, dtype, device
        # int8: the formats with an integer path take it (pack_quant_i8: all of the
        # kernels' formats); a stack mixing one without it keeps the bf16 path, which
        # a CPU with AVX-VNNI and no AVX-512 lacks (its tensors then run dense).
        self.i8_types = set(kernels.quant_i8_types()) if quant and int8 else set()
        bf16_path = set(kernels.quant_types()) if quant and kernels.available() else set()
        self.kernel_types = bf16_path or self.i8_types
        self.kind = "dense" if not quant else "quant-i8" if int8 else "quant"
        self.permuted = spec.model_type in _PERMUTED
        self.parts: list[tuple[str, int | None, bytes]] = []
        self.fallback: Counter[str] = Counter()

    # -- one tensor ---------------------------------------------------------
    def info(self, name: str, shape: tuple[int, ...]):
        if name not in self.gf.tensors:
            raise GGUFError(f"{self.gf.path.name}: GGUF lacks tensor {name}, which a "
                            f"{self.spec.model_type} model of this config needs")
        info = self.gf.tensors[name]
        if info.shape != shape:
            raise GGUFError(f"{self.gf.path.name}: tensor {name} has shape {info.shape}, but the "
                            f"file's metadata implies {shape}")
        return info

    def row_order(self, name: str) -> np.ndarray | None:
        """Row indices that undo llama.cpp's q/k interleave: hf_row[r] = gguf_row[order[r]]."""
        if not self.permuted or not (".attn_q." in name or ".attn_k." in name):
            return None
        heads = self.spec.num_heads if ".attn_q." in name else self.spec.num_kv_heads
        rows = self.gf.tensors[name].shape[0]
        return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)

    def raw(self, name: str) -> np.ndarray:
        raw, order = self.gf.raw(name), self.row_order(name)
        return raw if order is None else raw[order]

    def dense(self, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
        self.info(name, shape)
        values = torch.from_numpy(self.gf.dequantize(name))
        self.gf.release(name)
        order = self.row_order(name)
        if order is not None:
            values = values[torch.from_numpy(order)]
        tensor = values.to(device=self.device, dtype=dtype or self.dtype)
        self.record(name, tensor)
        return tensor

    def record(self, name: str, tensor: torch.Tensor) -> None:
        key, layer = hf_name(name)
        self.parts.append((key, layer, _digest_part(tensor)))
        if key == "model.embed_tokens.weight" and self.spec.tie_embeddings:
            self.parts.append(("lm_head.weight", None, _digest_part(tensor)))

    def record_sample(self, name: str, raw: np.ndarray, ggml_type: int,
                      shape: tuple[int, int]) -> None:
        """The fingerprint sample of a quantized tensor, read from the few rows it
        touches (the same 64 values _digest_part takes from the dense matrix)."""
        import gguf

        rows, cols = shape
        numel = rows * cols
        picks = np.arange(0, numel, max(1, numel // 64))[:64]
        touched, where = np.unique(picks // cols, return_inverse=True)
        values = gguf.quants.dequantize(raw[touched], gguf.GGMLQuantizationType(ggml_type))
        sample = torch.from_numpy(np.asarray(values, np.float32)[where, picks % cols])
        key, layer = hf_name(name)
        data = sample.to(self.dtype).float().numpy().tobytes()
        self.parts.append((key, layer, data))
        if key == "model.embed_tokens.weight" and self.spec.tie_embeddings:
            self.parts.append(("lm_head.weight", None, data))

    def quantizable(self, name: str) -> bool:
        kind = self.gf.tensors[name].ggml_type
        if kind in _FLOAT_TYPES or not self.quant:
            return False
        if kind not in self.kernel_types:
            self.fallback[self.gf.tensors[name].type_name] += 1
            return False
        return True

    # -- fused groups -------------------------------------------------------
    def linear(self, names: list[str], rows: list[int], cols: int,
               bias: list[str] | None) -> Linear | StackedLinear:
        """One [sum(rows), cols] matrix from `names` stacked by rows (q/k/v, gate/up)."""
        infos = [self.info(n, (r, cols)) for n, r in zip(names, rows)]
        biases = [self.dense(b, (r,)) for b, r in zip(bias, rows)] if bias else None
        quant = [self.quantizable(n) for n in names]
        types = {i.ggml_type for i, q in zip(infos, quant) if q}
        # The kernels stack differently typed parts in one pack (a Q4_K_M file's
        # Q4_K q/k with a Q6_K v) when every part but the last spans whole 64-row tiles.
        if all(quant) and (len(types) == 1 or all(r % 64 == 0 for r in rows[:-1])):
            return self._packed(names, infos, rows, cols, biases)
        if not any(quant):
            weight = torch.cat([self.dense(n, (r, cols)) for n, r in zip(names, rows)])
            return Linear(weight, torch.cat(biases) if biases else None)
        parts = []
        for i, (n, r, q) in enumerate(zip(names, rows, quant)):
            b = [biases[i]] if biases else None
            parts.append(self._packed([n], [infos[i]], [r], cols, b) if q else
                         Linear(self.dense(n, (r, cols)), b[0] if b else None))
        return StackedLinear(parts)

    def _packed(self, names, infos, rows, cols, biases) -> Linear:
        raws = [self.raw(n) for n in names]
        for n, raw, info, r in zip(names, raws, infos, rows):
            self.record_sample(n, raw, info.ggml_type, (r, cols))
        kinds = [info.ggml_type for info in infos]
        if len(set(kinds)) == 1:
            raw = np.concatenate(raws) if len(raws) > 1 else raws[0].copy()  # off the mapped file
            parts = [(torch.from_numpy(raw), kinds[0], sum(rows))]
        else:
            parts = [(torch.from_numpy(raw.copy()), kind, r) for raw, kind, r in zip(raws, kinds, rows)]
        pack = kernels.pack_quant_i8 if set(kinds) <= self.i8_types else kernels.pack_quant_cat
        packed = pack(parts, cols)
        for n in names:
            self.gf.release(n)
        fmt = "+".join(dict.fromkeys(info.type_name for info in infos))
        return Linear.from_pack(packed, sum(rows), cols, torch.cat(biases) if biases else None, fmt)

    def embedding(self) -> tuple[Embedding, Linear]:
        vocab, hidden = self.spec.vocab_size, self.spec.hidden_size
        name = "token_embd.weight"
        info = self.info(name, (vocab, hidden))
        tied = self.spec.tie_embeddings
        if self.quantizable(name):
            raw = self.gf.raw(name).copy()
            self.record_sample(name, raw, info.ggml_type, (vocab, hidden))
            if info.ggml_type in self.i8_types:
                packed = kernels.pack_quant_i8([(torch.from_numpy(raw), info.ggml_type, vocab)], hidden)
            else:
                packed = kernels.pack_quant(torch.from_numpy(raw), info.ggml_type, vocab, hidden)
            self.gf.release(name)
            embed = Embedding(packed=packed, shape=(vocab, hidden), fmt=info.type_name)
            head = Linear.from_pack(packed, vocab, hidden, None, info.type_name) if tied else None
        else:
            dense = self.dense(name, (vocab, hidden))
            embed = Embedding(dense)
            head = Linear(dense) if tied else None
        if head is None:
            head = self.linear(["output.weight"], [vocab], hidden, None)
        return embed, head

    def note(self) -> None:
        for kind, count in sorted(self.fallback.items()):
            print(f"verispec: the kernels lack {kind} blocks; {count} tensor(s) of "
                  f"{self.gf.path.name} run as dense bf16", file=sys.stderr)


def hf_name(gguf_name: str) -> tuple[str, int | None]:
    """The transformers parameter name of a GGUF tensor, and its layer index."""
    fixed = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    if gguf_name in fixed:
        return fixed[gguf_name], None
    _, layer, part, kind = gguf_name.split(".")
    return f"model.layers.{layer}.{_HF_NAMES[part]}.{kind}", int(layer)


def gguf_name(hf_key: str) -> str:
    """The GGUF tensor name of a transformers parameter name (hf_name's inverse)."""
    fixed = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    if hf_key in fixed:
        return fixed[hf_key]
    _, _, layer, rest = hf_key.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    part = {v: k for k, v in _HF_NAMES.items()} | {"mlp.gate_up_proj": "ffn_up"}  # Phi-3's fused
    part = part[module]
    return f"blk.{layer}.{part}.{kind}"


def _check_quant(quant: bool, dtype: torch.dtype, device: torch.device, int8: bool) -> None:
    on = kernels.available() or (int8 and bool(kernels.quant_i8_types()))
    if quant and (dtype != torch.bfloat16 or device.type != "cpu" or not on):
        raise ValueError("quantized GGUF weights run in bf16 on verispec's CPU kernels "
                         f"(here: {dtype}, {device}, kernels {'on' if on else 'off'}); use --weights dense")


def load_gguf_weights(gf: GGUFFile, spec: LlamaSpec, quant: bool, dtype: torch.dtype,
                      device: torch.device, quiet: bool = False, int8: bool = False) -> ModelWeights:
    """The native weights of `gf`. quant=True packs quantized tensors for the
    kernels (bf16 on CPU only); quant=False dequantizes every tensor to `dtype`.
    int8 (with quant): the blocks take the kernels' integer path (every format the
    kernels have, on AVX-512-VNNI or AVX-VNNI: kernels.i8_isa())."""
    _check_quant(quant, dtype, device, int8)
    b = _Builder(gf, spec, quant, dtype, device, int8)
    names = layer_names(gf.metadata.get("general.architecture"))
    heads, kv, hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
    qkv_rows = [heads * hd, kv * hd, kv * hd]
    inter, hidden = spec.intermediate_size, spec.hidden_size
    embed, head = b.embedding()
    layers = []
    for i in range(spec.num_layers):
        p = f"blk.{i}."
        qk_norm = None
        if spec.qk_norm:
            qk_norm = torch.cat([b.dense(p + "attn_q_norm.weight", (hd,))[None].expand(heads, -1),
                                 b.dense(p + "attn_k_norm.weight", (hd,))[None].expand(kv, -1)])
        layers.append(LayerWeights(
            attn_norm=b.dense(p + "attn_norm.weight", (hidden,)),
            qkv=b.linear([p + f"{n}.weight" for n in names["qkv"]], _split(qkv_rows, names["qkv"]),
                         hidden, [p + f"{n}.bias" for n in names["qkv"]] if spec.qkv_bias else None),
            qk_norm=qk_norm,
            o=b.linear([p + "attn_output.weight"], [hidden], heads * hd,
                       [p + "attn_output.bias"] if spec.o_bias else None),
            mlp_norm=b.dense(p + "ffn_norm.weight", (hidden,)),
            gate_up=b.linear([p + f"{n}.weight" for n in names["gate_up"]],
                             _split([inter, inter], names["gate_up"]), hidden,
                             [p + f"{n}.bias" for n in names["gate_up"]] if spec.mlp_bias else None),
            down=b.linear([p + "ffn_down.weight"], [hidden], inter,
                          [p + "ffn_down.bias"] if spec.mlp_bias else None),
        ))
    norm = b.dense("output_norm.weight", (hidden,))
    if not quiet:
        b.note()
    return ModelWeights(embedding=embed, layers=layers, norm=norm, lm_head=head,
                        fingerprint_parts=b.parts, weights_kind=b.kind,
                        source=Path(gf.path))


def _split(rows: list[int], names: list[str]) -> list[int]:
    """Row counts per tensor: one fused tensor (Phi-3's attn_qkv, ffn_up) takes them all."""
    return rows if len(names) == len(rows) else [sum(rows)]


@dataclass
class GGUFModel:
    path: Path
    spec: LlamaSpec
    weights: ModelWeights
    eos_token_ids: frozenset[int]
    gemma: object | None = None  # Gemma 2/3: the GemmaSpec
    norms: list | None = None  # Gemma 2/3: per layer, the post-attention/feed-forward norms


def read_gguf(source: "str | Path | GGUFFile", dtype: torch.dtype, device: torch.device,
              quant: bool, quiet: bool = False, int8: bool = False) -> GGUFModel:
    """Config, weights and EOS ids of a GGUF file (a path or an open GGUFFile)."""
    gf = source if isinstance(source, GGUFFile) else GGUFFile(source)
    config = hf_config(gf)
    spec, gemma = parse_arch(config)
    eos = config.get("eos_token_id")
    eos_ids = frozenset([] if eos is None else [int(eos)])
    if gemma is None:
        weights = load_gguf_weights(gf, spec, quant, dtype, device, quiet=quiet, int8=int8)
        return GGUFModel(gf.path, spec, weights, eos_ids)
    _check_quant(quant, dtype, device, int8)
    b = _Builder(gf, spec, quant, dtype, device, int8)
    weights, norms = load_gemma_gguf(b, spec)
    if not quiet:
        b.note()
    return GGUFModel(gf.path, spec, weights, eos_ids, gemma, norms)
