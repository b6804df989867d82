"""Adaptive k (verispec.policy.AdaptiveK) on synthetic acceptances and step times,
driven through its Plan / Outcome interface: no models."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from verispec import policy as policy_module
from verispec.acceptance import Evidence
from verispec.cadence import LookAgain
from verispec.economics import (
    CostModel,
    best_rate,
    expected_speedup,
    expected_tokens,
    load_profile,
    optimal_k,
    tokens_per_pass,
)
from verispec.plan import Outcome, Plan
from verispec.policy import PROBE_K, AdaptiveK

T1 = 0.02  # simulated seconds of one plain decode step
MAX_K = 12
NGRAM = CostModel(draft_cost=0.0, verify_overhead=0.05)
DRAFT = CostModel(draft_cost=0.1, verify_overhead=0.05)
# A GPU-like measured shape: flat while memory-bound, then a knee.
PROFILE = CostModel(draft_cost=0.02, profile=(1.0, 1.01, 1.02, 1.03, 1.05, 1.08, 1.15, 1.3,
                                               1.45, 1.6, 1.75, 1.9, 2.05, 2.2))


def learn(policy: AdaptiveK, k: int, drafted: int, accepted: int, draft: float = 0.0,
          verify: float = 0.0, evidence: Evidence | None = None,
          shadow: int | None = None) -> None:
    """One verified chain step of `k` asked, `drafted` fed and `accepted` kept, as a
    request reports it; verify 0 is an untimed step (a stopped clock)."""
    policy.observe(Plan(k, shadow=shadow is not None, evidence=evidence),
                   Outcome(drafted, drafted, accepted, accepted < drafted, shadow=shadow,
                           draft_seconds=draft, verify_seconds=verify))


@dataclass
class Step:
    k: int
    accepted: int
    draft: float
    verify: float

    @property
    def tokens(self) -> int:
        return self.accepted + 1

    @property
    def seconds(self) -> float:
        return self.draft + self.verify

    def teach(self, policy: AdaptiveK, evidence: Evidence | None = None,
              shadow: int | None = None) -> None:
        learn(policy, self.k, self.k, self.accepted, self.draft, self.verify, evidence, shadow)


class World:
    """Synthetic ground truth: per-depth Bernoulli acceptance and a step-time
    model T1 * (k * c + T(k+1)/T(1)), optionally with lognormal timing noise."""

    def __init__(self, alphas, cost: CostModel, seed: int = 0, noise: float = 0.0):
        self.alphas = list(alphas)
        self.cost, self.noise = cost, noise
        self.rng = np.random.default_rng(seed)

    def alpha(self, depth: int) -> float:
        return self.alphas[min(depth, len(self.alphas) - 1)]

    def accept(self, k: int) -> int:
        accepted = 0
        while accepted < k and self.rng.random() < self.alpha(accepted):
            accepted += 1
        return accepted

    def step(self, k: int) -> Step:
        accepted = self.accept(k)
        jitter = self.rng.lognormal(0.0, self.noise, 2) if self.noise else np.ones(2)
        draft = T1 * k * self.cost.draft_cost * jitter[0]
        verify = T1 * self.cost.relative_time(k + 1) * jitter[1]
        return Step(k, accepted, draft, verify)


class EvenWorld(World):
    """Acceptance without sampling noise: each depth accepts exactly a fraction
    alpha of its trials (error diffusion, rounding to nearest so that a depth
    tried only a few times is not biased low), so an exact optimum is reachable."""

    def __init__(self, alpha: float, cost: CostModel):
        super().__init__([alpha], cost)
        self.carry = np.full(64, 0.5)

    def accept(self, k: int) -> int:
        accepted = 0
        while accepted < k:
            self.carry[accepted] += self.alphas[0]
            if self.carry[accepted] < 1.0:
                break
            self.carry[accepted] -= 1.0
            accepted += 1
        return accepted


def run(policy: AdaptiveK, world: World, steps: int, max_k: int = MAX_K,
        shadow: bool = False):
    """Throughput in tokens per simulated second, and the k chosen at each step.
    With `shadow`, plain steps report a free one-token shadow draft, as the
    engine does for n-gram lookup."""
    tokens, seconds, ks = 0, 0.0, []
    for _ in range(steps):
        k = policy.choose(max_k)
        out = world.step(k)
        out.teach(policy, shadow=world.accept(1) if shadow and k == 0 else None)
        tokens, seconds = tokens + out.tokens, seconds + out.seconds
        ks.append(k)
    return tokens / seconds, np.array(ks)


def static(k: int, world: World, steps: int) -> float:
    outs = [world.step(k) for _ in range(steps)]
    return sum(o.tokens for o in outs) / sum(o.seconds for o in outs)


@pytest.fixture
def long_memory(monkeypatch):
    """Acceptance that barely forgets: the estimates converge on a steady world."""
    monkeypatch.setattr(policy_module, "HALF_LIFE", 256.0)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.95])
@pytest.mark.parametrize("k", [0, 1, 4, 9])
def test_expected_tokens_reduces_to_economics(alpha, k):
    assert tokens_per_pass([alpha] * k)[k] == pytest.approx(expected_tokens(alpha, k))


def test_expected_tokens_depth_dependent():
    assert tokens_per_pass([0.9, 0.5, 0.5])[3] == pytest.approx(1 + 0.9 + 0.45 + 0.225)


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


class EvidenceWorld(World):
    """Steps of two kinds told apart by the draft's evidence, like n-gram lookup's
    matched suffix length: evidence 1 (a weak match, 60% of steps) is accepted
    with alpha 0.15 per depth, evidence 4 (a copy) with 0.9."""

    CLASSES = {1: (0.6, 0.15), 4: (0.4, 0.9)}

    def __init__(self, cost: CostModel, seed: int):
        super().__init__([0.0], cost, seed=seed)
        self.evidence = 1

    def next_evidence(self) -> int:
        self.evidence = 1 if self.rng.random() < self.CLASSES[1][0] else 4
        self.alphas = [self.CLASSES[self.evidence][1]]
        return self.evidence


def run_with_evidence(controller: AdaptiveK, world: EvidenceWorld, steps: int, keyed: bool):
    tokens, seconds, ks = 0, 0.0, {1: [], 4: []}
    for _ in range(steps):
        evidence = world.next_evidence()
        told = Evidence(evidence, 0.5) if keyed else None
        k = controller.choose(MAX_K, told)
        out = world.step(k)
        out.teach(controller, told, shadow=world.accept(1) if k == 0 else None)
        tokens, seconds = tokens + out.tokens, seconds + out.seconds
        ks[evidence].append(k)
    return tokens / seconds, {e: float(np.median(v)) for e, v in ks.items()}


@pytest.mark.parametrize("overhead", [0.05, 0.2])
def test_evidence_keyed_k_beats_every_static_k(overhead):
    """Pooled acceptance can only pick one k for copy steps and free steps alike; keyed
    by the proposer's evidence, the controller drafts long on copies and little
    elsewhere, which beats the best static k (in this simulation by 22-36%). The
    priors here are neutral (0.5): the split is learned."""
    cost = CostModel(verify_overhead=overhead)
    steps = 3000
    keyed, ks = run_with_evidence(AdaptiveK(MAX_K, cost), EvidenceWorld(cost, 1), steps,
                                  keyed=True)
    pooled, pooled_ks = run_with_evidence(AdaptiveK(MAX_K, cost), EvidenceWorld(cost, 1), steps,
                                          keyed=False)
    best = 0.0
    for k in range(MAX_K + 1):
        world = EvidenceWorld(cost, 5 + k)
        outs = [(world.next_evidence(), world.step(k))[1] for _ in range(steps)]
        best = max(best, sum(o.tokens for o in outs) / sum(o.seconds for o in outs))
    assert keyed >= 1.15 * best
    assert pooled <= 1.05 * best  # without the evidence it is a static-k controller
    assert pooled_ks[1] == pooled_ks[4]
    assert ks[1] <= 1 and ks[4] >= optimal_k(0.9, cost, MAX_K).k - 1


def test_evidence_estimates_are_separate_and_pooled_alphas_see_everything():
    controller = AdaptiveK(MAX_K, NGRAM)
    for _ in range(40):
        controller.choose(MAX_K, Evidence(4, 0.5))
        learn(controller, 6, 6, 6, evidence=Evidence(4, 0.5))
        controller.choose(MAX_K, Evidence(1, 0.5))
        learn(controller, 6, 6, 0, evidence=Evidence(1, 0.5))
    assert controller.evidence_alphas(Evidence(4, 0.5))[0] > 0.9
    assert controller.evidence_alphas(Evidence(1, 0.5))[0] < 0.1
    assert 0.3 < controller.alphas[0] < 0.7
    # A key never seen reads its prior; no evidence reads the pooled estimate.
    assert (controller.evidence_alphas(Evidence(2, 0.3)) == 0.3).all()
    assert (controller.evidence_alphas(None) == controller.alphas).all()


def test_evidence_prior_sets_the_first_choice_and_yields_to_outcomes():
    """A new evidence key starts from the proposer's prior: a likely copy drafts
    long from its first step, a weak match drafts little, and outcomes that
    contradict a prior overturn it within a few steps."""
    controller = AdaptiveK(MAX_K, NGRAM)
    assert controller.choose(MAX_K, Evidence(4, 0.9)) >= 8
    assert controller.choose(MAX_K, Evidence(1, 0.2)) <= 1
    for _ in range(6):
        controller.choose(MAX_K, Evidence(4, 0.9))
        learn(controller, 8, 8, 0, evidence=Evidence(4, 0.9))
    assert controller.choose(MAX_K, Evidence(4, 0.9)) <= 1


@pytest.mark.parametrize("seed", range(6))
def test_depth_acceptance_equals_the_full_vector_update(seed):
    """The per-depth tallies, decaying only the depths ever counted, give exactly the
    alphas of decaying every depth's count vector each step."""
    from verispec.acceptance import DepthAcceptance

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
    """The one cadence (verispec.cadence): a look every `interval` steps, the interval
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
