"""Prompt lookup decoding (Saxena 2023): find the latest earlier occurrence of
the context's suffix and propose what followed it. No model, no state: the
proposer re-reads the committed context each step, so nothing can go stale
after a rollback or a context shift (llama.cpp #21815)."""
from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from ..tree import TokenTree
from .base import DraftContext, Proposal, Proposer, ProposerSetup, register


def lookup(tokens: np.ndarray, k: int, ngram_min: int, ngram_max: int) -> np.ndarray:
    """Continuation of the longest suffix n-gram (ngram_max down to ngram_min)
    at its most recent earlier occurrence; at most k tokens, maybe none."""
    length = tokens.shape[0]
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        pattern = tokens[length - n:]
        # Windows start at i <= length - 1 - n, so a continuation token exists
        # and the suffix itself is never its own match.
        windows = sliding_window_view(tokens[: length - 1], n)  # [length - n, n]
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start: start + k]
    return tokens[:0]


def lookup_many(tokens: np.ndarray, k: int, ngram_min: int, ngram_max: int,
                limit: int) -> list[np.ndarray]:
    """Up to `limit` distinct continuations: longer n-grams first, and within
    one n the most recent occurrence first (one tree branch per match)."""
    length = tokens.shape[0]
    found: list[np.ndarray] = []
    seen: set[tuple[int, ...]] = set()
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        windows = sliding_window_view(tokens[: length - 1], n)  # [length - n, n]
        for hit in np.flatnonzero((windows == tokens[length - n:]).all(axis=1))[::-1]:
            start = int(hit) + n
            candidate = tokens[start: start + k]
            key = tuple(candidate.tolist())
            if key not in seen:
                seen.add(key)
                found.append(candidate)
                if len(found) == limit:
                    return found
    return found


class NgramProposer(Proposer):
    name = "ngram"
    free = True

    def __init__(self, ngram_min: int, ngram_max: int, eos_token_ids: frozenset[int],
                 tree_nodes: int = 0) -> None:
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.eos = np.array(sorted(eos_token_ids), dtype=np.int64)
        self.tree_nodes = tree_nodes  # 0 proposes a chain; else a tree of at most this many nodes

    def _cut_at_eos(self, found: np.ndarray) -> np.ndarray:
        eos_at = np.flatnonzero(np.isin(found, self.eos))
        # Propose up to and including EOS, never past it (transformers #31301).
        return found[: eos_at[0] + 1] if eos_at.size else found

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        if k <= 0:
            return Proposal.empty()
        tokens = np.asarray(ctx.tokens, dtype=np.int64)
        if self.tree_nodes:
            paths = [self._cut_at_eos(c).tolist()
                     for c in lookup_many(tokens, k, self.ngram_min, self.ngram_max, limit=8)]
            paths = [p for p in paths if p]
            if len(paths) > 1:
                tree = TokenTree.from_paths(paths).trimmed(max_depth=k, max_nodes=self.tree_nodes)
                return Proposal(tree.tokens, tree=tree)
            found = np.asarray(paths[0] if paths else [], dtype=np.int64)
        else:
            found = self._cut_at_eos(lookup(tokens, k, self.ngram_min, self.ngram_max))
        return Proposal(torch.from_numpy(found.copy()))


@register("ngram")
def _build(setup: ProposerSetup) -> Proposer:
    return NgramProposer(setup.spec.ngram_min, setup.spec.ngram_max, setup.target.eos_token_ids,
                         tree_nodes=setup.spec.tree)
