"""Online acceptance, the one estimator: censored counts, discounted, per draft depth.

A step that drafted tells how far acceptance went: `accepted` drafts, then (if a draft
was left) one rejected. alpha = accepted / (accepted + rejections) over discounted
counts is the estimate of the per-token acceptance under a geometric model (`Tally`).
Per depth, alpha_i = P(draft i accepted | drafts < i accepted) from the same outcomes
(depths 1..a succeeded, depth a + 1 failed if rejected): `DepthAcceptance`, a `Tally`
per depth, each depth shrunk toward the one above it. Counts are discounted (half-life
in observed steps) to follow text that changes character.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Evidence:
    """What a proposer knows, before drafting, about how good its guess will be."""
    key: int  # small integer naming the situation (n-gram lookup: matched suffix length)
    prior_alpha: float  # first-draft acceptance to assume in it until some are measured


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


class DepthAcceptance:
    """A `Tally` per depth, each shrunk toward the depth above."""

    def __init__(self, max_depth: int, half_life: float, prior_alpha: float,
                 prior_strength: float, pool_strength: float) -> None:
        self.max_depth = max_depth
        self._gamma = 0.5 ** (1.0 / half_life)
        self._prior_alpha, self._prior_strength = prior_alpha, prior_strength
        self._pool = pool_strength
        # Depths at and past `_top` were never counted (their tallies are 0).
        self._depths = [Tally() for _ in range(max_depth)]
        self._top = 0
        # Cached `alpha_list` and `alphas`, dropped when the counts change.
        self._alphas: list[float] | None = None
        self._array: np.ndarray | None = None
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
        self._count(accepted, rejected)

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
