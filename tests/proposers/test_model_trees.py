"""Token trees drafted by models (draft LM, EAGLE head, Medusa heads): the
shared selection (top-b breadth-first, EAGLE-2's dynamic tree), the head's and
the draft's tree rows against brute-force chains, greedy equality with plain
decoding on both backends, and sampled output against the target's exact
distribution."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from conftest import tiny_target
from distribution_support import exact_marginals, worst_pvalue
from heads_support import random_head
from test_greedy_equality import plain
from test_head_equality import _sampled_counts
from tree_support import Recorded, tree_request

from verispec import Engine, SamplingParams, SpecConfig
from verispec.proposers import ProposerSetup, build
from verispec.proposers import eagle as eagle_module
from verispec.proposers.base import DraftContext
from verispec.proposers.heads.eagle import HeadCache
from verispec.proposers.tree_drafting import DraftTree, TreeShape, grow
from verispec.request import run_alone
from verispec.step import rejection
from verispec.step.lossless import compare_greedy
from verispec.step.token_tree import ROOT, TokenTree

PROMPTS = [[3, 17, 4, 9, 3, 17, 4], list(range(10, 40))]
GREEDY = SamplingParams(max_new_tokens=24)


# -- selection, on a synthetic draft ---------------------------------------------

def _path_log_probs(path: tuple[int, ...], vocab: int) -> torch.Tensor:
    """A fixed random draft distribution [vocab] for the children of `path`."""
    seed = hash(path) % 2**31
    return torch.log_softmax(2 * torch.randn(vocab, generator=torch.Generator().manual_seed(seed)), -1)


def _path(draft: DraftTree, node: int) -> tuple[int, ...]:
    tokens = []
    while node != ROOT:
        tokens.append(draft.tokens[node])
        node = draft.parents[node]
    return tuple(tokens[::-1])


def _synthetic(vocab: int, record: list | None = None):
    def expand(draft: DraftTree, frontier: list[int]) -> torch.Tensor:
        paths = [_path(draft, node) for node in frontier]
        if record is not None:
            record.append(paths)
        return torch.stack([_path_log_probs(p, vocab) for p in paths])
    return expand


def _score(path: tuple[int, ...], vocab: int) -> float:
    return sum(float(_path_log_probs(path[:i], vocab)[path[i]]) for i in range(len(path)))


def _tree_paths(tree: TokenTree) -> set[tuple[int, ...]]:
    return {tuple(tree.tokens[tree.ancestors(i)].tolist()) for i in range(len(tree))}


def test_topb_gives_branch_children_per_node_breadth_first():
    vocab = 10
    tree = grow(_synthetic(vocab), TreeShape(budget=7, shape="topb", branch=3), max_depth=4)
    assert tree.parent_list == [ROOT, ROOT, ROOT, 0, 0, 0, 1]
    for node in (ROOT, 0):
        children = tree.children(node)
        path = () if node == ROOT else (tree.token_list[node],)
        want = torch.topk(_path_log_probs(path, vocab), 3).indices.tolist()
        assert [tree.token_list[c] for c in children] == want  # likeliest first
    full = grow(_synthetic(vocab), TreeShape(budget=100, shape="topb", branch=2), max_depth=3)
    assert len(full) == 2 + 4 + 8 and full.depth_list == sorted(full.depth_list)
    assert all(len(full.children(i)) == 2 for i in range(6))


def test_dynamic_with_budget_width_keeps_exactly_the_best_nodes():
    """Expanding the budget best of every depth (what Medusa affords) keeps the
    budget best nodes of the whole branch-ary tree: brute force over all of it."""
    vocab, branch, depth = 8, 3, 4
    every = []
    for length in range(1, depth + 1):
        for prefix in itertools.product(range(branch), repeat=length):
            path: list[int] = []
            for rank in prefix:
                path.append(torch.topk(_path_log_probs(tuple(path), vocab), branch).indices[rank].item())
            every.append(tuple(path))
    ranked = sorted(every, key=lambda p: -_score(p, vocab))
    for budget in (1, 5, 12, 30):
        tree = grow(_synthetic(vocab), TreeShape(budget, "dynamic", branch), depth, width=budget)
        assert _tree_paths(tree) == set(ranked[:budget])


def test_dynamic_eagle2_expands_the_branch_best_and_keeps_the_budget_best():
    vocab, branch, budget = 9, 2, 10
    record: list[list[tuple[int, ...]]] = []
    tree = grow(_synthetic(vocab, record), TreeShape(budget, "dynamic", branch), max_depth=5)
    assert len(tree) == budget and tree.max_depth <= 5
    generated = set()
    for expanded in record:
        assert len(expanded) <= branch
        for path in expanded:
            children = torch.topk(_path_log_probs(path, vocab), branch).indices.tolist()
            generated |= {path + (c,) for c in children}
    # The frontier of each depth is the branch best of the nodes generated at that depth.
    for expanded in record[1:]:
        depth = len(expanded[0])
        same_depth = sorted((p for p in generated if len(p) == depth), key=lambda p: -_score(p, vocab))
        assert set(expanded) == set(same_depth[:branch])
    kept = _tree_paths(tree)
    assert kept == set(sorted(generated, key=lambda p: -_score(p, vocab))[:budget])
    assert all(p[:-1] in kept for p in kept if len(p) > 1)  # ancestor-closed


def test_stop_tokens_zero_probabilities_and_row_limits():
    vocab = 6
    tree = grow(_synthetic(vocab), TreeShape(40, "topb", 3, stop_tokens=frozenset(range(0, 6, 2))), 3)
    assert all(tree.token_list[p] % 2 for p in tree.parent_list if p != ROOT)
    assert any(t % 2 == 0 for t in tree.token_list)  # EOS is proposed, never expanded

    def peaked(draft, frontier):  # one token with all the mass
        return torch.log(torch.eye(vocab)[[1] * len(frontier)])
    chain = grow(peaked, TreeShape(10, "dynamic", 3), 4)
    assert chain.token_list == [1, 1, 1, 1] and chain.parent_list == [ROOT, 0, 1, 2]
    record: list = []
    limited = grow(_synthetic(vocab, record), TreeShape(30, "dynamic", 3), 5, max_rows=4)
    assert sum(len(paths) for paths in record[1:]) <= 4 and limited.max_depth <= 3


def test_tree_settings_are_validated_and_reach_the_spec_from_the_cli():
    from verispec.cli.args import spec_from
    from verispec.cli.main import build_parser

    args = build_parser().parse_args(["generate", "--prompt", "hi", "--proposer", "eagle",
                                      "--tree", "24", "--tree-shape", "topb", "--tree-branch", "2"])
    spec = spec_from(args)
    assert (spec.tree, spec.tree_shape, spec.tree_branch) == (24, "topb", 2)
    defaults = spec_from(build_parser().parse_args(["generate", "--prompt", "hi"]))
    assert (defaults.tree, defaults.tree_shape, defaults.tree_branch) == (0, "dynamic", 4)
    with pytest.raises(ValueError, match="tree_shape"):
        SpecConfig("eagle", tree=8, tree_shape="wide")
    with pytest.raises(ValueError, match="tree_branch"):
        SpecConfig("eagle", tree=8, tree_branch=0)


# -- engines and heads --------------------------------------------------------

@pytest.fixture(scope="module", params=["hf", "native"])
def target(request, tiny, tiny_native):
    return tiny if request.param == "hf" else tiny_native


@pytest.fixture(scope="module")
def engine(target):
    engine = Engine(target)
    engine._drafts["same"] = target
    engine._drafts["random"] = tiny_target(99, layers=1)
    return engine


@pytest.fixture(scope="module")
def heads(tmp_path_factory, tiny):
    """Random heads made for `tiny`'s weights, which `tiny_native` shares."""
    root = tmp_path_factory.mktemp("tree-heads")
    return {kind: str(random_head(root / kind, kind, tiny)) for kind in ("eagle", "medusa")}


