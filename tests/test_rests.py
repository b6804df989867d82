"""A costly proposer under adaptive k is judged at each request's end and rests after
a loss (verispec.request.SpecRequest, `Engine.rests`): the next requests decode
plainly, never calling it, with output identical to plain decoding; the rest doubles
while it keeps losing and ends when it earns. Free proposers and fixed k are not judged."""
from __future__ import annotations

import time

import pytest
import torch

from conftest import tiny_engine, tiny_target
from verispec.config import SamplingParams, SpecConfig
from verispec.metrics import Stats
from verispec.plan import FixedK, Plan, PlanContext, Policy
from verispec.proposers.auto_memory import AutoMemory
from verispec.proposers.base import DraftContext, Proposal, Proposer
from verispec.request import SpecRequest, run_alone
from verispec.stopping import Stopper

PROMPT = [3, 17, 4, 9, 3, 17, 4, 9, 3, 17, 4, 22, 5]
NEW = 24


class Scripted(Proposer):
    """Drafts the plain greedy continuation (`right`) or a token off it at every depth,
    after `pause` seconds per call: a draft model that pays, or one that never does."""
    name = "scripted"

    def __init__(self, future: list[int], right: bool, pause: float) -> None:
        self.future, self.right, self.pause = future, right, pause
        self.calls = 0

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        self.calls += 1
        time.sleep(self.pause)
        done = len(ctx.tokens) - len(PROMPT)
        drafts = self.future[done:done + k]
        if not self.right:
            drafts = [(t + 1) % 64 for t in drafts]
        return Proposal(torch.tensor(drafts, dtype=torch.long))


@pytest.fixture(scope="module")
def target():
    return tiny_target(0, layers=2)


@pytest.fixture(scope="module")
def plain(target) -> list[int]:
    return _run(_request(target, Scripted([], True, 0.0), None, adaptive=False, k=0))


class EveryOther(FixedK):
    """An adaptive policy that drafts on every other step: a request with plain steps to
    weigh its drafting steps against, whatever its proposer's acceptance."""
    adaptive = True

    def __init__(self) -> None:
        super().__init__(0)
        self.steps = 0

    def plan(self, ctx: PlanContext, room: int) -> Plan:
        self.steps += 1
        return Plan(room if self.steps % 2 else 0, 0)


def _request(target, proposer: Proposer, rests: AutoMemory | None, adaptive: bool = True,
             k: int = 4, policy: Policy | None = None) -> SpecRequest:
    sampling = SamplingParams(max_new_tokens=NEW)
    spec = SpecConfig("ngram", k=k, adaptive=adaptive)
    return SpecRequest(target, list(PROMPT), sampling, spec, proposer,
                       Stopper(sampling, target.eos_token_ids, None), torch.Generator(),
                       Stats(proposer=proposer.name, k=k), policy=policy, rests=rests)


def _run(request: SpecRequest) -> list[int]:
    return [t for step in run_alone(request.seq.target, request) for t in step.tokens]


def test_a_losing_costly_proposer_rests_and_its_requests_decode_plainly(target, plain):
    rests = AutoMemory()
    losing = Scripted(plain, right=False, pause=0.003)
    first = _request(target, losing, rests)
    assert _run(first) == plain and not first.stats.rested
    assert sum(s.k > 0 for s in first.stats.steps) > 0  # it drafted, at a loss
    assert rests.candidates["scripted"].resting == 1
    calls = losing.calls
    second = _request(target, losing, rests)
    assert _run(second) == plain
    assert second.stats.rested and losing.calls == calls  # never asked
    assert all(s.k == 0 and s.proposer == "none" for s in second.stats.steps)
    third = _request(target, losing, rests)  # the rest is over: judged again, and it lost
    assert _run(third) == plain and not third.stats.rested and losing.calls > calls
    assert rests.candidates["scripted"].resting == 2  # the rest doubled


def test_a_proposer_that_earns_ends_its_rests(target, plain):
    rests = AutoMemory()
    rests.judge("scripted", -1.0)  # an earlier loss
    rests.judge("scripted", -1.0)  # and another: its next rest would be 4 requests
    assert rests.candidates["scripted"].resting == 2
    rests.candidates["scripted"].resting = 0
    paying = Scripted(plain, right=True, pause=0.0)
    request = _request(target, paying, rests, policy=EveryOther())
    assert _run(request) == plain and not request.stats.rested
    assert rests.candidates["scripted"].rest.interval == rests.rest_start
    assert rests.candidates["scripted"].resting == 0


def test_fixed_k_and_free_proposers_are_not_judged(target, plain):
    rests = AutoMemory()
    fixed = _request(target, Scripted(plain, right=False, pause=0.003), rests, adaptive=False)
    assert _run(fixed) == plain
    free = Scripted(plain, right=False, pause=0.003)
    free.free = True
    assert _run(_request(target, free, rests)) == plain
    assert rests.candidates == {}


def test_an_engine_rests_adaptive_lookahead_for_its_next_request_only():
    engine = tiny_engine()
    prompt, sampling = PROMPT * 2, SamplingParams(max_new_tokens=NEW)
    plain = engine.generate(prompt, sampling, SpecConfig("none", k=0)).token_ids
    spec = SpecConfig("lookahead", k=4, adaptive=True, tree=6)
    engine.rests.judge("lookahead/tree", -1.0)  # as if the last request lost
    rested = engine.generate(prompt, sampling, spec)
    assert rested.token_ids == plain and rested.stats.rested
    assert rested.stats.drafted == 0 and rested.stats.proposer == "lookahead"
    assert "(rested: plain decoding)" in rested.stats.format_line()
    after = engine.generate(prompt, sampling, spec)
    assert after.token_ids == plain and not after.stats.rested
