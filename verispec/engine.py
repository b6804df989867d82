"""The speculative decoding loop, on token ids only:
prefill -> propose -> one target forward -> verify -> commit/rollback -> yield.

One request's decoding is a state machine, `SpecRequest`: `prepare()` does
everything before the target forward (prefill feed, or proposal and draft
length) and returns that forward's arguments as a `BatchItem`; `complete()`
takes the forward's output and does everything after it (verification,
rollback, stop checks, statistics). Whoever runs the forward in between is free
to run it alone (`speculate`, the single-request loop) or fused with other
requests' items (`verispec.serving.scheduler`), because a request's state
lives in the request and its own cache only.

Cache invariant: between steps the target cache holds every committed token
but the last one, which is fed first in the next step together with the k
drafts. Row i of that forward's logits then predicts the token after draft i,
so one pass verifies all k drafts and yields one more token for free.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np
import torch

from .config import SamplingParams, SpecConfig
from .economics import load_profile
from .grammar import Constraint, apply_mask, constrained_proposal, masked_draft_probs
from .metrics import Stats, StepRecord
from .policy import AdaptiveK, StepObservation
from .models.base import BatchItem, ForwardOutput, TargetModel
from .acceptance import Evidence
from .processors import LogitProcessor, TokenLogprob, chain_ancestry, token_logprobs
from .proposers.base import DraftContext, HeldRows, Proposal, Proposer, VerifiedRows
from .rejection import Verdict, verify_greedy, verify_sampling, verify_typical
from .sampling import logits_to_probs
from .stopping import Stopper
from .token_tree import ROOT
from .tree import TreeFeed, tree_ancestry, tree_feed, tree_finish
from .tree_policy import AdaptiveTree


@dataclass
class Step:
    tokens: list[int]  # committed this step, in order
    finish_reason: str | None  # set on the last step: "stop" or "length"
    logprobs: list[TokenLogprob] | None = None  # one per token, when sampling.logprobs is set


def validate_prompt(target: TargetModel, prompt: list[int], sampling: SamplingParams) -> None:
    if not prompt:
        raise ValueError("the prompt is empty")
    if min(prompt) < 0 or max(prompt) >= target.vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {target.vocab_size})")
    need = len(prompt) + sampling.max_new_tokens
    if need > target.max_context:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_new_tokens ({sampling.max_new_tokens}) = "
            f"{need} exceeds the model's context of {target.max_context} tokens")


@dataclass
class StepOutcome:
    tokens: list[int]  # accepted drafts, then one recovered or bonus token
    num_accepted: int
    drafted: int  # draft tokens (chain) or tree nodes verified
    hidden: tuple[torch.Tensor, ...]  # per requested layer, rows of the committed positions
    leaf: bool = False  # tree step: the accepted path ended at a leaf (nothing was rejected)
    bonus: bool = False  # tokens[-1] is the bonus token (every draft on its path accepted)
    rejected: list[int] = field(default_factory=list)  # drafts discarded, the rejected one first
    logprobs: list[TokenLogprob] | None = None  # per emitted token, from its processed target row
    rows: VerifiedRows | None = None  # for a proposer that reads every fed row (reads_rows)


@dataclass
class _Pending:
    """What `prepare` set up and `complete` needs: exactly one forward is in flight."""
    budget: int  # draft length chosen for this step
    draft_seconds: float
    drafts: torch.Tensor | None = None  # chain step: the verified drafts
    draft_probs: torch.Tensor | None = None
    tree: TreeFeed | None = None  # tree step
    shadow: Proposal | None = None  # an unverified guess at k = 0, for acceptance evidence
    prefill: bool = False
    evidence: Evidence | None = None  # what the proposer told the controller before k was chosen
    allowed: torch.Tensor | None = None  # [k + 1, vocab] bool: the grammar's mask per verified row


class SpecRequest:
    """One request's speculation, one target forward at a time.

    Use: `while not r.finished: item = r.prepare(); out = <forward item>;
    step = r.complete(out, seconds)`. `complete` returns None after the prefill
    and a `Step` after every decode forward. `release()` drops the cache.
    """

    def __init__(self, target: TargetModel, prompt: list[int], sampling: SamplingParams,
                 spec: SpecConfig, proposer: Proposer, stopper: Stopper,
                 generator: torch.Generator, stats: Stats, own_timing: bool = True,
                 constraint: Constraint | None = None) -> None:
        """`own_timing`: the adaptive controller prices k from this request's
        measured forward times. A batch scheduler passes False: its step times
        belong to the whole batch, and it chooses k for the batch itself."""
        validate_prompt(target, prompt, sampling)
        self.started = time.perf_counter()
        self.target, self.sampling, self.spec = target, sampling, spec
        self.proposer, self.stopper, self.generator, self.stats = proposer, stopper, generator, stats
        self.own_timing = own_timing
        # Validates logit_bias ids against the vocabulary before any model work.
        self.processor = LogitProcessor(sampling, target.vocab_size, target.eos_token_ids)
        self.constraint = constraint  # a grammar the output must match (verispec.grammar)
        # A tree step briefly holds all its nodes before compaction.
        self.cache = target.new_cache(capacity=min(
            target.max_context, len(prompt) + sampling.max_new_tokens + spec.tree))
        self.tokens = list(prompt)
        self.num_prompt = len(prompt)
        self.generated: list[int] = []
        self.hidden: tuple[torch.Tensor, ...] = ()
        self.controller = _controller(spec)
        # A free, stateless proposer can be asked at k = 0 for a shadow guess that
        # measures acceptance without a verify cost (see verispec.policy).
        self.shadows = self.controller is not None and proposer.free
        self._held = HeldRows()  # hidden rows of steps that drafted nothing, for the next that does
        self._evidence: Evidence | None = None  # announced by next_alphas() for a scheduler's k
        self.finish_reason: str | None = None
        self._pending: _Pending | None = None
        self._prefilled = len(prompt) <= 1  # a one-token prompt has nothing to prefill
        stats.prompt_tokens = len(prompt)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def prefilled(self) -> bool:
        return self._prefilled

    def room(self) -> int:
        """The most draft tokens the next step may verify: the request's k, and
        never past max_new_tokens (the bonus token needs one slot) or the context."""
        if self.proposer is None or not self.proposer.drafts:
            return 0
        return max(0, min(self.spec.k, self.sampling.max_new_tokens - len(self.generated) - 1,
                          self.target.max_context - len(self.tokens)))

    def next_alphas(self) -> np.ndarray:
        """For a scheduler that chooses k itself (adaptive requests only): the
        acceptance per depth to price this request's next step with, keyed on the
        proposer's evidence, under which the step's outcome is then counted too."""
        self._evidence = self.proposer.evidence(
            DraftContext(self.tokens, self.num_prompt, self.hidden))
        return self.controller.begin_step(self._evidence)

    def prepare(self, k: int | None = None, allow_shadow: bool = True) -> BatchItem:
        """The arguments of this request's next target forward. `k`: the draft
        length chosen by a scheduler (clipped to `room()`); None lets the
        request choose (its fixed k, or its adaptive controller's).
        `allow_shadow`: False skips the shadow draft a k = 0 step would otherwise make."""
        if self.finished or self._pending is not None or self.cache is None:
            raise RuntimeError("prepare() needs a live request with no forward in flight")
        hidden_layers = self.proposer.hidden_layers
        if not self._prefilled:
            self._pending = _Pending(0, 0.0, prefill=True)
            return BatchItem(torch.tensor(self.tokens[:-1]), self.cache, num_logits=1,
                             hidden_layers=hidden_layers)
        room = self.room()
        ctx = DraftContext(self.tokens, self.num_prompt, self.hidden)
        evidence, self._evidence = self._evidence, None
        if k is not None:
            budget = max(0, min(k, room))
        elif self.controller and room > 0:
            evidence = self.proposer.evidence(ctx)
            budget = self.controller.choose(room, evidence)
        else:
            budget = room
        if self.controller is not None and k is None:
            # A tree controller (`--tree auto`) set this step's node budget with k; a
            # scheduler-chosen k keeps the proposer's configured budget.
            ctx.tree_nodes = self.controller.nodes
        t0 = time.perf_counter()
        proposal = Proposal.empty()
        shadow = None
        if budget > 0:
            ctx.target_hidden = self._held.release(self.hidden)
            proposal = self.proposer.propose(ctx, budget) if self.constraint is None else \
                constrained_proposal(self.constraint, self.proposer, ctx, budget)
        elif self.shadows and allow_shadow and room > 0:
            shadow = self.proposer.propose(ctx, 1)
        else:
            self._held.hold(self.hidden)
        draft_seconds = time.perf_counter() - t0
        if proposal.tree is not None:
            # Depth <= budget keeps max_new_tokens; node count keeps the context.
            room_nodes = min(self.target.max_context, getattr(self.cache, "capacity", None)
                             or self.target.max_context) - len(self.tokens)
            tree = proposal.tree.trimmed(max_depth=budget, max_nodes=room_nodes)
            feed = tree_feed(self.cache.length, self.tokens, tree)
            self._pending = _Pending(budget, draft_seconds, tree=feed, shadow=shadow,
                                     evidence=evidence)
            return BatchItem(feed.tokens, self.cache, positions=feed.layout.positions,
                             mask=feed.layout.mask, hidden_layers=hidden_layers)
        drafts = proposal.tokens[:budget].to(torch.long)
        probs = proposal.draft_probs[:budget] if proposal.draft_probs is not None else None
        allowed = None
        if self.constraint is not None:
            allowed = self.constraint.masks(drafts.tolist())  # [k + 1, vocab]
            probs = masked_draft_probs(probs, allowed[: drafts.shape[0]])
        self._pending = _Pending(budget, draft_seconds, drafts, probs, shadow=shadow,
                                 evidence=evidence, allowed=allowed)
        feed = torch.cat([torch.tensor([self.tokens[-1]]), drafts])  # [k + 1]
        return BatchItem(feed, self.cache, hidden_layers=hidden_layers)

    def complete(self, out: ForwardOutput, forward_seconds: float = 0.0) -> Step | None:
        """Consume the forward of the item `prepare` returned: None after the
        prefill, else the tokens committed by this step."""
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("complete() without a prepared forward")
        if pending.prefill:
            self.hidden = out.hidden
            self._prefilled = True
            self.stats.time_prefill = time.perf_counter() - self.started
            return None
        t0 = time.perf_counter()
        outcome = self._verify(pending, out)
        verify_seconds = forward_seconds + time.perf_counter() - t0
        self.hidden = outcome.hidden
        committed: list[int] = []
        for token in outcome.tokens:
            committed.append(token)
            self.generated.append(token)
            self.finish_reason = self.stopper.check(self.generated)
            if self.finish_reason:
                break
        self.tokens.extend(committed)
        if self.constraint is not None:
            self.constraint.commit(committed)
        if outcome.rows is not None:
            outcome.rows.committed = committed
            self.proposer.verified(outcome.rows)
        if self.finish_reason:
            self.proposer.finished(DraftContext(self.tokens, self.num_prompt))
        # Cut with the tokens: nothing past EOS, a stop string or max_new_tokens (vLLM #47616).
        logprobs = outcome.logprobs[: len(committed)] if outcome.logprobs is not None else None
        stats = self.stats
        stats.time_draft += pending.draft_seconds
        stats.time_verify += verify_seconds
        if self.controller:
            timed = self.own_timing
            if pending.tree is None:
                drafted, fed, tree = outcome.drafted, None, False
            else:
                # Depths along the accepted path, censored at a leaf: the acceptance per
                # depth the controller models (tree nodes are not depths).
                drafted, fed, tree = outcome.num_accepted + (not outcome.leaf), outcome.drafted + 1, True
            self.controller.observe(StepObservation(
                pending.budget, drafted, outcome.num_accepted,
                pending.draft_seconds if timed else None, verify_seconds if timed else None,
                fed_positions=fed, tree=tree))
            if pending.shadow is not None and len(pending.shadow):
                self.controller.observe_shadow(
                    1, int(int(pending.shadow.tokens[0]) == committed[0]))
        stats.record(StepRecord(self.proposer.active, pending.budget, outcome.drafted,
                                outcome.num_accepted, len(committed),
                                pending.evidence.key if pending.evidence is not None else None,
                                bonus=outcome.bonus, rejected=tuple(outcome.rejected)))
        stats.time_total = time.perf_counter() - self.started
        if self.finish_reason:
            stats.finish_reason = self.finish_reason
        return Step(committed, self.finish_reason, logprobs)

    def release(self) -> None:
        """Drop the cache (and the proposer, which may own a draft cache) now,
        rather than whenever the request object is collected."""
        self.cache = None
        self._pending = None
        self.proposer = None

    def _verify(self, pending: _Pending, out: ForwardOutput) -> StepOutcome:
        if pending.tree is not None:
            feed = pending.tree
            tree = feed.tree
            logits = self.processor.process(out.logits, self.tokens, self.num_prompt, tree.tokens,
                                            tree_ancestry(feed))  # [N + 1, vocab]
            result = tree_finish(feed, out, self.cache, self.sampling, self.generator, logits)
            # The rejected candidates: the children of the last accepted node.
            below = tree.children(result.path[-1] if result.path else ROOT)
            rows = [0] + [i + 1 for i in result.path]  # the rows the emitted tokens came from
            return StepOutcome(result.tokens, result.num_accepted, len(tree), result.hidden,
                               leaf=result.bonus, bonus=result.bonus,
                               rejected=[tree.token_list[i] for i in below],
                               logprobs=self._logprobs(logits[rows], result.tokens),
                               rows=self._rows(tree.token_list, tree.parent_list, logits))
        drafts = pending.drafts
        logits = self.processor.process(out.logits, self.tokens, self.num_prompt, drafts,
                                        chain_ancestry(drafts.shape[0]))  # [k + 1, vocab]
        if pending.allowed is not None:
            logits = apply_mask(logits, pending.allowed)
        verdict = _verify(drafts, pending.draft_probs, logits, self.sampling, self.generator,
                          self.spec.lossy_typical)
        # Roll back the rejected drafts: keep the fed token and the accepted ones.
        self.cache.truncate(len(self.tokens) + verdict.num_accepted)
        hidden = tuple(h[: verdict.num_accepted + 1] for h in out.hidden)
        chain = drafts.tolist()
        return StepOutcome(verdict.tokens, verdict.num_accepted, len(drafts), hidden,
                           bonus=verdict.bonus, rejected=chain[verdict.num_accepted:],
                           logprobs=self._logprobs(logits[: len(verdict.tokens)], verdict.tokens),
                           rows=self._rows(chain, list(range(-1, len(chain) - 1)), logits))

    def _rows(self, tokens: list[int], parents: list[int],
              logits: torch.Tensor) -> VerifiedRows | None:
        """logits: [N + 1, vocab] processed, row 0 the fed committed token."""
        if not self.proposer.reads_rows:
            return None
        return VerifiedRows(tokens, parents, logits.argmax(dim=-1).tolist(), [])

    def _logprobs(self, rows: torch.Tensor, tokens: list[int]) -> list[TokenLogprob] | None:
        """rows: [len(tokens), vocab] processed logits, row i the one token i was drawn from."""
        if self.sampling.logprobs is None:
            return None
        return token_logprobs(rows, tokens, self.sampling)


def run_alone(target: TargetModel, request: SpecRequest) -> Iterator[Step]:
    """Drive one request with one plain `target.forward` per step."""
    while not request.finished:
        item = request.prepare()
        t0 = time.perf_counter()
        out = target.forward(item.tokens, item.cache, positions=item.positions, mask=item.mask,
                             num_logits=item.num_logits, hidden_layers=item.hidden_layers)
        step = request.complete(out, time.perf_counter() - t0)
        if step is not None:
            yield step


def speculate(
    target: TargetModel,
    prompt: list[int],
    sampling: SamplingParams,
    spec: SpecConfig,
    proposer: Proposer,
    stopper: Stopper,
    generator: torch.Generator,
    stats: Stats,
) -> Iterator[Step]:
    """The single-request loop: every committed block as a `Step`, the last
    one with its finish reason."""
    request = SpecRequest(target, prompt, sampling, spec, proposer, stopper, generator, stats)
    return run_alone(target, request)


def _controller(spec: SpecConfig) -> AdaptiveK | AdaptiveTree | None:
    if not spec.adaptive:
        return None
    chain = AdaptiveK(load_profile(spec.profile) if spec.profile else None)
    return AdaptiveTree(chain, spec.tree) if spec.tree_auto else chain


def _verify(drafts: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
            sampling: SamplingParams, generator: torch.Generator, lossy: bool = False) -> Verdict:
    if sampling.greedy:
        return verify_greedy(drafts, target_logits)
    target_probs = logits_to_probs(target_logits, sampling)  # [k + 1, vocab]
    if lossy:  # opt-in (SpecConfig.lossy_typical); the request's stats are marked lossy
        return verify_typical(drafts, target_probs, generator)
    return verify_sampling(drafts, draft_probs, target_probs, generator)
