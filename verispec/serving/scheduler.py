"""Continuous batching of speculative requests.

One thread owns the model. Each step it admits queued requests into the
running batch (up to `max_num_seqs`), asks every decoding request for a quote
(`SpecRequest.quote`: its room, acceptance per depth and draft price, from its
policy, verispec.policy.plan), chooses every request's draft length for this step
(`cost.allocate`: speculation yields to load, checked against the realized rate
by `guard.SpeculationGuard`), hands each request its plan (`Quote.plan(k)`) to
`prepare` its forward, runs ONE `target.forward_batch` over all of them, and
hands each output back to its request's `complete`. Requests join and leave
only at these step boundaries.

Isolation: a request owns its KV cache, generator, proposer, stopper and
policy, and `forward_batch` promises that item i's output equals what
`forward(item i)` alone returns, so a request's output (greedy tokens, or the
sampled stream for a given seed) does not depend on what shares its batch.

Callers talk to the thread through `Ticket`s: `submit` queues them (or raises
`QueueFull`), events come back through the ticket's `sink` callback (called on
the scheduler thread: it must not block), and `cancel` marks a ticket so that
the next step boundary drops it and releases its cache.
"""
from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from verispec.config import SamplingParams, SpecConfig
from verispec.metrics import Stats, StepRecord
from verispec.models.base import TargetModel
from verispec.policy.acceptance import Tally
from verispec.policy.adaptive import EXPLORE_EVERY
from verispec.policy.economics import CostModel, SecondsPerUnit
from verispec.policy.look_again import LookAgain
from verispec.policy.plan import Plan
from verispec.request import SpecRequest
from verispec.serving.cost import Candidate, StepCost, allocate, calibrate
from verispec.serving.guard import SpeculationGuard
from verispec.serving.metrics import Gauges, ServingMetrics


class QueueFull(Exception):
    """The wait queue is at `max_queue`: the caller should retry later (HTTP 429)."""


