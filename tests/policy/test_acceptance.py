"""The policy's shared estimators: per-depth acceptance (verispec.policy.acceptance) and the
one look-again cadence (verispec.policy.look_again)."""
from __future__ import annotations

import numpy as np
import pytest

from verispec.policy.acceptance import DepthAcceptance
from verispec.policy.look_again import LookAgain


@pytest.mark.parametrize("seed", range(6))
def test_depth_acceptance_equals_the_full_vector_update(seed):
    """The per-depth tallies, decaying only the depths ever counted, give exactly the
    alphas of decaying every depth's count vector each step."""
    rng = np.random.default_rng(seed)
    depth, half_life, prior, strength, pool = 8, float(rng.uniform(2, 32)), 0.4, 2.0, 1.0
    estimate = DepthAcceptance(depth, half_life, prior, strength, pool)
    gamma = 0.5 ** (1.0 / half_life)
    succ, fail = np.zeros(depth), np.zeros(depth)
    succ[0], fail[0] = prior * strength, (1 - prior) * strength
    for _ in range(60):
        drafted = int(rng.integers(0, 12))
        accepted = int(rng.integers(0, drafted + 1))
        estimate.add(accepted, accepted < drafted)
        if drafted:
            succ, fail = succ * gamma, fail * gamma
            succ[:min(accepted, depth)] += 1.0
            if accepted < min(drafted, depth):
                fail[accepted] += 1.0
        counts = succ + fail
        want, parent, weight = np.empty(depth), prior, 0.0
        reached = int(np.flatnonzero(counts > 0)[-1]) + 1
        for i in range(reached):
            parent = (succ[i] + weight * parent) / (counts[i] + weight)
            want[i], weight = parent, pool
        want[reached:] = parent
        np.testing.assert_array_equal(estimate.alphas, want)


def test_look_again_backs_off_while_looks_find_nothing():
    """The one cadence (verispec.policy.look_again): a look every `interval` steps, the interval
    doubling to its limit while looks find nothing and back to its start when one finds
    something; a fixed interval never moves; 0 never looks."""
    probes = LookAgain(2, 8)
    due = [step for step in range(1, 39) if probes.due() and not probes.found_nothing()]
    assert due == [2, 6, 14, 22, 30, 38] and probes.looks == 6
    probes.found()
    assert [probes.due() for _ in range(2)] == [False, True]
    explore = LookAgain(16)
    turns = [explore.looks for _ in range(64) if explore.due()]
    assert turns == [1, 2, 3, 4]
    explore.found_nothing()
    assert explore.interval == 16
    never = LookAgain(0)
    assert not any(never.due() for _ in range(100))
