"""`auto`: per request, draft with whichever proposer is paying best right now.

Candidates are ngram (free), eagle and medusa (when a trained head matches the
target) and plain decoding. Each step picks the candidate with the highest
expected goodput, E[tokens per pass] / (draft time + verify time), from:

- alpha, per candidate: a discounted count of drafts that matched what the
  target then committed over drafts that could have. It is scored for every
  candidate that proposed, chosen or not: ngram costs nothing, so it shadows
  every step; a costly candidate that is not chosen is probed (asked for a
  guess and re-scored) after `probe_every` steps, an interval that doubles up
  to `probe_max` each time a probe loses and returns to `probe_every` when the
  choice changes. A change in the text's character (copying a document, then
  free writing) changes the choice within a few steps, and probes then come
  fast again; a candidate that keeps losing costs ~1/probe_max of its drafts.
- draft time per token per candidate and the verify time, both measured.

A costly candidate that is not probed is not called at all: the target's
hidden rows it would read wait in its `HeldRows` and reach it in one call
before its next probe. An EAGLE head then runs one step
over many rows instead of one small step per target pass, which is what kept
it scored for ~15% of the time on the `mixed` workload before.

Expected tokens per pass for k drafts at per-token acceptance alpha is
(1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023). Scoring by matching
the committed tokens is exact for greedy decoding and a fair estimate when
sampling. Outputs never depend on the choice: every candidate's proposal goes
through the same lossless verification.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

from .base import DraftContext, HeldRows, Proposal, Proposer, ProposerSetup, build, register

CANDIDATES = ("ngram", "eagle", "medusa")


@dataclass
class Track:
    """What `auto` knows about one candidate in this request."""
    proposer: Proposer
    accepted: float = 1.0  # discounted matched drafts (prior: alpha 0.5 until data)
    rejected: float = 1.0  # discounted first mismatches
    draft_seconds: float = 0.0  # per drafted token, running mean
    pending: list[int] = field(default_factory=list)  # its last guess, awaiting the verdict
    chosen_steps: int = 0
    interval: int = 8  # steps between probes while not chosen
    next_probe: int = 0  # the step of its next probe
    held: HeldRows = field(default_factory=HeldRows)  # hidden rows of the steps it skipped

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)


def expected_tokens(alpha: float, k: int) -> float:
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class AutoProposer(Proposer):
    name = "auto"

    def __init__(self, candidates: dict[str, Proposer], decay: float = 0.8,
                 probe_every: int = 8, probe_max: int = 64, held_rows: int = 512) -> None:
        if not candidates:
            raise ValueError("auto needs at least one candidate proposer")
        if not 1 <= probe_every <= probe_max:
            raise ValueError(f"need 1 <= probe_every <= probe_max, got {probe_every}, {probe_max}")
        self.tracks = {name: Track(p, interval=probe_every, next_probe=probe_every,
                                   held=HeldRows(held_rows))
                       for name, p in candidates.items()}
        self.hidden_layers = tuple(sorted({layer for p in candidates.values()
                                           for layer in p.hidden_layers}))
        self.decay = decay
        self.probe_every = probe_every
        self.probe_max = probe_max
        self.choice = "none"  # the candidate behind the last proposal
        self._seen = 0  # committed tokens already scored
        self._last_call: float | None = None
        self._verify_seconds = 0.0  # per target pass, running mean
        self._steps = 0

    @property
    def active(self) -> str:
        return self.choice

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        now = time.perf_counter()
        if self._last_call is not None:
            # Between two calls the engine ran one target pass (and its bookkeeping).
            self._verify_seconds = _mean(self._verify_seconds, now - self._last_call, self._steps)
        self._score(ctx.tokens)
        self._steps += 1
        best, best_rate = "none", 1.0 / max(self._verify_seconds, 1e-6)
        for name, track in self.tracks.items():
            rate = expected_tokens(track.alpha, k) / max(
                self._verify_seconds + k * track.draft_seconds, 1e-6)
            if k > 0 and rate > best_rate:
                best, best_rate = name, rate
        if best != self.choice:
            for track in self.tracks.values():
                track.interval = self.probe_every
                track.next_probe = min(track.next_probe, self._steps + self.probe_every)
        chosen = Proposal.empty()
        for name, track in self.tracks.items():
            probe = name != best and not track.proposer.free and self._steps >= track.next_probe
            if name != best and not track.proposer.free and not probe:
                track.held.hold(ctx.target_hidden)
                track.pending = []
                continue
            if probe:
                # A probe that would not have won backs off; one that would have is
                # chosen next step (its alpha rose), which resets the intervals.
                track.next_probe = self._steps + track.interval
                track.interval = min(2 * track.interval, self.probe_max)
            want = max(k, 1)
            start = time.perf_counter()
            caught_up = dataclasses.replace(ctx, target_hidden=track.held.release(ctx.target_hidden))
            proposal = track.proposer.propose(caught_up, want)
            if len(proposal):
                track.draft_seconds = _mean(track.draft_seconds,
                                            (time.perf_counter() - start) / len(proposal),
                                            track.chosen_steps + 1)
            track.pending = proposal.tokens.tolist()
            if name == best:
                track.chosen_steps += 1
                chosen = proposal if k > 0 else Proposal.empty()
        self.choice = best
        self._last_call = time.perf_counter()
        return chosen

    def _score(self, tokens: list[int]) -> None:
        """Credit each candidate's last guess with the tokens committed since."""
        new = tokens[self._seen:]
        if self._seen:
            for track in self.tracks.values():
                if not track.pending or not new:
                    continue
                matched = 0
                for guess, actual in zip(track.pending, new):
                    if guess != actual:
                        break
                    matched += 1
                track.accepted = self.decay * track.accepted + matched
                track.rejected = self.decay * track.rejected + (matched < len(track.pending))
                track.pending = []
        self._seen = len(tokens)


def _mean(old: float, value: float, count: int) -> float:
    """Running mean over the first steps, then an exponential one (recent steps weigh more)."""
    if count <= 0:
        return value
    weight = max(1.0 / (count + 1), 0.2)
    return (1 - weight) * old + weight * value


@register("auto")
def _build(setup: ProposerSetup) -> Proposer:
    candidates: dict[str, Proposer] = {}
    for name in CANDIDATES:
        spec = dataclasses.replace(setup.spec, proposer=name, tree=0)
        try:
            candidates[name] = build(dataclasses.replace(setup, spec=spec))
        except ValueError:
            # No head trained for this target: the candidate is simply absent.
            continue
    return AutoProposer(candidates)
