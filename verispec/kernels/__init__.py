"""Native CPU kernels, built on first use; see build.py for the fallback rules.

`pack(weight)` repacks a bf16 [out, in] matrix once; `linear(x, packed, out,
bias)` then computes x @ weight.T (+ bias) for bf16 x [n, in], with a row's
bits independent of n, of the other rows and of the thread count. The matmul
runs on AMX where the CPU and OS allow it, else on AVX-512-BF16 (`isa()`).

`pack_quant(raw, ggml_type, out, in)` keeps a GGUF tensor in its blocks
(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: `quant_types()`); `linear`
takes it as it takes a dense pack and returns, bit for bit, what the dense
path returns for the reference dequantization (gguf.quants.dequantize) rounded
to bf16. `embedding(packed, ids)` looks rows up from such a pack.
`pack_quant_i8` is the integer path (every format above): x rounded to int8 per
row as llama.cpp does (per 32 values, per 256 for the K-quants), exact int32 block
sums; row-invariant too, but its bits are not the dense path's. It runs on
AVX-512-VNNI in the module above, or, on a CPU with AVX-VNNI and no AVX-512, in a
second module of 256-bit kernels with the same bits (`i8_isa()`; build.py).
VERISPEC_NO_VNNI=1 makes a process act as if the CPU lacked VNNI;
VERISPEC_I8_ISA=avx-vnni as if it had AVX-VNNI and no AVX-512 (the AVX-512 module
stays off, so the models take their eager path), VERISPEC_I8_ISA=avx512-vnni
keeps the integer path off the 256-bit module.
`attend(q, caches, row_cache, row_len, row_index)` is attention whose
result for a row depends only on that row's query and visible keys (see
attention.cpp). `sampling_probs` and `sampling_draw` are sampled decoding's per-token
host work (sampling.cpp). `available()` says whether the kernel can be used; when it is False
callers must take their ordinary path.
"""
from __future__ import annotations

import os
import threading

import torch

from verispec.kernels.build import cpu_flags

_lock = threading.Lock()
_built: dict[str, object] = {}  # build.py's function name -> its module or None
I8_ISAS = ("avx512-vnni", "avx-vnni")
_isa_memo: dict[tuple[str | None, str | None], str | None] = {}


def _once(builder: str):
    """build.`builder`()'s module (None where it cannot build), built once per process."""
    if builder not in _built:
        with _lock:
            if builder not in _built:
                from verispec.kernels import build

                _built[builder] = getattr(build, builder)()
    return _built[builder]


def _get():
    return _once("build")


def _get_vnni256():
    return _once("build_vnni256")


def _forced_isa() -> str | None:
    forced = os.environ.get("VERISPEC_I8_ISA") or None
    if forced is not None and forced not in I8_ISAS:
        raise ValueError(f"VERISPEC_I8_ISA={forced!r}: choose one of {', '.join(I8_ISAS)}")
    return forced


def available() -> bool:
    """Whether the AVX-512 module runs (the bf16 kernels, attention, fused layers)."""
    return _forced_isa() != "avx-vnni" and _get() is not None


def _require():
    module = _get()
    if module is None:
        raise RuntimeError("the bf16 kernel is unavailable; check available() first")
    return module


def choose_i8_isa(flags: set[str], forced: str | None, avx512_module, vnni256_module) -> str | None:
    """The integer path's instruction set: "avx512-vnni" where the CPU has AVX-512-VNNI
    and the AVX-512 module runs, else "avx-vnni" where it has AVX-VNNI and the 256-bit
    module builds, else None. `forced` (one of I8_ISAS) allows only that one; the
    modules are callables saying whether each runs, asked only when needed."""
    if forced != "avx-vnni" and "avx512_vnni" in flags and avx512_module():
        return "avx512-vnni"
    if forced != "avx512-vnni" and (forced == "avx-vnni" or "avx_vnni" in flags) and vnni256_module():
        return "avx-vnni"
    return None


