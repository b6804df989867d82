"""Sampling's native CPU path (kernels/sampling.cpp) against the torch path it replaces
on CPU: the same kept tokens under temperature, min_p, top_k and top_p, up to a float
sum rounding across a boundary (counted, and bounded); probabilities equal to float32
rounding; and draws equal to torch's inversion token for token, for the same uniforms."""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from verispec import kernels
from verispec.config import SamplingParams
from verispec.step.sampling import logits_to_probs, make_generator, sample, torch_draw, torch_probs

pytestmark = pytest.mark.skipif(not kernels.available(), reason="needs the native kernels")

VOCAB = 49152  # the default model's vocabulary
PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=0.7, top_p=1e-6),
    SamplingParams(temperature=1.3, top_p=0.999),
    SamplingParams(temperature=0.7, top_k=1),
    SamplingParams(temperature=0.7, top_k=40),
    SamplingParams(temperature=1.0, top_k=40, top_p=0.8),
    SamplingParams(temperature=0.7, min_p=0.05),
    SamplingParams(temperature=0.7, min_p=1.0),  # the top token alone: its weight is exactly 1
    SamplingParams(temperature=0.7, min_p=0.05, top_k=20, top_p=0.95),
    SamplingParams(temperature=0.5, top_k=VOCAB - 1),
]


def rows(kind: str, n: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    base = torch.randn(n, vocab, generator=gen)  # [n, vocab]
    if kind == "peaked":
        return base * 4
    if kind == "flat":
        return base * 0.05  # nuclei of tens of thousands: the candidates' last resort
    if kind == "ties":
        return (base * 2).round()  # a few dozen distinct values
    if kind == "bf16":
        return (base * 6).to(torch.bfloat16).float()  # the native backend's logits
    if kind == "masked":  # a grammar's or a logit bias's -inf on most of the row
        return (base * 3).masked_fill(base > -1.0, float("-inf"))
    raise AssertionError(kind)


def exact_keep(logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rules in float64 on one [vocab] row: (kept tokens, each token's probability
    under the rules before top_p, each token's mass before it in that order)."""
    tempered = logits.double() / params.temperature
    probs = tempered.softmax(-1)
    if params.min_p:
        tempered = tempered.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    if params.top_k and params.top_k < tempered.numel():
        tempered = tempered.masked_fill(tempered < torch.topk(tempered, params.top_k).values[-1], float("-inf"))
    probs = tempered.softmax(-1)
    ordered, order = torch.sort(probs, descending=True, stable=True)
    before = torch.empty_like(probs).scatter_(0, order, ordered.cumsum(0) - ordered)
    keep = (probs > 0) & (before < params.top_p) if params.top_p < 1.0 else probs > 0
    return keep, probs, before


@pytest.mark.parametrize("kind", ["peaked", "flat", "ties", "bf16", "masked"])
def test_kept_tokens_are_the_exact_rules_and_probabilities_match_the_torch_path(kind):
    gen = torch.Generator().manual_seed(len(kind))
    logits = rows(kind, 6, VOCAB, gen)  # [6, vocab]
    near = 0
    for params in PARAMS:
        fast = logits_to_probs(logits, params)
        ref = torch_probs(logits, params)
        assert fast.shape == ref.shape and fast.dtype == torch.float32
        assert torch.allclose(fast.sum(-1), torch.ones(logits.shape[0]))
        for row in range(logits.shape[0]):
            keep, probs, before = exact_keep(logits[row], params)
            differ = torch.nonzero((fast[row] > 0) != keep).flatten()
            differ = differ[probs[differ] >= 1e-30]  # weights the kernel's exp flushes to zero
            if differ.numel():
                boundary = probs[keep].min()
                if int((fast[row] > 0).sum()) == int(keep.sum()) and bool((probs[differ] == boundary).all()):
                    continue  # tied tokens exchanged at the boundary (the order among ties is free)
                # Otherwise only within float32 rounding of a boundary: the kernel's
                # weights are float32 exps, its sums float64.
                assert bool(((before[differ] - params.top_p).abs() < 1e-6).all()), (params, row)
                near += 1
                continue
            # Where torch's float32 sums agree on the kept tokens, the probabilities agree.
            if torch.equal(fast[row] > 0, ref[row] > 0):
                torch.testing.assert_close(fast[row], ref[row], rtol=2e-5, atol=1e-9)
            else:
                # Tied tokens exchanged at the boundary, or torch's float32 cumsum of a
                # nucleus of thousands dropping a sliver of mass.
                changed = probs[(fast[row] > 0) != (ref[row] > 0)]
                assert bool((changed == changed[0]).all()) or (
                    int(keep.sum()) > 1000 and float(changed.sum()) < 2e-5), (params, row)
    assert near <= 2  # of 66 rows


def test_the_most_likely_token_is_always_kept_and_top_k_keeps_its_ties():
    logits = torch.tensor([[3.0, 1.0, 3.0, 2.0, 2.0, 2.0, -1.0]])  # [1, 7]
    keep = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=3)) > 0
    assert keep.tolist() == [[True, False, True, True, True, True, False]]  # the k-th value's ties
    keep = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=1e-9)) > 0
    assert int(keep.sum()) == 1 and bool(keep[0, 0] | keep[0, 2])


