"""The policies (their interface is verispec.plan): a fixed k, and adaptive k, the
draft length chosen per step so that speculation pays or stops.

`AdaptiveK` keeps two online estimates and picks the k that maximises expected tokens
per second, E(k) / (T_draft(k) + T_verify(k + 1)); relative to plain decoding that is
the seed's formula 9.3, E / (T_draft/T_decode + 1 + overhead*k). k = 0 (one token per
T_verify(1)) wins whenever speculation cannot pay, which is what keeps adaptive
decoding from being slower than plain decoding for long.

* Acceptance per depth, alpha_i (verispec.acceptance.DepthAcceptance): discounted
  counts of censored chain outcomes. A proposer that can
  tell, before drafting, how good its guess will be (`Proposer.evidence`: n-gram
  lookup's matched suffix length) gets one estimate per evidence value as well: see
  "Evidence" below.
* Step time: discounted means of measured seconds per target forward for each number
  of fed positions n (economics.StepCost), and of draft seconds per requested token
  (economics.SecondsPerUnit), over a prior `CostModel` (a profile from `verispec
  profile` via `economics.load_profile`, or nearly flat) whose shape fills in
  unmeasured widths.
* Step shape (verispec.draft_shape.DraftShape): the positions a step of k fed and the
  depth it reached. A chain of k feeds k; a tree step (lookahead's window and guesses,
  a fixed `--tree` budget) feeds its nodes at any k, so k is priced at that width and
  credited only the depth it reaches.

Looking again (verispec.cadence.LookAgain): every `EXPLORE_EVERY`-th speculative step
tries k + 1 or k - 1 (alternately), since estimates beyond the chosen k are
extrapolations and a pessimistic one would never be corrected. k = 0 produces no
acceptance evidence, so it must not be absorbing. Two ways out:

* Probes (any proposer, the only option for draft models): while the argmax is 0 a
  step drafts `PROBE_K` after `PROBE_EVERY` plain steps, an interval that doubles after
  each probe with nothing accepted, up to `PROBE_LIMIT`, and returns to `PROBE_EVERY`
  after a probe with an accepted draft.
* Shadows (free, stateless proposers such as n-gram lookup): at k = 0 the engine may
  still call the proposer, commit the target's token as usual, and report whether the
  guess matched it. For a one-hot draft token x, P(sampled token == x) = p_target(x) =
  P(rejection sampling accepts x), so matching the committed token is an unbiased
  acceptance sample at no verify cost. Shadows postpone probes. Not for draft models:
  the shadow would cost a draft forward.

And the curve's own staleness check: a plain step is taken whenever T(1), the rate
every draft is weighed against, has not been timed for a half-life and the plan's gain
is not clear (economics.StepCost.plain_due).

Evidence. The plan prices k from the acceptance of earlier drafts made with the same
evidence. For n-gram lookup the matched suffix length splits steps sharply
(proposers/ngram.py, MATCH_PRIOR): a long match is accepted several times as often as
a 1-token one. One pooled estimate averages a copy burst with the free writing around
it and picks a middling k for both; per evidence, the policy drafts long inside the
burst and little outside it, which no static k can do. A new key starts from the
proposer's prior for it (`Evidence.prior_alpha`), because a request is too short to
learn five estimates from scratch: with a neutral prior the long-match estimate was
still drafting 1 token on copies late in a summary. Every outcome also feeds the pooled
estimate, which is what `alphas` returns (a batch scheduler reads it).

The constants below are the policy's tunables, each with its reason; the bench figures
behind the defaults are in docs/notebook/house_policy.md.
"""
from __future__ import annotations

import math

import numpy as np

from .acceptance import DepthAcceptance, Evidence
from .cadence import LookAgain
from .config import SpecConfig
from .draft_shape import DraftShape, between
from .economics import Choice, CostModel, StepCost, best_rate, load_profile, tokens_per_pass
from .plan import Outcome, Plan, PlanContext, Policy, Quote