def i8_isa() -> str | None:
    """Which module runs the integer path in this process (choose_i8_isa), or None:
    then --weights auto takes the bf16 path. None under VERISPEC_NO_VNNI=1."""
    key = (os.environ.get("VERISPEC_NO_VNNI"), os.environ.get("VERISPEC_I8_ISA"))
    if key not in _isa_memo:
        _isa_memo[key] = None if key[0] else choose_i8_isa(
            cpu_flags(), _forced_isa(), available, lambda: _get_vnni256() is not None)
    return _isa_memo[key]


def i8_backend(isa: str):
    """The module that runs the integer path on `isa` (one of I8_ISAS), whatever this
    process chose, or None where it cannot run here: for tests and benchmarks that
    run both on one pack (the packs are the same)."""
    if isa not in I8_ISAS:
        raise ValueError(f"unknown integer-path ISA {isa!r}; choose one of {', '.join(I8_ISAS)}")
    if isa == "avx512-vnni":
        return _get() if "avx512_vnni" in cpu_flags() else None
    return _get_vnni256() if "avx_vnni" in cpu_flags() else None


def i8_stream_hint() -> str | None:
    """How the integer path requests its K-quant weights ahead of use: "nta" (non-temporal)
    on an AMD CPU, "t1" (into L2) on any other, where the 32-weight formats' one-to-three-row
    sweeps request theirs T0 (quant_i8.h, kStreamNta); None where the path does not run."""
    module = _i8_module()
    if module is None:
        return None
    return "nta" if module.quant_i8_stream_nta() else "t1"


def _i8_module():
    isa = i8_isa()
    return _get() if isa == "avx512-vnni" else _get_vnni256() if isa == "avx-vnni" else None


def _module_for(packed: torch.Tensor):
    """The module that runs `packed`: the 256-bit one for an integer-path pack where it
    runs the integer path, else the AVX-512 one. On the hot path of every linear():
    where the 256-bit module was never built, one check; where the AVX-512 one is
    absent, no environment read."""
    vnni256 = _built.get("build_vnni256")
    if (vnni256 is not None and packed.dtype == torch.uint8
            and (_built.get("build") is None or i8_isa() == "avx-vnni") and vnni256.is_quant_i8(packed)):
        return vnni256
    return _require()


def isa() -> str | None:
    """"amx" or "avx512-bf16": the instruction set every matmul of this process uses."""
    if not available():
        return None
    module = _get()
    from verispec.kernels.build import ISA_NAMES

    return ISA_NAMES[module.init()]


def pack(weight: torch.Tensor) -> torch.Tensor:
    return _require().pack(weight)


# gguf.GGMLQuantizationType names, for messages (the kernels do not import gguf).
GGML_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
                   10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 30: "BF16"}


def quant_types() -> frozenset[int]:
    """The ggml type ids pack_quant accepts."""
    return frozenset(_require().quant_types())


def quant_fused_rows(rows: int | None = None) -> int:
    """Row counts up to this many (at most 8; 4 for 32-weight block formats)
    multiply a quantized pack in one fused pass on AVX-512, dequantized in
    registers, with the same bits as the buffered path that larger counts take.
    `rows` sets it; 0 turns the fused pass off (for benchmarks)."""
    return _require().quant_fused_rows(-1 if rows is None else int(rows))


def _check_type(ggml_type: int) -> None:
    if int(ggml_type) not in quant_types():
        name = GGML_TYPE_NAMES.get(int(ggml_type), f"type {int(ggml_type)}")
        have = ", ".join(GGML_TYPE_NAMES[t] for t in sorted(quant_types()))
        raise ValueError(f"no quantized kernel for ggml {name} (kernels support {have}); "
                         f"dequantize this tensor to bf16 and pack() it instead")


def pack_quant(raw: torch.Tensor, ggml_type: int, out_features: int, in_features: int) -> torch.Tensor:
    """A GGUF tensor's bytes (uint8, row-major blocks as in the file) -> a pack for
    linear() and embedding(), about the size of the raw bytes. Tensors of one type
    stacked on the out dimension (q/k/v, gate/up) are simply their bytes
    concatenated; tensors of different types go through pack_quant_cat."""
    return pack_quant_cat([(raw, ggml_type, out_features)], in_features)


