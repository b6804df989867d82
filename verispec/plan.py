"""How much to draft: the one interface every policy implements, and the policies.

A policy sees a request before each step and answers with a `Plan` (draft depth,
tree node budget, whether a free proposer may make an unverified shadow guess);
after the step it learns from the `Outcome`. A batch allocator (serving) asks
each request for a `Quote` instead (its room, its acceptance per depth, its draft
price), chooses the batch's draft lengths itself, and turns each into a plan with
`Quote.plan(k)`; that plan says its step time belongs to the batch
(`own_clock=False`), so the policy does not learn a per-request cost from it.

    policy.plan(ctx, room) -> Plan          # a request that runs alone
    policy.quote(ctx, room) -> Quote        # a batch allocator's view
    policy.observe(plan, outcome)           # after every verified step

Policies: `FixedK` (the request's k) and `AdaptiveKPolicy` (verispec.policy.AdaptiveK:
rate-maximising k per step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .acceptance import Evidence, Tally
from .config import SpecConfig
from .economics import DraftPrice, load_profile
from .policy import AdaptiveK, StepObservation
from .proposers.base import DraftContext, Proposer


@dataclass(frozen=True)
class Plan:
    """One step's drafting orders."""
    k: int  # drafts to ask for (a chain's length, a tree's depth), within the step's room
    nodes: int  # this step's tree node budget; 0 drafts a chain
    shadow: bool = False  # at k = 0 a free proposer may still guess, unverified, as evidence
    evidence: Evidence | None = None  # what the proposer said before k was chosen
    own_clock: bool = True  # the step's time is this request's alone; False in a shared batch


@dataclass(frozen=True)
class Outcome:
    """What a policy learns from one verified step."""
    drafted: int  # chain: drafts verified; tree: nodes verified
    accepted: int  # accepted drafts (a tree's accepted path length)
    tree: bool = False
    leaf: bool = False  # tree: the accepted path ended at a leaf (nothing on it was rejected)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # the forward and the verifier
    shadow: int | None = None  # a shadow guess's first token was committed (1) or not (0)
    depth: int = 0  # the verified proposal's deepest node (a chain's length)


@dataclass(frozen=True)
class Quote:
    """A request as a batch allocator prices it for one step."""
    room: int  # the most drafts this step may verify
    alphas: Sequence[float]  # per-depth acceptance estimates (deeper depths reuse the last)
    fixed: bool  # drafts `room` whatever the allocator says (a fixed-k request)
    evidence: Evidence | None = None  # the key the step's outcome will be counted under
    draft_seconds: float | None = None  # measured seconds per requested draft token
    nodes: int = 0  # the tree node budget a step keeps when its depth is chosen for it
    # Positions fed and depth reached for k = 0..room (draft_shape.DraftShape.tables) when a
    # step is not a chain of k; None: a chain.
    shape: tuple[Sequence[float], Sequence[float]] | None = None

    def plan(self, k: int) -> Plan:
        """The plan of a step whose draft length the allocator chose (clipped to room)."""
        k = max(0, min(k, self.room))
        return Plan(k, self.nodes, shadow=not self.fixed and self.room > 0,
                    evidence=self.evidence, own_clock=False)


@dataclass
class PlanContext:
    """What a policy may look at before a step."""
    draft: DraftContext  # the committed tokens and the target's last hidden rows
    proposer: Proposer

    def evidence(self) -> Evidence | None:
        """The proposer's evidence (n-gram lookup: its matched suffix length); asked only
        by policies that key acceptance on it."""
        return self.proposer.evidence(self.draft)


