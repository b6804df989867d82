"""Adaptive k (verispec.policy.adaptive.AdaptiveK) on synthetic acceptances and step times,
driven through its Plan / Outcome interface: no models."""
from __future__ import annotations

import json

import numpy as np
import pytest
from adaptive_support import (
    DRAFT,
    MAX_K,
    NGRAM,
    PROFILE,
    T1,
    EvenWorld,
    Step,
    World,
    learn,
    run,
    static,
)

from verispec.bench.calculator import expected_speedup, optimal_k
from verispec.policy import adaptive as policy_module
from verispec.policy.adaptive import PROBE_K, AdaptiveK
from verispec.policy.economics import CostModel, best_rate, load_profile, tokens_per_pass
from verispec.policy.look_again import LookAgain
from verispec.policy.plan import Outcome


@pytest.fixture
def long_memory(monkeypatch):
    """Acceptance that barely forgets: the estimates converge on a steady world."""
    monkeypatch.setattr(policy_module, "HALF_LIFE", 256.0)


@pytest.mark.parametrize("alpha, cost", [
    (0.8, CostModel(verify_overhead=0.1)),
    (0.5, NGRAM),
    (0.5, DRAFT),
    (0.9, PROFILE),
    (0.7, CostModel(draft_cost=0.2, verify_overhead=0.1)),
    (0.1, DRAFT),
])
def test_choice_converges_to_optimal_k(alpha, cost, long_memory):
    expected = optimal_k(alpha, cost, MAX_K).k
    controller = AdaptiveK(MAX_K, cost)
    run(controller, EvenWorld(alpha, cost), 600)
    assert controller.choose(MAX_K) == expected
    # The economics core on the true alpha and cost picks the same k, at the speedup
    # of the closed form (seconds in units of T(1), so the rate is the speedup).
    best = best_rate(tokens_per_pass([alpha] * MAX_K), [cost.pass_cost(k) for k in range(MAX_K + 1)])
    assert best.k == expected
    assert best.rate == pytest.approx(expected_speedup(alpha, expected, cost))


def test_measured_profile_file(tmp_path, long_memory):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"n": [1, 2, 4, 8, 16],
                                "seconds": [0.02, 0.0202, 0.0206, 0.024, 0.04],
                                "draft_cost_per_token": 0.03}))
    cost = load_profile(path)
    expected = optimal_k(0.85, cost, MAX_K).k
    controller = AdaptiveK(MAX_K, cost)
    run(controller, EvenWorld(0.85, cost), 600)
    assert controller.choose(MAX_K) == expected


def test_online_timing_overrides_a_wrong_prior(long_memory):
    truth = CostModel(draft_cost=0.0, verify_overhead=0.05)
    prior = CostModel(draft_cost=0.3, verify_overhead=0.5)
    assert optimal_k(0.8, prior, MAX_K).k < optimal_k(0.8, truth, MAX_K).k
    controller = AdaptiveK(MAX_K, prior)
    run(controller, EvenWorld(0.8, truth), 600)
    assert controller.choose(MAX_K) == optimal_k(0.8, truth, MAX_K).k
    best = controller.best(MAX_K)  # its rate in tokens/s; times T(1), the speedup
    assert best.rate * controller.step_seconds(0)[0] == pytest.approx(
        optimal_k(0.8, truth, MAX_K).speedup, rel=0.02)


@pytest.mark.parametrize("cost", [NGRAM, DRAFT])
def test_hopeless_drafts_fall_back_to_plain_with_sparse_probes(cost):
    controller, world = AdaptiveK(MAX_K, cost), World([0.0], cost, seed=1)
    _, first = run(controller, world, 20)
    assert (first == 0).any()
    probes = controller.probes
    _, ks = run(controller, world, 980)
    after = ks[80:]
    # After warm-up every speculative step is a scheduled probe of PROBE_K,
    # and failed probes space themselves out.
    assert np.count_nonzero(after) / after.size < 0.03
    assert np.count_nonzero(ks) == controller.probes - probes
    assert set(after[after > 0]) <= {PROBE_K}


@pytest.mark.parametrize("alpha, cost", [
    (0.8, NGRAM), (0.95, NGRAM), (0.2, CostModel(verify_overhead=0.1)),
    (0.5, DRAFT), (0.9, PROFILE), (0.6, CostModel(draft_cost=0.2, verify_overhead=0.1)),
])
def test_adaptive_throughput_near_best_static(alpha, cost):
    steps = 3000
    adaptive, _ = run(AdaptiveK(MAX_K, cost), World([alpha], cost, seed=2, noise=0.05), steps,
                      shadow=cost.draft_cost == 0)
    best = max(static(k, World([alpha], cost, seed=3 + k, noise=0.05), steps)
               for k in range(MAX_K + 1))
    assert adaptive >= 0.95 * best


def test_draft_model_at_low_alpha_is_never_slower_than_plain():
    steps = 3000
    adaptive, _ = run(AdaptiveK(MAX_K, DRAFT), World([0.35], DRAFT, seed=4, noise=0.05), steps)
    plain = static(0, World([0.35], DRAFT, seed=5, noise=0.05), steps)
    long_drafts = static(10, World([0.35], DRAFT, seed=6, noise=0.05), steps)
    assert adaptive >= 0.97 * plain
    assert long_drafts < 0.8 * plain


