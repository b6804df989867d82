"""`--tree auto` (verispec.tree_policy): the depth and node budget chosen per
step on synthetic acceptances and step times, and the engine wiring on tiny models."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import tiny_engine
from verispec import SamplingParams, SpecConfig
from verispec.config import DEFAULT_SPEC
from verispec.economics import CostModel, tokens_per_pass
from verispec.policy import AdaptiveK, StepObservation
from verispec.proposers.base import DraftContext
from verispec.proposers.ngram import NgramProposer
from verispec.tree_policy import AdaptiveTree, TreePlan

T1 = 0.02


def controller(cost: CostModel, max_nodes: int = 32) -> AdaptiveTree:
    return AdaptiveTree(AdaptiveK(cost, prior_alpha=0.5), max_nodes)


def teach(tree: AdaptiveTree, nodes: int, alpha: float, depth: int, steps: int = 200,
          seed: int = 0) -> None:
    """Tree steps of this budget whose accepted path goes one depth further with prob alpha."""
    rng = np.random.default_rng(seed)
    tree.nodes = nodes
    for _ in range(steps):
        accepted = 0
        while accepted < depth and rng.random() < alpha:
            accepted += 1
        drafted = accepted + (accepted < depth)
        tree.observe(StepObservation(depth, drafted, accepted, tree=True))


def teach_chain(tree: AdaptiveTree, alpha: float, k: int, steps: int = 200, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        tree.chain.observe(StepObservation(k, k, accepted))


def test_wide_trees_win_when_verification_is_free():
    """Memory-bound verify (flat T) and trees that keep more of the target's choices: the
    widest budget at full depth wins, as E_b(d) / T(b + 1) says."""
    tree = controller(CostModel(verify_overhead=0.0))
    teach_chain(tree, 0.3, 4)
    for nodes, alpha in ((4, 0.45), (8, 0.55), (16, 0.65), (32, 0.75)):
        teach(tree, nodes, alpha, depth=min(nodes, 6))
    plan = tree.plan(6)
    assert (plan.nodes, plan.k) == (32, 6)
    want = tokens_per_pass(tree.tree_alphas(32)[:6])[6]
    assert plan.rate == pytest.approx(want / tree.chain.verify_seconds(33))


def test_trees_lose_when_every_position_costs():
    """Compute-bound verify (T grows with every node): the same acceptances no longer pay
    for the siblings, and the chain's own optimum (AdaptiveK.best) is what remains."""
    tree = controller(CostModel(verify_overhead=1.0))
    teach_chain(tree, 0.7, 6)
    for nodes, alpha in ((4, 0.75), (8, 0.8), (16, 0.85), (32, 0.9)):
        teach(tree, nodes, alpha, depth=min(nodes, 6))
    plan = tree.plan(6)
    best_chain = tree.chain.best(6)
    assert plan == TreePlan(best_chain.k, 0, best_chain.rate)


def test_plan_matches_brute_force_over_budgets_and_depths():
    cost = CostModel(draft_cost=0.05, verify_overhead=0.04)
    tree = controller(cost)
    teach_chain(tree, 0.5, 5)
    for nodes, alpha in ((4, 0.6), (8, 0.66), (16, 0.7), (32, 0.72)):
        teach(tree, nodes, alpha, depth=min(nodes, 8))
    draft = tree.chain.draft_seconds_per_token()
    chain = tree.chain.best(8)
    rates = {(0, chain.k): chain.rate}
    for nodes in tree.budgets:
        for d in range(1, min(8, nodes) + 1):
            rates[(nodes, d)] = (tokens_per_pass(tree.tree_alphas(nodes)[:d])[d]
                                 / (tree.chain.verify_seconds(nodes + 1) + draft * d))
    nodes, depth = max(rates, key=rates.get)
    plan = tree.plan(8)
    assert (plan.nodes, plan.k) == (nodes, depth)


def test_hopeless_drafts_choose_nothing():
    tree = controller(CostModel(verify_overhead=0.05))
    teach_chain(tree, 0.0, 4)
    for nodes in tree.budgets:
        teach(tree, nodes, 0.0, depth=min(nodes, 4))
    plans = [(tree.choose(8), tree.nodes) for _ in range(64)]
    assert sum(k == 0 for k, _ in plans) >= 56  # only the chain's sparse probes draft
    assert all(nodes == 0 for k, nodes in plans if k == 0)


def test_exploration_climbs_to_better_budgets():
    """Exploration tries the plan's neighbouring budgets; when each wider tree does
    better, the plan climbs the ladder to the widest one."""
    tree = controller(CostModel(verify_overhead=0.0), max_nodes=16)
    teach_chain(tree, 0.3, 4)
    alpha = {4: 0.5, 8: 0.7, 16: 0.9}
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(16 * 12):
        k = tree.choose(6)
        if k and tree.nodes:
            seen.add(tree.nodes)
            accepted = 0
            while accepted < k and rng.random() < alpha[tree.nodes]:
                accepted += 1
            tree.observe(StepObservation(k, accepted + (accepted < k), accepted, tree=True))
        elif k:
            tree.observe(StepObservation(k, k, int(rng.random() < 0.3)))
    assert seen == set(tree.budgets) == {4, 8, 16}
    assert tree.plan(6).nodes == 16


