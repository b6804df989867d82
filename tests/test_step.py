"""The step's parts apart: the mechanism (verispec.engine) verifies what the
drafting side hands it, the policy (verispec.plan) only says how much, and a
proposer that reads rows hears the target at every fed row after every verify."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import tiny_target
from verispec.config import SamplingParams, SpecConfig
from verispec.metrics import Stats
from verispec.plan import Plan
from verispec.policy import AdaptiveK, FixedK, policy_for
from verispec.proposers.base import DraftContext, Proposal, Proposer, VerifiedRows
from verispec.proposers.ngram import NgramProposer
from verispec.request import SpecRequest, run_alone
from verispec.stopping import Stopper

PROMPT = [3, 17, 4, 9, 3, 17, 4, 9, 3, 17, 4, 22, 5, 3, 17, 4, 9]


@pytest.fixture(scope="module")
def target():
    return tiny_target(0, layers=2)


class Listening(Proposer):
    """n-gram lookup that records what the engine tells it."""
    name = "listening"
    free = True
    reads_rows = True

    def __init__(self, tree: int = 0) -> None:
        self.inner = NgramProposer(1, 4, frozenset(), tree_nodes=tree)
        self.heard: list[VerifiedRows] = []
        self.budgets: list[int | None] = []

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        self.budgets.append(ctx.tree_nodes)
        return self.inner.propose(ctx, k)

    def evidence(self, ctx: DraftContext):
        return self.inner.evidence(ctx)

    def verified(self, rows: VerifiedRows) -> None:
        self.heard.append(rows)


def request(target, spec: SpecConfig, proposer: Proposer, sampling=None) -> SpecRequest:
    sampling = sampling or SamplingParams(max_new_tokens=40)
    return SpecRequest(target, list(PROMPT), sampling, spec, proposer,
                       Stopper(sampling, target.eos_token_ids, None),
                       torch.Generator().manual_seed(0), Stats(proposer=proposer.name, k=spec.k))


def plain(target, new: int) -> list[int]:
    proposer = NgramProposer(1, 4, frozenset())
    spec = SpecConfig("ngram", k=0)
    return [t for step in run_alone(target, request(target, spec, proposer,
                                                      SamplingParams(max_new_tokens=new)))
            for t in step.tokens]


@pytest.mark.parametrize("tree", [0, 8])
def test_a_reading_proposer_hears_the_target_at_every_fed_row(target, tree):
    """After every forward that fed drafts, `verified` gets each fed draft, its parent and
    the target's argmax after every row; greedy, the committed tokens are that argmax
    along the accepted path (a chain's rows in order), and the output is plain greedy.
    A step that fed nothing is not reported: its one row is the committed token's."""
    listening = Listening(tree)
    r = request(target, SpecConfig("ngram", k=6, tree=tree), listening)
    steps = list(run_alone(target, r))
    assert len(steps) == len(r.stats.steps)
    out = [t for step in steps for t in step.tokens]
    assert out == plain(target, 40)
    fed = [(step, record) for step, record in zip(steps, r.stats.steps) if record.drafted]
    assert 0 < len(fed) < len(steps)  # both kinds of step occurred
    assert len(listening.heard) == len(fed)
    trees = 0
    for rows, (step, record) in zip(listening.heard, fed):
        assert rows.committed == step.tokens
        assert len(rows.tokens) == len(rows.parents) == record.drafted
        assert len(rows.next_tokens) == record.drafted + 1
        # Follow the accepted path: each committed token is the target's argmax at the
        # row of the node before it, and the accepted ones are children of that node.
        node = -1
        for token in step.tokens:
            assert rows.next_tokens[node + 1] == token
            child = next((i for i, (t, p) in enumerate(zip(rows.tokens, rows.parents))
                          if p == node and t == token), None)
            if child is None:
                break
            node = child
        trees += any(p != i - 1 for i, p in enumerate(rows.parents))
    assert (trees > 0) == bool(tree)
    assert sum(record.accepted for record in r.stats.steps) > 0


def test_every_step_drafts_with_the_configured_tree_budget(target, monkeypatch):
    """Fixed and adaptive-k steps leave the tree budget to the proposer's configured one
    (a step's context names none; only a grammar's forced chain does)."""
    import types

    # A stopped clock: untimed steps, so the policies' choices depend on acceptance alone.
    stopped = types.SimpleNamespace(perf_counter=lambda: 0.0)
    for module in ("drafting", "request"):
        monkeypatch.setattr(f"verispec.{module}.time", stopped)
    for spec, kind in [(SpecConfig("ngram", k=6, tree=16), FixedK),
                       (SpecConfig("ngram", k=6, tree=16, adaptive=True), AdaptiveK)]:
        listening = Listening(16)
        r = request(target, spec, listening, SamplingParams(max_new_tokens=120))
        assert type(r.policy) is kind
        plans = []
        original = r.policy.plan
        r.policy.plan = lambda ctx, room: plans.append(original(ctx, room)) or plans[-1]
        list(run_alone(target, r))
        # The proposer is called for drafts and, free, for shadow guesses at k = 0.
        assert listening.budgets == [None for p in plans if p.k or p.shadow]
        assert any(p.k for p in plans)


def test_a_batch_plan_teaches_acceptance_but_not_step_time(target):
    """A plan from a quote (a batch allocator's) says the step time is the batch's: the
    adaptive controller learns acceptance and its own draft price from it, and its
    step-cost curve stays the prior."""
    fresh = policy_for(SpecConfig("ngram", k=6, adaptive=True))
    r = request(target, SpecConfig("ngram", k=6, adaptive=True), NgramProposer(1, 4, frozenset()))
    r.complete(target.forward_batch([r.prepare()])[0], 0.5)  # the prefill
    while not r.finished:
        quote = r.quote()
        plan = quote.plan(3)
        assert plan == Plan(min(3, quote.room), shadow=quote.room > 0,
                            evidence=quote.evidence, own_clock=False)
        r.complete(target.forward_batch([r.prepare(plan)])[0], 0.5)
    policy = r.policy
    assert np.array_equal(policy.curve.table(7), fresh.curve.table(7))
    assert not np.array_equal(policy.alphas, fresh.alphas)
    # The draft price a batch pays, per token: the policy's own estimate.
    assert policy.seconds_per_draft == policy.draft_price.measured is not None


def test_fixed_k_quotes_its_measured_acceptance(target):
    r = request(target, SpecConfig("ngram", k=4), NgramProposer(1, 4, frozenset()))
    list(run_alone(target, r))
    quote = r.policy.quote(r.context(), 4)
    assert quote.fixed and quote.room == 4
    # The one acceptance estimate: accepted drafts over accepted drafts and rejections.
    rejections = sum(step.accepted < step.drafted for step in r.stats.steps)
    assert quote.alphas == (r.stats.accepted / (r.stats.accepted + rejections),)
    assert r.policy.plain(4) == Plan(4, own_clock=False)  # a held step still drafts k
    adaptive = policy_for(SpecConfig("ngram", k=4, adaptive=True))
    assert adaptive.plain(4) == Plan(0, own_clock=False)  # ... and adaptive ones do not
