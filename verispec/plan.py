"""How much to draft: the one interface every policy implements (the policies are in
verispec.policy).

A policy sees a request before each step and answers with a `Plan` (the draft
length, whether a free proposer may make an unverified shadow guess); after the step
it learns from the `Outcome`. A batch allocator (serving) asks each request for a
`Quote` instead (its room, its acceptance per depth, its draft price), chooses the
batch's draft lengths itself, and turns each into a plan with `Quote.plan(k)`; that
plan says its step time belongs to the batch (`own_clock=False`), so the policy does
not learn a per-request cost from it.

    policy.plan(ctx, room) -> Plan     # a request that runs alone
    policy.quote(ctx, room) -> Quote   # a batch allocator's view
    policy.observe(plan, outcome)      # after every verified step
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from .acceptance import Evidence, Tally
from .economics import SecondsPerUnit


@dataclass(frozen=True)
class Plan:
    """One step's drafting orders."""
    k: int  # drafts to ask for (a chain's length, a tree's depth), within the step's room
    shadow: bool = False  # at k = 0 a free proposer may still guess, unverified, as evidence
    evidence: Evidence | None = None  # what the proposer said before k was chosen
    own_clock: bool = True  # the step's time is this request's alone; False in a shared batch


@dataclass(frozen=True)
class Outcome:
    """What one verified step tells its policy: the same meaning for a chain (node i
    below node i - 1) and a tree."""
    fed: int  # draft positions the forward verified (a chain's drafts, a tree's nodes)
    reached: int  # the depth of the deepest draft fed (a chain's length)
    accepted: int  # drafts accepted: the accepted chain prefix, or tree path
    rejected: bool  # the draft after the accepted ones was rejected (False: none was left)
    tree: bool = False  # a tree step: it fed `fed` nodes to reach depth `reached`
    shadow: int | None = None  # a shadow guess's first token was committed (1) or not (0)
    draft_seconds: float = 0.0  # in the proposer
    verify_seconds: float = 0.0  # the forward and the verifier; 0 from a stopped clock

    def __post_init__(self) -> None:
        if not 0 <= self.accepted <= self.reached <= self.fed:
            raise ValueError(f"need 0 <= accepted <= reached <= fed, got {self.accepted}, "
                             f"{self.reached}, {self.fed}")
        if self.shadow not in (None, 0, 1):
            raise ValueError(f"shadow is None, 0 or 1, got {self.shadow}")
        for name in ("draft_seconds", "verify_seconds"):
            value = getattr(self, name)
            if not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True)
class Quote:
    """A request as a batch allocator prices it for one step."""
    room: int  # the most drafts this step may verify
    alphas: Sequence[float]  # per-depth acceptance estimates (deeper depths reuse the last)
    fixed: bool  # drafts `room` whatever the allocator says (a fixed-k request)
    evidence: Evidence | None = None  # the key the step's outcome will be counted under
    draft_seconds: float | None = None  # measured seconds per requested draft token
    # Positions fed and depth reached for k = 0..room (draft_shape.DraftShape.tables) when a
    # step is not a chain of k; None: a chain.
    shape: tuple[Sequence[float], Sequence[float]] | None = None

    def plan(self, k: int) -> Plan:
        """The plan of a step whose draft length the allocator chose (clipped to room)."""
        k = max(0, min(k, self.room))
        return Plan(k, shadow=not self.fixed and self.room > 0, evidence=self.evidence,
                    own_clock=False)


class Evidenced(Protocol):
    """What a policy asks of a proposer (verispec.proposers.base.Proposer is one)."""

    def evidence(self, ctx: Any) -> Evidence | None: ...


@dataclass
class PlanContext:
    """What a policy may look at before a step: the proposer's evidence, and nothing of
    the model (the policy side imports no torch)."""
    draft: Any  # the proposer's view of the step (proposers.base.DraftContext)
    proposer: Evidenced

    def evidence(self) -> Evidence | None:
        """The proposer's evidence (n-gram lookup: its matched suffix length); asked only
        by policies that key acceptance on it."""
        return self.proposer.evidence(self.draft)


class Policy:
    """Chooses each step's plan for one request; see the module docstring."""
    adaptive = False  # chooses k per step (a batch allocator may choose it instead)

    def __init__(self) -> None:
        self.draft_price = SecondsPerUnit()  # seconds per requested draft token
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
        return Plan(0 if self.adaptive else room, own_clock=False)

    def observe(self, plan: Plan, outcome: Outcome) -> None:
        if outcome.fed:
            self.outcomes.add(outcome.accepted, outcome.rejected, 1.0)
        self._learn(plan, outcome)

    def seed(self, alpha: float, strength: float) -> None:
        """Start from what earlier requests of the same kind accepted (serving pools it);
        a fixed k has nothing to start."""

    @property
    def seconds_per_draft(self) -> float | None:
        return self.draft_price.measured

    def _learn(self, plan: Plan, outcome: Outcome) -> None:
        raise NotImplementedError
