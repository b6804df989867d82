"""verispec's row-invariant attention kernel (kernels/attention.cpp): accuracy
against a float32 reference, and the invariant that lets native bf16
verification equal plain decoding bit for bit: a row's output depends only on its
query and the keys it sees, never on the other rows, the requests sharing the
call, or the thread count."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from verispec import kernels
from verispec.kernels.build import cpu_vendor

pytestmark = pytest.mark.skipif(not kernels.available(), reason="verispec kernels unavailable here")


def _caches(count: int, kv_heads: int, capacity: int, head_dim: int, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, kv_heads, capacity, head_dim, generator=gen).to(dtype) * 2
            for _ in range(count)]


def _reference(q, caches, row_cache, row_len, row_index=None):
    """float32 softmax attention of each row over exactly its visible keys."""
    rows, heads, head_dim = q.shape
    out = []
    for r in range(rows):
        kv = caches[int(row_cache[r])].float()
        groups = heads // kv.shape[1]
        n = int(row_len[r])
        if row_index is not None and int(row_index[r, 0]) >= 0:
            keys = row_index[r, :n]
        else:
            keys = torch.arange(n)
        k = kv[0][:, keys].repeat_interleave(groups, 0)  # [heads, n, hd]
        v = kv[1][:, keys].repeat_interleave(groups, 0)
        out.append(F.scaled_dot_product_attention(q[r].float()[:, None], k, v).reshape(-1))
    return torch.stack(out)


# float32: summation order only; bf16: one final rounding (half a unit, 2^-9
# relative) on top of float32 math.
@pytest.mark.parametrize("dtype, rel", [(torch.float32, 1e-6), (torch.bfloat16, 2.0 ** -8)])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (4, 2, 16), (8, 8, 48),
                                                       (4, 1, 128), (4, 1, 256)])
def test_matches_reference(dtype, rel, heads, kv_heads, head_dim):
    caches = _caches(2, kv_heads, 100, head_dim, dtype)
    gen = torch.Generator().manual_seed(1)
    rows = 7
    q = torch.randn(rows, heads, head_dim, generator=gen).to(dtype)
    row_cache = torch.tensor([0, 0, 1, 1, 1, 0, 1])
    row_len = torch.tensor([1, 17, 16, 33, 100, 64, 5])
    out = kernels.attend(q, caches, row_cache, row_len)
    assert out.shape == (rows, heads * head_dim) and out.dtype == dtype
    ref = _reference(q, caches, row_cache, row_len)
    assert ((out.float() - ref).abs() <= rel * ref.abs() + 1e-5).all()


def test_index_rows_see_exactly_their_keys():
    """Tree rows: an explicit ascending key list, mixed with prefix rows (-1 first)."""
    caches = _caches(1, 2, 40, 16, torch.float32)
    q = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(2))
    row_index = torch.full((3, 40), -1, dtype=torch.long)
    row_index[0, :5] = torch.tensor([0, 1, 2, 10, 12])
    row_index[2, :3] = torch.tensor([3, 7, 39])
    row_len = torch.tensor([5, 20, 3])
    out = kernels.attend(q, caches, torch.zeros(3, dtype=torch.long), row_len, row_index)
    ref = _reference(q, caches, torch.zeros(3, dtype=torch.long), row_len, row_index)
    assert (out - ref).abs().max() < 1e-5
    # Stale keys outside a row's list cannot leak in: scribbling on them changes nothing.
    caches[0][:, :, 20:39] = 1e4
    caches[0][:, :, 4:7] = -1e4
    again = kernels.attend(q, caches, torch.zeros(3, dtype=torch.long), row_len, row_index)
    assert torch.equal(again[0], out[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_bits_independent_of_neighbours_batch_and_threads(dtype):
    caches = _caches(3, 3, 600, 64, dtype, seed=3)
    gen = torch.Generator().manual_seed(4)
    rows = 24
    q = torch.randn(rows, 9, 64, generator=gen).to(dtype)
    row_cache = torch.tensor([i % 3 for i in range(rows)])
    row_len = torch.randint(1, 600, (rows,), generator=gen)
    alone = torch.cat([kernels.attend(q[r:r + 1].contiguous(), [caches[int(row_cache[r])]],
                                      torch.zeros(1, dtype=torch.long), row_len[r:r + 1])
                       for r in range(rows)])
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            together = kernels.attend(q, caches, row_cache, row_len)
            assert torch.equal(together, alone), threads
    finally:
        torch.set_num_threads(before)
    # Consecutive rows of one request (how verification blocks arrive) as well.
    block_len = torch.arange(500, 516)
    block = kernels.attend(q[:16].contiguous(), caches[:1], torch.zeros(16, dtype=torch.long), block_len)
    for r in range(16):
        one = kernels.attend(q[r:r + 1].contiguous(), caches[:1], torch.zeros(1, dtype=torch.long),
                             block_len[r:r + 1])
        assert torch.equal(one[0], block[r])


def test_bad_inputs_raise():
    caches = _caches(1, 2, 10, 16, torch.float32)
    q = torch.randn(2, 4, 16)
    zeros = torch.zeros(2, dtype=torch.long)
    with pytest.raises(RuntimeError, match="1..capacity"):
        kernels.attend(q, caches, zeros, torch.tensor([0, 3]))
    with pytest.raises(RuntimeError, match="1..capacity"):
        kernels.attend(q, caches, zeros, torch.tensor([11, 3]))
    with pytest.raises(RuntimeError, match="cache index"):
        kernels.attend(q, caches, torch.tensor([0, 1]), torch.tensor([1, 3]))
    with pytest.raises(RuntimeError, match="out of range"):
        kernels.attend(q, caches, zeros, torch.tensor([2, 3]), torch.tensor([[0, 10, 0], [-1, 0, 0]]))
    with pytest.raises(RuntimeError, match="dtype"):
        kernels.attend(q.bfloat16(), caches, zeros, torch.tensor([1, 3]))


@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_gemma_scale_and_soft_cap_match_reference(softcap):
    """Gemma's query_pre_attn_scalar scale and Gemma 2's tanh soft-cap, in float32,
    and a row's bits still independent of the rows around it."""
    heads, kv_heads, head_dim, scale = 4, 2, 32, 0.3
    caches = _caches(1, kv_heads, 40, head_dim, torch.float32, seed=3)
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(5, heads, head_dim, generator=gen) * 2
    row_len = torch.tensor([1, 7, 16, 33, 40])
    zeros = torch.zeros(5, dtype=torch.long)
    out = kernels.attend(q, caches, zeros, row_len, scale=scale, softcap=softcap)
    for r in range(5):
        n = int(row_len[r])
        k = caches[0][0][:, :n].repeat_interleave(2, 0)  # [heads, n, hd]
        v = caches[0][1][:, :n].repeat_interleave(2, 0)
        scores = (q[r][:, None] @ k.transpose(-1, -2)) * scale  # [heads, 1, n]
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        want = (scores.softmax(-1) @ v).reshape(-1)
        assert (out[r] - want).abs().max() < 1e-5
        alone = kernels.attend(q[r:r + 1].contiguous(), caches, zeros[:1], row_len[r:r + 1],
                               scale=scale, softcap=softcap)
        assert torch.equal(alone[0], out[r])
    if softcap:  # the cap is applied (scores here reach beyond +-3)
        plain = kernels.attend(q, caches, zeros, row_len, scale=scale)
        assert (plain - out).abs().max() > 1e-3


