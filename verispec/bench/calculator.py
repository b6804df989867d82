"""`verispec calc`'s arithmetic, for a user-given acceptance: the expected tokens per pass,
the speedup, the best k and the ceiling (Leviathan et al. 2023, section 3). The policy's own
estimators and the cost model it shares with this are in verispec.policy.economics."""
from __future__ import annotations

import math
from dataclasses import dataclass

from verispec.policy.economics import CostModel, best_rate, check_alpha, check_k, tokens_per_pass


def expected_tokens(alpha: float, k: int) -> float:
    """E(k) for a user-given alpha in [0, 1) at every depth and k >= 0 (checked):
    (1 - alpha^(k+1)) / (1 - alpha)."""
    return tokens_per_pass([check_alpha(alpha)] * check_k(k))[-1]


def expected_speedup(alpha: float, k: int, cost: CostModel) -> float:
    """Expected tokens per unit time relative to plain decoding (1.0 = break-even)."""
    return expected_tokens(alpha, k) / cost.pass_cost(k)


@dataclass(frozen=True)
class OptimalK:
    k: int
    speedup: float


def optimal_k(alpha: float, cost: CostModel, k_max: int = 32) -> OptimalK:
    """Best draft length in 0..k_max (`best_rate` over E(k) and the pass cost in plain
    decode steps, so the rate is the speedup)."""
    k_max = check_k(k_max, "k_max")
    best = best_rate(tokens_per_pass([check_alpha(alpha)] * k_max),
                     [cost.pass_cost(k) for k in range(k_max + 1)])
    return OptimalK(best.k, best.rate)


def ceiling(cost: CostModel) -> float:
    """Least upper bound of the speedup over every alpha < 1 and every k.

    As alpha -> 1, E -> k + 1, so the bound is sup_k (k+1) / pass_cost(k). For a
    linear cost this is max(1, 1 / (c + overhead)), i.e. 1/overhead when c = 0;
    inf when extra positions are free.
    """
    slope = cost.draft_cost + cost.marginal_overhead
    asymptote = math.inf if slope == 0.0 else 1.0 / slope
    measured = len(cost.profile) if cost.profile is not None else 1
    return max(asymptote, max((k + 1) / cost.pass_cost(k) for k in range(measured)))
