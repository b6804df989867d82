"""The rejection sampler: table cases from one-hot logits, and distribution
tests showing the emitted tokens follow the target, not the draft."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from verispec.config import SamplingParams
from verispec.step.rejection import verify_greedy, verify_sampling
from verispec.step.sampling import greedy_tokens, logits_to_probs, make_generator

V = 8


def one_hot_logits(tokens: list[int], vocab: int = V) -> torch.Tensor:
    logits = torch.full((len(tokens), vocab), -10.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 10.0
    return logits  # [len(tokens), vocab]


@pytest.mark.parametrize("drafts, target, accepted, emitted, bonus", [
    ([1, 2, 3], [1, 2, 3, 4], 3, [1, 2, 3, 4], True),    # all accepted, bonus token
    ([1, 5, 3], [1, 2, 3, 4], 1, [1, 2], False),         # first mismatch at index 1
    ([7, 2, 3], [1, 2, 3, 4], 0, [1], False),            # first draft rejected
    ([], [6], 0, [6], True),                             # empty draft: plain decoding
])
def test_greedy_table(drafts, target, accepted, emitted, bonus):
    verdict = verify_greedy(torch.tensor(drafts, dtype=torch.long), one_hot_logits(target))
    assert (verdict.num_accepted, verdict.tokens, verdict.bonus) == (accepted, emitted, bonus)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_match_torch_argmax_including_ties(dtype):
    # The fast argmax must pick torch.argmax's token everywhere, or speculative and
    # plain greedy could part at a tie: bf16 logits of a 49k vocabulary tie often.
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 49152, generator=gen).to(dtype)  # [rows, vocab]
    logits[1, [40, 7, 30000]] = 50.0  # a three-way tie: the first index wins
    logits[2] = 0.0  # all equal
    logits[3, 11] = float("nan")  # torch treats NaN as the maximum
    assert greedy_tokens(logits) == logits.argmax(-1).tolist()
    assert greedy_tokens(logits)[1:3] == [7, 0]
    assert greedy_tokens(logits[4]) == int(logits[4].argmax())
    assert greedy_tokens(logits[:, ::3]) == logits[:, ::3].argmax(-1).tolist()  # strided view


@pytest.mark.parametrize("drafts, target, accepted, emitted", [
    ([1, 2, 3], [1, 2, 3, 4], 3, [1, 2, 3, 4]),
    ([1, 5, 3], [1, 2, 3, 4], 1, [1, 2]),
    ([], [6], 0, [6]),
])
def test_sampling_table_with_one_hot_target(drafts, target, accepted, emitted):
    # With a one-hot target the sampler has no freedom: it must behave like greedy,
    # whether the draft is deterministic (None) or a spread distribution.
    sampling = SamplingParams(temperature=1.0)
    target_probs = logits_to_probs(one_hot_logits(target, V) * 5, sampling)
    spread = torch.full((len(drafts), V), 1.0 / V)
    for draft_probs in (None, spread):
        verdict = verify_sampling(torch.tensor(drafts, dtype=torch.long), draft_probs,
                                  target_probs, make_generator(0))
        assert verdict.num_accepted == accepted
        assert verdict.tokens == emitted


def _distributions(seed: int, k: int):
    gen = torch.Generator().manual_seed(seed)
    target = torch.rand(k + 1, V, generator=gen) ** 3  # peaked and different from the draft
    draft = torch.rand(k, V, generator=gen)
    return target / target.sum(-1, keepdim=True), draft / draft.sum(-1, keepdim=True)


def _speculative_samples(target: torch.Tensor, draft: torch.Tensor | None, k: int,
                         runs: int, length: int, seed: int) -> np.ndarray:
    """Generate `runs` sequences of `length` tokens from a context-free target
    (position p has distribution target[p]) by draft-then-verify steps."""
    gen = make_generator(seed)
    out = np.empty((runs, length), dtype=np.int64)
    for r in range(runs):
        seq: list[int] = []
        while len(seq) < length:
            p = len(seq)
            n = min(k, length - p - 1)
            if draft is None:  # a deterministic proposer always guesses token 0
                drafts, draft_probs = torch.zeros(n, dtype=torch.long), None
            else:
                draft_probs = draft[p:p + n]
                drafts = torch.multinomial(draft_probs, 1, generator=gen).squeeze(-1) if n else \
                    torch.empty(0, dtype=torch.long)
            verdict = verify_sampling(drafts, draft_probs, target[p:p + n + 1], gen)
            seq.extend(verdict.tokens)
        out[r] = seq[:length]
    return out


@pytest.mark.parametrize("use_draft_probs", [True, False])
def test_emitted_tokens_follow_the_target(use_draft_probs):
    """1e5 seeded sequences; every position's empirical distribution must pass a
    chi-square test against the target (p > 1e-3) with total variation < 0.01,
    while the same test rejects the draft's distribution (a control that shows
    the test can fail)."""
    length = k = 3
    runs = 100_000
    target = _distributions(2, length - 1)[0]  # [length, V]
    draft = _distributions(3, length)[1]  # [length, V]
    samples = _speculative_samples(target, draft if use_draft_probs else None, k,
                                   runs, length, seed=7)
    for pos in range(length):
        counts = np.bincount(samples[:, pos], minlength=V)
        target_pos = target[pos].double().numpy()
        target_pos /= target_pos.sum()
        assert chisquare(counts, target_pos * runs).pvalue > 1e-3, f"position {pos}"
        tv = 0.5 * np.abs(counts / runs - target_pos).sum()
        assert tv < 0.01, f"position {pos}: total variation {tv:.4f}"
        if use_draft_probs:
            wrong = draft[pos].double().numpy()
            assert chisquare(counts, wrong / wrong.sum() * runs).pvalue < 1e-6


def test_top_k_and_top_p_never_emit_a_masked_token():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=gen) * 3  # [k + 1, vocab]
    for params in (SamplingParams(temperature=1.0, top_k=3),
                   SamplingParams(temperature=0.7, top_p=0.5),
                   SamplingParams(temperature=1.3, top_k=10, top_p=0.8)):
        target_probs = logits_to_probs(logits, params)
        allowed = target_probs > 0
        assert (allowed.sum(-1) >= 1).all()
        if params.top_k:
            assert (allowed.sum(-1) <= params.top_k).all()
        # An adversarial draft that only proposes masked tokens, uniformly.
        draft_probs = (~allowed[:3]).float()
        draft_probs /= draft_probs.sum(-1, keepdim=True)
        sampler = make_generator(1)
        for _ in range(300):
            drafts = torch.multinomial(draft_probs, 1, generator=sampler).squeeze(-1)
            verdict = verify_sampling(drafts, draft_probs, target_probs, sampler)
            for pos, token in enumerate(verdict.tokens):
                assert allowed[pos, token], f"masked token {token} emitted at {pos}"


def test_top_p_keeps_the_nucleus():
    probs = logits_to_probs(torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])),
                            SamplingParams(temperature=1.0, top_p=0.8))
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    greedy = logits_to_probs(torch.tensor([[0.1, 2.0, 0.3]]), SamplingParams())
    assert greedy.tolist() == [[0.0, 1.0, 0.0]]
