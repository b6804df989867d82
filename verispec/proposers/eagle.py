"""EAGLE drafting (Li et al. 2024) with a trained head (verispec.heads).

Cache discipline. Head row t holds (target feature f_t, token x_{t+1}) at
RoPE position t. Rows fed with the target's real features are permanent,
because committed tokens never change; rows fed with the head's own predicted
features while drafting are dropped at the start of the next proposal, and
the tokens the verifier kept come back as real rows from the target's hidden
states of that verification (DraftContext.target_hidden: one row per
committed position, ending at the row that predicted the last committed
token). A rejected draft therefore never leaves a trace in the cache.

Trees (SpecConfig.tree): a node's row reads its parent's predicted feature
and its own token, like a chain row, at RoPE position (the newest real row's
position) + depth, and attends to every real row, its ancestors and itself.
Drafted tree rows are dropped at the next proposal like chain rows.

A step the engine ran without asking for a proposal (adaptive k chose 0)
leaves positions the head never sees; rows carry their own positions, so the
head just attends over fewer rows there. That can cost acceptance, never
correctness.
"""
from __future__ import annotations

import torch

from ..heads.eagle import HeadCache
from ..heads.runtime import LoadedHead, load_head
from ..sampling import logits_to_probs, sample
from ..token_tree import ROOT, TokenTree
from .base import DraftContext, Proposal, Proposer, ProposerSetup, register
from .tree_drafting import DraftTree, FedRows, TreeShape, as_proposal, draft_log_probs, grow


class EagleProposer(Proposer):
    name = "eagle"

    def __init__(self, head: LoadedHead, sampling, generator: torch.Generator,
                 eos_token_ids: frozenset[int], tree: TreeShape | None = None) -> None:
        self.head = head
        self.tree = tree  # None drafts chains
        self.hidden_layers = head.hidden_layers
        self.sampling = sampling
        self.generator = generator
        self.eos = frozenset() if sampling.ignore_eos else eos_token_ids
        module = head.module
        self.cache = HeadCache(module.kv_heads, module.head_dim, head.parts.dtype, head.parts.device)
        self.real_rows = 0  # cache rows fed with the target's own features
        self.fed_until = 0  # positions below this were offered to the head already
        self.last_out: torch.Tensor | None = None  # [1, hidden] output of the newest real row

    def _absorb(self, ctx: DraftContext) -> None:
        """Feed the target's new hidden rows as real rows, each with the token it predicted."""
        hidden = ctx.target_hidden
        if not hidden or hidden[0].shape[0] == 0:
            return
        count = hidden[0].shape[0]
        end = len(ctx.tokens) - 1  # the rows cover positions [end - count, end)
        start = max(end - count, self.fed_until)
        if start >= end:
            return
        offset = start - (end - count)
        dtype = self.head.parts.dtype
        feature = self.head.module.target_feature([h[offset:].to(dtype) for h in hidden])
        tokens = torch.tensor(ctx.tokens[start + 1:end + 1], dtype=torch.long)
        positions = torch.arange(start, end)
        out = self.head.module.step(feature, self.head.embed(tokens), positions, self.cache)
        self.real_rows = self.cache.length
        self.fed_until = end
        self.last_out = out[-1:]

    @torch.inference_mode()
    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        self.cache.truncate(self.real_rows)
        self._absorb(ctx)
        # Without the target's row that predicted the last committed token there
        # is nothing to draft from (a one-token prompt before its first step).
        if k <= 0 or self.last_out is None or self.fed_until != len(ctx.tokens) - 1:
            return Proposal.empty()
        shape = TreeShape.for_step(self.tree, ctx)
        if shape is not None:
            return as_proposal(self._draft_tree(len(ctx.tokens), k, shape))
        head, output = self.head, self.head.output
        first_position = len(ctx.tokens) - 1
        positions = torch.arange(first_position, first_position + k)
        out = self.last_out
        tokens: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        # The chain stays where the head runs and is read once at the end: on a GPU a
        # read per draft token would wait for every step.
        for i in range(k):
            feature = head.parts.final_norm(out)  # [1, hidden], the predicted next feature
            logits = output.logits(feature)  # [1, draft vocab]
            if self.sampling.greedy:
                index = logits.argmax(-1)
            else:
                dist = logits_to_probs(logits, self.sampling)
                index = sample(dist, self.generator)
                probs.append(output.full(dist)[0])
            tokens.append(output.token_ids(index))  # [1]
            if i + 1 < k:
                out = head.module.step(feature, head.embed(tokens[-1]), positions[i:i + 1],
                                       self.cache)
        drafts = torch.cat(tokens).tolist()
        # Nothing after EOS can be accepted (transformers #31301).
        keep = next((i + 1 for i, token in enumerate(drafts) if token in self.eos), len(drafts))
        return Proposal(torch.tensor(drafts[:keep], dtype=torch.long),
                        torch.stack(probs[:keep]) if probs else None)

    def _draft_tree(self, num_tokens: int, k: int, shape: TreeShape) -> TokenTree:
        head = self.head
        rows = FedRows(prefix=self.cache.length, root_position=num_tokens - 2)
        # Post-norm predicted feature of each node's row, read by its children's rows.
        features = {ROOT: head.parts.final_norm(self.last_out)}  # node -> [1, hidden]

        def expand(draft: DraftTree, frontier: list[int]) -> torch.Tensor:
            if frontier != [ROOT]:
                layout = rows.layout(draft, frontier)
                parent_features = torch.cat([features[draft.parents[i]] for i in frontier])
                tokens = torch.tensor([draft.tokens[i] for i in frontier], dtype=torch.long)
                out = head.module.step(parent_features, head.embed(tokens), layout.positions,
                                       self.cache, mask=layout.mask)  # [n, hidden]
                features.update(zip(frontier, head.parts.final_norm(out).split(1)))
            predicted = torch.cat([features[i] for i in frontier])  # [n, hidden]
            return draft_log_probs(head.output.logits(predicted), self.sampling)

        return grow(expand, shape, k, token_ids=head.output.token_ids)


@register("eagle")
def _build(setup: ProposerSetup) -> Proposer:
    head = load_head(setup.spec.head, "eagle", setup.target, setup.spec.head_vocab,
                     setup.spec.head_quant)
    eos = setup.target.eos_token_ids
    return EagleProposer(head, setup.sampling, setup.generator, eos,
                         TreeShape.from_spec(setup.spec, setup.sampling, eos))
