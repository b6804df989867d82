"""Token trees (verispec.token_tree) verified in one target pass (SpecInfer, Miao
et al. 2023; Medusa; EAGLE): their attention mask and positions, and the feed and
finish around the one forward the engine runs when a proposer returns a tree.

The root of every tree is the last committed token, which the chain loop feeds
first anyway; node i hangs below its parent and is fed as row i + 1. A row
attends to the committed context, its ancestors and itself, at RoPE position
past_len + depth, so each root-to-leaf path computes exactly what that path fed
alone as a chain would, and the accepted path's cache entries, moved together,
are exactly those of the chain.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .config import SamplingParams
from .rejection import TreeVerdict, verify_tree_greedy, verify_tree_sampling
from .sampling import ProbRows
from .token_tree import TokenTree


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


def tree_ancestry(feed: TreeFeed) -> torch.Tensor:
    """[N + 1, N] bool: the nodes in each fed row's prefix (its ancestors and itself),
    which the request's logit processors count (verispec.processors)."""
    return feed.layout.mask[:, feed.past_len + 1:]


def tree_finish(feed: TreeFeed, out, cache, sampling: SamplingParams,
                generator: torch.Generator,
                target_logits: torch.Tensor | None = None) -> TreeStepResult:
    """Verify the tree against the forward's logits [N + 1, vocab] and compact the cache.
    `target_logits`: those logits after the request's processors, when it has any.

    After: the cache holds the committed tokens, the last one and the accepted
    nodes, i.e. again every committed token but the last newly emitted one,
    so chain steps and tree steps may alternate freely.
    """
    tree, past_len = feed.tree, feed.past_len
    logits = out.logits if target_logits is None else target_logits  # [N + 1, vocab]
    if sampling.greedy:
        verdict: TreeVerdict = verify_tree_greedy(tree, logits)
    else:
        # The walk reads a value per node it tries: from a GPU, the rows come over once.
        verdict = verify_tree_sampling(tree, ProbRows(logits.cpu(), sampling), generator)
    rows = torch.tensor([0] + [i + 1 for i in verdict.path], dtype=torch.long)  # [accepted + 1]
    cache.compact(past_len, past_len + rows)
    hidden = tuple(h[rows.to(h.device, non_blocking=True)] for h in out.hidden)
    return TreeStepResult(verdict.tokens, verdict.num_accepted, verdict.path, verdict.bonus, hidden)
