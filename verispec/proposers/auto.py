"""`auto`: per request, draft with whichever proposer is paying best right now.

Candidates are ngram and suffix (both free), lookahead, eagle and medusa (when a trained
head matches the target), a draft model (when `SpecConfig.draft` names one) and the
request's predicted output when it has one (proposers.prediction, free). This is
the drafting side: each step the request's policy (verispec.plan.AutoPolicy, the one
controller) names the candidate and its draft length together, from what this proposer
measures per candidate:

- alpha: a discounted count of drafts that matched what the target then committed over
  drafts that could have (acceptance.Tally). It is scored for every candidate that
  proposed, chosen or not: a free one guesses every step; a costly one that is not chosen
  is probed (asked for a guess and re-scored) after `probe_every` steps, an interval that
  doubles up to `probe_max` each time a probe does not win (cadence.Backoff) and returns
  to `probe_every` when another candidate displaces it under one evidence key (below). A
  change in the text's character (copying a document, then free writing) changes the
  choice within a few steps; a candidate that keeps losing costs ~1/probe_max of its drafts.
  A probe is also spaced by its price: at most `probe_share` of the request's wall time
  goes to one candidate's probes (its measured seconds per probe over the measured
  seconds between steps), so a head whose call costs a good part of a target pass is not
  probed every few steps on text where no candidate clearly wins.
- its draft price, seconds per requested token (economics.DraftPrice, carried from one
  request of an Engine to the next: auto_memory.AutoMemory), and how many
  positions its proposals feed per requested token (a tree feeds more than its depth; a
  lookup that found less feeds fewer), which is what its pass costs on the step-cost curve.

A costly candidate that drafted at a loss in a request (its steps' tokens, at the rate of
the request's other steps, were worth less than its steps and probes took) rests for the
Engine's next requests, which are built without it (auto_memory.AutoMemory): the hidden
rows kept for it and the plan's pricing of it tax every step, not only its own.

A costly candidate that is not probed is not called at all: the target's hidden rows it
would read wait in its `HeldRows` and reach it in one call before its next probe, so an
EAGLE head runs one step over many rows instead of one small step per target pass.

Alpha is kept per evidence key as well as pooled. A free candidate that knows how good
its guess will be before drafting (n-gram lookup: its matched suffix length,
`Proposer.evidence`) names the situation of every step, and each costly candidate's
outcomes are counted under that key too. A free candidate's own are counted under its own
evidence, and with none (key 0: nothing matched) it has nothing to draft that step, so it
is not a choice. On held-out target text the key separates the candidates
(`python -m verispec.training.evaluate --by-key`, docs/heads.md): after a short match the
EAGLE head's chains commit more tokens per pass than n-gram lookup's, after a longer match
n-gram lookup commits more. So within one answer `auto` copies with n-gram lookup and
writes freely with the head, step by step, instead of backing one candidate for the whole
request.

Scoring by matching the committed tokens is exact for greedy decoding and a fair estimate
when sampling. Outputs never depend on the choice: every candidate's proposal goes through
the same lossless verification.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field

from ..acceptance import Evidence, Tally
from ..cadence import Backoff
from ..draft_shape import DraftShape
from ..economics import DraftPrice
from . import prediction
from .auto_memory import AutoMemory, Ledger
from .base import (DraftContext, HeldRows, Proposal, Proposer, ProposerSetup, VerifiedRows,
                   build, register)

CANDIDATES = ("ngram", "suffix", "lookahead", "eagle", "medusa", "draft")  # each where it can be built
log = logging.getLogger(__name__)


KEY_PRIOR_STRENGTH = 2.0  # pseudo-outcomes a new key's counts start from, decayed like real ones


@dataclass
class Track:
    """What `auto` knows about one candidate in this request."""
    proposer: Proposer
    pooled: Tally = field(default_factory=lambda: Tally(1.0, 1.0))  # every outcome (prior:
    # alpha 0.5, fading as outcomes arrive)
    by_key: dict[int, Tally] = field(default_factory=dict)  # outcomes under each evidence key
    price: DraftPrice = field(default_factory=DraftPrice)  # seconds per requested draft token
    # What its proposals feed and reach per requested length (a chain of k
    # until seen); the half-life follows the proposer's decay (AutoProposer).
    shape: DraftShape = field(default_factory=DraftShape)
    pending: list[list[int]] = field(default_factory=list)  # its last guess as root-to-leaf
    # paths (one for a chain), awaiting the verdict
    pending_key: int | None = None  # the evidence key the guess was made under
    backoff: Backoff = field(default_factory=lambda: Backoff(8, 64))  # steps between probes
    # while not chosen
    probe_price: DraftPrice = field(default_factory=DraftPrice)  # seconds per probe
    next_probe: int = 0  # the step of its next probe
    held: HeldRows = field(default_factory=HeldRows)  # hidden rows of the steps it skipped
    ledger: Ledger = field(default_factory=Ledger)  # what its drafts saved in this request

    @property
    def interval(self) -> int:
        return self.backoff.interval

    def proposed(self, proposal: Proposal, k: int, seconds: float) -> None:
        tree = proposal.tree
        self.price.observe(seconds, k)
        if tree is not None:
            self.shape.observe(k, len(tree), tree.max_depth)
        else:
            self.shape.observe(k, len(proposal), len(proposal))

    @property
    def alpha(self) -> float:
        return self.pooled.alpha

    def prior(self, evidence: Evidence, own: bool) -> float:
        """A new key starts from the evidence's own rate for the candidate that gave
        it (`own`), and from the pooled alpha for the others."""
        return evidence.prior_alpha if own else self.alpha

    def tally_at(self, evidence: Evidence | None, own: bool) -> Tally:
        """Its outcomes under `evidence`'s key (a new key: the prior it will start from)."""
        if evidence is None:
            return self.pooled
        tally = self.by_key.get(evidence.key)
        if tally is None:
            return Tally.seeded(self.prior(evidence, own), KEY_PRIOR_STRENGTH)
        return tally


