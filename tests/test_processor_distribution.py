"""Sampling with logit processors stays exact under speculation.

A bigram toy target (raw logits depend on the last token only) is made
history-dependent by the request's processors. Sequences are drawn by
draft-then-verify steps through the engine's own pieces: `LogitProcessor`
with chain or tree ancestry, `logits_to_probs`, the chain verifier the engine
calls, and the tree verifier. Their joint distribution over every two-token
continuation (the second token is verified at a row whose prefix holds the
first, an accepted draft) must pass a chi-square test against the exact
processed target, computed by enumeration with an independent, token-by-token
statement of the processors (tests/test_processors.naive_processed). A control that processes
verified rows with the committed prefix only (the vLLM #18902 class of bug)
fails the same test.
"""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from test_processors import naive_processed
from verispec import SamplingParams
from verispec import engine as engine_module
from verispec.processors import LogitProcessor, chain_ancestry
from verispec.rejection import verify_tree_sampling
from verispec.sampling import logits_to_probs, sample
from verispec.token_tree import ROOT, TokenTree
from verispec.tree import tree_ancestry, tree_feed

V, LENGTH, EOS = 4, 2, 0
PROMPT = [1, 2]
GEN = torch.Generator().manual_seed(2025)
TARGET = torch.randn(V, V, generator=GEN)  # [last token, vocab] raw logits
DRAFT = TARGET + torch.randn(V, V, generator=GEN)  # a draft that overlaps but differs
CASES = {
    "presence": dict(presence_penalty=1.5),
    "frequency": dict(frequency_penalty=1.0),
    "repetition": dict(repetition_penalty=2.5),
    "logit_bias": dict(logit_bias={0: 1.5, 3: -1.0}),
    "min_p": dict(min_p=0.3),
    "min_tokens": dict(min_tokens=2),
}


def exact_distribution(sampling: SamplingParams) -> np.ndarray:
    """[V ** LENGTH] probability of each continuation under the processed target."""
    table = np.zeros(V ** LENGTH)
    for index, seq in enumerate(itertools.product(range(V), repeat=LENGTH)):
        prob, output = 1.0, []
        for token in seq:
            last = (PROMPT + output)[-1]
            logits = naive_processed(TARGET[last], PROMPT, output, sampling, {EOS})
            logits = logits / sampling.temperature
            probs = torch.softmax(logits, -1)
            probs = torch.where(probs < sampling.min_p * probs.max(), 0.0, probs)
            prob *= float(probs[token] / probs.sum())
            output.append(token)
        table[index] = prob
    return table


def _draft_from(processor, committed, drafts, sampling, gen, tokens=None):
    """One draft token drawn from the processed draft after committed + drafts."""
    history = committed + drafts
    probs = logits_to_probs(processor.one(DRAFT[history[-1]], history, len(PROMPT)), sampling)
    token = int(sample(probs, gen)) if tokens is None else tokens
    return token, probs


def chain_step(processor, committed, sampling, gen, k, one_hot):
    drafts, rows = [], []
    for _ in range(k):
        if one_hot:  # a deterministic proposer: the target's raw argmax, no probabilities
            drafts.append(int(TARGET[(committed + drafts)[-1]].argmax()))
            continue
        token, probs = _draft_from(processor, committed, drafts, sampling, gen)
        drafts.append(token)
        rows.append(probs)
    history = committed + drafts
    raw = torch.stack([TARGET[history[len(committed) - 1 + i]] for i in range(k + 1)])  # [k+1, V]
    drafted = torch.tensor(drafts, dtype=torch.long)
    processed = processor.process(raw, committed, len(PROMPT), drafted, chain_ancestry(k))
    draft_probs = torch.stack(rows) if rows else None  # [k, V]
    # The engine's own chain verifier reads only these three fields of a sequence.
    seq = SimpleNamespace(sampling=sampling, lossy_typical=False, generator=gen)
    return engine_module._verify_chain(drafted, draft_probs, processed, seq).tokens