# Acceptance and step shape forget with this half-life, in steps: a request's text
# changes character within a few sentences (a copied block, then free writing).
HALF_LIFE = 16.0
# Where acceptance starts without evidence, and what a prior weighs in outcomes: at
# depth 1 (this alpha, or an evidence key's) and from the depth above at deeper depths.
PRIOR_ALPHA = 0.5
PRIOR_WEIGHT = 1.0
# Every this many speculative steps, one drafts k + 1 or k - 1 instead (and the batch
# scheduler moves one request's k): the widths beside the choice get measured.
EXPLORE_EVERY = 16
# At k = 0, a probe of PROBE_K drafts after PROBE_EVERY plain steps, the wait doubling up to
# PROBE_LIMIT while probes find nothing: a hopeless request pays for about 1/64 probes.
PROBE_K = 2
PROBE_EVERY = 8
PROBE_LIMIT = 64


class FixedK(Policy):
    """Drafts the request's k (its room) every step."""

    def plan(self, ctx: PlanContext, room: int) -> Plan:
        return Plan(room)

    def quote(self, ctx: PlanContext, room: int) -> Quote:
        # Only for the batch's rate estimate: a fixed request drafts what it asked for.
        alpha = self.outcomes.alpha if self.outcomes.count else PRIOR_ALPHA
        return Quote(room, (alpha,), True, None, self.seconds_per_draft)

    def _learn(self, plan: Plan, outcome: Outcome) -> None:
        self.draft_price.observe(outcome.draft_seconds, plan.k)


