"""Token trees drafted by a model (draft LM, EAGLE head, Medusa heads): the
expansion loop, candidate scores, top-b and budget selection, and the mask of
drafted rows fed to a model's cache, shared by every model-based proposer.

A node's score is its cumulative draft log-probability, the sum of the draft's
log-probabilities along its root-to-node path. Two shapes:

- topb: every node of a depth gets its `branch` likeliest children, breadth-
  first, until `budget` nodes exist (Medusa's static trees, Cai et al. 2024).
- dynamic: EAGLE-2 (Li et al. 2024, "Faster Inference of Language Models with
  Dynamic Draft Trees", Sec. 4): depth by depth, expand the `width` frontier
  nodes with the best scores, each with its `branch` likeliest children; then
  rerank every drafted node and keep the `budget` best. A child never scores
  above its parent and ties go to the earlier node, which always is the
  parent, so the kept set is ancestor-closed and forms a tree by itself.

Candidates are the draft's top choices, a deterministic function of the
context, so trees carry no draft_probs: verify_tree_sampling's one-hot rule
keeps sampled output exactly the target's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from verispec.config import SamplingParams, SpecConfig
from verispec.proposers.base import DraftContext, Proposal
from verispec.step.sampling import logits_to_probs
from verispec.step.token_tree import ROOT, TokenTree
from verispec.step.tree import TreeAttention, tree_attention


@dataclass(frozen=True)
class TreeShape:
    budget: int  # most nodes in a tree (SpecConfig.tree)
    shape: str  # "dynamic" or "topb" (SpecConfig.tree_shape)
    branch: int  # children per expanded node (SpecConfig.tree_branch)
    stop_tokens: frozenset[int] = frozenset()  # never expanded: nothing after EOS is accepted

    @staticmethod
    def from_spec(spec: SpecConfig, sampling: SamplingParams,
                  eos_token_ids: frozenset[int]) -> "TreeShape | None":
        """None when the request drafts chains (spec.tree == 0)."""
        if not spec.tree:
            return None
        stop = frozenset() if sampling.ignore_eos else frozenset(eos_token_ids)
        return TreeShape(spec.tree, spec.tree_shape, spec.tree_branch, stop)

    @staticmethod
    def for_step(shape: "TreeShape | None", ctx: DraftContext) -> "TreeShape | None":
        """This step's shape: the step's budget (`--tree auto`) within the configured
        one; None drafts a chain."""
        if shape is None:
            return None
        budget = ctx.tree_budget(shape.budget)
        return replace(shape, budget=budget) if budget else None


@dataclass
class DraftTree:
    """Every node drafted so far, in creation order (a parent precedes its children)."""
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # cumulative draft log-probability

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int, log_prob: float) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depth(parent) + 1)
        # min(., 0) keeps child <= parent under rounding: the selection relies on it.
        self.scores.append(self.score(parent) + min(log_prob, 0.0))
        return len(self.tokens) - 1

    def depth(self, node: int) -> int:
        return 0 if node == ROOT else self.depths[node]

    def score(self, node: int) -> float:
        return 0.0 if node == ROOT else self.scores[node]

    def subtree(self, kept: list[int]) -> TokenTree:
        """The TokenTree of an ancestor-closed, increasing list of node indices."""
        new_index = {old: new for new, old in enumerate(kept)}
        new_index[ROOT] = ROOT
        return TokenTree(torch.tensor([self.tokens[i] for i in kept], dtype=torch.long),
                         torch.tensor([new_index[self.parents[i]] for i in kept], dtype=torch.long))


# expand(tree so far, frontier) -> [len(frontier), draft vocab] log-probabilities of each
# frontier node's children; the frontier is [ROOT] at depth 1, then nodes of one depth.
Expand = Callable[[DraftTree, list[int]], torch.Tensor]


def draft_log_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """[n, vocab] log-probabilities that rank candidates: the request's own
    transformed distribution when sampling, the plain softmax when greedy
    (its one-hot would rank nothing but the argmax)."""
    if sampling.greedy:
        return torch.log_softmax(logits.float(), dim=-1)
    return logits_to_probs(logits, sampling).log()


def _best(draft: DraftTree, nodes: list[int], count: int) -> list[int]:
    """The `count` best-scoring nodes, ties to the earlier one, in creation order."""
    ranked = sorted(nodes, key=lambda i: (-draft.scores[i], i))
    return sorted(ranked[:count])


def grow(expand: Expand, shape: TreeShape, max_depth: int,
         token_ids: Callable[[torch.Tensor], torch.Tensor] | None = None,
         width: int | None = None, max_rows: int | None = None) -> TokenTree:
    """Draft a tree of at most shape.budget nodes and depth max_depth.

    token_ids maps draft-vocabulary indices to token ids (a reduced draft
    vocabulary); width: frontier nodes expanded per depth in the dynamic shape
    (EAGLE-2 uses the branch factor; free expanders may afford the budget,
    which makes the kept set exactly the budget best nodes of the full
    branch-ary tree); max_rows: the most nodes below the root an expander
    may be asked to feed (a model's cache room).
    """
    draft = DraftTree()
    frontier = [ROOT]
    fed = 0
    dynamic = shape.shape == "dynamic"
    width = shape.branch if width is None else width
    for _ in range(max_depth):
        if frontier != [ROOT]:
            rows = len(frontier) if max_rows is None else max(0, max_rows - fed)
            if dynamic:
                frontier = _best(draft, frontier, min(width, rows))
            else:
                # Only as many parents as the budget has children left for.
                wanted = math.ceil((shape.budget - len(draft)) / shape.branch)
                frontier = frontier[: min(wanted, rows)]
            fed += len(frontier)
        if not frontier:
            break
        log_probs = expand(draft, frontier)  # [n, draft vocab]
        top = torch.topk(log_probs, min(shape.branch, log_probs.shape[-1]), dim=-1)  # [n, b]
        tokens = top.indices if token_ids is None else token_ids(top.indices)
        new: list[int] = []
        for parent, row_tokens, row_scores in zip(frontier, tokens.tolist(), top.values.tolist()):
            for token, log_prob in zip(row_tokens, row_scores):
                room = dynamic or len(draft) < shape.budget
                # A zero-probability candidate is one the draft would never pick.
                if room and log_prob > -math.inf:
                    new.append(draft.add(token, parent, log_prob))
        frontier = [i for i in new if draft.tokens[i] not in shape.stop_tokens]
    kept = _best(draft, list(range(len(draft))), shape.budget) if dynamic else list(range(len(draft)))
    return draft.subtree(kept)


def as_proposal(tree: TokenTree) -> Proposal:
    return Proposal(tree.tokens, tree=tree) if len(tree) else Proposal.empty()


@dataclass
class FedRows:
    """Drafted nodes fed to a model's cache after `prefix` context rows.

    A drafted row attends to every context row, to its ancestors' rows and to
    itself, at RoPE position root_position + depth: what the node's root-to-
    node path fed alone as a chain would see (the layout of verispec.step.tree).
    """
    prefix: int  # cache rows before the first drafted one; every drafted row attends them
    root_position: int  # RoPE position of the root's row
    nodes: list[int] = field(default_factory=list)  # the node of each drafted cache row

    def layout(self, draft: DraftTree, nodes: list[int]) -> TreeAttention:
        """Mask [n, prefix + fed + n] and positions [n] for feeding `nodes`
        next; records them as fed. Every ancestor must have been fed before."""
        # Row and column i + 1 of the tree's own layout are node i; column 0 is the root.
        full = tree_attention(draft.subtree(list(range(len(draft)))), past_len=0)
        self.nodes.extend(nodes)
        rows = torch.tensor(nodes, dtype=torch.long) + 1
        columns = torch.tensor(self.nodes, dtype=torch.long) + 1
        local = full.mask[rows][:, columns]  # [n, fed + n]: ancestors and self
        if int(local.sum()) != sum(draft.depths[i] for i in nodes):
            raise ValueError("a drafted row's ancestor was never fed to the cache")
        mask = torch.cat([torch.ones(len(nodes), self.prefix, dtype=torch.bool), local], dim=1)
        return TreeAttention(mask, self.root_position + full.positions[rows])