def _spec(name: str, heads, **tree) -> SpecConfig:
    if name in ("eagle", "medusa"):
        return SpecConfig(name, head=heads[name], **tree)
    return SpecConfig("draft", draft=name, **tree)


# The corners of (depth cap, node budget) and one middle point, not the full grid: CI time.
@pytest.mark.parametrize("k,budget", [(1, 4), (5, 4), (1, 30), (5, 30), (3, 12)])
@pytest.mark.parametrize("shape", ["dynamic", "topb"])
@pytest.mark.parametrize("name", ["eagle", "medusa", "same", "random"])
def test_greedy_equality_with_model_trees(engine, target, heads, name, shape, budget, k):
    spec = _spec(name, heads, k=k, tree=budget, tree_shape=shape, tree_branch=3)
    for prompt in PROMPTS:
        want = plain(engine, prompt, GREEDY.max_new_tokens)
        got = engine.generate(prompt, GREEDY, spec)
        comparison = compare_greedy(target, prompt, want.token_ids, got.token_ids)
        assert comparison.identical, comparison.describe()
        assert got.stats.drafted > 0
        assert max(s.drafted for s in got.stats.steps) <= budget
        assert max(s.accepted for s in got.stats.steps) <= k
        if name == "same":
            assert got.stats.tau > 1 + min(k, 2) / 2


