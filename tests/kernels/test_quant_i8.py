"""The integer path of a quantized product (kernels/quant_i8.cpp, --weights quant-i8).

Its contract differs from the bf16 path's: each row of x is rounded to int8 per
32-element block (dx = max|x| / 127, q = round-even(x / dx)), every block's sum is
exact in int32, and only the scales are float. So the test holds it to an
independent float64 reference on those same int8 rows, within the fp32
accumulation and the one bf16 rounding; and to the property speculation needs,
bit for bit: a row's output depends on that row alone, not on how many rows share
the call, which rows they are, or the thread count.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from verispec import kernels

pytestmark = pytest.mark.skipif(not kernels.available() or not kernels.quant_i8_types(),
                                reason="verispec kernels or AVX-512-VNNI unavailable here")

FORMATS = [T.Q8_0, T.Q4_0, T.Q4_1]
HALF_BYTES = {T.Q8_0: 2, T.Q4_0: 2, T.Q4_1: 4}  # the leading fp16 fields of a block


def _raw(qtype: T, out: int, inp: int, seed: int = 0) -> np.ndarray:
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(out * inp // block, size), dtype=np.uint8)
    halves = rng.normal(0, 0.02, size=(blocks.shape[0], HALF_BYTES[qtype] // 2)).astype(np.float16)
    blocks[:, :HALF_BYTES[qtype]] = halves.view(np.uint8)
    return blocks.reshape(-1)


def _x(rows: int, inp: int, seed: int = 1) -> torch.Tensor:
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(seed))
    if inp > 32:
        x[:, :32] = 0.0  # an all-zero block: dx = 0, no division by it
        x[0, 40] = 30.0  # an outlier: the rest of its block rounds coarsely
    return x.bfloat16()


def _int8_rows(x: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The activation rounding the contract names, in numpy float32: (q, dx)."""
    xs = x.float().numpy().reshape(x.shape[0], -1, 32)
    d = (np.abs(xs).max(axis=2, keepdims=True) / np.float32(127)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.rint((xs * inv).astype(np.float32))
    return q, d


def _reference(x: torch.Tensor, raw: np.ndarray, qtype: T, out: int, inp: int) -> np.ndarray:
    weight = dequantize(raw, qtype).reshape(out, inp).astype(np.float64)
    q, d = _int8_rows(x)
    x_int8 = (q * d).reshape(x.shape[0], inp).astype(np.float64)
    return x_int8 @ weight.T


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_matches_the_int8_reference(qtype):
    for out, inp in [(101, 96), (64, 32), (200, 608)]:
        raw = _raw(qtype, out, inp, seed=out)
        packed = kernels.pack_quant_i8([(torch.from_numpy(raw), int(qtype), out)], inp)
        x = _x(9, inp)
        want = _reference(x, raw, qtype, out, inp)
        got = kernels.linear(x, packed, out).double().numpy()
        # fp32 accumulation (relative 1e-6 of the terms' magnitude) and one bf16 rounding.
        scale = np.abs(x.double().numpy()) @ np.abs(dequantize(raw, qtype).reshape(out, inp)).T
        assert np.all(np.abs(got - want) <= 2.0 ** -8 * np.abs(want) + 1e-5 * scale + 1e-30), (out, inp)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_row_bits_independent_of_row_count_and_neighbours(qtype):
    out, inp = 200, 608
    raw = _raw(qtype, out, inp, seed=3)
    packed = kernels.pack_quant_i8([(torch.from_numpy(raw), int(qtype), out)], inp)
    x = _x(17, inp, seed=5)
    bias = torch.randn(out).bfloat16()
    alone = [kernels.linear(x[r:r + 1], packed, out, bias) for r in range(17)]
    for n in range(1, 18):
        got = kernels.linear(x[:n], packed, out, bias)
        for r in range(n):
            assert torch.equal(_bits(got[r:r + 1]), _bits(alone[r])), (n, r)
    shuffled = torch.randperm(17, generator=torch.Generator().manual_seed(0))
    got = kernels.linear(x[shuffled], packed, out, bias)
    for i, r in enumerate(shuffled.tolist()):
        assert torch.equal(_bits(got[i:i + 1]), _bits(alone[r]))


def test_thread_count_does_not_change_bits():
    out, inp = 1536, 576
    raw = _raw(T.Q4_1, out, inp, seed=7)
    packed = kernels.pack_quant_i8([(torch.from_numpy(raw), int(T.Q4_1), out)], inp)
    x = _x(5, inp, seed=9)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(kernels.linear(x, packed, out))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(_bits(results[0]), _bits(results[1]))


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda t: t.name)
def test_embedding_rows_equal_the_bf16_packs(qtype):
    out, inp = 101, 96
    raw = _raw(qtype, out, inp, seed=11)
    i8 = kernels.pack_quant_i8([(torch.from_numpy(raw), int(qtype), out)], inp)
    bf16 = kernels.pack_quant(torch.from_numpy(raw), int(qtype), out, inp)
    ids = torch.tensor([[0, 17, 100], [63, 64, 5]])
    assert torch.equal(_bits(kernels.embedding(i8, ids)), _bits(kernels.embedding(bf16, ids)))
    assert kernels.quant_shape(i8) == (out, inp)


def test_stacked_tensors_of_two_types_share_one_pack():
    inp = 96
    q = _raw(T.Q4_1, 64, inp, seed=1)
    v = _raw(T.Q8_0, 40, inp, seed=2)
    stacked = kernels.pack_quant_i8([(torch.from_numpy(q), int(T.Q4_1), 64),
                                     (torch.from_numpy(v), int(T.Q8_0), 40)], inp)
    x = _x(3, inp)
    got = kernels.linear(x, stacked, 104)
    alone_q = kernels.linear(x, kernels.pack_quant_i8([(torch.from_numpy(q), int(T.Q4_1), 64)], inp), 64)
    alone_v = kernels.linear(x, kernels.pack_quant_i8([(torch.from_numpy(v), int(T.Q8_0), 40)], inp), 40)
    assert torch.equal(_bits(got), _bits(torch.cat([alone_q, alone_v], dim=1)))


def test_clear_errors():
    raw = torch.from_numpy(_raw(T.Q4_1, 16, 64))
    with pytest.raises(ValueError, match="no integer kernel for ggml Q4_K"):
        kernels.pack_quant_i8([(raw, int(T.Q4_K), 16)], 64)
    with pytest.raises(RuntimeError, match="needs 640 contiguous uint8 bytes"):
        kernels.pack_quant_i8([(raw[:-1], int(T.Q4_1), 16)], 64)
    packed = kernels.pack_quant_i8([(raw, int(T.Q4_1), 16)], 64)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        kernels.linear(_x(1, 96), packed, 16)