class AutoProposer(Proposer):
    name = "auto"
    # At a step its policy drafts nothing, `auto` is still asked (as for a shadow guess):
    # its free candidates guess for their scores and a due probe runs; it drafts nothing.
    free = True

    def __init__(self, candidates: dict[str, Proposer], decay: float = 0.8,
                 probe_every: int = 8, probe_max: int = 64, held_rows: int = 512,
                 probe_share: float = 0.01, memory: AutoMemory | None = None) -> None:
        if not candidates:
            raise ValueError("auto needs at least one candidate proposer")
        if not 1 <= probe_every <= probe_max:
            raise ValueError(f"need 1 <= probe_every <= probe_max, got {probe_every}, {probe_max}")
        if not probe_share > 0:
            raise ValueError(f"probe_share must be > 0, got {probe_share}")
        if not 0.0 < decay < 1.0:
            raise ValueError(f"decay must be in (0, 1), got {decay}")
        half_life = math.log(0.5) / math.log(decay)
        self.tracks = {name: Track(p, backoff=Backoff(probe_every, probe_max),
                                   next_probe=probe_every, held=HeldRows(held_rows),
                                   shape=DraftShape(half_life))
                       for name, p in candidates.items()}
        # The Engine's memory (shared by its requests): each track starts from a copy of
        # its prices, and the request's end writes them back with each costly
        # candidate's verdict.
        self._memory = memory
        for name, track in self.tracks.items():
            known = memory.prices(name) if memory is not None else None
            if known is not None:
                track.price, track.probe_price = known.draft, known.probe
        self.hidden_layers = tuple(sorted({layer for p in candidates.values()
                                           for layer in p.hidden_layers}))
        self.decay = decay
        self.probe_every = probe_every
        self.probe_max = probe_max
        self.probe_share = probe_share
        self.choice = "none"  # the candidate behind the last proposal
        # Wall seconds from one call to the next: a step as the request lives it (its
        # forward, the host work, the drafts), or a batch's step in serving.
        self._step_price = DraftPrice()
        self._called: float | None = None
        self._length = 0  # the context's length at the last call
        self._total = Ledger()  # every booked step's committed tokens and wall time
        self._seen = 0  # committed tokens already scored
        self._steps = 0
        self._best_by_key: dict[int | None, str] = {}
        self._evidence: Evidence | None = None
        self._evidence_from: str | None = None  # the candidate that gave it
        self._evidence_at: tuple | None = None  # the step it was computed for
        self._own: dict[str, Evidence] = {}  # each free candidate's own evidence this step
        self._alphas: tuple[float, dict[str, float]] | None = None  # (z, alphas) this step

    @property
    def active(self) -> str:
        return self.choice

    @property
    def reads_rows(self) -> bool:
        return any(track.proposer.reads_rows for track in self.tracks.values())

    def verified(self, rows: VerifiedRows) -> None:
        """The rows were the chosen candidate's draft: only it may read them (a
        lookahead window not chosen this step just does not advance)."""
        track = self.tracks.get(self.choice)
        if track is not None and track.proposer.reads_rows:
            track.proposer.verified(rows)

    def finished(self, ctx: DraftContext) -> None:
        for name, track in self.tracks.items():
            track.proposer.finished(ctx)
            if self._memory is not None:
                saved = None if track.proposer.free else \
                    track.ledger.verdict(self._total.tokens, self._total.seconds)
                self._memory.finished(name, track.price, track.probe_price, saved)

    def alphas(self, ctx: DraftContext, z: float = 0.0) -> dict[str, float]:
        """Each candidate's acceptance under its key for this step, `z` standard errors
        down (Tally.lower): a free candidate's own evidence, whose key 0 (no match, so
        nothing to draft) gives 0; the step's evidence for the others (pooled without)."""
        self._score(ctx.tokens)
        self._evidence_for(ctx)
        if self._alphas is not None and self._alphas[0] == z:
            return self._alphas[1]  # asked again in the same step (plan, then evidence)
        out = {}
        for name, track in self.tracks.items():
            found, own = self._key_evidence(name)
            out[name] = 0.0 if own and found.key == 0 else track.tally_at(found, own).lower(z)
        self._alphas = (z, out)
        return out

    def evidence(self, ctx: DraftContext) -> Evidence | None:
        """The evidence of the first free candidate that gives any (n-gram lookup's
        match length), with the best rate any candidate has shown under its key as
        the prior (for stats and a batch allocator's view of the step)."""
        found = self._evidence_for(ctx)
        if found is None:
            return None
        # At the caution the plan priced this step with, so the estimates are not redone.
        z = self._alphas[0] if self._alphas is not None else 0.0
        return Evidence(found.key, max(self.alphas(ctx, z).values()))

    def _key_evidence(self, name: str) -> tuple[Evidence | None, bool]:
        """The evidence `name`'s outcome is counted under this step, and whether it is
        its own: a free candidate's own (what it matched says how good its guess is),
        else the step's (it names the situation the others guess in)."""
        own = self._own.get(name)
        return (own, True) if own is not None else (self._evidence, name == self._evidence_from)

    def _evidence_for(self, ctx: DraftContext) -> Evidence | None:
        # Every step commits at least one token, so the length names the step.
        at = (len(ctx.tokens), ctx.tokens[-1] if ctx.tokens else None)
        if self._evidence_at != at:
            self._evidence_at, self._evidence, self._evidence_from = at, None, None
            self._alphas = None
            self._own = {name: track.proposer.evidence(ctx) for name, track in self.tracks.items()
                         if track.proposer.free}
            self._own = {name: found for name, found in self._own.items() if found is not None}
            first = next(iter(self._own), None)
            if first is not None:
                self._evidence, self._evidence_from = self._own[first], first
        return self._evidence

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        """Draft k with the candidate the plan chose (`ctx.candidate`; None drafts
        nothing), and let the others guess or wait as their scoring needs."""
        self._score(ctx.tokens)
        self._steps += 1
        now = time.perf_counter()
        if self._called is not None:
            self._book(len(ctx.tokens) - self._length, now - self._called)
        self._called, self._length = now, len(ctx.tokens)
        evidence = self._evidence_for(ctx)
        key = None if evidence is None else evidence.key
        best = ctx.candidate if k > 0 and ctx.candidate in self.tracks else "none"
        # The winner that a new one displaced in a known situation (the text may have
        # changed character) is probed again soon. Choices that differ between keys are
        # expected, and so is a winner that drafts on some steps of a key and not on
        # others (an estimate near the break-even point); and on text where no
        # candidate clearly pays the winner alternates between near-equals: resetting
        # every candidate's interval at each change kept them all probing every few steps.
        previous = self._best_by_key.get(key, best)
        if "none" not in (best, previous) and best != previous:
            track = self.tracks[previous]
            track.backoff.reset()
            track.next_probe = min(track.next_probe,
                                   self._steps + max(self.probe_every, self._priced_gap(track)))
        if best != "none":
            self._best_by_key[key] = best
        chosen = Proposal.empty()
        for name, track in self.tracks.items():
            probe = name != best and not track.proposer.free and self._steps >= track.next_probe
            if name != best and not track.proposer.free and not probe:
                track.held.hold(ctx.target_hidden)
                track.pending = []
                continue
            start = time.perf_counter()
            held = track.held.release(ctx.target_hidden)
            caught_up = ctx if held is ctx.target_hidden else \
                dataclasses.replace(ctx, target_hidden=held)
            proposal = track.proposer.propose(caught_up, max(k, 1))
            seconds = time.perf_counter() - start
            track.proposed(proposal, max(k, 1), seconds)
            if probe:
                # A probe that would not have won backs off; one that would have is
                # chosen next step (its alpha rose), which resets the intervals.
                track.probe_price.observe(seconds, 1)
                track.ledger.probes += seconds
                track.next_probe = self._steps + max(track.backoff.interval,
                                                     self._priced_gap(track))
                track.backoff.longer()
            track.pending = _paths(proposal)
            found, own = self._key_evidence(name)
            track.pending_key = None if found is None else found.key
            if found is not None and found.key not in track.by_key:
                track.by_key[found.key] = track.tally_at(found, own)
            if name == best:
                chosen = proposal
        self.choice = best
        return chosen

    def _book(self, committed: int, seconds: float) -> None:
        """The last step, from one call to this one: its pass, its host work and the
        drafts, which committed `committed` tokens (several steps where calls were
        skipped), booked to the request and to the candidate that drafted it."""
        self._step_price.observe(seconds, 1)
        self._total.add(committed, seconds)
        track = self.tracks.get(self.choice)
        if track is not None:
            track.ledger.add(committed, seconds)

    def _priced_gap(self, track: Track) -> int:
        """Steps between `track`'s probes that keep them within `probe_share` of the
        wall time; 0 until both prices are measured."""
        probe, step = track.probe_price.measured, self._step_price.measured
        if probe is None or not step:
            return 0
        return math.ceil(probe / (self.probe_share * step))

    def _score(self, tokens: list[int]) -> None:
        """Credit each candidate's last guess with the tokens committed since,
        pooled and under the evidence key it was made under."""
        new = tokens[self._seen:]
        if self._seen:
            for track in self.tracks.values():
                if not track.pending or not new:
                    continue
                # What verification keeps of a tree: the longest path prefix that
                # matches. It missed if that prefix ends at a committed token that differs;
                # a guess that matched all that was committed is censored, not missed.
                reach = [(_matched(path, new), len(path)) for path in track.pending]
                matched = max(m for m, _ in reach)
                missed = matched < len(new) and not any(m == matched == n for m, n in reach)
                track.pooled.add(matched, missed, self.decay)
                if track.pending_key in track.by_key:
                    track.by_key[track.pending_key].add(matched, missed, self.decay)
                track.pending = []
        self._seen = len(tokens)


