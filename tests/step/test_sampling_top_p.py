"""The nucleus (top_p) found from a growing top-m selection equals the one a
full sort of the vocabulary finds: on peaked, flat and tied rows, top_p near 0
and near 1, many rows at once, bf16-derived logits, and composed with min_p
and top_k."""
from __future__ import annotations

import pytest
import torch

from verispec.config import SamplingParams
from verispec.step import sampling
from verispec.step.sampling import top_p_keep, torch_probs

VOCAB = 49152  # the default model's vocabulary


def sort_keep(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The full-sort nucleus of the same probabilities: [rows, vocab] bool."""
    probs = logits.softmax(-1)
    ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    drop = (ordered.cumsum(-1) - ordered) >= top_p
    return torch.zeros_like(drop).scatter(-1, order, ~drop)


def sort_logits_reference(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The previous implementation, kept here as the semantics' reference: the
    sorted logits' softmax, then the strict mass-before rule."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(-1)
    drop = (sorted_probs.cumsum(-1) - sorted_probs) >= top_p
    return torch.zeros_like(drop).scatter(-1, order, ~drop)


def assert_same_nucleus(keep: torch.Tensor, ref: torch.Tensor, logits: torch.Tensor) -> None:
    """Equal kept sets, except that tokens tied in probability at the boundary may
    be exchanged: then the counts agree and every differing token has the
    probability of the boundary token."""
    assert torch.equal(keep.sum(-1), ref.sum(-1))
    probs = logits.softmax(-1)
    for row in torch.nonzero((keep != ref).any(-1)).flatten().tolist():
        boundary = probs[row][ref[row]].min()
        assert torch.all(probs[row][keep[row] != ref[row]] == boundary), f"row {row}"


def rows(kind: str, n: int, gen: torch.Generator) -> torch.Tensor:
    base = torch.randn(n, VOCAB, generator=gen)  # [n, vocab]
    if kind == "peaked":
        return base * 4
    if kind == "flat":
        return base * 0.05  # a nucleus of tens of thousands: the full-size fallback
    if kind == "ties":
        return (base * 2).round()  # a few dozen distinct values
    if kind == "bf16":
        return (base * 6).to(torch.bfloat16).float()  # the native backend's logits
    if kind == "mixed":  # one row per regime, so the size grows for all rows at once
        scale = torch.tensor([8.0, 4.0, 2.0, 1.0, 0.3, 0.05]).repeat(n)[:n, None]
        return base * scale
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "bf16", "mixed"])
@pytest.mark.parametrize("top_p", [1e-6, 0.5, 0.9, 0.95, 0.999999])
def test_nucleus_equals_the_full_sort(kind, top_p):
    gen = torch.Generator().manual_seed(len(kind) * 1000 + int(top_p * 100))
    logits = rows(kind, 9, gen) / 0.7  # [9, vocab], tempered like a verified block
    keep = top_p_keep(logits, top_p)
    ref = sort_keep(logits, top_p)
    if kind == "peaked":
        assert torch.equal(keep, ref)  # a nucleus of distinct probabilities
    else:  # flat rows tie too: ~49k probabilities near 1/vocab round onto fewer floats
        assert_same_nucleus(keep, ref, logits)
    assert keep.any(-1).all()  # the most likely token is always kept
    if top_p == 1e-6:
        assert torch.equal(keep.sum(-1), torch.ones(9, dtype=torch.long))


@pytest.mark.parametrize("size", [63, 64, 65, 256, 257])
def test_a_nucleus_at_the_selection_boundary(size):
    # `size` equally likely tokens hold 0.95 of the mass, the rest share 0.05: the
    # nucleus at top_p 0.9 is close to `size`, across the first selection's edge.
    head = torch.full((size,), 0.95 / size)
    tail = torch.full((VOCAB - size,), 0.05 / (VOCAB - size))
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(size))
    logits = torch.cat([head, tail]).log()[perm][None]  # [1, vocab]
    logits = logits + 1e-4 * torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1))
    keep = top_p_keep(logits, 0.9)
    assert torch.equal(keep, sort_keep(logits, 0.9))
    assert abs(int(keep.sum()) - round(size * 0.9 / 0.95)) <= 1


def test_equals_the_previous_sort_of_logits():
    # The old code sorted the logits and took the softmax of the sorted row; its
    # probabilities can differ from these by rounding only, so its nucleus is the
    # same up to tied tokens, except where a mass before a token lies within
    # rounding of top_p (a sum of up to ~49k rounded terms).
    gen = torch.Generator().manual_seed(7)
    logits = torch.cat([rows("mixed", 30, gen), rows("bf16", 10, gen)]) / 0.7
    for top_p in (0.3, 0.9, 0.99):
        keep = top_p_keep(logits, top_p)
        old = sort_logits_reference(logits, top_p)
        probs = logits.softmax(-1)
        ordered = torch.sort(probs, dim=-1, descending=True).values
        mass_before = ordered.cumsum(-1) - ordered
        for row in torch.nonzero((keep != old).any(-1)).flatten().tolist():
            boundary = probs[row][old[row]].min()
            if keep[row].sum() == old[row].sum() and torch.all(
                    probs[row][keep[row] != old[row]] == boundary):
                continue  # tied tokens exchanged
            gap = (mass_before[row] - top_p).abs().min()
            assert gap < 1e-4, f"row {row} differs {gap:.2e} away from the boundary"
            # Only a long sum rounds that far: a nucleus of thousands of tokens.
            assert old[row].sum() > 1000 and (keep[row] != old[row]).sum() == 1


def test_torch_probs_is_the_sort_references_distribution():
    gen = torch.Generator().manual_seed(3)
    logits = rows("mixed", 12, gen)
    for params in (SamplingParams(temperature=0.7, top_p=0.9),
                   SamplingParams(temperature=1.0, top_p=0.8, top_k=40),
                   SamplingParams(temperature=0.7, top_p=0.95, min_p=0.05),
                   SamplingParams(temperature=1.3, top_p=0.999)):
        probs = torch_probs(logits, params)  # [12, vocab]
        tempered = logits / params.temperature
        if params.min_p:
            tempered_probs = tempered.softmax(-1)
            floor = params.min_p * tempered_probs.amax(-1, keepdim=True)
            tempered = tempered.masked_fill(tempered_probs < floor, float("-inf"))
        if params.top_k:
            kth = torch.topk(tempered, params.top_k, dim=-1).values[..., -1:]
            tempered = tempered.masked_fill(tempered < kth, float("-inf"))
        keep = sort_keep(tempered, params.top_p)
        expected = tempered.masked_fill(~keep, float("-inf")).softmax(-1)
        assert torch.equal(probs, expected)
        assert torch.allclose(probs.sum(-1), torch.ones(12))


def test_one_row_and_small_vocabularies(monkeypatch):
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))  # [vocab]: one row, 1-D
    assert top_p_keep(logits, 0.8).tolist() == [True, True, False, False]
    assert top_p_keep(logits, 0.81).tolist() == [True, True, True, False]
    # A vocabulary smaller than the first selection, and growth from a size of 1.
    monkeypatch.setattr(sampling, "_NUCLEUS_FIRST", 1)
    gen = torch.Generator().manual_seed(5)
    many = torch.randn(7, 300, generator=gen)  # [7, 300]
    for top_p in (0.2, 0.9, 0.9999):
        assert torch.equal(top_p_keep(many, top_p), sort_keep(many, top_p))