def tree_step(processor, committed, sampling, gen, depth):
    """Two i.i.d. children per node, two levels: siblings drawn with replacement
    from the processed draft given their own path."""
    tokens, parents, rows = [], [], []
    frontier = [ROOT]
    for _ in range(depth):
        new = []
        for parent in frontier:
            path = []
            node = parent
            while node != ROOT:
                path.insert(0, tokens[node])
                node = parents[node]
            for _ in range(2):
                token, probs = _draft_from(processor, committed, path, sampling, gen)
                tokens.append(token)
                parents.append(parent)
                rows.append(probs)
                new.append(len(tokens) - 1)
        frontier = new
    tree = TokenTree(torch.tensor(tokens), torch.tensor(parents), torch.stack(rows))
    feed = tree_feed(len(committed) - 1, committed, tree)
    last = [committed[-1]] + tokens  # row 0 is the root, row i + 1 is node i
    raw = torch.stack([TARGET[t] for t in last])  # [N + 1, V]
    processed = processor.process(raw, committed, len(PROMPT), tree.tokens, tree_ancestry(feed))
    return verify_tree_sampling(tree, logits_to_probs(processed, sampling), gen).tokens


def draw(sampling: SamplingParams, runs: int, mode: str, seed: int) -> np.ndarray:
    """[V ** LENGTH] counts of the continuations drawn by speculative steps."""
    gen = torch.Generator().manual_seed(seed)
    processor = LogitProcessor(sampling, V, frozenset({EOS}))
    counts = np.zeros(V ** LENGTH, dtype=np.int64)
    for _ in range(runs):
        committed = list(PROMPT)
        while len(committed) - len(PROMPT) < LENGTH:
            left = LENGTH - (len(committed) - len(PROMPT))
            if mode == "tree":
                emitted = tree_step(processor, committed, sampling, gen, min(2, left - 1)) \
                    if left > 1 else chain_step(processor, committed, sampling, gen, 0, True)
            else:
                emitted = chain_step(processor, committed, sampling, gen, left - 1, mode == "one-hot")
            committed.extend(emitted)
        seq = committed[len(PROMPT):len(PROMPT) + LENGTH]
        counts[int(np.ravel_multi_index(seq, (V,) * LENGTH))] += 1
    return counts


def fit(counts: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
    runs = counts.sum()
    keep = exact > 0
    assert counts[~keep].sum() == 0, "a continuation the processed target forbids was emitted"
    p = chisquare(counts[keep], exact[keep] / exact[keep].sum() * runs).pvalue
    return float(p), float(0.5 * np.abs(counts / runs - exact).sum())


# Chain with sampled draft probabilities and i.i.d. trees for every processor; a
# deterministic (one-hot) proposer for the history-dependent two.
MODES = [(name, mode) for name in CASES for mode in ("draft", "tree")] + [
    ("presence", "one-hot"), ("min_tokens", "one-hot")]


@pytest.mark.parametrize("name,mode", MODES)
def test_processed_sampling_is_lossless(name, mode, full_size_runs):
    sampling = SamplingParams(temperature=1.0, **CASES[name])
    exact = exact_distribution(sampling)
    plain = exact_distribution(SamplingParams(temperature=1.0))
    # Non-vacuity: the processor really changes the distribution being tested.
    assert 0.5 * np.abs(exact - plain).sum() > 0.05
    p, tv = fit(draw(sampling, 5 * full_size_runs, mode, seed=len(name) + len(mode)), exact)
    assert p > 1e-3 and tv < 0.05, (p, tv)


def test_distribution_check_catches_a_committed_only_history(monkeypatch, full_size_runs):
    """The bug class this guards against: verified rows penalized with the
    committed prefix only, ignoring the accepted drafts before them."""
    real = LogitProcessor.process

    def committed_only(self, logits, committed, num_prompt, drafts=None, ancestry=None):
        return real(self, logits, committed, num_prompt)

    monkeypatch.setattr(LogitProcessor, "process", committed_only)
    sampling = SamplingParams(temperature=1.0, **CASES["presence"])
    p, tv = fit(draw(sampling, 5 * full_size_runs, "draft", seed=3), exact_distribution(sampling))
    assert p < 1e-6 and tv > 0.05, (p, tv)
