"""Prompt lookup decoding (Saxena 2023): find the latest earlier occurrence of
the context's suffix and propose what followed it. No model; the only state is
an index of the committed context (`NgramIndex`), which drafts never enter and
which re-indexes whenever the context is not an extension of what it saw, so
nothing can go stale after a rollback or a context shift (llama.cpp #21815).
A tree holds one branch per distinct continuation; with SpecConfig.frequency_drafts
a sampled request's chain is drawn from the continuation counts instead
(verispec.proposers.ngram_sampled).
tests/test_ngram.py checks it against a full scan of the context."""
from __future__ import annotations

import torch

from ..token_tree import TokenTree
from ..acceptance import Evidence
from .base import DraftContext, Proposal, Proposer, ProposerSetup, register
from .ngram_sampled import FrequencyDrafts


# First-draft acceptance by matched suffix length 0, 1, 2, 3, 4+, rounded from how
# often the proposal's first token was the target's next one on greedy target
# responses to `verispec train-head`'s prompts, not the bench's (the measurement:
# docs/notebook/redesign.md). Priors only: each request's own outcomes take over
# within a few steps.
MATCH_PRIOR = (0.0, 0.2, 0.5, 0.65, 0.9)
OCCURRENCES = 64  # most recent occurrences a frequency draft counts



def match_evidence(length: int) -> Evidence:
    """The evidence of a draft whose context suffix matched `length` tokens earlier."""
    return Evidence(length, MATCH_PRIOR[min(length, len(MATCH_PRIOR) - 1)])


class NgramIndex:
    """Every n-gram of the committed context (ngram_min <= n <= ngram_max) that
    has a continuation, with its start positions, extended as the context grows.

    Finds what a scan of the whole context for the suffix n-gram finds, in
    O(ngram_max) per step instead of O(context): that scan, run for every request at every
    step (shadow guesses included), was a measurable share of a batched
    serving step. Committed tokens never change, so entries never go stale; a
    context that is not an extension of the indexed one is re-indexed.
    """

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.tokens: list[int] = []
        self.starts: dict[tuple[int, ...], list[int]] = {}  # n-gram -> starts, oldest first

    def update(self, tokens: list[int]) -> None:
        old = len(self.tokens)
        if tokens[:old] != self.tokens:
            self.tokens, self.starts, old = [], {}, 0
        self.tokens.extend(tokens[old:])
        # An n-gram starting at i is usable once token i + n (its continuation) exists.
        for n in range(self.ngram_min, self.ngram_max + 1):
            for i in range(max(0, old - n), len(self.tokens) - n):
                self.starts.setdefault(tuple(self.tokens[i:i + n]), []).append(i)

    def longest_match(self) -> int:
        """The longest n whose suffix n-gram occurred earlier with a continuation; 0 if none."""
        tokens, length = self.tokens, len(self.tokens)
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            if tuple(tokens[length - n:]) in self.starts:
                return n
        return 0

    def continuations(self, k: int, limit: int) -> list[list[int]]:
        """Up to `limit` distinct continuations of at most k tokens of the context's
        suffix: longer n-grams first, and within one n the most recent occurrence
        first (one tree branch per match); limit 1 is prompt lookup's single guess."""
        tokens, length = self.tokens, len(self.tokens)
        found: list[list[int]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            for start in reversed(self.starts.get(tuple(tokens[length - n:]), ())):
                candidate = tokens[start + n: start + n + k]
                key = tuple(candidate)
                if key not in seen:
                    seen.add(key)
                    found.append(candidate)
                    if len(found) == limit:
                        return found
        return found

    def occurrences(self, k: int, limit: int) -> list[list[int]]:
        """What followed each of the `limit` most recent occurrences of the longest
        matched suffix, at most k tokens each, duplicates kept: the counts of a
        frequency draft (verispec.proposers.ngram_sampled)."""
        n = self.longest_match()
        if not n:
            return []
        tokens, length = self.tokens, len(self.tokens)
        starts = self.starts[tuple(tokens[length - n:])][-limit:]
        return [tokens[start + n: start + n + k] for start in starts]


class NgramProposer(Proposer):
    name = "ngram"
    free = True

    def __init__(self, ngram_min: int, ngram_max: int, eos_token_ids: frozenset[int],
                 tree_nodes: int = 0, frequency: FrequencyDrafts | None = None) -> None:
        self.frequency = frequency  # sampled requests: chains drawn from continuation counts
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.eos = frozenset(eos_token_ids)
        self.tree_nodes = tree_nodes  # 0 proposes a chain; else a tree of at most this many nodes
        self.index = NgramIndex(ngram_min, ngram_max)

    def _cut_at_eos(self, found: list[int]) -> list[int]:
        # Propose up to and including EOS, never past it (transformers #31301).
        cut = next((i for i, t in enumerate(found) if t in self.eos), None)
        return found if cut is None else found[: cut + 1]

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        if k <= 0:
            return Proposal.empty()
        self.index.update(ctx.tokens)
        nodes = ctx.tree_budget(self.tree_nodes)
        if self.frequency is not None and not nodes:
            return self.frequency.chain(self.index.occurrences(k, OCCURRENCES), k, self.eos)
        paths = [p for p in (self._cut_at_eos(c) for c in
                             self.index.continuations(k, limit=8 if nodes else 1)) if p]
        if nodes and len(paths) > 1:
            tree = TokenTree.from_paths(paths).trimmed(max_depth=k, max_nodes=nodes)
            return Proposal(tree.tokens, tree=tree)
        return Proposal(torch.tensor(paths[0] if paths else [], dtype=torch.long))

    def evidence(self, ctx: DraftContext) -> Evidence:
        self.index.update(ctx.tokens)
        return match_evidence(self.index.longest_match())


@register("ngram")
def _build(setup: ProposerSetup) -> Proposer:
    return NgramProposer(setup.spec.ngram_min, setup.spec.ngram_max, setup.target.eos_token_ids,
                         tree_nodes=setup.spec.tree, frequency=FrequencyDrafts.of(setup))
