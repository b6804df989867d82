"""A draft language model (Leviathan et al. 2023): a separate small model, or
`self:L`, the target's own first L layers with its final norm and LM head
(a layer-skip self-draft, as in LayerSkip / Draft&Verify).

The draft owns its cache. Instead of replaying the engine's accept/reject
bookkeeping it keeps the list of tokens its cache has seen and, each step,
rolls back to the longest common prefix with the committed context. That one
rule covers partial acceptance, full acceptance (the last draft token and the
bonus token were never fed) and anything else that rewrites the tail.

Trees (SpecConfig.tree): after the committed tokens, the draft feeds each
expanded node as one row at position (last committed position) + depth that
attends to the context, its ancestors and itself, a whole depth per forward.
Those rows never enter `seen`, so the next proposal's rollback drops them.
"""
from __future__ import annotations

import numpy as np
import torch

from verispec.proposers.base import DraftContext, Proposal, Proposer, ProposerSetup, register
from verispec.proposers.tree_drafting import (
    DraftTree,
    FedRows,
    TreeShape,
    as_proposal,
    draft_log_probs,
    grow,
)
from verispec.step.processors import LogitProcessor
from verispec.step.sampling import greedy_tokens, logits_to_probs, sample
from verispec.step.token_tree import ROOT, TokenTree
from verispec.step.tree import tree_attention


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


class DraftModelProposer(Proposer):
    name = "draft"

    def __init__(self, model, sampling, generator: torch.Generator,
                 tree: TreeShape | None = None, eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.model = model
        # The draft proposes from the request's processed distribution too: the
        # verifier only needs the probabilities it really sampled from, and
        # matching the target's processing keeps acceptance up.
        self.processor = LogitProcessor(sampling, model.vocab_size, eos_token_ids)
        self.tree = tree  # None drafts chains
        self.sampling = sampling
        self.generator = generator
        self.cache = model.new_cache()
        self.seen: list[int] = []

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        tokens = ctx.tokens
        # A draft with a shorter context than the target drafts less instead of
        # failing (llama.cpp #22554).
        limit = getattr(self.cache, "capacity", None) or self.model.max_context
        k = min(k, limit - len(tokens))
        if k <= 0:
            return Proposal.empty()
        # Keep at least the last token unfed: its logits give the first draft.
        keep = min(common_prefix(self.seen, tokens), len(tokens) - 1)
        self.cache.truncate(keep)
        self.seen = tokens[:]
        logits = self.model.forward(
            torch.tensor(tokens[keep:]), self.cache, num_logits=1).logits[-1]
        shape = TreeShape.for_step(self.tree, ctx)
        if shape is not None:
            return as_proposal(self._draft_tree(ctx, logits, k, limit - len(tokens), shape))
        drafts: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            if self.processor.active:
                logits = self.processor.one(logits, tokens + drafts, ctx.num_prompt)  # [vocab]
            if self.sampling.greedy:
                token = greedy_tokens(logits)
            else:
                dist = logits_to_probs(logits, self.sampling)  # [vocab]
                token = int(sample(dist, self.generator))
                probs.append(dist)
            drafts.append(token)
            if i + 1 < k:
                logits = self.model.forward(
                    torch.tensor([token]), self.cache, num_logits=1).logits[-1]
                self.seen.append(token)
        return Proposal(torch.tensor(drafts), torch.stack(probs) if probs else None)

    def _draft_tree(self, ctx: DraftContext, logits: torch.Tensor, k: int, room: int,
                    shape: TreeShape) -> TokenTree:
        """logits [vocab]: the draft's prediction after the last committed token,
        whose row is the root; room: cache rows left for drafted nodes."""
        rows = FedRows(prefix=self.cache.length, root_position=len(ctx.tokens) - 1)

        def expand(draft: DraftTree, frontier: list[int]) -> torch.Tensor:
            if frontier == [ROOT]:
                return draft_log_probs(self._processed(logits[None], ctx, draft, frontier),
                                       self.sampling)  # [1, vocab]
            layout = rows.layout(draft, frontier)
            tokens = torch.tensor([draft.tokens[i] for i in frontier], dtype=torch.long)
            out = self.model.forward(tokens, self.cache, positions=layout.positions,
                                     mask=layout.mask)  # [n, vocab]
            return draft_log_probs(self._processed(out.logits, ctx, draft, frontier), self.sampling)

        return grow(expand, shape, k, max_rows=room)

    def _processed(self, logits: torch.Tensor, ctx: DraftContext, draft: DraftTree,
                   frontier: list[int]) -> torch.Tensor:
        """[n, vocab] logits of the frontier's children under the request's processors,
        each frontier node's prefix being the context and its own path."""
        if not self.processor.active:
            return logits
        if frontier == [ROOT]:
            return self.processor.process(logits, ctx.tokens, ctx.num_prompt)
        nodes = torch.tensor(draft.tokens, dtype=torch.long)
        paths = tree_attention(draft.subtree(list(range(len(draft)))), 0).mask[:, 1:]  # [n+1, n]
        ancestry = paths[torch.tensor(frontier, dtype=torch.long) + 1]  # [len(frontier), n]
        return self.processor.process(logits, ctx.tokens, ctx.num_prompt, nodes, ancestry)


@register("draft")
def _build(setup: ProposerSetup) -> Proposer:
    model = setup.resources["load_draft"](setup.spec.draft)
    return DraftModelProposer(model, setup.sampling, setup.generator, TreeShape.from_spec(
        setup.spec, setup.sampling, setup.target.eos_token_ids), setup.target.eos_token_ids)
