"""The integer path (kernels/quant_i8*.cpp) bit for bit, for every format it has.

The reference decodes the GGUF blocks itself (checked against gguf.quants.dequantize),
rounds each row of x to int8 as the contract says (per 32 values for the 32-weight
formats, per 256 for the K-quants), sums each block's or super-block's integer
products exactly, and applies the float steps in the contract's order with a correctly
rounded float32 fused multiply-add: the kernel's result must be that, bit for bit.
Then the property speculation needs: a row's bits do not depend on the row count, the
row's position, its neighbours or the thread count.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from gguf_support import Q, random_blocks
from gguf.quants import dequantize
from verispec import kernels

pytestmark = pytest.mark.skipif(not kernels.available() or not kernels.quant_i8_types(),
                                reason="verispec kernels or AVX-512-VNNI unavailable here")

LEGACY = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
K_QUANTS = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
F32, F64 = np.float32, np.float64


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[..., at:at + 2].copy().view(np.float16)[..., 0].astype(F32)


def _nib32(qs: np.ndarray) -> np.ndarray:
    return np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int64)


def _bits32(qh: np.ndarray) -> np.ndarray:
    word = qh.copy().view(np.uint32)[..., 0].astype(np.int64)
    return (word[..., None] >> np.arange(32)) & 1


def _scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 8 six-bit sub-block scales and mins from their 12 bytes."""
    s = s.astype(np.int64)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    return sc, m


def _nib256(qs: np.ndarray) -> np.ndarray:
    """256 4-bit quants: 64-value chunks of 32 bytes, low nibbles then high."""
    chunks = qs.reshape(*qs.shape[:-1], 4, 32).astype(np.int64)
    return np.stack([chunks & 15, chunks >> 4], axis=-2).reshape(*qs.shape[:-1], 256)


def decode(raw: np.ndarray, qtype: Q, out: int, inp: int) -> dict:
    """The blocks' integer quants q [out, in] (w = scale * (q - zero) + ...), and their
    scales per block: d, m (minimum), sc (sub-block scales), mins (sub-block mins)."""
    size = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q5_0: 22, Q.Q5_1: 24, Q.Q8_0: 34, Q.Q4_K: 144, Q.Q5_K: 176,
            Q.Q6_K: 210}[qtype]
    b = raw.reshape(out, -1, size)
    if qtype == Q.Q4_0:
        return {"q": _nib32(b[..., 2:18]) - 8, "d": _half(b, 0)}
    if qtype == Q.Q4_1:
        return {"q": _nib32(b[..., 4:20]), "d": _half(b, 0), "m": _half(b, 2)}
    if qtype == Q.Q5_0:
        return {"q": (_nib32(b[..., 6:22]) | _bits32(b[..., 2:6]) << 4) - 16, "d": _half(b, 0)}
    if qtype == Q.Q5_1:
        return {"q": _nib32(b[..., 8:24]) | _bits32(b[..., 4:8]) << 4, "d": _half(b, 0), "m": _half(b, 2)}
    if qtype == Q.Q8_0:
        return {"q": b[..., 2:34].view(np.int8).astype(np.int64), "d": _half(b, 0)}
    if qtype in (Q.Q4_K, Q.Q5_K):
        sc, m = _scale_min(b[..., 4:16])
        if qtype == Q.Q4_K:
            q = _nib256(b[..., 16:144])
        else:
            high = (b[..., 16:48].astype(np.int64)[..., None, :] >> np.arange(8)[:, None]) & 1
            q = _nib256(b[..., 48:176]) | high.reshape(out, -1, 256) << 4
        return {"q": q, "d": _half(b, 0), "dmin": _half(b, 2), "sc": sc, "mins": m}
    ql, qh = b[..., 0:128].astype(np.int64), b[..., 128:192].astype(np.int64)
    low = np.concatenate([ql[..., h * 64:(h + 1) * 64] >> (4 * i) & 15 for h in range(2) for i in range(2)], -1)
    high = np.concatenate([qh[..., h * 32:(h + 1) * 32] >> (2 * i) & 3 for h in range(2) for i in range(4)], -1)
    return {"q": (low | high << 4) - 32, "d": _half(b, 208), "sc": b[..., 192:208].view(np.int8).astype(np.int64)}


