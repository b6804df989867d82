"""GGUF block formats inside verispec's matmul (kernels/quant*.cpp).

The contract: a quantized pack multiplies by exactly the bf16 weights
gguf.quants.dequantize gives (rounded to nearest even), in the dense kernel's
summation order, so linear(x, pack_quant(raw)) equals linear(x, pack(reference))
bit for bit; rows stay independent of each other, of their number and of the
thread count. Blocks are random bytes with sane fp16 scale fields (every bit
pattern of the quants and K sub-scales is a valid block), or gguf's own
quantizer where it has one.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from verispec import kernels

pytestmark = pytest.mark.skipif(not kernels.available(), reason="verispec kernels unavailable here")

FORMATS = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K]
LEGACY = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]  # those gguf can also quantize
ROWS = list(range(1, 18)) + [32]
# byte ranges of each block's fp16 fields: random bytes there could be inf/NaN
HALF_FIELDS = {T.Q8_0: (0, 2), T.Q4_0: (0, 2), T.Q5_0: (0, 2), T.Q4_1: (0, 4), T.Q5_1: (0, 4),
               T.Q4_K: (0, 4), T.Q5_K: (0, 4), T.Q6_K: (208, 210)}


def _raw(qtype: T, out: int, inp: int, seed: int = 0) -> np.ndarray:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(out * inp // block, size), dtype=np.uint8)
    lo, hi = HALF_FIELDS[qtype]
    halves = rng.normal(0, 0.02, size=(blocks.shape[0], (hi - lo) // 2)).astype(np.float16)
    blocks[:, lo:hi] = halves.view(np.uint8)
    return blocks.reshape(-1)


def _reference(raw: np.ndarray, qtype: T, out: int, inp: int) -> torch.Tensor:
    return torch.from_numpy(dequantize(raw, qtype).reshape(out, inp).copy()).bfloat16()


def _x(rows: int, inp: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, inp, generator=torch.Generator().manual_seed(seed)).bfloat16()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _shapes(qtype: T) -> list[tuple[int, int]]:
    # Out rows not a multiple of the 64-output group or the 16-output tile; in
    # spanning several blocks, and for the K-quants several 256-weight super-blocks.
    if qtype in LEGACY:
        return [(101, 96), (64, 32), (200, 608)]
    return [(101, 512), (37, 768)]


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_bit_identical_to_dense_reference(qtype):
    for out, inp in _shapes(qtype):
        raw = _raw(qtype, out, inp, seed=out)
        ref = _reference(raw, qtype, out, inp)
        packed = kernels.pack_quant(torch.from_numpy(raw), int(qtype), out, inp)
        dense = kernels.pack(ref)
        x = _x(32, inp)
        bias = torch.randn(out).bfloat16()
        for n in ROWS:
            for b in (None, bias):
                got = kernels.linear(x[:n], packed, out, b)
                assert torch.equal(_bits(got), _bits(kernels.linear(x[:n], dense, out, b))), (out, inp, n)
        # The values themselves: the reference's float32 rounded to nearest even.
        assert torch.equal(_bits(kernels.dequantize(packed)), _bits(ref))


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_fused_pass_equals_buffered_pass(qtype):
    """Up to 4 rows (8 for the K-quants) dequantize in registers (quant_fused.cpp);
    the buffered path (dequantized chunks, then the dense passes) must give the same bits."""
    assert kernels.quant_fused_rows() == 8
    out, inp = _shapes(qtype)[0]
    packed = kernels.pack_quant(torch.from_numpy(_raw(qtype, out, inp, seed=11)), int(qtype), out, inp)
    x, bias = _x(9, inp, seed=12), torch.randn(out).bfloat16()
    fused = [kernels.linear(x[:n], packed, out, bias) for n in range(1, 10)]
    try:
        kernels.quant_fused_rows(0)
        buffered = [kernels.linear(x[:n], packed, out, bias) for n in range(1, 10)]
    finally:
        kernels.quant_fused_rows(8)
    for n, (a, b) in enumerate(zip(fused, buffered), start=1):
        assert torch.equal(_bits(a), _bits(b)), n
    with pytest.raises(RuntimeError, match="at most 8"):
        kernels.quant_fused_rows(9)


@pytest.mark.parametrize("qtype", LEGACY, ids=lambda t: t.name)
def test_gguf_quantized_weights(qtype):
    """Blocks from gguf's own quantizer (real scales, real rounding)."""
    out, inp = 130, 320
    weights = np.random.default_rng(3).normal(0, 0.05, size=(out, inp)).astype(np.float32)
    raw = quantize(weights, qtype).reshape(-1)
    ref = _reference(raw, qtype, out, inp)
    packed = kernels.pack_quant(torch.from_numpy(raw), int(qtype), out, inp)
    x = _x(9, inp, seed=4)
    assert torch.equal(_bits(kernels.linear(x, packed, out)), _bits(kernels.linear(x, kernels.pack(ref), out)))
    # ... and the product is the product of those weights (fp32 accumulation).
    exact = x.float() @ ref.float().T
    assert (kernels.linear(x, packed, out).float() - exact).abs().max() < 2.0 ** -7 * exact.abs().max()


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_row_bits_independent_of_row_count_and_neighbours(qtype):
    out, inp = 200, 512
    packed = kernels.pack_quant(torch.from_numpy(_raw(qtype, out, inp, seed=9)), int(qtype), out, inp)
    x = _x(40, inp, seed=5)
    singles = torch.cat([kernels.linear(x[i:i + 1], packed, out) for i in range(40)])
    for n in list(range(1, 18)) + [32, 40]:
        assert torch.equal(_bits(kernels.linear(x[:n], packed, out)), _bits(singles[:n])), n
    other = _x(40, inp, seed=6)
    mixed = torch.cat((other[:5], x[7:8], other[5:12]))
    assert torch.equal(_bits(kernels.linear(mixed, packed, out)[5]), _bits(singles[7]))