class SchedulerClosed(Exception):
    """The scheduler is shutting down and takes no new requests (HTTP 503)."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 8  # requests in the running batch
    max_queue: int = 64  # requests waiting for a slot; more are refused
    profile: CostModel | None = None  # prior shape of T(n), from `verispec profile`
    calibrate: bool = True  # without a profile, time a few forwards at start for the prior
    # Drafting must lift the predicted step rate by this fraction: near the break-even point
    # a draft is as likely to cost as to pay, and plain decoding is a server's floor.
    margin: float = 0.02
    explore_every: int = EXPLORE_EVERY  # every n-th step one request drafts one more or less; 0: never
    # A new adaptive request starts from its proposer's pooled acceptance worth this many
    # outcomes: enough to skip learning from 0.5, few enough for its own to take over soon.
    pool_strength: float = 4.0
    guard_window: int = 16  # steps per window of the realized-rate check (guard.py); 0: off

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.guard_window < 0 or self.guard_window == 1:
            raise ValueError("guard_window must be 0 (off) or >= 2 (a probe alternates the "
                             f"two modes), got {self.guard_window}")
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")


@dataclass
class Progress:
    """Tokens committed by one step of a request; the last one has a finish reason."""
    tokens: list[int]
    finish_reason: str | None
    stats: Stats
    record: StepRecord | None = None  # this step's own record (stats keeps growing meanwhile)
    logprobs: list | None = None  # per token (verispec.step.processors.TokenLogprob), when asked for


@dataclass
class Failure:
    """The request ended without finishing: `reason` is cancelled, invalid (its
    settings were refused when it was built), error or shutdown."""
    reason: str
    message: str


Event = Progress | Failure


@dataclass(eq=False)
class Ticket:
    ids: list[int]
    sampling: SamplingParams
    spec: SpecConfig
    sink: Callable[[Event], None]
    id: int = field(default_factory=itertools.count().__next__)
    cancelled: bool = False
    done: bool = False
    prediction: tuple[int, ...] | None = None  # a predicted output's ids (proposers.prediction)


@dataclass(eq=False)
class _Slot:
    """A running request and its ticket."""
    ticket: Ticket
    request: SpecRequest


# (ids, sampling, spec, prediction) -> a step-wise request, e.g. `Engine.new_request`
RequestFactory = Callable[[list[int], SamplingParams, SpecConfig, tuple[int, ...] | None],
                          SpecRequest]


class Scheduler:
    def __init__(self, target: TargetModel, build: RequestFactory,
                 config: SchedulerConfig | None = None,
                 metrics: ServingMetrics | None = None) -> None:
        """`build(ids, sampling, spec, prediction)` makes a step-wise request, e.g.
        `engine.new_request`."""
        self.target = target
        self.build = build
        self.config = config or SchedulerConfig()
        self.metrics = metrics or ServingMetrics()
        prior = self.config.profile
        if prior is None and self.config.calibrate:
            prior = calibrate(target)
        self.cost = StepCost(prior, fused=target.fuses_batches)
        self.guard = SpeculationGuard(self.config.guard_window) if self.config.guard_window else None
        self._cond = threading.Condition()
        self._queue: deque[Ticket] = deque()
        self._running: list[_Slot] = []
        self._closing = False
        self._stop = False
        self._admitting = 0  # popped from the queue, not yet running: counted as busy
        self._stepping = False  # a step is in flight (its end may already have emptied the batch)
        self._explore = LookAgain(self.config.explore_every)  # counts every step
        self._guarded = 0  # decoding requests of this step if the guard's answer mattered, else 0
        self._guard_measured = False  # this step decodes only: its time is the guard's sample
        # Host seconds per decoding request of a step that no draft length changes (quotes,
        # plans, feeds; cost.allocate's H): the same discounted estimate as a draft price.
        self._host = SecondsPerUnit()
        self._allocated = False  # this step's draft lengths came from the allocator
        self._caches: weakref.WeakSet = weakref.WeakSet()  # every cache a request made
        # Per proposer: discounted accepted drafts and first rejections of finished requests.
        # A new adaptive request starts from their ratio rather than from a blind prior:
        # at 16 streams of short requests, each one learning alpha from 0.5 on its own
        # drafted enough in its first steps to cost the batch several percent.
        self._pooled: dict[str, Tally] = {}
        self._thread = threading.Thread(target=self._loop, name="verispec-scheduler", daemon=True)
        self._thread.start()

    # -- caller side (any thread) ---------------------------------------------
    def submit(self, tickets: Sequence[Ticket]) -> None:
        """Queue all tickets or none: `QueueFull` past `max_queue` (counting
        free batch slots as room), `SchedulerClosed` while shutting down."""
        with self._cond:
            if self._closing:
                raise SchedulerClosed("the server is shutting down")
            free_slots = max(0, self.config.max_num_seqs - len(self._running) - self._admitting)
            if len(self._queue) + len(tickets) > self.config.max_queue + free_slots:
                self.metrics.request_done("rejected")
                raise QueueFull(f"the queue is full ({len(self._queue)} waiting, "
                                f"max_queue {self.config.max_queue}); retry later")
            self._queue.extend(tickets)
            self._cond.notify_all()

    def cancel(self, ticket: Ticket) -> None:
        """Drop the ticket at the next step boundary, releasing its cache; a no-op once done."""
        with self._cond:
            ticket.cancelled = True
            self._cond.notify_all()

    def gauges(self) -> Gauges:
        with self._cond:
            return Gauges(len(self._queue), len(self._running) + self._admitting, len(self._caches))

    def idle(self) -> bool:
        with self._cond:
            return self._idle()

    def alive(self) -> bool:
        """The scheduler thread is running (a replica's health check)."""
        return self._thread.is_alive()

    def _idle(self) -> bool:
        return not self._queue and not self._running and not self._admitting and not self._stepping

    def close(self, timeout: float = 30.0) -> None:
        """Graceful shutdown: refuse new requests, let running and queued ones
        finish for up to `timeout` seconds, then cancel the rest and stop."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            deadline = time.monotonic() + timeout
            while not self._idle() and time.monotonic() < deadline:
                self._cond.wait(timeout=max(0.0, deadline - time.monotonic()))
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=60.0)

    # -- scheduler thread -----------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    for slot in list(self._running):
                        self._end(slot, Failure("shutdown", "the server shut down"))
                    for ticket in self._queue:
                        self._fail(ticket, Failure("shutdown", "the server shut down"))
                    self._running.clear()
                    self._queue.clear()
                    self._cond.notify_all()
                    return
                self._reap()
                admit = []
                while self._queue and len(self._running) + len(admit) < self.config.max_num_seqs:
                    admit.append(self._queue.popleft())
                self._admitting = len(admit)
                if not admit and not self._running:
                    self._cond.notify_all()  # wakes close() waiting for an empty scheduler
                    self._cond.wait()
                    continue
            for ticket in admit:
                self._admit(ticket)
            if self._running:
                self._stepping = True
                try:
                    self._step()
                finally:
                    # The step's locals (batch items) held caches until it returned.
                    with self._cond:
                        self._stepping = False
                        self._cond.notify_all()

    def _admit(self, ticket: Ticket) -> None:
        request = None
        try:
            request = self.build(ticket.ids, ticket.sampling, ticket.spec, ticket.prediction)
        except ValueError as exc:  # settings the request's proposer refused
            self._fail(ticket, Failure("invalid", str(exc)))
        except Exception as exc:  # a bad request must not stop the others
            self._fail(ticket, Failure("error", f"{type(exc).__name__}: {exc}"))
        with self._cond:
            self._admitting -= 1
            if request is not None:
                pooled = self._pooled.get(ticket.spec.proposer)
                if request.policy.adaptive and pooled and pooled.count >= 1.0:
                    request.policy.seed(pooled.alpha, self.config.pool_strength)
                self.metrics.admitted(len(ticket.ids))
                self._caches.add(request.cache)
                self._running.append(_Slot(ticket, request))
            self._cond.notify_all()

    def _reap(self) -> None:
        """Drop cancelled tickets, queued or running (called holding the lock)."""
        for ticket in [t for t in self._queue if t.cancelled]:
            self._queue.remove(ticket)
            self._fail(ticket, Failure("cancelled", "cancelled by the client"))
        for slot in [s for s in self._running if s.ticket.cancelled]:
            self._end(slot, Failure("cancelled", "cancelled by the client"))

    def _plans(self, slots: list[_Slot]) -> list[Plan | None]:
        """Every running request's plan for this step; None for a prefill."""
        turn = self._explore.looks if self._explore.due() else None
        decoding = sum(slot.request.prefilled for slot in slots)
        adaptive = any(s.request.prefilled and s.request.policy.adaptive and s.request.room()
                       for s in slots)
        # Only steps where the guard's answer changes something measure its two modes.
        self._guarded = decoding if adaptive else 0
        self._guard_measured = decoding == len(slots)  # a prefill's cost would swamp the drafts'
        self._allocated = False
        if self.guard is not None and adaptive and not self.guard.allow(decoding):
            # Speculation is not paying at this load: adaptive requests decode plainly, and
            # skip the allocator and their shadow drafts, whose host time is then pure cost.
            self.metrics.held_by_guard()
            return [s.request.policy.plain(s.request.room()) if s.request.prefilled else None
                    for s in slots]
        quotes = [s.request.quote() if s.request.prefilled else None for s in slots]
        candidates = [Candidate(1, q.room, q.alphas, q.fixed, q.draft_seconds, shape=q.shape)
                      if q is not None
                      else Candidate(max(0, len(s.request.tokens) - 1), 0, (0.0,), decoding=False)
                      for s, q in zip(slots, quotes)]
        overhead = (self._host.measured or 0.0) * decoding
        ks = list(allocate(candidates, self.cost, self.config.margin, overhead))
        self._allocated = True
        movable = [i for i, c in enumerate(candidates) if c.decoding and not c.fixed and c.k_cap]
        if turn is not None and movable:
            # Step times are measured only at the widths the allocator picks, and a wrong
            # extrapolation elsewhere would never be corrected: now and then one request
            # drafts one more, or one fewer, so the widths next to the chosen one are
            # measured too. The rate is flat near its optimum, so this costs little.
            i = movable[turn % len(movable)]
            up = (turn // len(movable)) % 2 == 0 or ks[i] == 0
            ks[i] = min(ks[i] + 1, candidates[i].k_cap) if up else ks[i] - 1
        return [q.plan(k) if q is not None else None for q, k in zip(quotes, ks)]

    def _step(self) -> None:
        started = time.perf_counter()
        slots = list(self._running)
        plans = self._plans(slots)
        items, live = [], []
        for slot, plan in zip(slots, plans):
            try:
                items.append(slot.request.prepare(plan))
                live.append(slot)
            except Exception as exc:
                self._end_locked(slot, Failure("error", f"{type(exc).__name__}: {exc}"))
        if not items:
            return
        t0 = time.perf_counter()
        try:
            outputs = self.target.forward_batch(items)
        except Exception as exc:
            # The caches of this batch are in an unknown state: end all of its requests.
            for slot in live:
                self._end_locked(slot, Failure("error", f"{type(exc).__name__}: {exc}"))
            return
        seconds = time.perf_counter() - t0
        emitted = drafted = accepted = 0
        decode_ks = []
        host = t0 - started  # less what the drafts took, which their prices already count
        for slot, out in zip(live, outputs):
            request = slot.request
            try:
                step = request.complete(out, seconds)
            except Exception as exc:
                self._end_locked(slot, Failure("error", f"{type(exc).__name__}: {exc}"))
                continue
            if step is None:  # the prefill commits nothing
                continue
            record = step.record
            if record.k:
                host -= step.draft_seconds
            decode_ks.append(record.k)
            emitted, drafted = emitted + record.emitted, drafted + record.drafted
            accepted += record.accepted
            self._deliver(slot.ticket, Progress(step.tokens, step.finish_reason, request.stats, record,
                                                step.logprobs))
            if request.finished:
                self._end_locked(slot, None)
        # The cost of a width is the forward plus verifying its rows on the host: per
        # request and per row, the latter is what a draft costs beyond the matmuls.
        self.cost.observe([int(item.tokens.shape[0]) for item in items], time.perf_counter() - t0)
        self.metrics.step(len(items), seconds, decode_ks, emitted, drafted, accepted)
        # H's sample: a step the allocator priced, where every request decoded (a held
        # step skips the quotes; a prefill or a failed request is not a decode step's work).
        if self._allocated and len(decode_ks) == len(slots):
            self._host.observe(max(0.0, host), len(slots))
        if self.guard is not None and self._guarded:
            self.guard.record(self._guarded, emitted, time.perf_counter() - started,
                              measured=self._guard_measured)

    def _end_locked(self, slot: _Slot, failure: Failure | None) -> None:
        with self._cond:
            self._end(slot, failure)
            self._cond.notify_all()

    def _end(self, slot: _Slot, failure: Failure | None) -> None:
        """Remove a running request and release its cache (called holding the lock)."""
        if slot in self._running:
            self._running.remove(slot)
        stats = slot.request.stats
        # Tree steps count nodes, not chain outcomes; a prediction's drafts are not its
        # proposer's, whose pooled acceptance would start the next requests too high.
        if not slot.ticket.spec.tree and slot.ticket.prediction is None:
            self._pool(slot.ticket.spec.proposer, slot.request.policy.outcomes)
        slot.request.release()
        if failure is None:
            slot.ticket.done = True
            self.metrics.request_done("finished", tau=stats.tau)
        else:
            self._fail(slot.ticket, failure)

    def _pool(self, proposer: str, outcomes: Tally, decay: float = 0.8) -> None:
        """Fold a finished request's chain outcomes (its policy's `outcomes`) into its
        proposer's pooled estimate."""
        if outcomes.count:
            self._pooled.setdefault(proposer, Tally()).add(outcomes.accepted, outcomes.rejected,
                                                           decay)

    def _fail(self, ticket: Ticket, failure: Failure) -> None:
        if ticket.done:
            return
        ticket.done = True
        self.metrics.request_done(failure.reason)
        self._deliver(ticket, failure)

    @staticmethod
    def _deliver(ticket: Ticket, event: Event) -> None:
        try:
            ticket.sink(event)
        except Exception:  # a consumer gone away must not stop the batch
            ticket.cancelled = True
