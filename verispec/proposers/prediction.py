"""Predicted Outputs (OpenAI's `prediction`): drafts from a text the client expects
the answer to repeat, such as the file being edited. Speculation with a draft the
client supplies: the output never changes, only how many target passes it takes.

Alignment (`PredictionAlignment`): a cursor into the prediction follows every
committed output token equal to the one under it. Where the output leaves the
prediction (an edit), the cursor is lost; each later token looks the output's
suffix up in the prediction as n-gram lookup would (the request's ngram_max down to
ngram_min, longest first), and takes the occurrence nearest after where the output
left, so the alignment moves forward through the prediction as an edited copy
does (none after it: lost until the output's end). Only an alignment that has
followed ngram_max tokens in a row moves that anchor when it fails: a chance match
inside inserted text (a new docstring's words) must not carry the alignment past
the code the output will rejoin.

Drafting (`PredictionProposer`): while aligned, the prediction drafts the tokens
after the cursor; otherwise the request's own proposer (`inner`) drafts, so adaptive
k and every other proposer, `auto`'s rule included, work as without a prediction.
As in `auto`'s rule, the longer match wins: when the inner proposer's evidence (n-gram
lookup, suffix decoding, auto: its matched suffix length) is longer than the run the
alignment has followed, the inner proposer drafts that step (not at the output's
start, where the client's word is all there is). A model that rewrites
more than it copies leaves the alignment on one-token re-alignments, where prompt
lookup over the same code finds longer matches (docs/predicted_outputs.md, the
replay).
The evidence of a prediction draft is keyed on how many output tokens in a row the
cursor has followed (its own keys, apart from n-gram lookup's), so adaptive k
learns per request how far an aligned prediction holds.

Every draft goes through the same verification as any other proposer's: a
one-hot draft (rejection.verify_sampling with no draft probabilities when sampling).
"""
from __future__ import annotations

import bisect
import dataclasses
from typing import Sequence

import torch

from verispec.metrics import PREDICTION as NAME  # step records count its drafts (accounting)
from verispec.policy.acceptance import Evidence
from verispec.proposers.base import (
    DraftContext,
    HeldRows,
    Proposal,
    Proposer,
    ProposerSetup,
    VerifiedRows,
    build,
)

# Evidence keys of prediction drafts: KEY_BASE + the tokens followed in a row (capped),
# apart from n-gram lookup's match lengths. Priors only, each request's own outcomes
# take over within a few steps: an alignment that has held for a few tokens is an
# unedited stretch of the prediction, which a copy repeats almost surely.
KEY_BASE = 1000
RUN_PRIOR = (0.5, 0.5, 0.6, 0.75, 0.9)  # by tokens followed in a row: 0, 1, 2, 3, 4+


class PredictionAlignment:
    """Where the output stands in the prediction; a function of the output tokens only
    (`follow` replays from scratch a context that is not an extension of the last)."""

    def __init__(self, prediction: Sequence[int], ngram_min: int = 1, ngram_max: int = 4) -> None:
        self.prediction = [int(t) for t in prediction]
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        # n-gram -> the positions just after its occurrences in the prediction, ascending
        self._ends: dict[tuple[int, ...], list[int]] = {}
        for n in range(ngram_min, ngram_max + 1):
            for end in range(n, len(self.prediction) + 1):
                self._ends.setdefault(tuple(self.prediction[end - n:end]), []).append(end)
        self._start()

    def _start(self) -> None:
        self.output: list[int] = []
        self.cursor: int | None = 0  # the prediction's position of the next expected token
        self.run = 0  # output tokens followed in a row up to the cursor
        self.left = 0  # where the output last left a confirmed alignment

    def follow(self, output: Sequence[int]) -> None:
        """Advance over the output tokens not seen yet."""
        old = len(self.output)
        if len(output) < old or list(output[:old]) != self.output:
            self._start()
            old = 0
        for token in output[old:]:
            self._step(int(token))

    def _step(self, token: int) -> None:
        self.output.append(token)
        cursor = self.cursor
        if cursor is not None and cursor < len(self.prediction) \
                and self.prediction[cursor] == token:
            self.cursor, self.run = cursor + 1, self.run + 1
            return
        if cursor is not None and self.run >= self.ngram_max:
            self.left = cursor  # a confirmed alignment: re-align after where it ended
        self.cursor, self.run = None, 0
        self._realign()

    def _realign(self) -> None:
        output = self.output
        for n in range(min(self.ngram_max, len(output)), self.ngram_min - 1, -1):
            ends = self._ends.get(tuple(output[len(output) - n:]))
            if not ends:
                continue
            after = bisect.bisect_right(ends, self.left)
            if after < len(ends):
                self.cursor, self.run = ends[after], n
                return

    def continuation(self, k: int) -> list[int]:
        """Up to k prediction tokens after the cursor; none while lost."""
        if self.cursor is None:
            return []
        return self.prediction[self.cursor:self.cursor + k]

    def evidence(self) -> Evidence:
        """Key 0 (nothing to draft) while lost or at the prediction's end, else the
        prediction's key for the run followed."""
        if not self.continuation(1):
            return Evidence(0, 0.0)
        bucket = min(self.run, len(RUN_PRIOR) - 1)
        return Evidence(KEY_BASE + bucket, RUN_PRIOR[bucket])


