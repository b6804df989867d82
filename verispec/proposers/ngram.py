"""Prompt lookup decoding (Saxena 2023): find the latest earlier occurrence of
the context's suffix and propose what followed it. No model, no state: the
proposer re-reads the committed context each step, so nothing can go stale
after a rollback or a context shift (llama.cpp #21815)."""
from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

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


class NgramProposer(Proposer):
    name = "ngram"

    def __init__(self, ngram_min: int, ngram_max: int, eos_token_ids: frozenset[int]) -> None:
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.eos = np.array(sorted(eos_token_ids), dtype=np.int64)

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        if k <= 0:
            return Proposal.empty()
        found = lookup(np.asarray(ctx.tokens, dtype=np.int64), k, self.ngram_min, self.ngram_max)
        eos_at = np.flatnonzero(np.isin(found, self.eos))
        if eos_at.size:
            # Propose up to and including EOS, never past it (transformers #31301).
            found = found[: eos_at[0] + 1]
        return Proposal(torch.from_numpy(found.copy()))


@register("ngram")
def _build(setup: ProposerSetup) -> Proposer:
    return NgramProposer(setup.spec.ngram_min, setup.spec.ngram_max, setup.target.eos_token_ids)
