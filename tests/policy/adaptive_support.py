"""A synthetic world for adaptive k (verispec.policy.adaptive.AdaptiveK): per-depth Bernoulli
acceptance and a modelled step time, the steps a request would report through Plan and
Outcome, and the throughput of a policy or a static k in it. No models."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verispec.policy.acceptance import Evidence
from verispec.policy.adaptive import AdaptiveK
from verispec.policy.economics import CostModel
from verispec.policy.plan import Outcome, Plan

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