def _shifted(cache: torch.Tensor) -> torch.Tensor:
    """The cache with every slot moved up by one: slot j + 1 holds what slot j held."""
    moved = torch.zeros_like(cache)
    moved[:, :, 1:] = cache[:, :, :-1]
    return moved


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(9, 3, 64), (12, 2, 128), (8, 2, 128), (4, 1, 256)])
def test_block_rows_equal_rows_alone_and_tree_rows(heads, kv_heads, head_dim):
    """Rows of verification blocks of 2..16 rows (lengths one apart, as a block
    arrives) share key sweeps with the rows around them; a tree row mixes its
    context with keys further up; a row whose keys sit one slot up goes through an
    explicit list. A row must get the same bits in every one of these, and alone,
    at 1 and 2 threads."""
    capacity, base = 80, 29  # lengths 30..45 cross the 16-key block boundaries
    cache = _caches(1, kv_heads, capacity, head_dim, torch.bfloat16, seed=5)[0]
    gen = torch.Generator().manual_seed(6)
    # Large scores: a score's last bit then reaches the bf16 output often enough to be seen.
    q = (torch.randn(16, heads, head_dim, generator=gen) * 8).bfloat16()
    row_len = torch.arange(base + 1, base + 17)
    one = torch.zeros(1, dtype=torch.long)
    alone = [kernels.attend(q[r:r + 1].contiguous(), [cache], one, row_len[r:r + 1]) for r in range(16)]
    # The same keys through an explicit list one slot up.
    up = torch.arange(1, capacity + 1).clamp(max=capacity - 1).repeat(16, 1)
    shifted = kernels.attend(q, [_shifted(cache)], torch.zeros(16, dtype=torch.long), row_len, up)
    # Tree rows: the context then a few ancestors further up the cache.
    tree_index = torch.full((16, capacity), -1, dtype=torch.long)
    for r in range(0, 16, 3):
        n = int(row_len[r])
        tree_index[r, :n] = torch.cat([torch.arange(n - 4), torch.tensor([n, n + 2, n + 5, n + 9])])
    tree_alone = {r: kernels.attend(q[r:r + 1].contiguous(), [cache], one, row_len[r:r + 1],
                                    tree_index[r:r + 1]) for r in range(0, 16, 3)}
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for rows in range(2, 17):
                for start in {0, 16 - rows}:
                    part = slice(start, start + rows)
                    zeros = torch.zeros(rows, dtype=torch.long)
                    block = kernels.attend(q[part].contiguous(), [cache], zeros, row_len[part])
                    tree = kernels.attend(q[part].contiguous(), [cache], zeros, row_len[part],
                                          tree_index[part].contiguous())
                    for i, r in enumerate(range(start, start + rows)):
                        assert torch.equal(block[i], alone[r][0]), (threads, rows, start, r)
                        assert torch.equal(block[i], shifted[r]), (threads, rows, start, r)
                        want = tree_alone[r][0] if r in tree_alone else alone[r][0]
                        assert torch.equal(tree[i], want), (threads, rows, start, r)
    finally:
        torch.set_num_threads(before)


