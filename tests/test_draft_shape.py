"""A tree step is priced as the pass it is: the adaptive controller learns what a step
of k feeds and reaches (verispec.draft_shape) and, on a steep cost curve, stops drafting
a lookahead tree that a chain's price would have made look cheap."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import CharTokenizer
from tree_support import Recorded
from verispec import Engine, SamplingParams, SpecConfig
from verispec.draft_shape import DraftShape, Shape, between
from verispec.economics import CostModel, StepCost
from verispec.metrics import Stats
from verispec.plan import Outcome, Plan
from verispec.policy import AdaptiveK
from verispec.proposers.lookahead import LookaheadProposer, LookaheadSettings
from verispec.request import SpecRequest, run_alone
from verispec.serving.cost import Candidate, allocate
from verispec.stopping import Stopper

T1 = 0.01
# Steep like this CPU's integer path (docs/suffix.md): a wide step costs far more than two rows.
STEEP = CostModel(profile=(1.0, 1.06, 1.23, 1.53, 1.61, 1.57, 1.64, 1.82,
                                                1.97, 2.1, 2.25))


class TreeWorld:
    """A proposer that feeds `nodes(k)` positions and reaches depth `depth(k)`, each
    depth accepted with `alpha`; a step costs T1 * T(1 + nodes)/T(1)."""

    def __init__(self, alpha: float, nodes, depth, seed: int = 0) -> None:
        self.alpha, self.nodes, self.depth = alpha, nodes, depth
        self.rng = np.random.default_rng(seed)

    def step(self, k: int) -> tuple[Outcome, int, float]:
        if k == 0:
            return Outcome(0, 0, 0, False, verify_seconds=T1), 1, T1
        depth, nodes = self.depth(k), self.nodes(k)
        accepted = 0
        while accepted < depth and self.rng.random() < self.alpha:
            accepted += 1
        seconds = T1 * STEEP.relative_time(1 + nodes)
        # A tree's accepted path: rejected unless it ran to the tree's depth.
        outcome = Outcome(nodes, depth, accepted, accepted < depth, tree=True,
                          verify_seconds=seconds)
        return outcome, accepted + 1, seconds


def rate(controller: AdaptiveK, world: TreeWorld, steps: int = 2000, max_k: int = 4,
         as_chain: bool = False) -> tuple[float, np.ndarray]:
    """Tokens per simulated second. `as_chain` hides the steps' shape (each is still timed
    at the width it fed), as before the shape was learned, to show what it changes."""
    tokens, seconds, ks = 0, 0.0, []
    for _ in range(steps):
        k = controller.choose(max_k)
        outcome, made, spent = world.step(k)
        if as_chain and k:
            outcome = dataclasses.replace(outcome, tree=False)  # timed at its width, shape unseen
        controller.observe(Plan(k), outcome)
        tokens, seconds = tokens + made, seconds + spent
        ks.append(k)
    return tokens / seconds, np.array(ks)


LOOKAHEAD = dict(nodes=lambda k: 3, depth=lambda k: 1)  # W = 1, N = 2, G = 2: 3 nodes, depth 1


def test_a_lookahead_tree_that_cannot_pay_falls_back_to_plain():
    """Depth 1 accepted 25% of the time: 1.25 tokens for a 4-row pass (1.53 plain steps)
    loses to plain decoding. Priced as a 2-row chain (1.06) it looked like a gain."""
    plain = 1.0 / T1
    shaped, ks = rate(AdaptiveK(4, STEEP), TreeWorld(0.25, **LOOKAHEAD, seed=1))
    assert shaped >= 0.97 * plain
    assert np.count_nonzero(ks[200:]) / ks[200:].size < 0.05
    chained, ks_chain = rate(AdaptiveK(4, STEEP), TreeWorld(0.25, **LOOKAHEAD, seed=1),
                             as_chain=True)
    assert np.count_nonzero(ks_chain[200:]) / ks_chain[200:].size > 0.5
    assert chained < 0.9 * plain


def test_a_flat_prior_learns_plain_decoding_is_faster_from_its_own_plain_steps():
    """Without a profile the curve's prior is nearly flat. A lookahead of W = 2, N = 3,
    G = 1 feeds 6 nodes down to depth 3 at every k >= 3, so a request that drafts times
    no one-row pass: T(1) is extrapolated down from T(7) along the flat prior, and plain
    decoding looks 1.46x slower than it is. At 35% acceptance a step commits 1.52
    tokens for 1.64 plain steps, which only looks like a gain. Exploration's plain steps
    time T(1), and the request stops drafting."""
    window = dict(nodes=lambda k: 6, depth=lambda k: min(k, 3))
    controller = AdaptiveK(4)
    shaped, ks = rate(controller, TreeWorld(0.35, **window, seed=5), steps=3000)
    assert np.count_nonzero(ks[1000:]) / ks[1000:].size < 0.05
    assert shaped >= 0.95 / T1
    assert controller.curve.table_list(4)[1] == pytest.approx(T1, rel=0.01)


def test_a_lookahead_tree_that_pays_keeps_drafting_one_level():
    """Accepted 80%: 1.8 tokens for 1.53 plain steps beats plain; k = 1 is enough, since
    the tree is no deeper at any k."""
    controller = AdaptiveK(4, STEEP)
    shaped, ks = rate(controller, TreeWorld(0.8, **LOOKAHEAD, seed=2))
    assert shaped >= 1.1 / T1
    assert np.mean(ks[200:] == 1) > 0.85
    assert controller.shape.at(1).nodes == pytest.approx(3.0)
    assert controller.shape.at(1).depth == pytest.approx(1.0)


def test_a_fixed_budget_is_priced_at_its_width_at_every_depth():
    """A `--tree 8` step feeds 8 nodes whatever its depth: deeper is worth it at high
    acceptance, and at low acceptance the 9-row pass is refused outright."""
    budget = dict(nodes=lambda k: 8, depth=lambda k: min(k, 4))
    deep, ks = rate(AdaptiveK(4, STEEP), TreeWorld(0.9, **budget, seed=3))
    assert np.median(ks[200:]) >= 3 and deep > 1.5 / T1
    shallow, ks = rate(AdaptiveK(4, STEEP), TreeWorld(0.3, **budget, seed=4))
    assert np.count_nonzero(ks[200:]) / ks[200:].size < 0.05 and shallow >= 0.97 / T1


def test_shape_estimator():
    shape = DraftShape(half_life=4.0)
    assert not shape.observed and shape.tables(3) == ([0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 2.0, 3.0])
    shape.observe(8, 4, 1)  # a lookahead step: 4 nodes, one level, whatever k asked
    # A shorter k reaches no deeper and keeps the tree's width.
    assert shape.at(1) == Shape(4.0, 1.0) and shape.at(8) == Shape(4.0, 1.0)
    chain = DraftShape(16.0)
    chain.observe(2, 2, 2)
    # A chain: one node per depth, up or down.
    assert chain.at(1) == Shape(1.0, 1.0) and chain.at(5) == Shape(5.0, 5.0)
    short = DraftShape(16.0)
    short.observe(4, 2, 2)  # asked 4, found 2: a longer k adds only half a level each
    assert short.at(6) == Shape(3.0, 3.0) and short.at(1) == Shape(1.0, 1.0)
    shape.observe(8, 2, 2)
    # Discounted: the newer reading weighs more than the older.
    assert 2.0 < shape.at(8).nodes < 3.0 and 1.5 < shape.at(8).depth < 2.0
    assert shape.tables(2)[1][0] == 0.0 and shape.tables(8)[0][8] == shape.at(8).nodes
    with pytest.raises(ValueError):
        shape.observe(0, 1, 1)
    with pytest.raises(ValueError):
        DraftShape(half_life=0.0)
    # A fractional width or depth reads the table linearly, and the last entry past its end.
    assert between([0.0, 1.0, 4.0], 1.5) == 2.5 and between([0.0, 1.0], 5.0) == 1.0


def test_lookahead_requests_learn_their_tree_width_and_equal_plain(tiny_native):
    """Through the engine: every tree step an adaptive lookahead request verifies reaches
    its policy as the tree it fed (its nodes and its deepest node), not as a chain of k,
    and the output is plain decoding's."""
    settings = LookaheadSettings(window=2, ngram=3, guesses=2)
    spec = SpecConfig("lookahead", k=4, adaptive=True, lookahead_window=2, lookahead_ngram=3,
                      lookahead_guesses=2)
    prompt = [3, 17, 4, 9, 3, 17, 4, 9, 3, 17]
    sampling = SamplingParams(max_new_tokens=40)
    proposer = Recorded(LookaheadProposer(tiny_native.eos_token_ids, settings))
    request = SpecRequest(tiny_native, prompt, sampling, spec, proposer,
                          Stopper(sampling, tiny_native.eos_token_ids, None),
                          torch.Generator().manual_seed(0), Stats(proposer="lookahead", k=4))
    policy = request.policy
    seen, observe = [], policy.observe
    policy.observe = lambda plan, outcome: (seen.append((plan, outcome)), observe(plan, outcome))
    list(run_alone(tiny_native, request))
    fed = [tree for tree in proposer.trees if tree is not None]
    tree_steps = [(plan, outcome) for plan, outcome in seen if outcome.tree]
    assert fed and len(tree_steps) == len(fed)
    assert [outcome.fed for _, outcome in tree_steps] == [len(tree) for tree in fed]
    assert [outcome.reached for _, outcome in tree_steps] == [tree.max_depth for tree in fed]
    assert policy.shape.lengths == sorted({plan.k for plan, _ in tree_steps})
    engine = Engine(tiny_native, tokenizer=CharTokenizer())
    plain = engine.generate(prompt, sampling, SpecConfig("none", k=0)).token_ids
    assert request.tokens[len(prompt):] == plain


def test_the_batch_allocator_prices_a_tree_request_at_its_width():
    """Serving: a lookahead request whose step feeds 3 nodes at any k, at 25% acceptance
    on a steep curve, is a 4-row pass for 1.25 tokens and gets no drafts; priced as a
    chain (no shape) the same request looked like a 2-row pass and drafted. At 80% the
    tree pays and drafts one level: deeper would feed no more and reach no deeper."""
    cost = StepCost(STEEP, fused=True)
    lookahead = ([0.0] + [3.0] * 4, [0.0] + [1.0] * 4)
    assert allocate([Candidate(1, 4, [0.25] * 4, shape=lookahead)], cost) == [0]
    assert allocate([Candidate(1, 4, [0.25] * 4)], cost) != [0]
    assert allocate([Candidate(1, 4, [0.8] * 4, shape=lookahead)], cost) == [1]
    # Requests run one after another (an unfused backend): two such trees and a chain at
    # the same acceptance, and only the chain drafts.
    ks = allocate([Candidate(1, 4, [0.3] * 4, shape=lookahead)] * 2
                  + [Candidate(1, 4, [0.3] * 4)], StepCost(STEEP, fused=False))
    assert ks[:2] == [0, 0] and ks[2] >= 1