def _first_child_depth(tree: TokenTree) -> int:
    """Length of the chain of first children: the draft's argmax path in the tree."""
    node, depth = ROOT, 0
    while tree.children(node):
        node, depth = tree.children(node)[0], depth + 1
    return depth


@pytest.mark.parametrize("shape", ["dynamic", "topb"])
def test_same_model_draft_tree_accepts_its_whole_argmax_path(target, shape):
    """With the target as its own draft, the tree's argmax path is the target's
    greedy continuation, so every step accepts all of it: the draft cache's
    tree rows (mask, positions, rollback) compute exactly the target's logits."""
    for budget, k, branch in [(4, 1, 4), (12, 3, 2), (30, 5, 3), (12, 5, 4)]:
        spec = SpecConfig("draft", draft="same", k=k, tree=budget, tree_shape=shape,
                          tree_branch=branch)
        proposer = build(ProposerSetup(target, spec, GREEDY, torch.Generator(),
                                       {"load_draft": lambda _: target}))
        recorded = Recorded(proposer)
        request = tree_request(target, PROMPTS[0], SamplingParams(max_new_tokens=64), recorded,
                               k=k, nodes=budget)
        steps = run_alone(target, request)
        depths = []
        for _ in range(6):
            step = next(steps)
            tree, accepted = recorded.trees[-1], request.stats.steps[-1].accepted
            assert accepted == _first_child_depth(tree), (budget, k, branch)
            assert len(step.tokens) == accepted + 1
            depths.append(accepted)
        committed = request.tokens
        if shape == "topb":  # the argmax path is the first node of every depth
            assert depths == [min(k, _topb_depth(budget, branch))] * len(depths)
        else:  # EAGLE-2 may rank other branches above it, though not always
            assert max(depths) >= min(k, 3)
        assert proposer.seen == committed[: len(proposer.seen)]


def _topb_depth(budget: int, branch: int) -> int:
    depth, total, width = 0, 0, 1
    while total < budget:
        width *= branch
        total += width
        depth += 1
    return depth


def _brute_force_chain(proposer, real_rows: int, root_out: torch.Tensor,
                       path: list[int], first_position: int) -> torch.Tensor:
    """The head's log-probabilities after drafting `path` as a chain on a fresh
    copy of the real rows: the recurrence of EagleProposer's chain drafting."""
    head = proposer.head
    cache = HeadCache(head.module.kv_heads, head.module.head_dim, head.parts.dtype, head.parts.device)
    cache.append(proposer.cache.keys[:real_rows].clone(), proposer.cache.values[:real_rows].clone())
    feature = head.parts.final_norm(root_out)
    for depth, token in enumerate(path):
        out = head.module.step(feature, head.embed(torch.tensor([token])),
                               torch.tensor([first_position + depth]), cache)
        feature = head.parts.final_norm(out)
    return torch.log_softmax(head.output.logits(feature).float(), -1)[0]