class Shift(World):
    def __init__(self, before: float, after: float, at: int, cost: CostModel, seed: int = 0):
        super().__init__([before], cost, seed)
        self.after, self.at, self.steps = after, at, 0

    def step(self, k: int) -> Step:
        self.steps += 1
        if self.steps > self.at:
            self.alphas = [self.after]
        return super().step(k)


@pytest.mark.parametrize("cost", [DRAFT, NGRAM])
def test_regime_change_drops_k_within_a_few_half_lives(cost):
    """Forgetting alone (half-life 16 steps) follows an abrupt change within about four
    half-lives. (A change detector that reset the counts did it within 30 steps; it
    gained nothing on the bench's replay and went: docs/notebook/house_policy.md.)"""
    # A free proposer reports shadows at k = 0; a draft model relies on probes.
    high, low = optimal_k(0.9, cost, MAX_K), optimal_k(0.1, cost, MAX_K)
    assert high.k >= 5 and low.k <= 1
    controller = AdaptiveK(MAX_K, cost)
    _, ks = run(controller, Shift(0.9, 0.1, 200, cost, seed=7), 400,
                shadow=cost.draft_cost == 0)
    assert np.median(ks[150:200]) >= high.k - 3
    assert ks[264:].max() <= 2
    assert np.median(ks[264:]) == low.k
    # Near break-even the estimate wanders between neighbours of the optimum;
    # what matters is the rate those choices get at the true alpha.
    rate = np.mean([expected_speedup(0.1, k, cost) for k in ks[264:]])
    assert rate >= 0.97 * low.speedup


def test_per_depth_estimates_converge(monkeypatch):
    truth = [0.9, 0.7, 0.5, 0.3]
    world = World(truth, NGRAM, seed=8)
    # A long memory isolates the estimator itself.
    monkeypatch.setattr(policy_module, "HALF_LIFE", 2000.0)
    controller = AdaptiveK(MAX_K, NGRAM)
    for _ in range(4000):
        world.step(4).teach(controller)
    np.testing.assert_allclose(controller.alphas[:4], truth, atol=0.05)


def test_unvisited_depths_inherit_the_deepest_estimate():
    controller = AdaptiveK(MAX_K, NGRAM)
    for _ in range(50):
        learn(controller, 1, 1, 1)
    assert controller.alphas[0] > 0.95
    assert np.all(controller.alphas[1:] == pytest.approx(controller.alphas[0]))


def test_shadows_replace_probes_and_lead_out_of_plain():
    controller = AdaptiveK(MAX_K, DRAFT)
    for _ in range(30):
        learn(controller, 2, 2, 0)
    assert controller.choose(MAX_K) == 0
    ks = []
    for step in range(200):
        ks.append(controller.choose(MAX_K))
        learn(controller, 0, 0, 0, verify=T1, shadow=int(step % 10 == 0))
    assert not any(ks) and controller.probes == 0
    for _ in range(20):
        learn(controller, 0, 0, 0, shadow=1)
    assert controller.choose(MAX_K) > 0


def test_probes_recover_when_text_becomes_predictable():
    controller = AdaptiveK(MAX_K, DRAFT)
    _, ks = run(controller, Shift(0.0, 0.9, 300, DRAFT, seed=9), 600)
    assert np.count_nonzero(ks[100:300]) <= 6  # only probes while drafts are hopeless
    # The first probe after the change comes within the capped interval (64),
    # and an accepted probe shortens the interval again.
    recovered = next(t for t in range(300, 600) if ks[t:t + 20].min() >= 3)
    assert recovered - 300 <= 120
    assert np.median(ks[-100:]) >= optimal_k(0.9, DRAFT, MAX_K).k - 2


def test_room_left_caps_the_choice():
    controller = AdaptiveK(MAX_K, NGRAM)
    for _ in range(50):
        learn(controller, 8, 8, 8)
    assert controller.choose(3) == 3
    assert controller.choose(0) == 0


@pytest.mark.parametrize("kwargs", [
    dict(fed=1, reached=1, accepted=2, rejected=False),
    dict(fed=-1, reached=0, accepted=0, rejected=False),
    dict(fed=1, reached=1, accepted=0, rejected=True, verify_seconds=float("nan")),
    dict(fed=2, reached=3, accepted=0, rejected=True),
])
def test_outcome_validation(kwargs):
    with pytest.raises(ValueError):
        Outcome(**kwargs)


def test_untimed_steps_leave_the_cost_prior_alone():
    controller = AdaptiveK(MAX_K, NGRAM)
    for _ in range(20):
        learn(controller, 4, 4, 4, 0.0, 0.0)
    np.testing.assert_allclose(controller.step_seconds(4),
                               [NGRAM.pass_cost(k) for k in range(5)])


def test_shadow_and_cadence_validation():
    with pytest.raises(ValueError):
        learn(AdaptiveK(MAX_K), 0, 0, 0, shadow=2)
    with pytest.raises(ValueError):
        LookAgain(128, 64)


def test_seeded_prior_starts_at_the_given_alpha_and_yields_to_evidence():
    controller = AdaptiveK(MAX_K, NGRAM)
    controller.seed(0.1, 4.0)
    assert controller.alphas[0] == pytest.approx(0.1) and controller.alphas[5] == pytest.approx(0.1)
    for _ in range(40):
        learn(controller, 4, 4, 4)
    assert controller.alphas[0] > 0.9
    with pytest.raises(ValueError):
        controller.seed(1.5, 4.0)


