"""Medusa drafting (Cai et al. 2024) with trained heads (verispec.heads).

Head j reads the target's hidden state at the position that predicted the
last committed token and guesses the token j places after it, all K heads in
one pass and one LM-head call. The heads keep no cache and no state besides
the newest target hidden row, so rollback needs nothing.

Each draft is drawn from its own head's distribution under the request's
sampling parameters and returned as draft_probs: the drafts are independent
given the hidden state, which rejection sampling allows, so the output stays
exactly the target's. Typical acceptance, Medusa's lossy verifier, is a
separate opt-in (SpecConfig.lossy_typical).

Trees (SpecConfig.tree) come from the heads' top-b lists, head j giving the
candidates of depth j whatever their parent: "topb" is the Cartesian product
trimmed breadth-first (Medusa's static trees), "dynamic" the budget index
tuples with the highest product of the heads' probabilities. Expanding costs
nothing here, so the dynamic shape expands every candidate that can still make
the budget, not just the branch best.
"""
from __future__ import annotations

import torch

from ..heads.runtime import LoadedHead, load_head
from ..sampling import logits_to_probs, sample
from .base import DraftContext, Proposal, Proposer, ProposerSetup, register
from .tree_drafting import DraftTree, TreeShape, as_proposal, draft_log_probs, grow


class MedusaProposer(Proposer):
    name = "medusa"

    def __init__(self, head: LoadedHead, sampling, generator: torch.Generator,
                 eos_token_ids: frozenset[int], tree: TreeShape | None = None) -> None:
        self.head = head
        self.tree = tree  # None drafts chains
        self.hidden_layers = head.hidden_layers
        self.sampling = sampling
        self.generator = generator
        self.eos = frozenset() if sampling.ignore_eos else eos_token_ids
        self.last_hidden: torch.Tensor | None = None  # [1, hidden]
        self.hidden_for = -1  # len(ctx.tokens) when last_hidden was the newest row

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        if ctx.target_hidden and ctx.target_hidden[0].shape[0]:
            self.last_hidden = ctx.target_hidden[0][-1:].to(self.head.parts.dtype)
            self.hidden_for = len(ctx.tokens)
        k = min(k, self.head.config.num_medusa)
        # The heads read the row that predicted the last committed token, no other.
        if k <= 0 or self.last_hidden is None or self.hidden_for != len(ctx.tokens):
            return Proposal.empty()
        output = self.head.output
        logits = output.logits(self.head.module(self.last_hidden)[:k, 0])  # [k, draft vocab]
        shape = TreeShape.for_step(self.tree, ctx)
        if shape is not None:
            head_log_probs = draft_log_probs(logits, self.sampling)  # [k, draft vocab]

            def expand(draft: DraftTree, frontier: list[int]) -> torch.Tensor:
                depth = draft.depth(frontier[0])  # the frontier's children come from head depth + 1
                return head_log_probs[depth].expand(len(frontier), -1)

            return as_proposal(grow(expand, shape, k, token_ids=output.token_ids,
                                    width=shape.budget))
        probs = None
        if self.sampling.greedy:
            index = logits.argmax(-1)
        else:
            dist = logits_to_probs(logits, self.sampling)
            index = sample(dist, self.generator)
            probs = output.full(dist)
        tokens = output.token_ids(index).tolist()  # [k]: one read of the device
        eos_at = [i for i, t in enumerate(tokens) if t in self.eos]
        if eos_at:
            cut = eos_at[0] + 1  # up to and including EOS, never past it
            tokens = tokens[:cut]
            probs = probs[:cut] if probs is not None else None
        return Proposal(torch.tensor(tokens, dtype=torch.long), probs)


@register("medusa")
def _build(setup: ProposerSetup) -> Proposer:
    head = load_head(setup.spec.head, "medusa", setup.target, setup.spec.head_vocab)
    eos = setup.target.eos_token_ids
    return MedusaProposer(head, setup.sampling, setup.generator, eos,
                          TreeShape.from_spec(setup.spec, setup.sampling, eos))
