"""`--proposer auto`: n-gram lookup or suffix decoding, whichever matched the longer
suffix, step by step; and the law it must keep (greedy output equals plain decoding)."""
from __future__ import annotations

import pytest

from test_greedy_equality import PROMPTS, plain
from verispec import Engine, SamplingParams, SpecConfig
from verispec.lossless import compare_greedy
from verispec.proposers.auto import AutoProposer
from verispec.proposers.base import DraftContext
from verispec.proposers.ngram import NgramProposer
from verispec.proposers.suffix import SuffixProposer
from verispec.proposers.suffix_store import SuffixStore


def _auto(store: SuffixStore) -> AutoProposer:
    return AutoProposer(NgramProposer(1, 4, frozenset()), SuffixProposer(store, frozenset()))


def test_drafts_with_whichever_matched_the_longer_suffix():
    """An earlier output in the store matches the context's last 6 tokens, the request itself
    only its last 2: suffix decoding drafts, with its evidence; n-gram lookup on a tie."""
    store = SuffixStore()
    earlier = [9, 8, 1, 2, 3, 4, 5, 6, 70, 71, 72, 73]
    store.add(earlier)
    context = [40, 5, 6, 41, 1, 2, 3, 4, 5, 6]
    auto = _auto(store)
    ctx = DraftContext(context, 1)
    evidence = auto.evidence(ctx)
    assert auto.active == "suffix" and evidence.key == 6
    assert auto.propose(ctx, 3).tokens.tolist() == [70, 71, 72]
    alone = _auto(SuffixStore())  # no store: both find the request's own 2-token match
    ctx = DraftContext(context, 1)
    assert alone.evidence(ctx).key == 2 and alone.active == "ngram"
    assert alone.propose(ctx, 3).tokens.tolist() == [41, 1, 2]
    # The choice follows the context step by step.
    store = SuffixStore()
    store.add(earlier)
    auto = _auto(store)
    assert auto.evidence(DraftContext([40, 41, 42, 43], 1)).key == 0 and auto.active == "ngram"
    assert auto.evidence(DraftContext([40, 41, 42, 43, 3, 4, 5, 6], 1)).key == 4
    assert auto.active == "suffix"


def test_the_engines_store_learns_each_output():
    store = SuffixStore()
    auto = _auto(store)
    auto.finished(DraftContext([1, 2, 3, 10, 11, 12], 3))
    assert store.sequences() == [[10, 11, 12]]


@pytest.mark.parametrize("backend", ["hf", "native"])
def test_auto_keeps_greedy_output_identical(tiny, tiny_native, backend):
    target = tiny if backend == "hf" else tiny_native
    engine = Engine(target)
    names = set()
    for spec in (SpecConfig("auto", k=4, adaptive=True), SpecConfig("auto", k=4),
                 SpecConfig("auto", k=4, tree=8)):
        for prompt in PROMPTS:
            want = plain(engine, prompt)
            got = engine.generate(prompt, SamplingParams(max_new_tokens=32), spec)
            comparison = compare_greedy(target, prompt, want.token_ids, got.token_ids)
            assert comparison.identical, comparison.describe()
            names |= {step.proposer for step in got.stats.steps}
    assert names <= {"ngram", "suffix", "none"} and names >= {"ngram", "suffix"}
