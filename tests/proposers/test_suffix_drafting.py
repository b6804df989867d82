"""Suffix decoding's drafts: frequencies within the caps, the trie-free chain equal to
grow_draft's, the kernel's lookups equal to the Python reference, the best store
winning, and one lookup per adaptive step."""
from __future__ import annotations

import random
from array import array

import pytest

from verispec import kernels
from verispec.proposers.base import DraftContext
from verispec.proposers.suffix import (
    SuffixProposer,
    SuffixSettings,
    chain_lookup,
    grow_draft,
    likeliest_chain,
    native_lookup,
)
from verispec.proposers.suffix_store import SuffixIndex, SuffixStore

# -- drafting ---------------------------------------------------------------------

def test_drafts_follow_frequencies_within_caps():
    paths = [[5, 6, 7]] * 6 + [[5, 8]] * 3 + [[9]]
    chain, score = grow_draft(paths, 8, chain=True, min_prob=0.1, stop=frozenset())
    assert chain.tokens == [5, 6, 7] and score == pytest.approx(0.9 + 0.6 + 0.6)
    tree, score = grow_draft(paths, 8, chain=False, min_prob=0.25, stop=frozenset())
    assert tree.tokens == [5, 6, 7, 8] and score == pytest.approx(0.9 + 0.6 + 0.6 + 0.3)
    cut, _ = grow_draft(paths, 8, chain=True, min_prob=0.1, stop=frozenset({6}))
    assert cut.tokens == [5, 6]  # nothing past a stop token
    # Depth <= factor * m + offset: a 2-token match drafts at most 2 with factor 1.
    proposer = SuffixProposer(None, frozenset(), settings=SuffixSettings(1.0, 0.0, 0.0))
    tokens = [1, 2, 3, 4, 5, 6, 9, 9, 1, 2]
    assert proposer.propose(DraftContext(tokens, len(tokens)), 8).tokens.tolist() == [3, 4]



def test_likeliest_chain_is_grow_drafts_chain():
    """The chain drafts' trie-free walk picks grow_draft's chain and score: ties to the
    first path to show a token, shares of all paths, nothing past a stop token."""
    rng = random.Random(5)
    for _ in range(500):
        paths = [[rng.randrange(4) for _ in range(rng.randrange(0, 7))]
                 for _ in range(rng.randrange(1, 12))]
        depth, min_prob = rng.randrange(1, 8), rng.choice([0.0, 0.1, 0.3])
        stop = frozenset(rng.sample(range(4), rng.randrange(0, 2)))
        draft, score = grow_draft(paths, depth, chain=True, min_prob=min_prob, stop=stop)
        tokens, probs = likeliest_chain(paths, depth, min_prob, stop)
        assert tokens == draft.tokens and sum(probs) == score


@pytest.mark.skipif(not kernels.available(), reason="verispec kernels unavailable here")
def test_native_lookup_equals_the_python_reference():
    """The kernel's lookup returns what chain_lookup's Python reference returns: over a
    store that evicted (offset streams, dead chain links), and over the request's own
    context, which the kernel scans where the reference reads the request's index; for
    contexts that copy a stored stretch and ones that do not, at several caps,
    thresholds and stops."""
    rng = random.Random(11)
    checked = {"request": 0, "global": 0}
    for trial in range(12):
        store = SuffixStore(max_requests=40, max_tokens=rng.choice([300, 2000]))
        sequences = []
        for _ in range(80):
            sequence = [rng.randrange(6) for _ in range(rng.randrange(3, 40))]
            sequences.append(sequence)
            store.add(sequence)
        settings = SuffixSettings(rng.choice([0.5, 1.0, 2.0]), rng.choice([0.0, 1.0]),
                                  rng.choice([0.0, 0.1, 0.4]))
        caps = [settings.depth_cap(m) for m in range(store.max_depth + 1)]
        stop = frozenset(rng.sample(range(6), rng.randrange(0, 2)))
        for _ in range(30):
            source = rng.choice(sequences)
            cut = rng.randrange(1, len(source) + 1)
            context = [rng.randrange(6) for _ in range(rng.randrange(0, 60))] + source[:cut]
            k = rng.randrange(1, 9)
            own = SuffixIndex(store.max_depth)
            own.add(context, keep_open=True)
            python = {"request": chain_lookup(own, context, k, caps, settings.min_prob, stop),
                      "global": store.read(lambda index: chain_lookup(
                          index, context, k, caps, settings.min_prob, stop))}
            native = store.read(lambda index: native_lookup(
                array("q", context), index, context, k, caps, settings.min_prob, stop,
                store.max_depth, own.recent))
            assert native == python
            alone = native_lookup(array("q", context), None, context, k, caps, settings.min_prob,
                                  stop, store.max_depth, own.recent)
            assert alone == {"request": python["request"]}
            for source_name, lookup in python.items():
                checked[source_name] += bool(lookup.chains)
    assert min(checked.values()) > 150  # most contexts found something to draft in each


