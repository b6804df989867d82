"""The bf16 matmul kernel (AMX, or AVX-512-BF16 where the CPU has no AMX; see
kernels.isa()): accuracy against a float32 reference, and the row-invariance the
lossless batch-invariant mode relies on. Skipped where the kernel is unavailable
(no AVX-512-BF16, no compiler): Linear then uses oneDNN."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from verispec import kernels
from verispec.models.llama_weights import Linear

pytestmark = pytest.mark.skipif(not kernels.available(), reason="bf16 kernel unavailable here")

# Model shapes (SmolLM2-135M qkv, o, gate_up, down) and ragged ones that exercise
# the padding of outputs to 64 and of k to 32.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (101, 64), (37, 50), (16, 32), (1, 7)]


def _data(out: int, inp: int, rows: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, inp, generator=gen).bfloat16()
    bias = torch.randn(out, generator=gen).bfloat16()
    x = torch.randn(rows, inp, generator=gen).bfloat16()
    return x, weight, bias


@pytest.mark.parametrize("out,inp", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_float32_reference(out, inp, with_bias):
    x, weight, bias = _data(out, inp, 20)
    bias = bias if with_bias else None
    y = kernels.linear(x, kernels.pack(weight), out, bias)
    assert y.dtype == torch.bfloat16 and y.shape == (20, out)
    ref = x.float() @ weight.float().T + (bias.float() if with_bias else 0.0)
    # fp32 accumulation then one rounding: within one bf16 ulp (2^-8 relative) plus
    # the fp32 summation error, bounded by sum |x_k w_k| * I * 2^-24.
    scale = x.float().abs() @ weight.float().abs().T
    assert ((y.float() - ref).abs() <= ref.abs() * 2.0 ** -8 + scale * inp * 2.0 ** -24 + 1e-30).all()
    # Most elements round to exactly the reference's bf16, as F.linear's do.
    assert (y == ref.bfloat16()).float().mean() > 0.99
    assert (y == F.linear(x, weight, bias)).float().mean() > 0.99


@pytest.mark.parametrize("out,inp", [(960, 576), (576, 1536), (101, 64)])
def test_row_bits_independent_of_row_count_and_neighbours(out, inp):
    x, weight, bias = _data(out, inp, 40)
    packed = kernels.pack(weight)
    singles = torch.cat([kernels.linear(x[i:i + 1], packed, out, bias) for i in range(40)])
    for n in list(range(1, 17)) + [17, 33, 40]:
        assert torch.equal(kernels.linear(x[:n], packed, out, bias), singles[:n]), n
    # A row keeps its bits whatever fills the rest of its 16-row tile.
    other, _, _ = _data(out, inp, 40, seed=1)
    mixed = torch.cat((other[:5], x[7:8], other[5:12]))
    assert torch.equal(kernels.linear(mixed, packed, out, bias)[5], singles[7])


def test_thread_count_does_not_change_bits():
    x, weight, bias = _data(49152 // 8, 576, 16)
    packed = kernels.pack(weight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernels.linear(x, packed, weight.shape[0], bias)
        torch.set_num_threads(2)
        two = kernels.linear(x, packed, weight.shape[0], bias)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_rounds_half_to_even_and_keeps_nan():
    # Exact fp32 sums that sit halfway between two bf16 values, and a NaN row.
    x = torch.tensor([[1.0, 2.0 ** -8], [1.0 + 2.0 ** -7, 2.0 ** -8], [-1.0, -(2.0 ** -8)],
                      [float("nan"), 1.0]]).bfloat16()
    weight = torch.ones(3, 2).bfloat16()
    y = kernels.linear(x, kernels.pack(weight), 3)
    exact = (x.float() @ weight.float().T).bfloat16()
    assert torch.equal(y[:3], exact[:3])
    assert y[:3, 0].tolist() == [1.0, 1.0 + 2.0 ** -6, -1.0]
    assert y[3].isnan().all()


def test_linear_dispatches_to_kernel():
    x, weight, bias = _data(101, 64, 3)
    lin = Linear(weight, bias)
    assert lin.kernel and lin.row_invariant
    assert torch.equal(lin(x), kernels.linear(x, kernels.pack(weight), 101, bias))
    assert not Linear(weight.float()).kernel