def dequantized(parts: dict, qtype: Q) -> np.ndarray:
    """The decoded blocks' weights in float64 (exact), to check decode() itself."""
    q, d = parts["q"].astype(F64), parts["d"].astype(F64)[..., None]
    if qtype in LEGACY:
        return (d * q + parts.get("m", np.zeros_like(parts["d"])).astype(F64)[..., None]).reshape(q.shape[0], -1)
    sub = 32 if qtype != Q.Q6_K else 16
    sc = np.repeat(parts["sc"], sub, axis=-1).astype(F64)
    w = d * sc * q
    if qtype != Q.Q6_K:
        w -= parts["dmin"].astype(F64)[..., None] * np.repeat(parts["mins"], 32, axis=-1)
    return w.reshape(q.shape[0], -1)


def int8_rows(x: torch.Tensor, block: int) -> tuple[np.ndarray, np.ndarray]:
    """x [n, in] rounded per `block` values: q [n, blocks, block] int64, d [n, blocks]."""
    xs = x.float().numpy().reshape(x.shape[0], -1, block)
    d = np.abs(xs).max(axis=2) / F32(127)
    inv = np.where(d > 0, F32(1) / np.where(d > 0, d, F32(1)), F32(0)).astype(F32)
    q = np.clip(np.rint(xs * inv[..., None]), -128, 127).astype(np.int64)
    return q, d.astype(F32)


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """round_to_float32(a * b + c), once, as VFMADD does. a * b is exact in float64;
    the sum's float64 rounding error (TwoSum) settles the one case where rounding
    twice could differ: the float64 sum lying exactly between two float32."""
    p, c64 = a.astype(F64) * b.astype(F64), c.astype(F64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)
    r = s.astype(F32)
    other = np.nextafter(r, np.where(s > r.astype(F64), F32(np.inf), F32(-np.inf)).astype(F32))
    tie = (s == (r.astype(F64) + other.astype(F64)) / 2) & (err != 0)
    pick = np.where(err > 0, np.maximum(r, other), np.minimum(r, other))
    return np.where(tie, pick, r).astype(F32)