@pytest.mark.parametrize("shape", ["dynamic", "topb"])
def test_eagle_tree_rows_equal_their_paths_fed_as_chains(target, heads, monkeypatch, shape):
    spec = SpecConfig("eagle", head=heads["eagle"], k=4, tree=20, tree_shape=shape, tree_branch=2)
    proposer = build(ProposerSetup(target, spec, GREEDY, torch.Generator()))
    record: list[tuple[list[list[int]], torch.Tensor]] = []
    real_grow = eagle_module.grow

    def spying_grow(expand, *args, **kwargs):
        def spy(draft, frontier):
            log_probs = expand(draft, frontier)
            record.append(([list(_path(draft, node)) for node in frontier], log_probs.clone()))
            return log_probs
        return real_grow(spy, *args, **kwargs)

    monkeypatch.setattr(eagle_module, "grow", spying_grow)
    tokens = PROMPTS[1][:12]
    hidden = target.forward(torch.tensor(tokens[:-1]), target.new_cache(),
                            hidden_layers=proposer.hidden_layers).hidden
    tree = proposer.propose(DraftContext(tokens, len(tokens), hidden), 4).tree
    assert tree.max_depth == 4 and len(record) == 4
    real_rows = proposer.real_rows
    assert proposer.cache.length == real_rows + sum(len(paths) for paths, _ in record[1:])
    for paths, log_probs in record:
        for path, row in zip(paths, log_probs):
            want = _brute_force_chain(proposer, real_rows, proposer.last_out, path, len(tokens) - 1)
            torch.testing.assert_close(row, want, atol=1e-5, rtol=1e-5)
    # The next proposal drops every drafted row before absorbing new real ones.
    proposer.propose(DraftContext(tokens, len(tokens), ()), 0)
    assert proposer.cache.length == real_rows


# -- sampling: the emitted tokens follow the target ----------------------------

@pytest.mark.parametrize("kind,shape", [("eagle", "dynamic"), ("medusa", "topb")])
def test_sampled_output_with_head_trees_follows_the_target(tmp_path, kind, shape, full_size_runs):
    """2000 seeded three-token requests on a vocab-8 target at T = 2, with a
    random head drafting a 6-node tree of depth 2: the first and second tokens'
    marginals pass chi-square against the target's exact ones."""
    runs = 2 * full_size_runs
    counts, marginals, drafted, accepted = _sampled_counts(
        tmp_path, kind, runs, tree=6, tree_shape=shape, tree_branch=3)
    assert drafted >= 6 * runs and 0.1 * runs < accepted < drafted
    assert worst_pvalue(counts, marginals, runs) > 1e-3


def test_distribution_check_catches_a_skipped_tree_residual(tmp_path, monkeypatch):
    """Control: a tree verifier that forgets to remove rejected candidates
    from the residual breaks the output distribution, and the check sees it."""
    monkeypatch.setattr(rejection, "_residual", lambda probs, draft, token: probs)
    runs = 400
    counts, marginals, _, _ = _sampled_counts(tmp_path, "eagle", runs, tree=6, tree_branch=3)
    assert worst_pvalue(counts, marginals, runs) < 1e-6


def test_sampled_output_with_a_self_draft_tree_follows_the_target(full_size_runs):
    """The same with a layer-skip self-draft (self:1 of a two-layer target)."""
    target = tiny_target(11, layers=2, vocab=8)
    engine = Engine(target)
    prompt, temperature, runs = [1, 2, 3], 2.0, 2 * full_size_runs
    spec = SpecConfig("draft", draft="self:1", k=2, tree=6, tree_branch=3)
    counts = np.zeros((2, 8))
    accepted = 0
    for seed in range(runs):
        got = engine.generate(prompt, SamplingParams(temperature=temperature, seed=seed,
                                                     max_new_tokens=3), spec)
        counts[0, got.token_ids[0]] += 1
        counts[1, got.token_ids[1]] += 1
        accepted += got.stats.accepted
    assert accepted > 0.1 * runs
    assert worst_pvalue(counts, exact_marginals(target, prompt, temperature), runs) > 1e-3
