"""n-gram lookup's index and a step's tree budget, against brute force."""
from __future__ import annotations

import numpy as np

from verispec.proposers.base import DraftContext
from verispec.proposers.ngram import NgramProposer


def test_step_budget_reaches_the_proposer():
    """DraftContext.tree_nodes: 0 drafts a chain, N caps the tree, None keeps the configured."""
    tokens = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6, 9, 3, 5, 6]
    ngram = NgramProposer(1, 4, frozenset(), tree_nodes=16)
    configured = ngram.propose(DraftContext(tokens, 4), 3)
    assert configured.tree is not None and len(configured.tree) > 2
    assert ngram.propose(DraftContext(tokens, 4, tree_nodes=0), 3).tree is None
    capped = ngram.propose(DraftContext(tokens, 4, tree_nodes=2), 3)
    assert capped.tree is not None and len(capped.tree) == 2


def _scan(tokens: list[int], k: int, ngram_min: int, ngram_max: int, limit: int) -> list[list[int]]:
    """Brute force: every earlier occurrence of the suffix n-gram, scanned right to left."""
    found: list[list[int]] = []
    for n in range(min(ngram_max, len(tokens) - 1), ngram_min - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for start in range(len(tokens) - 1 - n, -1, -1):
            candidate = tokens[start + n: start + n + k]
            if tokens[start:start + n] == suffix and candidate not in found:
                found.append(candidate)
                if len(found) == limit:
                    return found
    return found


def test_ngram_index_answers_what_the_scan_computes():
    """NgramIndex (incremental, O(ngram_max) per step) against a full scan on growing
    random contexts, and on a context that is not an extension of the indexed one."""
    from verispec.proposers.ngram import NgramIndex

    rng = np.random.default_rng(0)
    for vocab, ngram_min, ngram_max in ((3, 1, 4), (6, 2, 3), (50, 1, 1)):
        tokens = rng.integers(0, vocab, 400).tolist()
        index = NgramIndex(ngram_min, ngram_max)
        for end in range(1, 400, 7):
            index.update(tokens[:end])
            for k, limit in ((1, 1), (4, 1), (4, 8)):
                assert index.continuations(k, limit) == _scan(tokens[:end], k, ngram_min,
                                                              ngram_max, limit)
            # The evidence the adaptive controller keys acceptance on: the longest
            # suffix n-gram that occurred earlier with a continuation.
            context = tokens[:end]
            assert index.longest_match() == next(
                (n for n in range(min(ngram_max, end - 1), ngram_min - 1, -1)
                 if any(context[s:s + n] == context[end - n:] for s in range(end - n))), 0)
    index = NgramIndex(1, 3)
    index.update([1, 2, 3, 1, 2])
    index.update([9, 2, 3, 9])  # not an extension: re-indexed from scratch
    assert index.continuations(2, limit=1) == [[2, 3]]
