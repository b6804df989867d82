"""The drafting side of a step: asking the proposer for what a plan orders, the
shadow guesses and held rows that go with it, and the proposer's hooks after
the step (`Proposer.verified`, `Proposer.finished`).

Shadow guesses (see verispec.policy): a free, stateless proposer asked at k = 0
for one token costs no verify; whether the target then committed it is an
unbiased acceptance sample. Held rows (proposers.base.HeldRows): a step that
drafts nothing keeps the target's hidden rows for the next step that does, so a
proposer reading the target's features (EAGLE) sees every position.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .engine import Committed, Draft, Sequence, shape_draft
from .grammar import constrained_proposal
from .plan import Plan
from .proposers.base import DraftContext, HeldRows, Proposal, Proposer


@dataclass
class Drafted:
    """A step's draft as the mechanism verifies it, and what drafting it took."""
    draft: Draft
    seconds: float  # spent in the proposer
    shadow: Proposal | None = None  # an unverified guess at k = 0, for acceptance evidence

    def shadow_matched(self, committed: list[int]) -> int | None:
        """1 if the shadow's first token is what the step committed first, else 0;
        None without a shadow."""
        if self.shadow is None or not len(self.shadow):
            return None
        return int(int(self.shadow.tokens[0]) == committed[0])


class Drafter:
    """One request's proposer, driven by plans."""

    def __init__(self, proposer: Proposer) -> None:
        self.proposer = proposer
        self._held = HeldRows()  # hidden rows of steps that drafted nothing, for the next that does

    def context(self, seq: Sequence) -> DraftContext:
        return DraftContext(seq.tokens, seq.num_prompt, seq.hidden)

    def draft(self, seq: Sequence, plan: Plan) -> Drafted:
        ctx = DraftContext(seq.tokens, seq.num_prompt, seq.hidden)
        proposal, shadow = Proposal.empty(), None
        t0 = time.perf_counter()
        if plan.k > 0 or (plan.shadow and self.proposer.free):
            ctx.target_hidden = self._held.release(seq.hidden)
        if plan.k > 0:
            proposal = self.proposer.propose(ctx, plan.k) if seq.constraint is None else \
                constrained_proposal(seq.constraint, self.proposer, ctx, plan.k)
        elif plan.shadow and self.proposer.free:
            shadow = self.proposer.propose(ctx, 1)
        else:
            self._held.hold(seq.hidden)
        seconds = time.perf_counter() - t0
        return Drafted(shape_draft(seq, proposal, plan.k), seconds, shadow)

    def after(self, seq: Sequence, committed: Committed) -> None:
        """The proposer's hooks: the target's rows (lookahead) after every verify
        forward, and the request's end."""
        if committed.rows is not None:
            self.proposer.verified(committed.rows)
        if seq.finished:
            self.proposer.finished(DraftContext(seq.tokens, seq.num_prompt))
