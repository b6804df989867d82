"""Per-request choice of the draft length k, so that speculation pays or stops.

A request's policy (verispec.plan.AdaptiveKPolicy) holds one `AdaptiveK`, asks
`choose(max_k)` before each proposal and reports the outcome with
`observe(StepObservation(...))`. The
controller keeps two online estimates and picks the k that maximises expected
tokens per second, E(k) / (T_draft(k) + T_verify(k + 1)); relative to plain
decoding that is the seed's formula 9.3, E / (T_draft/T_decode + 1 + overhead*k).
k = 0 (one token per T_verify(1)) wins whenever speculation cannot pay, which is
what keeps adaptive decoding from being slower than plain decoding for long.

* Acceptance per depth, alpha_i (verispec.acceptance.DepthAcceptance): discounted
  counts of censored chain outcomes, reset at an abrupt change. A proposer
  that can tell, before drafting, how good its guess will be
  (`Proposer.evidence`: n-gram lookup's matched suffix length) gets one
  estimate per evidence value as well: see "Evidence" below.
* Step time: discounted means of measured seconds per target forward for each
  number of fed positions n, and of draft seconds per requested token, over a
  prior `CostModel` (a profile from `verispec profile` via
  `economics.load_profile`, or linear) whose shape fills in unmeasured widths.
* Step shape (verispec.draft_shape.DraftShape): the positions a step of k fed and
  the depth it reached. A chain of k feeds k; a tree step (lookahead's window and
  guesses, a fixed `--tree` budget) feeds its nodes at any k, so k is priced at
  that width and credited only the depth it reaches.

Estimates beyond the chosen k are extrapolations, and a pessimistic one would
never be corrected, so every `explore_every`-th speculative step tries k + 1 or
k - 1 (alternately); the rate curve is flat near its optimum, so this is cheap.
For the same reason a plain step is taken whenever T(1), the rate every draft is
weighed against, has not been timed for a half-life and the plan's gain is not
clear (StepCost.plain_due).

k = 0 produces no acceptance evidence, so it must not be absorbing. Two ways out:

* Probes (any proposer, the only option for draft models): while the argmax is
  0 the controller still returns `probe_k` every `interval` steps; the interval
  doubles after each probe with nothing accepted, up to `max_probe_interval`,
  so a hopeless request pays for ~1/64 probes, and returns to
  `probe_interval` after a probe with an accepted draft.
* Shadows (free, stateless proposers such as n-gram lookup): at k = 0 the engine
  may still call the proposer, commit the target's token as usual, and report
  `observe_shadow(drafted, matched)`. For a one-hot draft token x, P(sampled
  token == x) = p_target(x) = P(rejection sampling accepts x), so matching the
  committed token is an unbiased acceptance sample at no verify cost. Shadows
  postpone probes. Not for draft models: the shadow would cost a draft forward.

Evidence. `choose(max_k, evidence)` prices k from the acceptance of earlier
drafts made with the same evidence. For n-gram lookup the matched suffix
length splits steps sharply (proposers/ngram.py, MATCH_PRIOR): a long match is
accepted several times as often as a 1-token one. One pooled estimate averages a
copy burst with the free writing around it and picks a middling k for both;
per evidence, the controller drafts long inside the burst and little outside
it, which no static k can do. A new key starts from the proposer's prior for
it (`Evidence.prior_alpha`), because a request is too short to learn five
estimates from scratch: with a neutral prior the long-match estimate was still
drafting 1 token on copies late in a summary. Every outcome also feeds the pooled estimate, which is what `alphas`
returns (a batch scheduler reads it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .acceptance import DepthAcceptance, Evidence
from .cadence import Backoff, Explore
from .draft_shape import DraftShape, between
from .economics import (Choice, CostModel, DraftPrice, StepCost, best_draft, best_rate,
                        tokens_list)


@dataclass(frozen=True)
class StepObservation:
    k_requested: int  # draft length the engine asked the proposer for
    drafted: int  # drafts actually proposed, <= k_requested
    accepted: int  # accepted prefix of the drafts, <= drafted
    draft_seconds: float | None = None  # wall time of propose(); None when not timed
    verify_seconds: float | None = None  # wall time of the target forward and verifier
    fed_positions: int | None = None  # positions in that forward; None means drafted + 1
    # A tree step: drafted/accepted then count depths along the accepted path (censored:
    # drafted = accepted when the path ended at a leaf, else accepted + 1).
    tree: bool = False
    depth: int | None = None  # a tree step: its proposal's deepest node (None: drafted)

    def __post_init__(self) -> None:
        if not 0 <= self.accepted <= self.drafted:
            raise ValueError(f"need 0 <= accepted <= drafted, got {self.accepted}, {self.drafted}")
        if self.k_requested < 0:
            raise ValueError(f"k_requested must be >= 0, got {self.k_requested}")
        for name in ("draft_seconds", "verify_seconds"):
            value = getattr(self, name)
            if value is not None and not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.fed_positions is not None and self.fed_positions < 1:
            raise ValueError(f"fed_positions must be >= 1, got {self.fed_positions}")

    @property
    def positions(self) -> int:
        return self.fed_positions if self.fed_positions is not None else self.drafted + 1


class AdaptiveK:
    """Chooses k per step for one request; see the module docstring."""

    def __init__(self, cost: CostModel | None = None, *, max_depth: int = 32,
                 half_life: float = 16.0, cost_half_life: float = 64.0,
                 prior_alpha: float = 0.5, prior_strength: float = 1.0,
                 pool_strength: float = 1.0, explore_every: int = 16, probe_k: int = 2,
                 probe_interval: int = 8, max_probe_interval: int = 64,
                 change_window: int = 8, change_p: float = 1e-4) -> None:
        if not (max_depth >= 1 and probe_k >= 1 and explore_every >= 2 and change_window >= 2
                and 1 <= probe_interval <= max_probe_interval and half_life > 0
                and cost_half_life > 0 and 0.0 <= prior_alpha <= 1.0 and prior_strength > 0
                and pool_strength >= 0 and 0.0 < change_p < 1.0):
            raise ValueError("AdaptiveK: a count, interval, half-life or probability "
                             "is out of range")
        # Without a measurement, assume a free proposer and a nearly flat verify
        # (memory-bound decode); the online timings correct both within steps.
        self.cost = cost if cost is not None else CostModel(verify_overhead=0.02)
        self.max_depth = max_depth
        # The step-cost curve per width, the one the batch scheduler keeps (economics.StepCost),
        # and the draft price every policy uses (economics.DraftPrice).
        self.curve = StepCost(self.cost, fused=True, half_life=cost_half_life)
        self.draft_price = DraftPrice(cost_half_life)
        # What a tree step feeds and reaches per k (a chain of k until a tree step is seen).
        self.shape = DraftShape(half_life)
        self._pooled = DepthAcceptance(max_depth, half_life, prior_alpha, prior_strength,
                                       pool_strength, change_window, change_p)
        self._estimate = (max_depth, half_life, pool_strength, change_window, change_p)
        self._prior_strength = prior_strength
        self._by_evidence: dict[int, DepthAcceptance] = {}
        self._evidence: int | None = None  # the evidence key of the step being decided
        self.probe_k = probe_k
        self._warm = False  # a timed step has been seen (and skipped)
        # Probes at k = 0: steps between them back off while they fail (cadence.Backoff).
        self._probe = Backoff(probe_interval, max_probe_interval)
        self._idle, self._probing = 0, False
        self._explore = Explore(explore_every)  # counts speculative steps
        self.probes = 0  # probe steps issued

    @property
    def alphas(self) -> np.ndarray:
        """Estimated alpha_i for depths 1..max_depth over every outcome (read-only)."""
        return self._pooled.alphas

    @property
    def resets(self) -> int:
        """Abrupt changes detected in the pooled estimate."""
        return self._pooled.resets

    def evidence_alphas(self, evidence: Evidence | None) -> np.ndarray:
        """alpha_i for drafts made with `evidence`: its key's estimate, its prior for
        a key not seen yet, the pooled estimate for None."""
        estimate = self._estimate_of(evidence)
        if estimate is None:
            return np.full(self.max_depth, evidence.prior_alpha)  # where a new estimate starts
        return estimate.alphas

    def _estimate_of(self, evidence: Evidence | None) -> DepthAcceptance | None:
        return self._pooled if evidence is None else self._by_evidence.get(evidence.key)

    def begin_step(self, evidence: Evidence | None) -> np.ndarray:
        """Announce the evidence of the step about to be decided: its outcome will
        be counted under that key too. Returns the alphas to price its k with. A
        scheduler that chooses k itself calls this; `choose` does it for a request."""
        self._announce(evidence)
        return self.evidence_alphas(evidence)

    def _announce(self, evidence: Evidence | None) -> None:
        self._evidence = evidence.key if evidence is not None else None
        if evidence is not None and evidence.key not in self._by_evidence:
            self._by_evidence[evidence.key] = self.new_estimate(evidence.prior_alpha,
                                                                self._prior_strength)

    def new_estimate(self, prior_alpha: float, prior_strength: float) -> DepthAcceptance:
        """A per-depth acceptance estimate with this controller's forgetting and resets,
        from its own prior (an evidence key's)."""
        max_depth, half_life, pool, window, p = self._estimate
        return DepthAcceptance(max_depth, half_life, prior_alpha, prior_strength, pool, window, p)

    def step_seconds(self, max_k: int) -> list[float]:
        """Predicted seconds of one pass for k = 0..max_k (T(1) units before any timing):
        the request's step-cost curve (economics.StepCost: measured widths, the prior's
        shape rescaled between them, convex beyond) at the width a step of k feeds
        (`shape`: k + 1 for a chain), plus the draft seconds per token."""
        widths = [1.0 + nodes for nodes in self.shape.tables(max_k)[0]]
        table = self.curve.table_list(math.ceil(max(widths)))
        per_token = self._draft_per_token(table[1])
        return [between(table, width) + per_token * k for k, width in enumerate(widths)]

    def verify_seconds(self, positions: int) -> float:
        """Predicted seconds of one target forward over `positions` fed positions."""
        return float(self._verify_prediction(positions)[-1])

    def draft_seconds_per_token(self) -> float:
        return self._draft_per_token(float(self._verify_prediction(1)[0]))

    def _draft_per_token(self, t1: float) -> float:
        return self.draft_price.per_token(self.cost.draft_cost * t1)

    def _verify_prediction(self, widths: int) -> np.ndarray:
        """Seconds of a forward over n = 1..widths positions, at index n - 1."""
        return self.curve.table(widths)[1:]

    def best(self, max_k: int, evidence: Evidence | None = None) -> Choice:
        """The rate-maximising k in 0..min(max_k, max_depth), without exploration."""
        k_max = max(0, min(max_k, self.max_depth))
        estimate = self._estimate_of(evidence)
        alphas = estimate.alpha_list() if estimate is not None else [evidence.prior_alpha] * k_max
        if not self.shape.observed:
            return best_draft(alphas[:k_max], self.step_seconds(k_max))
        # A tree step reaches no deeper than its shape: tokens at that depth, not at k.
        tokens = tokens_list(alphas[:k_max])
        return best_rate([between(tokens, depth) for depth in self.shape.tables(k_max)[1]],
                         self.step_seconds(k_max))

    def choose(self, max_k: int, evidence: Evidence | None = None) -> int:
        """Draft length for the next step, at most max_k (the engine's room
        left): the rate-maximising k, a neighbour on exploration steps, 0 when
        speculation cannot pay, or `probe_k` on a scheduled probe. `evidence`:
        the proposer's `evidence` for this step; the step's outcome is then also
        counted under it."""
        self._announce(evidence)
        if max_k <= 0:
            return 0
        best = self.best(max_k, evidence)
        if best.k > 0 and self.curve.plain_due(best.rate):
            return 0  # time T(1) again (economics.StepCost.plain_due)
        if best.k > 0:
            self._probe.reset()
            self._idle, self._probing = 0, False
            turn = self._explore.tick()
            if turn is None:
                return best.k
            # A neighbour now and then (cadence.Explore), alternately deeper and shallower.
            return min(best.k + 1, max_k, self.max_depth) if turn % 2 == 0 else best.k - 1
        self._idle += 1
        if self._idle < self._probe.interval:
            return 0
        self._idle, self._probing = 0, True
        self.probes += 1
        return min(self.probe_k, max_k, self.max_depth)

    def observe(self, obs: StepObservation) -> None:
        """Record one verified step: its acceptance outcome and its timings."""
        if self._probing:
            # Back off only while probes keep failing; an accepted draft may
            # be the start of a new regime, so look again soon.
            if obs.accepted == 0:
                self._probe.longer()
            else:
                self._probe.reset()
            self._probing = False
        self._accept(obs.drafted, obs.accepted)
        if obs.tree and obs.k_requested > 0:
            self.shape.observe(obs.k_requested, obs.positions - 1,
                               obs.depth if obs.depth is not None else obs.drafted)
        self._time(obs)

    def seed(self, alpha: float, strength: float) -> None:
        """Start from a depth-1 prior of `alpha` worth `strength` observations (what
        earlier requests of the same kind accepted) instead of the default; before any
        observation, so a short request does not spend its first steps learning what
        the server already knows."""
        self._pooled.seed(alpha, strength)

    def observe_timing(self, obs: StepObservation) -> None:
        """Timings alone: a step whose acceptance belongs to another estimate."""
        self._time(obs)

    def observe_shadow(self, drafted: int, matched: int) -> None:
        """Acceptance evidence from a draft that was not verified: `matched` is
        the length of its prefix equal to the tokens actually committed."""
        if not 0 <= matched <= drafted:
            raise ValueError(f"need 0 <= matched <= drafted, got {matched}, {drafted}")
        self._accept(drafted, matched)
        if drafted > 0:
            self._idle = 0

    def _time(self, obs: StepObservation) -> None:
        # A zero forward reading is an untimed step (a stub clock), not a free forward.
        if obs.verify_seconds == 0.0:
            return
        # Draft seconds are the request's own even in a shared batch (verify_seconds None).
        if obs.draft_seconds is not None:
            prior = self.cost.draft_cost * self.curve.table_list(1)[1]
            self.draft_price.observe(obs.draft_seconds, obs.k_requested, prior)
        if obs.verify_seconds is None:
            return
        if not self._warm:
            self._warm = True  # a request's first timed step may carry warm-up
            return
        self.curve.observe([obs.positions], obs.verify_seconds)  # clips one-off stalls itself

    def _accept(self, drafted: int, accepted: int) -> None:
        self._pooled.add(drafted, accepted)
        if self._evidence is not None and self._evidence in self._by_evidence:
            self._by_evidence[self._evidence].add(drafted, accepted)

