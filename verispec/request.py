"""One request's speculation, one target forward at a time: where the mechanism
(verispec.engine), the drafting (verispec.drafting) and the policy (verispec.plan)
meet. The step, in order:

    prepare(plan):                             # before the forward
        plan = policy.plan(ctx, room)          #   how much to draft (unless a batch chose)
        drafted = drafter.draft(seq, plan)     #   what to draft
        item = feed(seq, drafted.draft)        #   the forward's arguments
    out = forward(item)                        # one target pass: `run_alone`, or a batch's
    complete(out):                             # after it
        committed = commit(seq, drafted.draft, out)   # verify, roll back, stop
        drafter.after(seq, committed)          #   the proposer's hooks
        policy.observe(plan, outcome)          #   learn
        record                                 #   stats, and the step for the caller

`run_alone` runs that step with one plain `target.forward`; the serving scheduler
(verispec.serving.scheduler) runs the same `prepare` / `complete` around a forward fused
with other requests'. A request's state lives in the request and its own cache only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import torch

from .config import SamplingParams, SpecConfig
from .drafting import Drafted, Drafter
from .engine import Committed, commit, feed, new_sequence, prefill_item, prefilled
from .grammar import Constraint
from .metrics import Stats, StepRecord
from .models.base import BatchItem, ForwardOutput, TargetModel
from .plan import Outcome, Plan, PlanContext, Policy, Quote
from .policy import policy_for
from .processors import TokenLogprob
from .proposers.base import Proposer
from .stopping import Stopper


@dataclass
class Step:
    """What one decode step committed, for the caller (a stream, a server's response)."""
    tokens: list[int]  # committed this step, in order
    finish_reason: str | None  # set on the last step: "stop" or "length"
    logprobs: list[TokenLogprob] | None = None  # one per token, when sampling.logprobs is set
    record: StepRecord | None = None  # this step's own record (Stats keeps growing meanwhile)
    draft_seconds: float = 0.0  # spent proposing this step's drafts


class SpecRequest:
    """A sequence (verispec.engine), its drafter and its policy, and its statistics.

    Step-wise use: `while not r.finished: item = r.prepare(plan); out = <forward
    item>; step = r.complete(out, seconds)`. `plan` None lets the request's own
    policy plan; a batch allocator passes `r.quote().plan(k)`. `complete` returns
    None after the prefill and a `Step` after every decode forward.
    """

    def __init__(self, target: TargetModel, prompt: list[int], sampling: SamplingParams,
                 spec: SpecConfig, proposer: Proposer, stopper: Stopper,
                 generator: torch.Generator, stats: Stats,
                 constraint: Constraint | None = None, policy: Policy | None = None) -> None:
        self.started = time.perf_counter()
        self.spec, self.stats = spec, stats
        self.policy = policy if policy is not None else policy_for(spec)
        self.seq = new_sequence(target, prompt, sampling, spec, stopper, generator, constraint,
                                proposer.hidden_layers)
        self.drafter = Drafter(proposer)
        self._pending: tuple[Plan, Drafted] | None = None
        self._prefilling = False
        stats.prompt_tokens = len(prompt)

    # -- state, read-only for callers --------------------------------------
    @property
    def finished(self) -> bool:
        return self.seq.finished

    @property
    def prefilled(self) -> bool:
        return self.seq.prefilled

    @property
    def tokens(self) -> list[int]:
        return self.seq.tokens

    @property
    def cache(self):
        return self.seq.cache

    @property
    def hidden(self) -> tuple[torch.Tensor, ...]:
        return self.seq.hidden

    @property
    def constraint(self) -> Constraint | None:
        return self.seq.constraint

    @property
    def proposer(self) -> Proposer | None:
        return self.drafter.proposer if self.drafter is not None else None

    def room(self) -> int:
        """The most draft tokens the next step may verify: the request's k within
        max_new_tokens and the context; 0 for a proposer that never drafts."""
        return self.seq.room(self.spec.k) if self.proposer.drafts else 0

    def context(self) -> PlanContext:
        return PlanContext(self.drafter.context(self.seq), self.proposer)

    def plan(self) -> Plan:
        return self.policy.plan(self.context(), self.room())

    def quote(self) -> Quote:
        """For a batch allocator: this request's next step, priced (adaptive requests
        count the step's outcome under the evidence quoted)."""
        return self.policy.quote(self.context(), self.room())

    # -- one step around a forward someone else runs -------------------------
    def prepare(self, plan: Plan | None = None) -> BatchItem:
        """The arguments of this request's next target forward: the prefill, or the
        drafts `plan` orders (None: the request's own policy plans)."""
        if self.finished or self._pending is not None or self._prefilling or self.cache is None:
            raise RuntimeError("prepare() needs a live request with no forward in flight")
        if not self.seq.prefilled:
            self._prefilling = True
            return prefill_item(self.seq)
        plan = plan if plan is not None else self.plan()
        drafted = self.drafter.draft(self.seq, plan)
        self._pending = (plan, drafted)
        return feed(self.seq, drafted.draft)

    def complete(self, out: ForwardOutput, forward_seconds: float = 0.0) -> Step | None:
        """Consume the forward of the item `prepare` returned: None after the
        prefill, else the tokens committed by this step."""
        if self._prefilling:
            self._prefilling = False
            prefilled(self.seq, out)
            self.stats.time_prefill = time.perf_counter() - self.started
            return None
        if self._pending is None:
            raise RuntimeError("complete() without a prepared forward")
        (plan, drafted), self._pending = self._pending, None
        t0 = time.perf_counter()
        committed = commit(self.seq, drafted.draft, out, rows=self.proposer.reads_rows)
        verify_seconds = forward_seconds + time.perf_counter() - t0
        self.drafter.after(self.seq, committed)
        self.policy.observe(plan, outcome(drafted, committed, verify_seconds))
        return self.record(plan, drafted, committed, verify_seconds)

    def record(self, plan: Plan, drafted: Drafted, committed: Committed,
               verify_seconds: float) -> Step:
        stats = self.stats
        stats.time_draft += drafted.seconds
        stats.time_verify += verify_seconds
        # A step that drafts nothing is a plain step, whoever drafted the one before it.
        record = StepRecord(self.proposer.active if plan.k else "none", plan.k, committed.drafted,
                            committed.num_accepted, len(committed.tokens),
                            plan.evidence.key if plan.evidence is not None else None,
                            bonus=committed.bonus, rejected=tuple(committed.rejected))
        stats.record(record)
        if self.seq.constraint is not None:
            stats.time_grammar = self.seq.constraint.seconds
            stats.grammar_forced = self.seq.constraint.forced_drafts
        stats.time_total = time.perf_counter() - self.started
        if committed.finish_reason:
            stats.finish_reason = committed.finish_reason
        return Step(committed.tokens, committed.finish_reason, committed.logprobs, record,
                    drafted.seconds)

    def release(self) -> None:
        """Drop the cache (and the proposer, which may own a draft cache) now,
        rather than whenever the request object is collected."""
        self.seq.cache = None
        self._pending = None
        self.drafter = None


def outcome(drafted: Drafted, committed: Committed, verify_seconds: float) -> Outcome:
    tree = drafted.draft.tree
    if tree is None:
        reached, rejected = committed.drafted, committed.num_accepted < committed.drafted
    else:
        # The engine may have cut the tree to a prefix of its nodes; none lies deeper than
        # that. A path that ended at a leaf had nothing left to reject.
        reached, rejected = min(tree.tree.max_depth, committed.drafted), not committed.leaf
    return Outcome(committed.drafted, reached, committed.num_accepted, rejected,
                   tree=tree is not None, shadow=drafted.shadow_matched(committed.tokens),
                   draft_seconds=drafted.seconds, verify_seconds=verify_seconds)


def forward(target: TargetModel, item: BatchItem) -> ForwardOutput:
    return target.forward(item.tokens, item.cache, positions=item.positions, mask=item.mask,
                          num_logits=item.num_logits, hidden_layers=item.hidden_layers)


def run_alone(target: TargetModel, request: SpecRequest) -> Iterator[Step]:
    """Drive one request with one plain `target.forward` per step: the scheduler's
    `prepare` / `complete`, with a forward of its own."""
    while not request.finished:
        item = request.prepare()
        t0 = time.perf_counter()
        out = forward(target, item)
        step = request.complete(out, time.perf_counter() - t0)
        if step is not None:  # None: the prefill
            yield step

