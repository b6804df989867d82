"""Monte-Carlo check of the closed forms in `economics`.

Each round drafts k tokens; the target accepts each independently with
probability alpha (the i.i.d. assumption of Leviathan et al. 2023, section 3.1),
the round stops at the first rejection, and the target adds one token of its own
(the corrected token on a rejection, the bonus token when all k pass).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verispec.bench.calculator import expected_speedup, expected_tokens, optimal_k
from verispec.policy.economics import CostModel, check_alpha, check_k

DEFAULT_ROUNDS_GRID = (6, 24, 96, 384, 1536)


def _check_rounds(rounds: int, name: str = "rounds") -> int:
    value = check_k(rounds, name)
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _tokens_per_round(rng: np.random.Generator, alpha: float, k: int, shape: tuple[int, ...]) -> np.ndarray:
    """Tokens emitted by each of `shape` independent rounds, in 1..k+1."""
    if k == 0:
        return np.ones(shape, dtype=np.int64)
    accepted = rng.random((*shape, k)) < alpha
    first_reject = np.where(accepted.all(axis=-1), k, accepted.argmin(axis=-1))
    return first_reject + 1


def tokens_std(alpha: float, k: int) -> float:
    """Exact per-round standard deviation of tokens emitted: X = j with
    probability alpha^(j-1) (1 - alpha) for j <= k, and X = k+1 w.p. alpha^k."""
    alpha, k = check_alpha(alpha), check_k(k)
    values = np.arange(1, k + 2, dtype=float)
    probs = alpha ** (values - 1) * (1.0 - alpha)
    probs[-1] = alpha**k
    mean = float(probs @ values)
    return math.sqrt(max(0.0, float(probs @ values**2) - mean**2))


def round_tokens(alpha: float, k: int, rounds: int, seed: int = 0) -> list[int]:
    """Tokens emitted by each round of `simulate(alpha, k, rounds, seed)`, in order:
    t - 1 accepted drafts, then the recovered token (t <= k) or the bonus (t = k + 1)."""
    alpha, k, rounds = check_alpha(alpha), check_k(k), _check_rounds(rounds)
    return _tokens_per_round(np.random.default_rng(seed), alpha, k, (rounds,)).tolist()


@dataclass(frozen=True)
class SimResult:
    tokens_per_pass: float
    theoretical: float
    speedup: float
    theoretical_speedup: float
    rounds: int


def simulate(alpha: float, k: int, rounds: int, seed: int = 0, cost: CostModel | None = None) -> SimResult:
    """Measured tokens per target pass over `rounds` rounds; each round is
    charged the deterministic `cost.pass_cost(k)`, so only the yield is random."""
    cost = cost if cost is not None else CostModel()
    measured = float(np.mean(round_tokens(alpha, k, rounds, seed)))
    return SimResult(
        tokens_per_pass=measured,
        theoretical=expected_tokens(alpha, k),
        speedup=measured / cost.pass_cost(k),
        theoretical_speedup=expected_speedup(alpha, k, cost),
        rounds=rounds,
    )


@dataclass(frozen=True)
class SpreadRow:
    rounds: int
    mean: float  # mean over trials of measured tokens per pass
    std: float  # std over trials: how far one run of `rounds` rounds can stray
    theoretical_std: float  # per-round std / sqrt(rounds)


def spread_by_rounds(
    alpha: float,
    k: int,
    rounds_grid: tuple[int, ...] = DEFAULT_ROUNDS_GRID,
    trials: int = 400,
    seed: int = 0,
) -> list[SpreadRow]:
    """Runs `trials` independent simulations at each rounds count; the std of
    their tokens-per-pass shrinks like 1/sqrt(rounds), which is why a 24-round
    benchmark cannot resolve a 5% difference."""
    alpha, k, trials = check_alpha(alpha), check_k(k), _check_rounds(trials, "trials")
    rng = np.random.default_rng(seed)
    per_round = tokens_std(alpha, k)
    rows = []
    for rounds in rounds_grid:
        rounds = _check_rounds(rounds)
        per_trial = _tokens_per_round(rng, alpha, k, (trials, rounds)).mean(axis=1)
        rows.append(SpreadRow(rounds, float(per_trial.mean()), float(per_trial.std(ddof=1) if trials > 1 else 0.0),
                              per_round / math.sqrt(rounds)))
    return rows


def plot_speedup(path: str | Path, alpha: float, cost: CostModel, k_max: int = 16) -> Path:
    """Expected speedup against k for `alpha` and `cost`, next to alpha = 0.35
    with a draft-model-like cost (c >= 0.1), which falls below break-even."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alpha, k_max = check_alpha(alpha), check_k(k_max, "k_max")
    ks = np.arange(k_max + 1)
    draft_like = CostModel(max(cost.draft_cost, 0.1), cost.verify_overhead, cost.profile)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(ks, [expected_speedup(alpha, k, cost) for k in ks], "o-",
            label=f"alpha={alpha:g}, c={cost.draft_cost:g}")
    best = optimal_k(alpha, cost, k_max)
    if 0 < best.k < k_max:
        ax.plot([best.k], [best.speedup], "r*", markersize=14, label=f"best k={best.k}: {best.speedup:.2f}x")
    low = [expected_speedup(0.35, k, draft_like) for k in ks]
    ax.plot(ks, low, "s--", color="tab:gray", label=f"alpha=0.35, c={draft_like.draft_cost:g}")
    if k_max >= 10:
        ax.annotate(f"k=10: {low[10]:.2f}x", (10, low[10]), textcoords="offset points", xytext=(0, -16),
                    ha="center", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8, label="plain decoding")
    ax.set_xlabel("k (draft length)")
    ax.set_ylabel("expected speedup")
    ax.set_title("Speculative decoding: expected speedup vs draft length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
