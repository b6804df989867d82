"""What the sampled-distribution tests share: the target's exact marginals of the first two
new tokens, the counts of seeded requests, and the chi-square verdict."""
from __future__ import annotations

import numpy as np
import torch
from scipy.stats import chisquare

from verispec import SamplingParams


def exact_marginals(target, prompt: list[int], temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """The target's distributions of the first and second new token."""
    def next_probs(tokens):
        logits = target.forward(torch.tensor(tokens), target.new_cache()).logits[-1]
        return (logits / temperature).softmax(-1).double().numpy()

    first = next_probs(prompt)
    second = sum(first[x] * next_probs(prompt + [x]) for x in range(len(first)))
    return first, second


def first_two_counts(engine, prompt: list[int], spec, temperature: float, runs: int,
                      **options):
    """How often each token came first and second over `runs` seeded three-token
    requests ([2, vocab]), with the drafted and accepted totals; `options` are
    more SamplingParams (a grammar, a logit_bias)."""
    counts = np.zeros((2, engine.target.vocab_size))
    drafted = accepted = 0
    for seed in range(runs):
        got = engine.generate(prompt, SamplingParams(temperature=temperature, seed=seed,
                                                     max_new_tokens=3, **options), spec)
        counts[0, got.token_ids[0]] += 1
        counts[1, got.token_ids[1]] += 1
        drafted += got.stats.drafted
        accepted += got.stats.accepted
    return counts, drafted, accepted


def worst_pvalue(counts, marginals, runs: int) -> float:
    return min(chisquare(observed, want / want.sum() * runs).pvalue
               for observed, want in zip(counts, marginals))
