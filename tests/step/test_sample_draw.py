"""sampling.sample draws by inversion of the cumulative mass: the categorical
distribution of each row, never a token of zero mass, unnormalized rows too."""
from __future__ import annotations

import torch
from scipy.stats import chisquare

from verispec.step.sampling import make_generator, sample


def test_draws_follow_each_row_and_skip_zero_mass():
    probs = torch.tensor([[0.0, 0.1, 0.0, 0.4, 0.2, 0.3, 0.0],
                          [0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5],
                          [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]])  # [3, 7]; the last unnormalized
    gen = make_generator(0)
    draws = torch.stack([sample(probs, gen) for _ in range(20000)])  # [20000, 3]
    for row in range(3):
        counts = torch.bincount(draws[:, row], minlength=7).double()
        mass = probs[row].double()
        support = mass > 0
        assert counts[~support].sum() == 0
        if support.sum() > 1:
            expected = mass[support] / mass.sum() * counts.sum()
            assert chisquare(counts[support].numpy(), expected.numpy()).pvalue > 1e-3
    assert sample(probs[0], gen).shape == ()  # one row in, one token out


def test_a_uniform_at_the_top_draws_the_last_token_of_positive_mass(monkeypatch):
    top = 1.0 - 2.0 ** -53
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.full(shape, top,
                                                                       dtype=torch.float64))
    probs = torch.tensor([[0.3, 0.7, 0.0, 0.0], [1e-30, 0.0, 1e-30, 0.0]])
    assert sample(probs, make_generator(0)).tolist() == [1, 2]
