"""Token trees verified in one target pass (SpecInfer, Miao et al. 2023; Medusa;
EAGLE): the structure, its attention mask and positions, and the one step the
engine runs when a proposer returns a tree instead of a chain.

The root of every tree is the last committed token, which the chain loop feeds
first anyway; node i hangs below its parent and is fed as row i + 1. A row
attends to the committed context, its ancestors and itself, at RoPE position
past_len + depth, so each root-to-leaf path computes exactly what that path fed
alone as a chain would, and the accepted path's cache entries, moved together,
are exactly those of the chain.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from .config import SamplingParams
from .models.base import TargetModel
from .rejection import TreeVerdict, verify_tree_greedy, verify_tree_sampling
from .sampling import logits_to_probs

ROOT = -1  # the parent index of the root's children


@dataclass(eq=False)
class TokenTree:
    tokens: torch.Tensor  # [N] int64
    parents: torch.Tensor  # [N] int64; parents[i] < i, ROOT for a child of the root
    draft_probs: torch.Tensor | None = None  # [N, vocab]: the distribution node i was drawn
    # from (its parent's children's); None = deterministic candidates (one-hot)
    token_list: list[int] = field(init=False, repr=False)
    parent_list: list[int] = field(init=False, repr=False)
    depth_list: list[int] = field(init=False, repr=False)
    _children: dict[int, list[int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.tokens = torch.as_tensor(self.tokens, dtype=torch.long).flatten()
        self.parents = torch.as_tensor(self.parents, dtype=torch.long).flatten()
        n = self.tokens.shape[0]
        if self.parents.shape[0] != n:
            raise ValueError(f"{n} tokens but {self.parents.shape[0]} parents")
        if self.draft_probs is not None and (self.draft_probs.dim() != 2
                                             or self.draft_probs.shape[0] != n):
            raise ValueError(f"draft_probs must be [{n}, vocab], got {tuple(self.draft_probs.shape)}")
        self.token_list = self.tokens.tolist()
        self.parent_list = self.parents.tolist()
        self.depth_list = []
        self._children = {ROOT: []}
        for i, parent in enumerate(self.parent_list):
            # Topological order is what lets one pass compute depths and masks.
            if not ROOT <= parent < i:
                raise ValueError(f"node {i} has parent {parent}; need {ROOT} <= parent < {i}")
            self.depth_list.append(1 if parent == ROOT else self.depth_list[parent] + 1)
            self._children[i] = []
            self._children[parent].append(i)

    def __len__(self) -> int:
        return len(self.token_list)

    @property
    def depths(self) -> torch.Tensor:
        """[N] int64; a child of the root has depth 1."""
        return torch.tensor(self.depth_list, dtype=torch.long)

    @property
    def max_depth(self) -> int:
        return max(self.depth_list, default=0)

    def children(self, node: int) -> list[int]:
        """Node indices below `node` (ROOT for the root), in drafting order."""
        return self._children[node]

    def ancestors(self, node: int) -> list[int]:
        """Root-to-node path of node indices, ending with `node`."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parent_list[node]
        return path[::-1]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path as node indices, leaves in index order."""
        return [self.ancestors(i) for i in range(len(self)) if not self._children[i]]

    def trimmed(self, max_depth: int, max_nodes: int | None = None) -> "TokenTree":
        """The subtree of nodes within max_depth among the first max_nodes; the
        engine's budget (max_new_tokens, context) bounds a tree's depth and size."""
        limit = len(self) if max_nodes is None else max_nodes
        # A kept node's parent comes earlier and is shallower, so it is kept too.
        kept = [i for i in range(min(limit, len(self))) if self.depth_list[i] <= max_depth]
        if len(kept) == len(self):
            return self
        new_index = {old: new for new, old in enumerate(kept)}
        new_index[ROOT] = ROOT
        index = torch.tensor(kept, dtype=torch.long)
        return TokenTree(self.tokens[index], torch.tensor([new_index[self.parent_list[i]] for i in kept]),
                         None if self.draft_probs is None else self.draft_probs[index])

    @staticmethod
    def from_chain(tokens: torch.Tensor, draft_probs: torch.Tensor | None = None) -> "TokenTree":
        tokens = torch.as_tensor(tokens, dtype=torch.long).flatten()
        return TokenTree(tokens, torch.arange(tokens.shape[0]) - 1, draft_probs)

    @staticmethod
    def from_paths(paths: Sequence[Sequence[int]]) -> "TokenTree":
        """A trie of deterministic candidate continuations (n-gram matches, Medusa
        top-k products): shared prefixes become shared nodes, verified once."""
        tokens: list[int] = []
        parents: list[int] = []
        index: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        for candidate in paths:
            node = ROOT
            for token in candidate:
                key = (node, int(token))
                if key not in index:
                    index[key] = len(tokens)
                    tokens.append(int(token))
                    parents.append(node)
                node = index[key]
        return TokenTree(torch.tensor(tokens, dtype=torch.long),
                         torch.tensor(parents, dtype=torch.long))


@dataclass
class TreeAttention:
    mask: torch.Tensor  # [N + 1, past_len + N + 1] bool, True = may attend
    positions: torch.Tensor  # [N + 1] int64 RoPE positions


def tree_attention(tree: TokenTree, past_len: int) -> TreeAttention:
    """Mask and positions for feeding [root] + tree nodes after past_len cached tokens."""
    n = len(tree)
    local = torch.zeros(n + 1, n + 1, dtype=torch.bool)  # row/col 0 = root, i + 1 = node i
    local[0, 0] = True
    for i, parent in enumerate(tree.parent_list):
        local[i + 1] = local[parent + 1]
        local[i + 1, i + 1] = True
    mask = torch.cat([torch.ones(n + 1, past_len, dtype=torch.bool), local], dim=1)
    positions = past_len + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths])
    return TreeAttention(mask, positions)


@dataclass
class TreeStepResult:
    tokens: list[int]  # emitted: the accepted path's tokens, then one recovered or bonus token
    num_accepted: int  # accepted tree nodes, 0..max_depth
    path: list[int]  # accepted node indices, root's child first
    bonus: bool  # the last token came from the target at a leaf
    hidden: tuple[torch.Tensor, ...] = ()  # per requested layer [num_accepted + 1, hidden]:
    # the root's row, then the accepted nodes' rows, like the chain's hidden[: accepted + 1]


@dataclass
class TreeFeed:
    """The target-forward arguments of one tree step, and what verification needs after it."""
    tree: TokenTree
    past_len: int  # cache length before the forward: every committed token but the last
    tokens: torch.Tensor  # [N + 1]: the last committed token, then the nodes
    layout: TreeAttention


def tree_feed(cache_length: int, committed_tokens: Sequence[int], tree: TokenTree) -> TreeFeed:
    """What to feed for [last committed token] + tree after `cache_length` cached positions.

    Before: the cache holds every committed token but the last (the chain
    loop's invariant); anything else would verify the tree against the wrong context.
    """
    if cache_length != len(committed_tokens) - 1:
        raise ValueError(f"cache holds {cache_length} positions; the step needs every committed "
                         f"token but the last ({len(committed_tokens) - 1})")
    tokens = torch.cat([torch.tensor([committed_tokens[-1]], dtype=torch.long), tree.tokens])
    return TreeFeed(tree, cache_length, tokens, tree_attention(tree, cache_length))


def tree_finish(feed: TreeFeed, out, cache, sampling: SamplingParams,
                generator: torch.Generator) -> TreeStepResult:
    """Verify the tree against the forward's logits [N + 1, vocab] and compact the cache.

    After: the cache holds the committed tokens, the last one and the accepted
    nodes, i.e. again every committed token but the last newly emitted one,
    so chain steps and tree steps may alternate freely.
    """
    tree, past_len = feed.tree, feed.past_len
    if sampling.greedy:
        verdict: TreeVerdict = verify_tree_greedy(tree, out.logits)
    else:
        verdict = verify_tree_sampling(tree, logits_to_probs(out.logits, sampling), generator)
    rows = torch.tensor([0] + [i + 1 for i in verdict.path], dtype=torch.long)  # [accepted + 1]
    # Keyword arguments: HFCache.compact and StaticKVCache.compact order them differently.
    cache.compact(start=past_len, keep=past_len + rows)
    hidden = tuple(h[rows.to(h.device)] for h in out.hidden)
    return TreeStepResult(verdict.tokens, verdict.num_accepted, verdict.path, verdict.bonus, hidden)


def tree_step(
    target: TargetModel,
    cache,
    committed_tokens: Sequence[int],
    tree: TokenTree,
    sampling: SamplingParams,
    generator: torch.Generator,
    hidden_layers: Sequence[int] = (),
) -> TreeStepResult:
    """One target forward over [last committed token] + tree, verification, and
    cache compaction: `tree_feed`, the forward, `tree_finish`. A batch scheduler
    calls the two halves itself around one forward shared by many requests."""
    feed = tree_feed(cache.length, committed_tokens, tree)
    out = target.forward(feed.tokens, cache, positions=feed.layout.positions,
                         mask=feed.layout.mask, hidden_layers=hidden_layers)  # [N + 1, vocab]
    return tree_finish(feed, out, cache, sampling, generator)