class AdaptiveK(Policy):
    """Chooses k per step for one request; see the module docstring. `k_max`: the
    request's cap on k, the deepest depth it estimates; `cost`: the prior shape of a
    forward's time against its width."""
    adaptive = True

    def __init__(self, k_max: int, cost: CostModel | None = None) -> None:
        super().__init__()
        self.cost = cost if cost is not None else StepCost().prior
        self.max_depth = max(1, k_max)
        # The step-cost curve per width, the one the batch scheduler keeps too; a request's
        # first timed forward may carry warm-up, so its curve skips it.
        self.curve = StepCost(self.cost, fused=True, skip_first=True)
        self.shape = DraftShape(HALF_LIFE)  # what a step of k feeds and reaches
        self._pooled = self._new_estimate(PRIOR_ALPHA)
        self._by_evidence: dict[int, DepthAcceptance] = {}
        self._probe = LookAgain(PROBE_EVERY, PROBE_LIMIT)  # plain steps between probes
        self._probing = False
        self._explore = LookAgain(EXPLORE_EVERY)  # speculative steps between explorations

    def _new_estimate(self, prior_alpha: float) -> DepthAcceptance:
        return DepthAcceptance(self.max_depth, HALF_LIFE, prior_alpha, PRIOR_WEIGHT, PRIOR_WEIGHT)

    # -- the Policy interface ---------------------------------------------------
    def plan(self, ctx: PlanContext, room: int) -> Plan:
        if room <= 0:
            return Plan(0)
        evidence = ctx.evidence()
        return Plan(self.choose(room, evidence), shadow=True, evidence=evidence)

    def quote(self, ctx: PlanContext, room: int) -> Quote:
        evidence = ctx.evidence()
        alphas = self._announce(evidence)  # the outcome is counted under it too
        shape = self.shape.tables(room) if self.shape.observed else None
        return Quote(room, alphas, False, evidence, self.seconds_per_draft, shape=shape)

    def seed(self, alpha: float, strength: float) -> None:
        """Start from a depth-1 prior of `alpha` worth `strength` outcomes (what earlier
        requests of the same kind accepted) instead of the default; before any outcome, so
        a short request does not spend its first steps learning what the server knows."""
        self._pooled.seed(alpha, strength)

    def _learn(self, plan: Plan, outcome: Outcome) -> None:
        if self._probing:
            # Back off only while probes keep failing; an accepted draft may be the start
            # of a new regime, so look again soon.
            if outcome.accepted == 0:
                self._probe.found_nothing()
            else:
                self._probe.found()
            self._probing = False
        self._accept(plan.evidence, outcome.accepted, outcome.rejected)
        if outcome.tree and plan.k > 0:
            self.shape.observe(plan.k, outcome.fed, outcome.reached)
        self._time(plan, outcome)
        if outcome.shadow is not None:
            self._accept(plan.evidence, outcome.shadow, not outcome.shadow)
            self._probe.waited = 0  # a shadow guess is evidence: no probe needed yet

    # -- the estimates ------------------------------------------------------------
    @property
    def alphas(self) -> np.ndarray:
        """Estimated alpha_i for depths 1..max_depth over every outcome (read-only)."""
        return self._pooled.alphas

    @property
    def probes(self) -> int:
        """Probe steps issued."""
        return self._probe.looks

    def evidence_alphas(self, evidence: Evidence | None) -> np.ndarray:
        """alpha_i for drafts made with `evidence`: its key's estimate, its prior for a key
        not seen yet, the pooled estimate for None."""
        estimate = self._estimate_of(evidence)
        if estimate is None:
            return np.full(self.max_depth, evidence.prior_alpha)  # where a new estimate starts
        return estimate.alphas

    def _estimate_of(self, evidence: Evidence | None) -> DepthAcceptance | None:
        return self._pooled if evidence is None else self._by_evidence.get(evidence.key)

    def _announce(self, evidence: Evidence | None) -> np.ndarray:
        """The alphas to price the step of `evidence` with; a new key's estimate starts."""
        if evidence is not None and evidence.key not in self._by_evidence:
            self._by_evidence[evidence.key] = self._new_estimate(evidence.prior_alpha)
        return self.evidence_alphas(evidence)

    def step_seconds(self, max_k: int) -> list[float]:
        """Predicted seconds of one pass for k = 0..max_k (T(1) units before any timing):
        the request's step-cost curve (measured widths, the prior's shape rescaled between
        them, convex beyond) at the width a step of k feeds (`shape`: k + 1 for a chain),
        plus the draft seconds per token."""
        widths = [1.0 + nodes for nodes in self.shape.tables(max_k)[0]]
        table = self.curve.table_list(math.ceil(max(widths)))
        per_token = self.draft_price.per_unit(self.cost.draft_cost * table[1])
        return [between(table, width) + per_token * k for k, width in enumerate(widths)]

    def best(self, max_k: int, evidence: Evidence | None = None) -> Choice:
        """The rate-maximising k in 0..min(max_k, max_depth), without exploration."""
        k_max = max(0, min(max_k, self.max_depth))
        estimate = self._estimate_of(evidence)
        alphas = estimate.alpha_list() if estimate is not None else [evidence.prior_alpha] * k_max
        tokens = tokens_per_pass(alphas[:k_max])
        if self.shape.observed:
            # A tree step reaches no deeper than its shape: tokens at that depth, not at k.
            tokens = [between(tokens, depth) for depth in self.shape.tables(k_max)[1]]
        return best_rate(tokens, self.step_seconds(k_max))

    def choose(self, max_k: int, evidence: Evidence | None = None) -> int:
        """Draft length for the next step, at most max_k (the room left): the
        rate-maximising k, a neighbour on exploration steps, 0 when speculation cannot pay,
        or `PROBE_K` on a scheduled probe. The step's outcome is also counted under
        `evidence` (the proposer's for this step)."""
        self._announce(evidence)
        if max_k <= 0:
            return 0
        best = self.best(max_k, evidence)
        if best.k > 0 and self.curve.plain_due(best.rate):
            return 0  # time T(1) again (economics.StepCost.plain_due)
        if best.k > 0:
            self._probe.found()
            self._probe.waited, self._probing = 0, False
            if not self._explore.due():
                return best.k
            # A neighbour, alternately deeper and shallower.
            deeper = self._explore.looks % 2 == 0
            return min(best.k + 1, max_k, self.max_depth) if deeper else best.k - 1
        if not self._probe.due():
            return 0
        self._probing = True
        return min(PROBE_K, max_k, self.max_depth)

    def _time(self, plan: Plan, outcome: Outcome) -> None:
        # A zero forward reading is an untimed step (a stopped clock), not a free forward.
        if plan.own_clock and outcome.verify_seconds == 0.0:
            return
        # Draft seconds are the request's own even in a shared batch.
        prior = self.cost.draft_cost * self.curve.table_list(1)[1]
        self.draft_price.observe(outcome.draft_seconds, plan.k, prior)
        if plan.own_clock:  # a batch's forward time is not this request's
            self.curve.observe([outcome.fed + 1], outcome.verify_seconds)

    def _accept(self, evidence: Evidence | None, accepted: int, rejected: bool) -> None:
        self._pooled.add(accepted, rejected)
        if evidence is not None and evidence.key in self._by_evidence:
            self._by_evidence[evidence.key].add(accepted, rejected)


def policy_for(spec: SpecConfig) -> Policy:
    if not spec.adaptive:
        return FixedK()
    return AdaptiveK(spec.k, load_profile(spec.profile) if spec.profile else None)
