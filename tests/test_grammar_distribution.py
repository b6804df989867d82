"""Sampling under a grammar stays exact under speculation: the first two tokens'
marginals follow the constrained target (the target's distribution masked by
the grammar and renormalized), computed here by enumeration with llguidance's
own masks from a fresh matcher per prefix, not with verispec.grammar.

A tiny random model over a 300-token byte-level BPE vocabulary (tests/
tokenizer_support.py), so a grammar leaves a handful of tokens at each step,
several of them different tokenizations of the same text; a logit_bias on
those tokens (a processor, so in the exact computation too) keeps drafts
inside the grammar often enough to be verified. Chains with sampled
draft probabilities (a random draft model), one-hot drafts (n-grams), a tree
setting (drafted as a chain under a grammar), and a grammar whose first token
is forced (drafted one-hot, committed with probability 1). A control that hands
the verifier the unmasked draft probabilities fails the same test."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from conftest import tiny_target
from test_head_equality import _first_two_counts
from tokenizer_support import family_tokenizer
from verispec import Engine, Grammar, SpecConfig

FREE = Grammar("regex", r"(the|he|t|[0-9])[a-e0-9]{1,2}")
FORCED = Grammar("regex", r"x(the|he|h)[0-9]")  # "x" is forced: drafted one-hot
TEMPERATURE = 2.0  # flattens the peaked tiny model, so every allowed token has mass
# Raises the tokens the grammars use, for target and draft alike (processors apply
# to both): a random draft then lands inside the grammar about half the time.
BIAS, FAVOURED = 5.0, set("abcde0123456789thx") | {"he", "the"}


@pytest.fixture(scope="module")
def engine():
    tokenizer = family_tokenizer("llama3")
    target = tiny_target(21, layers=1, vocab=len(tokenizer))
    target.eos_token_ids = frozenset({tokenizer.eos_token_id})
    engine = Engine(target, tokenizer=tokenizer)
    draft = tiny_target(22, layers=1, vocab=len(tokenizer))
    draft.eos_token_ids = target.eos_token_ids
    engine._drafts["random"] = draft
    return engine


def _bias(engine) -> dict[int, float]:
    return {i: BIAS for t, i in engine.tokenizer.get_vocab().items() if t in FAVOURED}


def _prompt(engine) -> list[int]:
    # Repeats give the n-gram proposer matches to draft from.
    return engine.encode("xthe1 the2 he3 t4a xthe")


def constrained_marginals(engine, prompt: list[int], grammar: Grammar) -> np.ndarray:
    """[2, vocab]: the constrained target's first- and second-token marginals."""
    import llguidance
    import llguidance.hf

    vocab = engine.target.vocab_size
    llt = llguidance.hf.from_tokenizer(engine.tokenizer, n_vocab=vocab)

    def row(prefix: list[int]) -> np.ndarray:
        matcher = llguidance.LLMatcher(llt, grammar.llguidance())
        assert matcher.consume_tokens(prefix)
        allowed = np.frombuffer(matcher.compute_logit_bias(), dtype=np.uint8)[:vocab] > 0
        logits = engine.target.forward(torch.tensor(prompt + prefix),
                                       engine.target.new_cache()).logits[-1].double().numpy()
        for token, bias in _bias(engine).items():
            logits[token] += bias
        scaled = np.where(allowed, logits / TEMPERATURE, -np.inf)
        probs = np.exp(scaled - scaled.max())
        return probs / probs.sum()

    first = row([])
    second = sum(first[t] * row([t]) for t in np.nonzero(first)[0])
    return np.stack([first, second])


def fit(counts: np.ndarray, marginals: np.ndarray) -> float:
    """The worst chi-square p-value of the two positions, on the constrained support."""
    worst = 1.0
    for observed, want in zip(counts, marginals):
        keep = want > 0
        assert observed[~keep].sum() == 0, "a token the grammar forbids was emitted"
        if keep.sum() > 1:
            worst = min(worst, chisquare(observed[keep], want[keep] * observed.sum()).pvalue)
    return worst


SPECS = {"sampled-draft chain": SpecConfig("draft", k=2, draft="random"),
         "n-gram chain": SpecConfig("ngram", k=2),
         "n-gram tree": SpecConfig("ngram", k=2, tree=6)}


@pytest.mark.parametrize("grammar, name", [(FREE, "sampled-draft chain"), (FREE, "n-gram tree"),
                                           (FORCED, "n-gram chain")],
                         ids=["free-sampled-draft", "free-ngram-tree", "forced-ngram"])
def test_sampled_constrained_output_follows_the_constrained_target(engine, grammar, name,
                                                                  full_size_runs):
    prompt = _prompt(engine)
    runs = full_size_runs
    counts, drafted, accepted = _first_two_counts(engine, prompt, SPECS[name], TEMPERATURE, runs,
                                                  grammar=grammar, logit_bias=_bias(engine))
    marginals = constrained_marginals(engine, prompt, grammar)
    # Non-vacuity: drafts were verified, and the grammar leaves a real choice.
    assert drafted >= runs // 2 and accepted > 0
    assert (marginals[1] > 0.01).sum() >= 3
    assert fit(counts, marginals) > 1e-3


def test_distribution_check_catches_unmasked_draft_probs(engine, monkeypatch, full_size_runs):
    """Control: a draft cut before its first forbidden token follows the drafted
    distribution masked and renormalized; handing the verifier the unmasked one
    breaks the output distribution, and the check above sees it."""
    from verispec import engine as engine_module

    monkeypatch.setattr(engine_module, "masked_draft_probs", lambda probs, allowed: probs)
    prompt = _prompt(engine)
    runs = full_size_runs
    counts, _, _ = _first_two_counts(engine, prompt, SPECS["sampled-draft chain"], TEMPERATURE,
                                     runs, grammar=FREE, logit_bias=_bias(engine))
    assert fit(counts, constrained_marginals(engine, prompt, FREE)) < 1e-6