def test_score_sums_follow_the_cpu_vendor():
    """bf16 scores take VDPBF16PS's FMA spelling on every CPU but AMD's, where VDPBF16PS
    issues slower than two FMAs (attention_blocks.h); the choice is one per process."""
    assert kernels.attention_dots() == ("vdpbf16ps" if cpu_vendor() == "AuthenticAMD" else "fma")


_DOTS_CHILD = """
import sys, torch
from verispec import kernels
data = torch.load(sys.argv[1])
outs = [kernels.attend(*case) for case in data]
torch.save({"dots": kernels.attention_dots(), "outs": outs}, sys.argv[2])
"""


@pytest.mark.skipif(cpu_vendor() == "AuthenticAMD", reason="AMD sums bf16 scores with VDPBF16PS only; the FMA "
                                                        "spelling is not taken there, nor measured")
def test_fma_scores_are_vdpbf16ps_bit_for_bit(tmp_path):
    """Where the FMA spelling runs, its bits are VDPBF16PS's: the same calls in a process
    forced to each: rows 1-16 of one request (prefix and tree rows), Gemma's soft cap and
    head_dim 256."""
    gen = torch.Generator().manual_seed(5)
    cases = []
    for heads, kv_heads, head_dim, softcap in [(12, 2, 128, 0.0), (9, 3, 64, 0.0), (8, 4, 256, 50.0)]:
        caches = [torch.randn(2, kv_heads, 120, head_dim, generator=gen).bfloat16() * 3]
        for rows in (1, 5, 16):
            q = (torch.randn(rows, heads, head_dim, generator=gen) * 2).bfloat16()
            row_len = torch.arange(100, 100 + rows)
            index = torch.full((rows, 120), -1)
            if rows > 1:
                index[1, :101] = torch.randperm(119, generator=gen)[:101].sort().values
            cases.append((q, caches, torch.zeros(rows, dtype=torch.long), row_len, index, 0.0, softcap))
    torch.save(cases, tmp_path / "in.pt")
    root = Path(__file__).resolve().parents[2]
    got = {}
    for dots in ("fma", "vdpbf16ps"):
        subprocess.run([sys.executable, "-c", _DOTS_CHILD, str(tmp_path / "in.pt"), str(tmp_path / f"{dots}.pt")],
                       check=True, cwd=root, env={**os.environ, "VERISPEC_ATTN_DOTS": dots}, timeout=300)
        got[dots] = torch.load(tmp_path / f"{dots}.pt")
        assert got[dots]["dots"] == dots
    for i, (fma, vdp) in enumerate(zip(got["fma"]["outs"], got["vdpbf16ps"]["outs"])):
        assert torch.equal(fma.view(torch.int16), vdp.view(torch.int16)), i