@pytest.mark.parametrize("vocab", [1, 7, 16, 17, 300])
def test_small_vocabularies_and_shapes(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(2, 3, vocab, generator=gen) * 3  # [2, 3, vocab]
    for params in PARAMS:
        fast = logits_to_probs(logits, params)
        assert fast.shape == logits.shape
        assert torch.equal(fast > 0, torch_probs(logits, params) > 0)
        torch.testing.assert_close(fast, torch_probs(logits, params), rtol=2e-5, atol=1e-9)
    one = logits[0, 0]  # [vocab]: one row, 1-D
    assert logits_to_probs(one, PARAMS[1]).shape == (vocab,)


def test_a_row_with_no_finite_logit_or_a_nan_takes_the_torch_path():
    bad = torch.zeros(2, 40)
    bad[0] = float("-inf")
    bad[1, 3] = float("nan")
    assert kernels.sampling_probs(bad, 0.7, 0.0, 0, 0.9) is None
    assert torch.equal(logits_to_probs(bad, PARAMS[1]).isnan(), torch_probs(bad, PARAMS[1]).isnan())


def test_logits_that_need_a_gradient_keep_the_torch_path():
    logits = torch.randn(2, 50, requires_grad=True)
    probs = logits_to_probs(logits, PARAMS[1])
    assert probs.grad_fn is not None
    torch.testing.assert_close(probs, torch_probs(logits, PARAMS[1]))


def test_draws_equal_the_torch_inversion_for_the_same_uniforms():
    gen = torch.Generator().manual_seed(11)
    logits = torch.cat([rows("peaked", 4, VOCAB, gen), rows("flat", 2, VOCAB, gen)])  # [6, vocab]
    cases = [logits_to_probs(logits, SamplingParams(temperature=0.7, top_p=0.9)),  # sparse rows
             logits_to_probs(logits, SamplingParams(temperature=1.0)),  # dense rows
             torch.rand(6, VOCAB, generator=gen) * 3.0,  # unnormalized
             torch.zeros(6, VOCAB).index_fill_(1, torch.tensor([5, 49000]), 1e-30),  # tiny mass
             torch.zeros(6, VOCAB)]  # no mass: the last token
    edges = torch.tensor([0.0, 2.0 ** -53, 0.5, 1.0 - 2.0 ** -53], dtype=torch.float64)
    for probs in cases:
        for _ in range(50):
            uniforms = torch.rand(6, generator=gen, dtype=torch.float64)
            assert torch.equal(kernels.sampling_draw(probs, uniforms), torch_draw(probs, uniforms))
        for u in edges:
            uniforms = u.repeat(6)
            assert torch.equal(kernels.sampling_draw(probs, uniforms), torch_draw(probs, uniforms))


def test_sampled_tokens_follow_the_torch_paths_distribution():
    # A row whose nucleus under top_k 40, top_p 0.9 holds a handful of tokens of clearly
    # different probability: the kernel's draws against torch_probs' probabilities.
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(VOCAB, generator=gen)
    logits[[17, 900, 30000, 49151, 4]] += torch.tensor([9.0, 8.5, 8.0, 7.5, 7.0])
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9)
    expected = torch_probs(logits, params).double()
    support = torch.nonzero(expected > 0).flatten()
    assert 3 <= support.numel() <= 10
    probs = logits_to_probs(logits, params)
    draws_gen = make_generator(0)
    draws = torch.tensor([int(sample(probs, draws_gen)) for _ in range(20000)])
    counts = torch.bincount(draws, minlength=VOCAB).double()
    assert counts.sum() == counts[support].sum()  # nothing outside the torch path's support
    assert chisquare(counts[support].numpy(), (expected[support] * 20000).numpy()).pvalue > 1e-3
