"""What `auto` carries across an Engine's requests (verispec/proposers/auto_memory.py): each
candidate's prices, and the rests of a costly candidate that drafted at a loss."""
from __future__ import annotations

import pytest

from test_auto import Scripted, _drive, _modelled_clock  # noqa: F401 (the autouse clock)
from verispec import SamplingParams, SpecConfig
from verispec.proposers.auto import AutoProposer
from verispec.proposers.auto_memory import AutoMemory, Ledger
from verispec.proposers.base import DraftContext


def _session(requests: int, good_head, memory: AutoMemory, head_cost: float = 0.001,
             steps: int = 40) -> tuple[list[bool], list[int]]:
    """Requests of one Engine, each built as `auto`'s builder builds it (a resting
    candidate left out), over n-gram lookup right on 2 steps of 3 and a head right where
    `good_head` says: whether the head was part of each, and the tokens it was asked for."""
    future = list(range(50)) * 80
    present, asked = [], []
    for _ in range(requests):
        copy = Scripted("ngram", future, lambda p: p % 3 != 0, free=True)
        model = Scripted("eagle", future, good_head)
        model.seconds_per_token = head_cost
        candidates = {n: p for n, p in (("ngram", copy), ("eagle", model))
                      if not memory.skip(n)}
        auto = AutoProposer(candidates, memory=memory)
        _drive(auto, future, steps)
        auto.finished(DraftContext(future[:5], 5))
        present.append("eagle" in candidates)
        asked.append(sum(model.asked))
    return present, asked


def test_a_later_request_starts_from_the_prices_earlier_ones_measured():
    """A head's call costs what it cost in the last request: seeded with that price, a
    later request does not draft with a losing head while it looks free (unseeded, its
    first calls in every request are priced at the prior, zero)."""
    future = list(range(50)) * 80
    asked = {}
    for seeded in (False, True):
        memory = AutoMemory() if seeded else None
        asked[seeded] = []
        for _ in range(3):
            copy = Scripted("ngram", future, lambda p: p % 3 != 0, free=True)
            model = Scripted("eagle", future, lambda p: p % 4 == 0)
            model.seconds_per_token = 0.001  # half a pass per drafted token
            auto = AutoProposer({"ngram": copy, "eagle": model}, memory=memory)
            if seeded and asked[seeded]:
                known = memory.candidates["eagle"].prices.draft
                assert auto.tracks["eagle"].price.measured == known.measured
                assert auto.tracks["eagle"].price is not known
            _drive(auto, future, 40)
            auto.finished(DraftContext(future[:5], 5))
            asked[seeded].append(sum(model.asked))
    assert asked[False] == [asked[False][0]] * 3  # every request relearns the price
    assert asked[True][0] == asked[False][0]
    assert max(asked[True][1:]) < asked[False][0]


def test_a_costly_candidate_that_loses_rests_for_doubling_stretches_of_requests():
    """A head that is never right drafts at a loss in the first request (its prior looks
    good): the next request is built without it, then two, then four..."""
    memory = AutoMemory(rest_start=1, rest_limit=4)
    present, asked = _session(16, lambda p: False, memory)
    assert asked[0] > 0
    assert present == [True, False, True, False, False, True, False, False, False, False,
                       True, False, False, False, False, True]
    assert memory.candidates["eagle"].resting == 4
    assert memory.candidates["ngram"].resting == 0  # a free candidate never rests


def test_a_costly_candidate_that_pays_keeps_its_place_and_a_win_ends_its_rests():
    memory = AutoMemory()
    present, asked = _session(6, lambda p: True, memory, head_cost=0.0001)
    assert all(present) and min(asked) > 40  # it drafts most steps of every request
    memory.candidates["eagle"].rest.longer()
    memory.candidates["eagle"].rest.longer()
    _session(1, lambda p: True, memory, head_cost=0.0001)
    assert memory.candidates["eagle"].rest.interval == 1


def test_the_ledger_weighs_a_candidates_steps_against_the_others():
    # 20 tokens in 10 s on its steps, 100 in 100 s on the rest (less its 5 s of probes):
    # at the others' 1.05 s a token its tokens were worth 21 s, and it took 15.
    ledger = Ledger(tokens=20, seconds=10.0, probes=5.0)
    assert ledger.verdict(120, 115.0) == pytest.approx(20 * 100 / 100 - 15.0)
    assert Ledger(tokens=2, seconds=10.0).verdict(102, 110.0) < 0
    assert Ledger().verdict(100, 50.0) is None  # never called: nothing to weigh
    assert Ledger(tokens=100, seconds=50.0).verdict(100, 50.0) is None  # drafted every step


def test_an_engine_carries_auto_memory_between_requests():
    from conftest import tiny_engine

    engine = tiny_engine()
    spec = SpecConfig("auto", k=4)
    engine.generate([3, 17, 4, 9, 3, 17, 4] * 3, SamplingParams(max_new_tokens=24), spec)
    memory = engine.auto_memory.scope("chain")
    known = {n: m.prices for n, m in memory.candidates.items() if m.prices}
    assert known and all(p.draft.measured is not None for p in known.values())
    for candidate in memory.candidates.values():
        candidate.resting = 0  # the first request's verdicts follow the clock; not tested here
    request = engine.new_request([5, 6, 7], SamplingParams(max_new_tokens=4), spec)
    for name, prices in known.items():
        assert request.proposer.tracks[name].price.measured == prices.draft.measured
    # A resting candidate is left out of the next request only.
    assert "lookahead" in request.proposer.tracks
    memory.candidates["lookahead"].resting = 1
    tree = SpecConfig("auto", k=4, tree=8)  # drafts trees: its own prices and rests
    assert "lookahead" in engine.new_request([5, 6, 7], SamplingParams(max_new_tokens=4),
                                             tree).proposer.tracks
    assert "lookahead" not in engine.new_request([5, 6, 7], SamplingParams(max_new_tokens=4),
                                                 spec).proposer.tracks
    assert "lookahead" in engine.new_request([5, 6, 7], SamplingParams(max_new_tokens=4),
                                             spec).proposer.tracks