class Policy:
    """Chooses each step's plan for one request; see the module docstring."""
    adaptive = False  # chooses k per step (a batch allocator may choose it instead)

    def __init__(self, nodes: int, draft_price: DraftPrice | None = None) -> None:
        self.nodes = nodes  # the configured tree node budget (SpecConfig.tree)
        self.draft_price = draft_price  # seconds per requested draft token (what a batch pays)
        # Every drafting step's outcome, undiscounted (decay 1): what serving pools per
        # proposer when the request ends, so that the next request starts from it.
        self.outcomes = Tally()

    def plan(self, ctx: PlanContext, room: int) -> Plan:
        raise NotImplementedError

    def quote(self, ctx: PlanContext, room: int) -> Quote:
        raise NotImplementedError

    def plain(self, room: int) -> Plan:
        """A step where speculation is held (serving's guard): a fixed k still drafts, an
        adaptive request decodes plainly, with no shadow guess, whose host time is then cost."""
        return Plan(0 if self.adaptive else room, self.nodes, own_clock=False)

    def observe(self, plan: Plan, outcome: Outcome) -> None:
        if outcome.drafted:
            self.outcomes.add(outcome.accepted, outcome.accepted < outcome.drafted, 1.0)
        self._learn(plan, outcome)

    def seed(self, alpha: float, strength: float) -> None:
        """Start from what earlier requests of the same kind accepted (serving pools it);
        a fixed k has nothing to start."""

    @property
    def seconds_per_draft(self) -> float | None:
        return self.draft_price.measured if self.draft_price is not None else None

    def _learn(self, plan: Plan, outcome: Outcome) -> None:
        raise NotImplementedError


class FixedK(Policy):
    """Drafts the request's k (its room) every step."""

    def __init__(self, nodes: int) -> None:
        super().__init__(nodes, DraftPrice())
        self.drafted = 0
        self.accepted = 0

    def plan(self, ctx: PlanContext, room: int) -> Plan:
        return Plan(room, self.nodes)

    def quote(self, ctx: PlanContext, room: int) -> Quote:
        # Only for the batch's rate estimate: a fixed request drafts what it asked for.
        alpha = self.accepted / self.drafted if self.drafted else 0.5
        return Quote(room, (alpha,), True, None, self.seconds_per_draft, self.nodes)

    def _learn(self, plan: Plan, outcome: Outcome) -> None:
        self.draft_price.observe(outcome.draft_seconds, plan.k)
        self.drafted += outcome.drafted
        self.accepted += outcome.accepted


class AdaptiveKPolicy(Policy):
    """The rate-maximising draft length per step (verispec.policy)."""
    adaptive = True

    def __init__(self, controller: AdaptiveK, nodes: int) -> None:
        super().__init__(nodes, controller.draft_price)  # one price: the controller's
        self.controller = controller

    def plan(self, ctx: PlanContext, room: int) -> Plan:
        if room <= 0:
            return Plan(0, self.nodes)
        evidence = ctx.evidence()
        k = self.controller.choose(room, evidence)
        return Plan(k, self._step_nodes(), shadow=True, evidence=evidence)

    def quote(self, ctx: PlanContext, room: int) -> Quote:
        evidence = ctx.evidence()
        alphas = self.controller.begin_step(evidence)  # the outcome is counted under it too
        return Quote(room, alphas, False, evidence, self.seconds_per_draft, self.nodes,
                     shape=self._shape(room))

    def _shape(self, room: int) -> tuple[list[float], list[float]] | None:
        shape = self.controller.shape
        return shape.tables(room) if shape.observed else None

    def seed(self, alpha: float, strength: float) -> None:
        self.controller.seed(alpha, strength)

    def _step_nodes(self) -> int:
        return self.nodes

    def _learn(self, plan: Plan, outcome: Outcome) -> None:
        if outcome.tree:
            # Depths along the accepted path, censored at a leaf: the acceptance per
            # depth the controller models (tree nodes are not depths).
            drafted, fed = outcome.accepted + (not outcome.leaf), outcome.drafted + 1
        else:
            drafted, fed = outcome.drafted, None
        # A batch's forward time is not this request's; its draft time is.
        self._observe(StepObservation(
            plan.k, drafted, outcome.accepted, outcome.draft_seconds,
            outcome.verify_seconds if plan.own_clock else None, fed_positions=fed,
            tree=outcome.tree, depth=outcome.depth if outcome.tree else None), plan)
        if outcome.shadow is not None:
            self.controller.observe_shadow(1, outcome.shadow)

    def _observe(self, obs: StepObservation, plan: Plan) -> None:
        self.controller.observe(obs)


def policy_for(spec: SpecConfig) -> Policy:
    if not spec.adaptive:
        return FixedK(spec.tree)
    return AdaptiveKPolicy(AdaptiveK(load_profile(spec.profile) if spec.profile else None),
                           spec.tree)