@pytest.mark.skipif(not kernels.available(), reason="verispec kernels unavailable here")
def test_native_and_python_proposers_draft_alike_as_the_context_grows():
    """Step by step over growing contexts, and past one that is not an extension (the
    proposer starts over), the kernel's proposer drafts what the Python one drafts."""
    rng = random.Random(3)
    store = SuffixStore()
    for _ in range(50):
        store.add([rng.randrange(8) for _ in range(rng.randrange(5, 30))])
    native = SuffixProposer(store, frozenset({7}), max_k=6)
    python = SuffixProposer(store, frozenset({7}), max_k=6)
    python._native = False
    assert native._native
    for text in range(3):
        tokens = [rng.randrange(8) for _ in range(5)]
        for _ in range(40):
            ctx = DraftContext(list(tokens), 2)
            assert native.evidence(ctx) == python.evidence(ctx)
            k = rng.randrange(1, 7)
            assert native.propose(ctx, k).tokens.tolist() == python.propose(ctx, k).tokens.tolist()
            assert native.last == python.last
            tokens += [rng.randrange(8) for _ in range(rng.randrange(1, 4))]


def test_global_store_beats_a_weaker_request_match():
    """The best-scoring draft of both stores wins: three past outputs agree on
    what follows, this request's two earlier occurrences disagree (score 1.5 < 3)."""
    store = SuffixStore()
    for _ in range(3):
        store.add([1, 2, 3, 4, 5, 6])
    proposer = SuffixProposer(store, frozenset(), settings=SuffixSettings(2.0, 0.0, 0.1))
    tokens = [2, 3, 7, 2, 3, 8, 5, 2, 3]
    assert proposer.propose(DraftContext(tokens, 4), 3).tokens.tolist() == [4, 5, 6]
    assert proposer.last.source == "global" and proposer.last.score == pytest.approx(3)
    alone = SuffixProposer(None, frozenset(), settings=SuffixSettings(2.0, 0.0, 0.1))
    # Alone, an even split goes to the newest occurrence.
    assert alone.propose(DraftContext(tokens, 4), 3).tokens.tolist() == [8, 5, 2]
    assert alone.last.source == "request" and alone.last.score == pytest.approx(1.5)
    proposer.finished(DraftContext(tokens, 4))
    assert store.sequences()[-1] == tokens[4:]



def test_evidence_then_propose_reads_the_stores_once_and_drafts_the_same():
    """An adaptive step asks for evidence, then a draft: the draft comes from the
    evidence's lookup and equals what a fresh proposer drafts for the same context."""
    store = SuffixStore()
    for _ in range(3):
        store.add([1, 2, 3, 4, 5, 6, 7, 8])
    tokens = [9, 9, 1, 2, 3]
    cached = SuffixProposer(store, frozenset(), max_k=6)
    calls = []
    original = store.read
    store.read = lambda *a: calls.append(a) or original(*a)
    evidence = cached.evidence(DraftContext(tokens, 2))
    for k in (4, 2, 6):
        draft = cached.propose(DraftContext(tokens, 2), k).tokens.tolist()
        fresh = SuffixProposer(store, frozenset()).propose(DraftContext(tokens, 2), k)
        assert draft == fresh.tokens.tolist() == [4, 5, 6, 7, 8][:min(k, 3)]
    assert evidence.key == 3 and len(calls) == 1 + 3  # the fresh proposers' own lookups
    cached.propose(DraftContext(tokens + [4], 2), 2)  # the next step searches again
    assert len(calls) == 5
