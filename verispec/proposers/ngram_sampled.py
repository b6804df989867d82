"""Drafts that carry real probabilities, for sampled decoding.

A deterministic draft token x is accepted with the target's probability of x,
target_probs[x] (one-hot speculative sampling), so a 0.6 / 0.4 choice the text
has made both ways before is accepted at most 60% of the time. Drawn instead
from draft_probs = the continuation frequencies and verified against them
(Leviathan et al. 2023, Thm. 1), it is accepted with probability
sum_x min(target_probs[x], draft_probs[x]), which is 1 when the two agree.

The draft distribution at each depth is what followed the context's suffix
AND the tokens drawn so far, counted over the occurrences (a back-off n-gram
model without the back-off: the longest match only), sharpened by the
request's temperature, `draft_probs ∝ count ** (1 / T)`, because the target's
own distribution is sharpened the same way. Every token is drawn from the row
reported for it, with the request's generator, and where no occurrence goes
on the chain ends: its length depends only on the drafts drawn, never on the
target, so the chain rule of speculative sampling stays exact. Proven by a
chi-square test of the sampled marginals (tests/proposers/test_ngram_sampled.py), with a
control showing that the same test catches drafts reported as one-hot.

Trees stay deterministic: a node whose children are every distinct
continuation is accepted with the sum of their target probabilities, the most
any draft of those tokens can get, and the one-hot multi-draft rule
(rejection.verify_tree_sampling) verifies them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from verispec.proposers.base import Proposal

if TYPE_CHECKING:
    from verispec.proposers.base import ProposerSetup


def frequency_chain(paths: list[list[int]], depth: int, vocab: int, temperature: float,
                    generator: torch.Generator, stop: frozenset[int],
                    min_share: float = 0.0) -> Proposal:
    """A chain of at most `depth` tokens, each drawn from the frequencies of what
    followed in `paths` (one per occurrence, duplicates kept) among the paths that
    agree with the tokens drawn before it; draft_probs [k', vocab] the rows drawn from.
    The chain ends where fewer than `min_share` of all paths agree with it."""
    drafted: list[int] = []
    rows: list[torch.Tensor] = []
    alive = [p for p in paths if p]
    for position in range(depth):
        counts: dict[int, int] = {}
        for path in alive:
            if len(path) > position:
                counts[path[position]] = counts.get(path[position], 0) + 1
        if not counts or sum(counts.values()) < min_share * len(paths):
            break
        tokens = torch.tensor(list(counts), dtype=torch.long)
        weights = torch.tensor(list(counts.values()), dtype=torch.float64) ** (1.0 / temperature)
        draft_probs = weights / weights.sum()  # [distinct tokens]
        pick = torch.multinomial(draft_probs.to(generator.device), 1, generator=generator)
        token = int(tokens[int(pick)])
        row = torch.zeros(vocab, dtype=torch.float32)
        row[tokens] = draft_probs.float()
        drafted.append(token)
        rows.append(row)
        if token in stop:
            break  # nothing after a stop token can be accepted
        alive = [p for p in alive if len(p) > position + 1 and p[position] == token]
    if not drafted:
        return Proposal.empty()
    return Proposal(torch.tensor(drafted, dtype=torch.long), torch.stack(rows))  # [k', vocab]


@dataclass(frozen=True)
class FrequencyDrafts:
    """A sampled request's frequency drafting: its vocabulary, temperature and generator."""
    vocab: int
    temperature: float
    generator: torch.Generator

    @staticmethod
    def of(setup: "ProposerSetup") -> "FrequencyDrafts | None":
        """For a request that samples with SpecConfig.frequency_drafts on; else None
        (greedy decoding keeps deterministic drafts: the argmax is all that is accepted)."""
        if not setup.spec.frequency_drafts or setup.sampling.greedy:
            return None
        return FrequencyDrafts(setup.target.vocab_size, setup.sampling.temperature,
                               setup.generator)

    def chain(self, paths: list[list[int]], depth: int, stop: frozenset[int],
              min_share: float = 0.0) -> Proposal:
        return frequency_chain(paths, depth, self.vocab, self.temperature, self.generator, stop,
                               min_share)