def test_step_budget_reaches_the_proposer():
    """DraftContext.tree_nodes: 0 drafts a chain, N caps the tree, None keeps the configured."""
    tokens = [5, 6, 7, 1, 5, 6, 8, 2, 5, 6, 9, 3, 5, 6]
    ngram = NgramProposer(1, 4, frozenset(), tree_nodes=16)
    configured = ngram.propose(DraftContext(tokens, 4), 3)
    assert configured.tree is not None and len(configured.tree) > 2
    assert ngram.propose(DraftContext(tokens, 4, tree_nodes=0), 3).tree is None
    capped = ngram.propose(DraftContext(tokens, 4, tree_nodes=2), 3)
    assert capped.tree is not None and len(capped.tree) == 2


def test_config_and_cli_spellings():
    from verispec.bench.runner import proposer_spec
    from verispec.cli import build_parser
    from verispec.cli_args import spec_from

    with pytest.raises(ValueError, match="tree_auto"):
        SpecConfig("ngram", tree=16, tree_auto=True)
    spec = proposer_spec("eagle+tree=auto", 5, None)
    assert spec.tree_auto and spec.adaptive and spec.tree == 32 and spec.k == 5
    spec = proposer_spec("ngram+tree=k", 6, None)
    assert spec.tree == 6 and spec.k == 6 and not spec.adaptive
    args = build_parser().parse_args(["generate", "--prompt", "x", "--tree", "auto",
                                      "--tree-max", "16"])
    spec = spec_from(args)
    assert spec.tree_auto and spec.adaptive and spec.tree == 16
    # Adaptive k is the default: the CLI's and the API's default configurations agree.
    assert spec_from(build_parser().parse_args(["generate", "--prompt", "x"])) == DEFAULT_SPEC
    assert DEFAULT_SPEC.adaptive and DEFAULT_SPEC.proposer == "ngram"
    fixed = spec_from(build_parser().parse_args(["generate", "--prompt", "x", "--k", "4"]))
    assert fixed.k == 4 and not fixed.adaptive


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


@pytest.mark.parametrize("spec", [
    SpecConfig("ngram", k=8, adaptive=True, tree=32, tree_auto=True),
    SpecConfig("draft", k=5, draft="same", adaptive=True, tree=16, tree_auto=True),
    SpecConfig("draft", k=5, draft="same", adaptive=True, tree=12, tree_auto=True,
               tree_shape="topb", tree_branch=2),
], ids=["ngram", "draft-dynamic", "draft-topb"])
def test_tree_auto_is_lossless(engine, spec):
    sampling = SamplingParams(max_new_tokens=40)
    for prompt in ([1, 2, 3, 4, 5, 1, 2, 3, 4] * 3, list(range(10, 40))):
        plain = engine.generate(prompt, sampling, SpecConfig("none")).token_ids
        result = engine.generate(prompt, sampling, spec)
        assert result.token_ids == plain
        assert result.stats.target_forwards <= len(plain)


def _scan(tokens: list[int], k: int, ngram_min: int, ngram_max: int, limit: int) -> list[list[int]]:
    """Brute force: every earlier occurrence of the suffix n-gram, scanned right to left."""
    found: list[list[int]] = []
    for n in range(min(ngram_max, len(tokens) - 1), ngram_min - 1, -1):
        suffix = tokens[len(tokens) - n:]
        for start in range(len(tokens) - 1 - n, -1, -1):
            candidate = tokens[start + n: start + n + k]
            if tokens[start:start + n] == suffix and candidate not in found:
                found.append(candidate)
                if len(found) == limit:
                    return found
    return found


def test_ngram_index_answers_what_the_scan_computes():
    """NgramIndex (incremental, O(ngram_max) per step) against a full scan on growing
    random contexts, and on a context that is not an extension of the indexed one."""
    from verispec.proposers.ngram import NgramIndex

    rng = np.random.default_rng(0)
    for vocab, ngram_min, ngram_max in ((3, 1, 4), (6, 2, 3), (50, 1, 1)):
        tokens = rng.integers(0, vocab, 400).tolist()
        index = NgramIndex(ngram_min, ngram_max)
        for end in range(1, 400, 7):
            index.update(tokens[:end])
            for k, limit in ((1, 1), (4, 1), (4, 8)):
                assert index.continuations(k, limit) == _scan(tokens[:end], k, ngram_min,
                                                              ngram_max, limit)
            # The evidence the adaptive controller keys acceptance on: the longest
            # suffix n-gram that occurred earlier with a continuation.
            context = tokens[:end]
            assert index.longest_match() == next(
                (n for n in range(min(ngram_max, end - 1), ngram_min - 1, -1)
                 if any(context[s:s + n] == context[end - n:] for s in range(end - n))), 0)
    index = NgramIndex(1, 3)
    index.update([1, 2, 3, 1, 2])
    index.update([9, 2, 3, 9])  # not an extension: re-indexed from scratch
    assert index.continuations(2, limit=1) == [[2, 3]]
