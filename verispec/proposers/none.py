"""Plain decoding through the same engine loop: the baseline."""
from __future__ import annotations

from verispec.proposers.base import DraftContext, Proposal, Proposer, ProposerSetup, register


class NoProposer(Proposer):
    name = "none"
    drafts = False

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        return Proposal.empty()


@register("none")
def _build(setup: ProposerSetup) -> Proposer:
    return NoProposer()