def pack_quant_cat(parts: list[tuple[torch.Tensor, int, int]], in_features: int) -> torch.Tensor:
    """One pack of several GGUF tensors stacked on the out dimension, each
    (raw bytes, ggml type, out_features) with its own type (a Q4_K_M file mixes
    Q4_K q/k with a Q6_K v). All but the last need a multiple of 64 rows."""
    for _, ggml_type, _ in parts:
        _check_type(ggml_type)
    raws = [raw.reshape(-1).view(torch.uint8).contiguous() for raw, _, _ in parts]
    return _require().pack_quant(raws, [int(t) for _, t, _ in parts], [int(o) for _, _, o in parts],
                                 int(in_features))


def quant_i8_types() -> frozenset[int]:
    """The ggml type ids with an integer path (pack_quant_i8): all of quant_types() on a
    CPU with AVX-512-VNNI or AVX-VNNI (i8_isa()), none elsewhere or under VERISPEC_NO_VNNI=1."""
    module = _i8_module()
    return frozenset(module.quant_i8_types()) if module is not None else frozenset()


def pack_quant_i8(parts: list[tuple[torch.Tensor, int, int]], in_features: int) -> torch.Tensor:
    """pack_quant_cat's parts for the integer path: linear() then rounds each row of x
    to int8 (per 32 values, as llama.cpp's Q8_0; per 256 for the K-quants, as its Q8_K)
    and sums each block's products exactly in int32 (AVX-512-VNNI or AVX-VNNI, with the
    same bits). Faster than the bf16 path, and as row-invariant, but its logits differ
    from it by that rounding."""
    have = quant_i8_types()
    for _, ggml_type, _ in parts:
        if int(ggml_type) not in have:
            name = GGML_TYPE_NAMES.get(int(ggml_type), f"type {int(ggml_type)}")
            raise ValueError(f"no integer kernel for ggml {name} (have: "
                             f"{', '.join(GGML_TYPE_NAMES[t] for t in sorted(have)) or 'none on this CPU'})")
    raws = [raw.reshape(-1).view(torch.uint8).contiguous() for raw, _, _ in parts]
    return _i8_module().pack_quant_i8(raws, [int(t) for _, t, _ in parts], [int(o) for _, _, o in parts],
                                      int(in_features))


def suffix_lookup(context, tokens, offset: int, live: int, heads: list[int], chains: list,
                  anchors: list[int], query: list[int], recent: int, store_recent: int, k: int,
                  caps: list[int], min_prob: float, stop: list[int], tried: int):
    """Suffix decoding's two lookups in one call: over `context` (array('q'), scanned) and
    over a store index's stream and anchor chains (`tokens` None: none); each what
    verispec.proposers.suffix.chain_lookup computes, as (longest match, [(match length,
    chain tokens, probabilities)])."""
    return _require().suffix_lookup(context, tokens, offset, live, heads, chains, anchors, query,
                                    recent, store_recent, k, caps, min_prob, stop, tried)


def sampling_probs(logits: torch.Tensor, temperature: float, min_p: float, top_k: int,
                   top_p: float) -> torch.Tensor | None:
    """float32 [rows, vocab] logits -> [rows, vocab] probabilities under the rules of
    verispec.step.sampling.torch_probs (temperature > 0), or None where a row holds a NaN
    or no finite logit."""
    return _require().sampling_probs(logits.contiguous(), float(temperature), float(min_p), int(top_k),
                                     float(top_p))


def sampling_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of float32 [rows, vocab] probabilities (not necessarily
    normalized) for float64 uniforms [rows]: sampling.sample's inversion, the same token."""
    return _require().sampling_draw(probs.contiguous(), uniforms.contiguous())


def is_quantized(packed: torch.Tensor) -> bool:
    """Whether `packed` came from pack_quant or pack_quant_i8 (else from pack)."""
    return packed.dtype == torch.uint8


def is_int8(packed: torch.Tensor) -> bool:
    """Whether `packed` came from pack_quant_i8: linear() rounds x to int8 for it."""
    return is_quantized(packed) and _module_for(packed).is_quant_i8(packed)


