"""`--tree auto`: the draft depth and the tree's node budget, chosen together
per step to maximise expected tokens per second.

A tree of b nodes and depth d costs one verify over b + 1 positions, T(b + 1)
from the request's measured cost curve (the same `AdaptiveK` timings a chain
uses: T depends on the fed width, not on the shape), plus d draft calls, one
per depth (a model drafts a whole depth in one call). It commits
E_b(d) = 1 + sum_{j<=d} prod_{i<=j} alpha_{b,i} tokens in expectation, where
alpha_{b,i} is the probability that the accepted path, having reached depth
i - 1, goes on to depth i in a tree of b nodes: the chain formula (Leviathan
et al. 2023, eq. 1) with per-depth acceptance measured per budget, since a
wider tree holds more of the target's likely continuations at every depth
(SpecInfer, Miao et al. 2023; EAGLE-2, Li et al. 2024).

Each candidate budget keeps its own censored per-depth estimate (a
`DepthAcceptance` with the chain's forgetting, `AdaptiveK.new_estimate`); a budget never tried borrows the chain's
estimate, a lower bound, since a tree's paths include the draft's first choice
at every depth. Every `explore_every`-th step verifies a budget next to the
best one (the less tried of the two) instead, so an estimate that looks poor
only for lack of evidence gets corrected, at about the plan's own cost. The chain itself (b = 0) is chosen by the request's
`AdaptiveK` as without trees, including k = 0 when nothing pays.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cadence import Explore
from .economics import tokens_per_pass
from .policy import AdaptiveK, StepObservation

BUDGETS = (4, 8, 16, 32, 64)  # candidate node budgets, cut at the request's cap


@dataclass(frozen=True)
class TreePlan:
    k: int  # draft depth (chain length when nodes == 0)
    nodes: int  # tree node budget; 0 drafts a chain
    rate: float  # predicted tokens per second (per T(1) before any timing)


class AdaptiveTree:
    """Chooses (depth, node budget) per step for one request; see the module docstring."""

    def __init__(self, chain: AdaptiveK, max_nodes: int, budgets: tuple[int, ...] = BUDGETS,
                 explore_every: int = 16) -> None:
        if max_nodes < 1 or explore_every < 2:
            raise ValueError("AdaptiveTree needs max_nodes >= 1 and explore_every >= 2")
        self.chain = chain
        self.budgets = tuple(sorted({b for b in budgets if b < max_nodes} | {max_nodes}))
        # A near-zero prior: an arm reads the chain's estimate until it is tried.
        self.arms = {b: chain.new_estimate(0.5, 1e-6) for b in self.budgets}
        self.tried = {b: 0 for b in self.budgets}
        self._explore = Explore(explore_every)  # counts steps that may draft
        self.nodes = 0  # the budget `choose` picked with its depth; 0 = chain

    @property
    def draft_price(self):
        """The chain's draft price (economics.DraftPrice): trees are drafted by the same proposer."""
        return self.chain.draft_price

    @property
    def alphas(self) -> np.ndarray:
        """The chain's per-depth estimates (what a batch scheduler prices drafts by)."""
        return self.chain.alphas

    def tree_alphas(self, nodes: int) -> np.ndarray:
        """Per-depth acceptance of trees of this budget, the chain's until one was verified."""
        return self.arms[nodes].alphas if self.tried[nodes] else self.chain.alphas

    def plan(self, max_k: int) -> TreePlan:
        """The rate-maximising (depth, budget), without exploration."""
        chain = self.chain.best(max_k)
        best = TreePlan(chain.k, 0, chain.rate)
        draft = self.chain.draft_seconds_per_token()
        for nodes in self.budgets:
            depth = min(max_k, nodes, self.chain.max_depth)
            if depth < 1:
                continue
            tokens = tokens_per_pass(self.tree_alphas(nodes)[:depth])[1:]  # E(d), d >= 1
            seconds = self.chain.verify_seconds(nodes + 1) + draft * np.arange(1, depth + 1)
            rates = tokens / seconds
            d = int(np.argmax(rates))
            if rates[d] > best.rate * (1.0 + 1e-9):
                best = TreePlan(d + 1, nodes, float(rates[d]))
        return best

    def begin_step(self, evidence) -> np.ndarray:
        """A scheduler's pricing hook (AdaptiveK.begin_step); tree budgets are priced
        from pooled acceptance, so the evidence is unused."""
        return self.alphas

    def choose(self, max_k: int, evidence=None) -> int:
        """Draft depth for the next step; `self.nodes` holds the node budget.
        `evidence` is accepted for the engine's sake and unused: tree budgets are
        priced from pooled acceptance."""
        if max_k <= 0:
            self.nodes = 0
            return 0
        explore = self._explore.tick() is not None
        plan = self.plan(max_k)
        if plan.nodes and self.chain.curve.plain_due(plan.rate):
            self.nodes = 0
            return 0  # time T(1) again (economics.StepCost.plain_due)
        if plan.nodes == 0:
            # The chain's own controller keeps its probes and exploration.
            self.nodes = 0
            k = self.chain.choose(max_k)
            if k == 0 or not explore:
                return k
            plan = TreePlan(k, 0, 0.0)
        elif not explore:
            self.nodes = plan.nodes
            return plan.k
        # Exploration: the less tried of the plan's neighbouring budgets (the chain's
        # neighbour is the smallest tree), at the plan's depth. Neighbours cost about what
        # the plan costs, so a wrong guess there is cheap; far budgets are reached step by
        # step as the plan moves.
        ladder = (0,) + self.budgets
        at = ladder.index(plan.nodes)
        near = [b for b in ladder[max(0, at - 1):at + 2] if b and b != plan.nodes]
        if not near:  # one budget (a cap of at most the smallest): nothing beside it
            self.nodes = plan.nodes
            return plan.k
        self.nodes = min(near, key=lambda b: (self.tried[b], b))
        return max(1, min(plan.k, self.nodes, max_k))

    def observe(self, obs: StepObservation, nodes: int | None = None) -> None:
        """A verified step; a tree step (obs.tree) verified a tree of budget `nodes`
        (the plan's; None: the one the last `choose` set)."""
        if not obs.tree:
            self.chain.observe(obs)
            return
        # A step whose depth a scheduler chose drafted the configured budget, the cap.
        budget = (self.nodes if nodes is None else nodes) or self.budgets[-1]
        self.tried[budget] += 1
        self.arms[budget].add(obs.drafted, obs.accepted)
        self.chain.observe_timing(obs)

    def observe_shadow(self, drafted: int, matched: int) -> None:
        self.chain.observe_shadow(drafted, matched)

    def seed(self, alpha: float, strength: float) -> None:
        self.chain.seed(alpha, strength)