def test_thread_count_does_not_change_bits():
    out, inp = 1000, 768
    packed = kernels.pack_quant(torch.from_numpy(_raw(T.Q5_K, out, inp, seed=2)), int(T.Q5_K), out, inp)
    x = _x(16, inp)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(kernels.linear(x, packed, out))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(_bits(r), _bits(results[0])) for r in results)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q6_K, T.Q4_1], ids=lambda t: t.name)
def test_embedding_rows_are_the_reference(qtype):
    out, inp = 150, 256
    raw = _raw(qtype, out, inp, seed=11)
    ref = _reference(raw, qtype, out, inp)
    packed = kernels.pack_quant(torch.from_numpy(raw), int(qtype), out, inp)
    ids = torch.tensor([[0, 149, 64], [17, 17, 100]])
    rows = kernels.embedding(packed, ids)
    assert rows.shape == (2, 3, inp) and rows.dtype == torch.bfloat16
    assert torch.equal(_bits(rows), _bits(ref[ids]))
    with pytest.raises(RuntimeError, match="out of range"):
        kernels.embedding(packed, torch.tensor([150]))


def test_stacked_tensors_share_one_pack():
    """q/k/v (or gate/up) fused on the out dimension: one type is plain concatenated
    bytes; mixed types (Q4_K_M's Q6_K v) go through pack_quant_cat."""
    inp = 512
    shapes = [(T.Q4_K, 128), (T.Q4_K, 64), (T.Q6_K, 64), (T.Q8_0, 30)]
    raws = [_raw(t, o, inp, seed=i) for i, (t, o) in enumerate(shapes)]
    refs = torch.cat([_reference(r, t, o, inp) for r, (t, o) in zip(raws, shapes)])
    out = refs.shape[0]
    mixed = kernels.pack_quant_cat([(torch.from_numpy(r), int(t), o) for r, (t, o) in zip(raws, shapes)], inp)
    x = _x(12, inp)
    want = kernels.linear(x, kernels.pack(refs), out)
    assert torch.equal(_bits(kernels.linear(x, mixed, out)), _bits(want))
    same = kernels.pack_quant(torch.from_numpy(np.concatenate(raws[:2])), int(T.Q4_K), 192, inp)
    assert torch.equal(_bits(kernels.linear(x, same, 192)), _bits(want[:, :192]))
    with pytest.raises(RuntimeError, match="multiple of 64 rows"):
        kernels.pack_quant_cat([(torch.from_numpy(raws[3]), int(T.Q8_0), 30),
                                (torch.from_numpy(raws[1]), int(T.Q4_K), 64)], inp)