def embedding(packed: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (int64, any shape) of a quantized pack -> bf16 [*ids.shape, in],
    each value the bf16 that linear() multiplies by."""
    return _module_for(packed).embedding(packed, ids)


def quant_shape(packed: torch.Tensor) -> tuple[int, int]:
    """(out_features, in_features) of a quantized pack."""
    out, inp = _module_for(packed).quant_shape(packed)
    return out, inp


def dequantize(packed: torch.Tensor) -> torch.Tensor:
    """The whole bf16 [out, in] matrix a quantized pack stands for (a fallback for
    code without a quantized path; linear() never needs it)."""
    return embedding(packed, torch.arange(quant_shape(packed)[0]))


def linear(x: torch.Tensor, packed: torch.Tensor, out_features: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    return _module_for(packed).linear(x, packed, out_features, bias)


def linear_float(x: torch.Tensor, packed: torch.Tensor, out_features: int,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """linear(...).float(), the same values, stored as float32 by the product itself: the
    logits skip a second pass (about 0.6 ms of an eight-row step with a 152k vocabulary)."""
    module = _module_for(packed)
    if module is _built.get("build"):
        return module.linear(x, packed, out_features, bias, float_out=True)
    return module.linear(x, packed, out_features, bias).float()


def attention_dots() -> str:
    """How bf16 attention scores are summed in this process: "fma" (VDPBF16PS's own sequence
    spelled as FMAs, the same bits where measured; every CPU but AMD's) or "vdpbf16ps"
    (AMD's); VERISPEC_ATTN_DOTS overrides it (attention_blocks.h)."""
    return _require().attention_dots()


def attend(q: torch.Tensor, caches: list[torch.Tensor], row_cache: torch.Tensor,
           row_len: torch.Tensor, row_index: torch.Tensor | None = None, scale: float = 0.0,
           softcap: float = 0.0) -> torch.Tensor:
    """q [rows, heads, head_dim] (bf16 or float32, contiguous); caches: per request
    [2, kv_heads, capacity, head_dim]; row r sees keys [0, row_len[r]) of
    caches[row_cache[r]], or, when row_index[r, 0] >= 0, the cache indices
    row_index[r, :row_len[r]] -> [rows, heads * head_dim]. Scores are scaled by
    `scale` (0: head_dim ** -0.5), then soft-capped to tanh(s / softcap) * softcap
    where softcap > 0 (Gemma 2)."""
    return _require().attend(q, caches, row_cache, row_len, row_index, float(scale), float(softcap))


def decoder_layer(x: torch.Tensor, weights: list[torch.Tensor], dims: list[int], eps: float,
                  cos: torch.Tensor, sin: torch.Tensor, caches: list[torch.Tensor],
                  row_cache: torch.Tensor, row_slot: torch.Tensor, row_len: torch.Tensor,
                  row_index: torch.Tensor | None = None) -> torch.Tensor:
    """One bf16 decoder layer (see layer.cpp). weights: attn_norm, packed qkv, qkv bias
    or empty, qk_norm [heads + kv_heads, head_dim] or empty, packed o, mlp_norm, packed
    gate_up, packed down; dims: heads, kv_heads, head_dim, intermediate; cos/sin
    [rows, head_dim]; row r's key and value go to slot row_slot[r] of caches[row_cache[r]]."""
    return _require().decoder_layer(x, weights, dims, eps, cos, sin, caches, row_cache, row_slot,
                                    row_len, row_index)


def gemma_layer(x: torch.Tensor, weights: list[torch.Tensor], dims: list[int], eps: float,
                scale: float, softcap: float, cos: torch.Tensor, sin: torch.Tensor,
                caches: list[torch.Tensor], row_cache: torch.Tensor, row_slot: torch.Tensor,
                row_len: torch.Tensor, row_index: torch.Tensor | None = None) -> torch.Tensor:
    """One bf16 Gemma 2/3 decoder layer (see gemma_layer.cpp). weights: attn_norm, packed
    qkv, qkv bias or empty, qk_norm or empty, packed o, post_attention norm,
    pre_feedforward norm, packed gate_up, packed down, post_feedforward norm; every
    norm float32 (1 + w). Otherwise as decoder_layer, with attend's scale and softcap."""
    return _require().gemma_layer(x, weights, dims, eps, scale, softcap, cos, sin, caches, row_cache,
                                  row_slot, row_len, row_index)