def reference(x: torch.Tensor, raw: np.ndarray, qtype: Q, out: int, inp: int,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """The integer path's contract, step by step: y [n, out] in bf16."""
    parts = decode(raw, qtype, out, inp)
    block = 32 if qtype in LEGACY else 256
    xq, dx = int8_rows(x, block)
    acc = np.zeros((x.shape[0], out), F32)
    for b in range(inp // block):
        wq, xb = parts["q"][:, b], xq[:, b]  # [out, block], [n, block]
        step = lambda w_scale: (w_scale[None, :, b] * dx[:, b, None]).astype(F32)  # noqa: E731
        if qtype in LEGACY:
            acc = fma32((xb @ wq.T).astype(F32), step(parts["d"]), acc)
            if "m" in parts:
                xs = (dx[:, b] * xb.sum(axis=1).astype(F32)).astype(F32)
                acc = fma32(np.broadcast_to(parts["m"][None, :, b], acc.shape), xs[:, None], acc)
            continue
        sub = 16 if qtype == Q.Q6_K else 32
        isum = np.einsum("nsk,osk->nos", xb.reshape(-1, block // sub, sub), wq.reshape(out, -1, sub))
        acc = fma32((isum * parts["sc"][None, :, b]).sum(-1).astype(F32), step(parts["d"]), acc)
        if qtype != Q.Q6_K:
            xsum = xb.reshape(-1, 8, 32).sum(-1)  # [n, 8]
            msum = (xsum[:, None, :] * parts["mins"][None, :, b]).sum(-1)
            acc = fma32(-msum.astype(F32), step(parts["dmin"]), acc)
    y = torch.from_numpy(acc)
    if bias is not None:
        y = y + bias.float()
    return y.bfloat16()


def _raw(qtype: Q, out: int, inp: int, seed: int) -> np.ndarray:
    return random_blocks(qtype, out, inp, np.random.default_rng(seed), scale=0.05).reshape(-1)


def _x(rows: int, inp: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(seed))
    x[:, :32] = 0.0  # an all-zero block: d = 0, no division by it
    x[0, 40] = 30.0  # an outlier: the rest of its block rounds coarsely
    return x.bfloat16()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16)


def _pack(parts: list[tuple[np.ndarray, Q, int]], inp: int) -> torch.Tensor:
    return kernels.pack_quant_i8([(torch.from_numpy(r), int(t), o) for r, t, o in parts], inp)


@pytest.mark.parametrize("qtype", LEGACY + K_QUANTS, ids=lambda t: t.name)
def test_decode_matches_gguf(qtype):
    out, inp = 21, 512
    raw = _raw(qtype, out, inp, seed=2)
    got = dequantized(decode(raw, qtype, out, inp), qtype)
    assert np.array_equal(got.astype(F32), dequantize(raw, qtype).reshape(out, inp))


@pytest.mark.parametrize("qtype", LEGACY + K_QUANTS, ids=lambda t: t.name)
def test_bits_equal_the_reference(qtype):
    # odd out (ragged tiles), one and three K super-blocks, several 64-output groups
    for out, inp in [(37, 256), (150, 768)]:
        raw = _raw(qtype, out, inp, seed=out)
        packed = _pack([(raw, qtype, out)], inp)
        x = _x(11, inp, seed=inp)
        bias = torch.randn(out, generator=torch.Generator().manual_seed(3)).bfloat16()
        for b in (None, bias):
            got = kernels.linear(x, packed, out, b)
            assert torch.equal(_bits(got), _bits(reference(x, raw, qtype, out, inp, b))), (out, inp)


@pytest.mark.parametrize("qtype", LEGACY + K_QUANTS, ids=lambda t: t.name)
def test_row_bits_do_not_depend_on_the_batch(qtype):
    """n = 1..16 rows at every start position, a shuffle, and 1 or 2 threads."""
    out, inp = 150, 512
    raw = _raw(qtype, out, inp, seed=5)
    packed = _pack([(raw, qtype, out)], inp)
    x = _x(16, inp, seed=7)
    alone = torch.cat([kernels.linear(x[r:r + 1], packed, out) for r in range(16)])
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for n in range(1, 17):
                for start in range(0, 17 - n):
                    got = kernels.linear(x[start:start + n], packed, out)
                    assert torch.equal(_bits(got), _bits(alone[start:start + n])), (threads, n, start)
            order = torch.randperm(16, generator=torch.Generator().manual_seed(threads))
            assert torch.equal(_bits(kernels.linear(x[order], packed, out)), _bits(alone[order]))
    finally:
        torch.set_num_threads(before)


def test_mixed_stack_is_its_parts():
    """A Q4_K_M stack: Q4_K q/k beside Q6_K v in one pack, and a 32-weight part."""
    inp = 512
    specs = [(Q.Q4_K, 128), (Q.Q6_K, 64), (Q.Q8_0, 64), (Q.Q5_K, 37)]
    parts = [(_raw(t, o, inp, seed=i), t, o) for i, (t, o) in enumerate(specs)]
    stacked = _pack(parts, inp)
    x = _x(9, inp, seed=4)
    got = kernels.linear(x, stacked, sum(o for _, o in specs))
    alone = torch.cat([reference(x, r, t, o, inp) for r, t, o in parts], dim=1)
    assert torch.equal(_bits(got), _bits(alone))


@pytest.mark.parametrize("qtype", LEGACY + K_QUANTS, ids=lambda t: t.name)
def test_embedding_rows_equal_the_bf16_packs(qtype):
    out, inp = 101, 512
    raw = _raw(qtype, out, inp, seed=11)
    i8 = _pack([(raw, qtype, out)], inp)
    bf16 = kernels.pack_quant(torch.from_numpy(raw), int(qtype), out, inp)
    ids = torch.tensor([[0, 17, 100], [63, 64, 5]])
    assert torch.equal(_bits(kernels.embedding(i8, ids)), _bits(kernels.embedding(bf16, ids)))
    assert kernels.quant_shape(i8) == (out, inp)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_thread_count_does_not_change_bits(qtype):
    out, inp = 2048, 512  # enough 64-output groups for both threads to get a share
    packed = _pack([(_raw(qtype, out, inp, seed=7), qtype, out)], inp)
    x = _x(16, inp, seed=9)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append([kernels.linear(x[:n], packed, out) for n in (1, 5, 16)])
    finally:
        torch.set_num_threads(before)
    for one, two in zip(*results):
        assert torch.equal(_bits(one), _bits(two))
    assert torch.equal(_bits(results[0][0]), _bits(results[0][2][:1]))


def test_clear_errors():
    raw = torch.from_numpy(_raw(Q.Q4_K, 16, 256, seed=0))
    with pytest.raises(ValueError, match="no integer kernel for ggml Q2_K"):
        kernels.pack_quant_i8([(raw, int(Q.Q2_K), 16)], 256)
    with pytest.raises(RuntimeError, match="needs 2304 contiguous uint8 bytes"):
        kernels.pack_quant_i8([(raw[:-1], int(Q.Q4_K), 16)], 256)
    with pytest.raises(RuntimeError, match="not a multiple of Q4_K's block of 256"):
        kernels.pack_quant_i8([(raw, int(Q.Q4_K), 32)], 128)
    packed = kernels.pack_quant_i8([(raw, int(Q.Q4_K), 16)], 256)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        kernels.linear(_x(1, 512, seed=0), packed, 16)
