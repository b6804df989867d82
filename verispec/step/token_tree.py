"""A token tree: the candidates a proposer hands the engine instead of a chain
(SpecInfer, Miao et al. 2023; Medusa; EAGLE), as tokens and parent indices.

Node i hangs below its parent (parents[i] < i, so the nodes are in topological
order); the root, the last committed token, is not a node. Only the structure
lives here: verispec.step.tree feeds a tree to the target and verifies it, and
verispec.step.rejection decides which path it keeps.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

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
