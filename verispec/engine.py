"""The speculative decoding loop, on token ids only:
prefill -> propose -> one target forward -> verify -> commit/rollback -> yield.

Cache invariant: between steps the target cache holds every committed token
but the last one, which is fed first in the next step together with the k
drafts. Row i of that forward's logits then predicts the token after draft i,
so one pass verifies all k drafts and yields one more token for free.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import torch

from .config import SamplingParams, SpecConfig
from .bench.economics import load_profile
from .metrics import Stats, StepRecord
from .policy import AdaptiveK, StepObservation
from .models.base import TargetModel
from .proposers.base import DraftContext, Proposal, Proposer
from .rejection import Verdict, verify_greedy, verify_sampling
from .sampling import logits_to_probs
from .stopping import Stopper
from .tree import tree_step


@dataclass
class Step:
    tokens: list[int]  # committed this step, in order
    finish_reason: str | None  # set on the last step: "stop" or "length"


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
    validate_prompt(target, prompt, sampling)
    started = time.perf_counter()
    # A tree step briefly holds all its nodes before compaction.
    cache = target.new_cache(capacity=min(target.max_context,
                                          len(prompt) + sampling.max_new_tokens + spec.tree))
    tokens = list(prompt)
    hidden_layers = proposer.hidden_layers
    hidden: tuple[torch.Tensor, ...] = ()
    if len(prompt) > 1:
        out = target.forward(torch.tensor(prompt[:-1]), cache, num_logits=1,
                             hidden_layers=hidden_layers)
        hidden = out.hidden
    stats.prompt_tokens = len(prompt)
    stats.time_prefill = time.perf_counter() - started
    generated: list[int] = []
    controller = _controller(spec)
    # A free, stateless proposer can be asked at k = 0 for a shadow guess that
    # measures acceptance without a verify cost (see verispec.policy).
    shadows = controller is not None and proposer.free

    while True:
        # Never draft past max_new_tokens (the bonus token needs one slot) or
        # past the model's context.
        room = min(spec.k, sampling.max_new_tokens - len(generated) - 1,
                   target.max_context - len(tokens))
        budget = controller.choose(room) if controller and room > 0 else room
        t0 = time.perf_counter()
        proposal = shadow = Proposal.empty()
        ctx = DraftContext(tokens, len(prompt), hidden)
        if budget > 0:
            proposal = proposer.propose(ctx, budget)
        elif shadows and room > 0:
            shadow = proposer.propose(ctx, 1)
        t1 = time.perf_counter()
        if proposal.tree is not None:
            # Depth <= budget keeps max_new_tokens; node count keeps the context.
            room_nodes = min(target.max_context, getattr(cache, "capacity", None)
                             or target.max_context) - len(tokens)
            tree = proposal.tree.trimmed(max_depth=budget, max_nodes=room_nodes)
            result = tree_step(target, cache, tokens, tree, sampling, generator, hidden_layers)
            outcome = StepOutcome(result.tokens, result.num_accepted, len(tree), result.hidden)
        else:
            outcome = _chain_step(target, cache, tokens, proposal, budget, sampling, generator,
                                  hidden_layers)
        hidden = outcome.hidden
        t2 = time.perf_counter()

        committed: list[int] = []
        reason = None
        for token in outcome.tokens:
            committed.append(token)
            generated.append(token)
            reason = stopper.check(generated)
            if reason:
                break
        tokens.extend(committed)
        stats.time_draft += t1 - t0
        stats.time_verify += t2 - t1
        if controller:
            controller.observe(StepObservation(budget, outcome.drafted, outcome.num_accepted,
                                               t1 - t0, t2 - t1))
            if len(shadow):
                controller.observe_shadow(1, int(int(shadow.tokens[0]) == committed[0]))
        stats.record(StepRecord(proposer.name, budget, outcome.drafted,
                                outcome.num_accepted, len(committed)))
        stats.time_total = time.perf_counter() - started
        if reason:
            stats.finish_reason = reason
        yield Step(committed, reason)
        if reason:
            return


@dataclass
class StepOutcome:
    tokens: list[int]  # accepted drafts, then one recovered or bonus token
    num_accepted: int
    drafted: int  # draft tokens (chain) or tree nodes verified
    hidden: tuple[torch.Tensor, ...]  # per requested layer, rows of the committed positions


def _chain_step(target: TargetModel, cache, tokens: list[int], proposal: Proposal, budget: int,
                sampling: SamplingParams, generator: torch.Generator,
                hidden_layers) -> StepOutcome:
    drafts = proposal.tokens[:budget]
    draft_probs = proposal.draft_probs[:budget] if proposal.draft_probs is not None else None
    feed = torch.cat([torch.tensor([tokens[-1]]), drafts.to(torch.long)])  # [k + 1]
    out = target.forward(feed, cache, hidden_layers=hidden_layers)  # logits [k + 1, vocab]
    verdict = _verify(drafts, draft_probs, out.logits, sampling, generator)
    # Roll back the rejected drafts: keep the fed token and the accepted ones.
    cache.truncate(len(tokens) + verdict.num_accepted)
    hidden = tuple(h[: verdict.num_accepted + 1] for h in out.hidden)
    return StepOutcome(verdict.tokens, verdict.num_accepted, len(drafts), hidden)


def _controller(spec: SpecConfig) -> AdaptiveK | None:
    if not spec.adaptive:
        return None
    return AdaptiveK(load_profile(spec.profile) if spec.profile else None)


def _verify(drafts: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
            sampling: SamplingParams, generator: torch.Generator) -> Verdict:
    if sampling.greedy:
        return verify_greedy(drafts, target_logits)
    target_probs = logits_to_probs(target_logits, sampling)  # [k + 1, vocab]
    return verify_sampling(drafts, draft_probs, target_probs, generator)
