"""`auto`: n-gram lookup or suffix decoding, whichever matched the longer suffix.

Both are free lookups, and the length of the context suffix each found earlier (in the
request; for suffix decoding also in the Engine's past outputs) says, before drafting,
how good its guess will be (`Proposer.evidence`). Each step drafts with the one that
matched longer, n-gram lookup on a tie, and the request's adaptive k prices the step by
that evidence like any other. The measured case for this rule against the per-step
goodput race it replaced is in docs/notebook/house_policy.md.
"""
from __future__ import annotations

import dataclasses

from ..acceptance import Evidence
from .base import DraftContext, Proposal, Proposer, ProposerSetup, build, register


class AutoProposer(Proposer):
    name = "auto"
    free = True

    def __init__(self, ngram: Proposer, suffix: Proposer) -> None:
        self.ngram, self.suffix = ngram, suffix
        self.choice = ngram
        self._at: int | None = None  # the context length `choice` was made for
        self._evidence: Evidence | None = None

    @property
    def active(self) -> str:
        return self.choice.name

    def _pick(self, ctx: DraftContext) -> Evidence | None:
        # Every step commits at least one token, so the length names the step.
        if self._at != len(ctx.tokens):
            by_ngram, by_suffix = self.ngram.evidence(ctx), self.suffix.evidence(ctx)
            longer = by_suffix.key > by_ngram.key
            self.choice = self.suffix if longer else self.ngram
            self._evidence = by_suffix if longer else by_ngram
            self._at = len(ctx.tokens)
        return self._evidence

    def evidence(self, ctx: DraftContext) -> Evidence | None:
        return self._pick(ctx)

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        self._pick(ctx)
        return self.choice.propose(ctx, k)

    def finished(self, ctx: DraftContext) -> None:
        self.ngram.finished(ctx)
        self.suffix.finished(ctx)  # the Engine's suffix store learns the output


@register("auto")
def _build(setup: ProposerSetup) -> Proposer:
    def one(name: str) -> Proposer:
        return build(dataclasses.replace(setup, spec=dataclasses.replace(setup.spec, proposer=name)))

    return AutoProposer(one("ngram"), one("suffix"))