class PredictionProposer(Proposer):
    """Drafts from the prediction while it leads (`_leads`), else from `inner`."""
    name = NAME

    def __init__(self, prediction: Sequence[int], eos_token_ids: frozenset[int], inner: Proposer,
                 ngram_min: int = 1, ngram_max: int = 4) -> None:
        self.alignment = PredictionAlignment(prediction, ngram_min, ngram_max)
        self.eos = frozenset(eos_token_ids)
        self.inner = inner
        self.free = inner.free
        self.hidden_layers = inner.hidden_layers
        self._held = HeldRows()  # the inner proposer's hidden rows of the prediction's steps
        self._last = NAME  # who drafted the latest proposal
        self._at: int | None = None  # the context length `_lead` was decided for
        self._lead = False

    @property
    def active(self) -> str:
        return self._last

    @property
    def reads_rows(self) -> bool:
        return self.inner.reads_rows

    def _leads(self, ctx: DraftContext) -> bool:
        """The prediction drafts this step: aligned, and at the output's start or having
        followed at least as long a run as the inner proposer matched. Every step
        commits a token, so the context's length names the step (evidence and propose
        ask once each)."""
        if self._at != len(ctx.tokens):
            self._at = len(ctx.tokens)
            self.alignment.follow(ctx.tokens[ctx.num_prompt:])
            self._lead = bool(self.alignment.continuation(1))
            # At the output's start the client's word is all there is: the prediction drafts.
            if self._lead and self.alignment.output:
                rival = self.inner.evidence(ctx)
                self._lead = rival is None or self.alignment.run >= rival.key
        return self._lead

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        if k <= 0:
            return Proposal.empty()
        if self._leads(ctx):
            self._last = NAME
            self._held.hold(ctx.target_hidden)
            found = self.alignment.continuation(k)
            cut = next((i for i, t in enumerate(found) if t in self.eos), None)
            return Proposal(torch.tensor(found if cut is None else found[:cut + 1],
                                         dtype=torch.long))
        held = self._held.release(ctx.target_hidden)
        if held is not ctx.target_hidden:
            ctx = dataclasses.replace(ctx, target_hidden=held)
        proposal = self.inner.propose(ctx, k)
        self._last = self.inner.active
        return proposal

    def evidence(self, ctx: DraftContext) -> Evidence | None:
        if self._leads(ctx):
            return self.alignment.evidence()
        return self.inner.evidence(ctx)

    def verified(self, rows: VerifiedRows) -> None:
        if self._last != NAME:
            self.inner.verified(rows)

    def finished(self, ctx: DraftContext) -> None:
        self.inner.finished(ctx)


def build_for_request(setup: ProposerSetup) -> Proposer:
    """`base.build`, with the setup's prediction drafting before the named proposer
    (`auto` included); plain decoding stays plain."""
    proposer = build(setup)
    if not setup.prediction or not proposer.drafts:
        return proposer
    return PredictionProposer(setup.prediction, setup.target.eos_token_ids, proposer,
                              setup.spec.ngram_min, setup.spec.ngram_max)