def test_pack_stays_about_the_raw_size():
    for qtype in FORMATS:
        out, inp = 256, 1024
        raw = _raw(qtype, out, inp)
        packed = kernels.pack_quant(torch.from_numpy(raw), int(qtype), out, inp)
        assert kernels.is_quantized(packed) and kernels.quant_shape(packed) == (out, inp)
        assert raw.size <= packed.numel() <= 1.04 * raw.size, qtype.name


def test_quant_types_and_clear_errors():
    assert kernels.quant_types() == {int(t) for t in FORMATS}
    raw = torch.zeros(64 * 256 // 256 * 84, dtype=torch.uint8)
    with pytest.raises(ValueError, match="Q2_K"):
        kernels.pack_quant(raw, int(T.Q2_K), 64, 256)
    with pytest.raises(RuntimeError, match="needs 2176 contiguous uint8 bytes"):
        kernels.pack_quant(torch.zeros(100, dtype=torch.uint8), int(T.Q8_0), 64, 32)
    with pytest.raises(RuntimeError, match="not a multiple of Q4_K's block of 256"):
        kernels.pack_quant(torch.zeros(64 * 144, dtype=torch.uint8), int(T.Q4_K), 64, 128)
    packed = kernels.pack_quant(torch.from_numpy(_raw(T.Q4_0, 64, 64)), int(T.Q4_0), 64, 64)
    with pytest.raises(RuntimeError, match="do not match the quantized weight"):
        kernels.linear(_x(1, 96), packed, 64)


def _layer_inputs(rows: int):
    hidden, heads, kv_heads, head_dim, inter = 256, 4, 2, 64, 512
    gen = torch.Generator().manual_seed(7)
    norm = lambda: (1 + 0.1 * torch.randn(hidden, generator=gen)).bfloat16()  # noqa: E731
    angles = torch.arange(rows)[:, None] * torch.rand(head_dim, generator=gen)[None]
    return dict(
        x=torch.randn(rows, hidden, generator=gen).bfloat16(), norms=(norm(), norm()),
        dims=[heads, kv_heads, head_dim, inter], cos=angles.cos().bfloat16(), sin=angles.sin().bfloat16(),
        parts={"qkv": [(T.Q4_K, heads * head_dim), (T.Q4_K, kv_heads * head_dim), (T.Q6_K, kv_heads * head_dim)],
               "o": [(T.Q5_0, hidden)], "gate_up": [(T.Q5_K, 2 * inter)], "down": [(T.Q8_0, hidden)]},
        in_features={"qkv": hidden, "o": heads * head_dim, "gate_up": hidden, "down": inter})


def _run_layer(inputs, packs, rows):
    heads, kv_heads, head_dim, _ = inputs["dims"]
    cache = torch.zeros(2, kv_heads, 16, head_dim, dtype=torch.bfloat16)
    none = torch.empty(0, dtype=torch.bfloat16)
    weights = [inputs["norms"][0], packs["qkv"], none, none, packs["o"], inputs["norms"][1],
               packs["gate_up"], packs["down"]]
    out = kernels.decoder_layer(inputs["x"], weights, inputs["dims"], 1e-5, inputs["cos"], inputs["sin"],
                                [cache], torch.zeros(rows, dtype=torch.long), torch.arange(rows),
                                torch.arange(1, rows + 1))
    return out, cache


def test_decoder_layer_takes_quantized_packs():
    """The fused layer with Q4_K/Q6_K qkv, Q5_0 o, Q5_K gate_up and Q8_0 down equals
    the layer on the dense packs of the reference weights, output and cache."""
    rows = 5
    inputs = _layer_inputs(rows)
    quant, dense = {}, {}
    for name, parts in inputs["parts"].items():
        inp = inputs["in_features"][name]
        raws = [_raw(t, o, inp, seed=i) for i, (t, o) in enumerate(parts)]
        quant[name] = kernels.pack_quant_cat([(torch.from_numpy(r), int(t), o)
                                              for r, (t, o) in zip(raws, parts)], inp)
        dense[name] = kernels.pack(torch.cat([_reference(r, t, o, inp) for r, (t, o) in zip(raws, parts)]))
    q_out, q_cache = _run_layer(inputs, quant, rows)
    d_out, d_cache = _run_layer(inputs, dense, rows)
    assert torch.equal(_bits(q_out), _bits(d_out)) and torch.equal(_bits(q_cache), _bits(d_cache))
    assert q_out.isfinite().all() and q_out.abs().max() > 0
