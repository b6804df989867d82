"""Frequency drafts (verispec.proposers.ngram_sampled): each draft token is drawn
from the continuation counts it reports, and sampled output through ngram and
suffix with them is exactly the target's; the same test catches drafts
misreported as one-hot."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from conftest import tiny_target
from test_head_equality import _exact_marginals, _first_two_counts, _worst_pvalue
from verispec import Engine, SamplingParams
from verispec.proposers import ngram_sampled
from verispec.proposers.base import Proposal
from verispec.proposers.ngram import NgramIndex
from verispec.proposers.ngram_sampled import frequency_chain
from verispec.spec_text import parse_spec

# After [1, 2] the context went on with 3 twice, 4 once and 5 once: drafts disagree.
PROMPT = [1, 2, 3, 6, 1, 2, 4, 7, 1, 2, 3, 6, 1, 2, 5, 0, 1, 2]


def test_rows_are_the_sharpened_counts_and_tokens_follow_them():
    paths = [[1, 2], [1, 2], [1, 3], [4]]
    generator = torch.Generator().manual_seed(0)
    first = np.zeros(8)
    for _ in range(2000):
        chain = frequency_chain(paths, 2, vocab=8, temperature=0.5, generator=generator,
                                stop=frozenset())
        rows = chain.draft_probs.numpy()
        # counts 3 : 1 at temperature 0.5 are 9 : 1
        assert rows[0, 1] == pytest.approx(0.9) and rows[0, 4] == pytest.approx(0.1)
        tokens = chain.tokens.tolist()
        first[tokens[0]] += 1
        if tokens[0] == 1:  # below 1: 2 twice, 3 once -> 4 : 1
            assert len(tokens) == 2 and rows[1, 2] == pytest.approx(0.8)
            assert rows[1].sum() == pytest.approx(1.0)
        else:  # nothing followed 4
            assert tokens == [4] and rows.shape == (1, 8)
    assert chisquare(first[[1, 4]], [1800, 200]).pvalue > 1e-3
    stopped = frequency_chain([[5, 6]], 2, 8, 1.0, generator, stop=frozenset({5}))
    assert stopped.tokens.tolist() == [5]
    short = frequency_chain([[1, 2], [3, 4], [3, 4]], 2, 8, 1.0, generator, frozenset(),
                            min_share=0.5)
    assert len(short) == 1 or short.tokens.tolist() == [3, 4]


def test_occurrences_count_every_match_of_the_longest_suffix():
    index = NgramIndex(1, 3)
    index.update(PROMPT)
    # [5, 0, 1, 2]'s longest earlier match is [1, 2], at four places, oldest first.
    assert index.longest_match() == 2
    assert index.occurrences(2, limit=64) == [[3, 6], [4, 7], [3, 6], [5, 0]]
    assert index.occurrences(2, limit=1) == [[5, 0]]
    index.update(PROMPT + [3])  # [1, 2, 3] came twice, both times followed by 6
    assert index.longest_match() == 3 and index.occurrences(2, 64) == [[6, 1], [6, 1]]


@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
def test_sampled_output_follows_the_target(proposer, full_size_runs):
    """1000 seeded three-token requests on a vocab-8 target at T = 2: the first and
    second tokens' marginals pass chi-square against the target's exact ones,
    and the drawn drafts are often accepted and often not."""
    target = tiny_target(11, layers=1, vocab=8)
    runs, temperature = full_size_runs, 2.0
    spec = parse_spec(proposer=proposer, k=2, frequency_drafts=True, suffix_min_prob=0.0)
    counts, drafted, accepted = _first_two_counts(Engine(target), PROMPT, spec, temperature, runs)
    assert drafted >= runs and 0.1 * drafted < accepted < 0.9 * drafted
    assert _worst_pvalue(counts, _exact_marginals(target, PROMPT, temperature), runs) > 1e-3


def test_distribution_check_catches_a_draft_not_drawn_from_its_row(monkeypatch, full_size_runs):
    """Control: the likeliest continuation proposed while the counts' row is reported
    as its draft distribution biases the output, and the check above sees it. (The
    reverse, a drawn token reported as one-hot, is lossless, only accepted less: a
    draft chosen without the verifier's randomness is verified exactly as a fixed one.)"""
    honest = ngram_sampled.frequency_chain

    def argmax_of_row(*args, **kw):
        rows = honest(*args, **kw).draft_probs
        if rows is None:
            return Proposal.empty()
        return Proposal(rows[:1].argmax(dim=-1), rows[:1])

    monkeypatch.setattr(ngram_sampled, "frequency_chain", argmax_of_row)
    target = tiny_target(11, layers=1, vocab=8)
    runs, temperature = full_size_runs, 2.0
    spec = parse_spec(proposer="ngram", k=2, frequency_drafts=True)
    counts, _, _ = _first_two_counts(Engine(target), PROMPT, spec, temperature, runs)
    assert _worst_pvalue(counts, _exact_marginals(target, PROMPT, temperature), runs) < 1e-6


def test_greedy_requests_keep_deterministic_drafts():
    target = tiny_target(11, layers=1, vocab=8)
    engine = Engine(target)
    plain = engine.generate(PROMPT, SamplingParams(max_new_tokens=12), parse_spec(proposer="none"))
    got = engine.generate(PROMPT, SamplingParams(max_new_tokens=12),
                          parse_spec(proposer="ngram", k=3, frequency_drafts=True))
    assert got.token_ids == plain.token_ids and got.stats.drafted > 0