def _paths(proposal: Proposal) -> list[list[int]]:
    if proposal.tree is None:
        return [proposal.tokens.tolist()] if len(proposal) else []
    tree = proposal.tree
    return [[tree.token_list[i] for i in path] for path in tree.paths()]


def _matched(guess: list[int], actual: list[int]) -> int:
    matched = 0
    for g, a in zip(guess, actual):
        if g != a:
            break
        matched += 1
    return matched


_said: set[tuple[str, str]] = set()  # (candidate, reason) already logged in this process


@register("auto")
def _build(setup: ProposerSetup) -> Proposer:
    """Every candidate that can be built for this target, each with the request's
    tree settings (a candidate drafts a tree where the request asks for one)."""
    candidates: dict[str, Proposer] = {}
    memory = setup.resources.get("auto_memory")
    if memory is not None:
        memory = memory.scope("tree" if setup.spec.tree else "chain")
    for name in CANDIDATES:
        if name == "draft" and not setup.spec.draft:
            continue  # no draft model named: not a candidate, nothing to report
        if memory is not None and memory.skip(name):
            continue  # a costly candidate that lost in this Engine's last requests
        try:
            spec = dataclasses.replace(setup.spec, proposer=name)
            candidates[name] = build(dataclasses.replace(setup, spec=spec))
        except ValueError as exc:
            # No head trained for this target, say: the candidate is absent, and the
            # log says why (once per reason, since a server builds one per request).
            level = logging.DEBUG if (name, str(exc)) in _said else logging.WARNING
            _said.add((name, str(exc)))
            log.log(level, "auto: candidate %s skipped: %s", name, exc)
    if not candidates:
        raise ValueError("auto: no candidate proposer could be built for this target "
                         "(see the log for each candidate's reason)")
    if setup.prediction:
        candidates[prediction.NAME] = prediction.predicted(setup)
    return AutoProposer(candidates, memory=memory)
