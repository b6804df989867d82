"""Online acceptance, the one estimator: censored counts, discounted, per draft depth.

A step that drafted tells how far acceptance went: `accepted` drafts, then (if a draft
was left) one rejected. alpha = accepted / (accepted + rejections) over discounted
counts is the estimate of the per-token acceptance under a geometric model (`Tally`).
Per depth, alpha_i = P(draft i accepted | drafts < i accepted) from the same outcomes
(depths 1..a succeeded, depth a + 1 failed if rejected): `DepthAcceptance`, a `Tally`
per depth, each depth shrunk toward the one above it. Counts are discounted (half-life
in observed steps) to follow text that changes character, and a binomial test on the
last few outcomes resets them at an abrupt change (ADWIN-style windowing, Bifet &
Gavalda 2007), since forgetting alone needs several half-lives to cross a gap.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Evidence:
    """What a proposer knows, before drafting, about how good its guess will be."""
    key: int  # small integer naming the situation (n-gram lookup: matched suffix length)
    prior_alpha: float  # first-draft acceptance to assume in it until some are measured


@dataclass(frozen=True)
class _Outcome:
    accepted: int
    rejected: bool
    alpha_before: float  # depth-1 estimate before this outcome was counted


@dataclass
class Tally:
    """Discounted accepted drafts and first rejections; alpha, their ratio. A request's
    policy keeps one over its whole run (`Policy.outcomes`), which serving pools per
    proposer, and `DepthAcceptance` one per depth."""
    accepted: float = 0.0
    rejected: float = 0.0

    def add(self, accepted: float, rejected: float, decay: float) -> None:
        self.accepted = decay * self.accepted + accepted
        self.rejected = decay * self.rejected + rejected

    @property
    def count(self) -> float:
        return self.accepted + self.rejected

    @property
    def alpha(self) -> float:
        return self.accepted / max(self.count, 1e-9)


def _binomial_tail(x: int, n: int, p: float) -> float:
    """min(P(X <= x), P(X >= x)) for X ~ Binomial(n, p)."""
    pmf = [math.comb(n, i) * p**i * (1.0 - p) ** (n - i) for i in range(n + 1)]
    return min(sum(pmf[: x + 1]), sum(pmf[x:]))


class DepthAcceptance:
    """A `Tally` per depth, each shrunk toward the depth above, with abrupt-change resets."""

    def __init__(self, max_depth: int, half_life: float, prior_alpha: float,
                 prior_strength: float, pool_strength: float, change_window: int,
                 change_p: float) -> None:
        self.max_depth = max_depth
        self._gamma = 0.5 ** (1.0 / half_life)
        self._prior_alpha, self._prior_strength = prior_alpha, prior_strength
        self._pool = pool_strength
        self._change_p = change_p
        self._recent: deque[_Outcome] = deque(maxlen=change_window)
        # Depths at and past `_top` were never counted (their tallies are 0).
        self._depths = [Tally() for _ in range(max_depth)]
        self._top = 0
        # Cached `alpha_list` and `alphas`, dropped when the counts change.
        self._alphas: list[float] | None = None
        self._array: np.ndarray | None = None
        self.resets = 0  # abrupt changes detected
        self._restart()

    @property
    def alphas(self) -> np.ndarray:
        """Estimated alpha_i for depths 1..max_depth. Each depth is shrunk
        toward the depth above it with `pool_strength` pseudo-observations, so
        depths never reached inherit the deepest observed estimate. Read-only
        and cached until the next observation: a serving step reads it for
        every running request."""
        if self._array is None:
            self._array = np.array(self.alpha_list())
            self._array.flags.writeable = False
        return self._array

    def alpha_list(self) -> list[float]:
        """`alphas` as plain floats, shared (not to be modified): a request's policy
        reads them once a step, where building an array cost more than the arithmetic."""
        if self._alphas is not None:
            return self._alphas
        out = [0.0] * self.max_depth
        parent, pool = self._prior_alpha, 0.0
        depths = self._depths[:self._top]
        # Depths past the deepest one ever reached have no counts: they inherit it.
        reached = max((i for i, t in enumerate(depths) if t.count > 0), default=-1) + 1
        for i in range(reached):
            n = depths[i].count
            parent = parent if n + pool == 0 else (depths[i].accepted + pool * parent) / (n + pool)
            out[i], pool = parent, self._pool
        out[reached:] = [parent] * (self.max_depth - reached)
        self._alphas = out
        return out

    def _first_alpha(self) -> float:
        """alphas[0] without building the vector (depth 1 is never pooled with a parent)."""
        first = self._depths[0]
        return first.accepted / first.count if first.count > 0 else self._prior_alpha

    def seed(self, alpha: float, strength: float) -> None:
        """Restart from a depth-1 prior of `alpha` worth `strength` observations."""
        if not (0.0 <= alpha <= 1.0 and strength > 0):
            raise ValueError(f"need 0 <= alpha <= 1 and strength > 0, got {alpha}, {strength}")
        self._prior_alpha, self._prior_strength = alpha, strength
        self._restart()

    def add(self, accepted: int, rejected: bool) -> None:
        """One step's outcome: `accepted` drafts, then a rejected one if `rejected`."""
        if not accepted and not rejected:
            return  # no evidence; forgetting is per observation so k = 0 does not drift
        self._recent.append(_Outcome(accepted, rejected, self._first_alpha()))
        self._count(accepted, rejected)
        if len(self._recent) < self._recent.maxlen:
            return
        # Test the window against the belief held before it began: the current
        # estimate has already absorbed the window and would mask the change.
        p = min(max(self._recent[0].alpha_before, 0.01), 0.99)
        hits = sum(1 for o in self._recent if o.accepted > 0)
        if _binomial_tail(hits, len(self._recent), p) < self._change_p:
            # Forget the old regime; the newest half of the window is the best
            # evidence about the new one (the older half may straddle the change).
            self.resets += 1
            keep = list(self._recent)[len(self._recent) // 2:]
            self._restart()
            self._recent.clear()
            for o in keep:
                self._count(o.accepted, o.rejected)

    def _restart(self) -> None:
        # The prior lives in the depth-1 counts and decays with them, so after
        # enough evidence it leaves no floor under the estimate.
        self._alphas, self._array = None, None
        self._depths = [Tally() for _ in range(self.max_depth)]
        self._depths[0] = Tally(self._prior_alpha * self._prior_strength,
                                (1.0 - self._prior_alpha) * self._prior_strength)
        self._top = 1

    def _count(self, accepted: int, rejected: bool) -> None:
        self._alphas, self._array = None, None
        accepted = min(accepted, self.max_depth)
        failed = accepted if rejected and accepted < self.max_depth else -1
        self._top = max(self._top, min(accepted + rejected, self.max_depth))
        gamma = self._gamma
        for i, tally in enumerate(self._depths[:self._top]):
            tally.add(1.0 if i < accepted else 0.0, 1.0 if i == failed else 0.0, gamma)
