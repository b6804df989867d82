"""Lookahead decoding (Fu, Bailis, Stoica and Zhang, "Break the Sequential
Dependency of LLM Inference Using Lookahead Decoding", ICML 2024): no model,
no training; the target itself, run on guesses, produces n-grams that later
steps verify.

Two branches share each step's one target forward, as one token tree below
the last committed token (verispec.step.tree feeds and verifies it):

- the lookahead branch, a 2D window of W columns and N - 1 levels of Jacobi
  trajectories (`JacobiWindow`): level 0 is a chain of W guesses below the
  root, and below its column-i node hangs column i of the higher levels, so
  column i's path is level 0 up to column i, then levels 1 .. N - 2 of column
  i. The target's most likely token at every one of those rows (handed back
  by `verified`) is the next Jacobi level: the levels move up one, the new
  level becomes the top (Sec. 3.1, Fig. 2). A full column read down, followed
  by the target's token after it, is an N-gram the target itself produced on
  a guessed prefix; it goes to the pool.
- the verification branch: up to G n-grams of the pool that start with the
  last committed token, their N - 1 continuation tokens as a trie (Sec. 3.2).

The pool (`NgramPool`) is filled from the window's columns and from the
prompt, keyed on the first token, duplicates dropped, at most G per key (the
newest kept). Window nodes are candidates too: a level-0 guess that happens to
be right is accepted like any other node.

Every draft is a deterministic function of the committed context and the
target's earlier argmax rows, never of this step's sampler, so trees carry
no draft_probs: verify_tree_sampling's one-hot multi-draft rule keeps sampled
output exactly the target's, as greedy verification keeps greedy output.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from verispec.proposers.base import (
    DraftContext,
    Proposal,
    Proposer,
    ProposerSetup,
    VerifiedRows,
    register,
)
from verispec.step.token_tree import ROOT, TokenTree


@dataclass(frozen=True)
class LookaheadSettings:
    # Defaults: SpecConfig's, sized to this machine's T(n) (docs/lookahead.md).
    window: int = 1  # W: Jacobi columns
    ngram: int = 2  # N: n-gram length; the window keeps N - 1 levels
    guesses: int = 2  # G: pool n-grams verified per step (and kept per first token)

    def __post_init__(self) -> None:
        if self.window < 1 or self.ngram < 2 or self.guesses < 0:
            raise ValueError(f"lookahead needs window >= 1, ngram >= 2 and guesses >= 0, got "
                             f"W={self.window}, N={self.ngram}, G={self.guesses}")

    @property
    def nodes(self) -> int:
        """Tree nodes of a full step: the window's W * (N - 1) and G continuations of N - 1."""
        return (self.window + self.guesses) * (self.ngram - 1)


class NgramPool:
    """N-grams keyed on their first token; per key the newest `per_key`
    distinct continuations, newest last (an insertion-ordered dict as a set)."""

    def __init__(self, n: int, per_key: int) -> None:
        self.n, self.per_key = n, per_key
        self._by_first: dict[int, dict[tuple[int, ...], None]] = {}

    def __len__(self) -> int:
        return sum(len(grams) for grams in self._by_first.values())

    def add(self, gram: tuple[int, ...]) -> None:
        if len(gram) != self.n or self.per_key == 0:
            return
        grams = self._by_first.setdefault(gram[0], {})
        continuation = gram[1:]
        grams.pop(continuation, None)  # a duplicate becomes the newest, kept once
        grams[continuation] = None
        if len(grams) > self.per_key:
            del grams[next(iter(grams))]

    def add_text(self, tokens: list[int]) -> None:
        for i in range(len(tokens) - self.n + 1):
            self.add(tuple(tokens[i:i + self.n]))

    def continuations(self, first: int, limit: int) -> list[tuple[int, ...]]:
        """Up to `limit` continuations of n-grams starting with `first`, newest first."""
        return list(reversed(self._by_first.get(first, {})))[:limit]


@dataclass
class JacobiWindow:
    """levels[j][i]: level j of column i. Level 0 is the chain below the root;
    levels[j][i] (j >= 1) hangs below levels[j - 1][i]. Until N - 1 levels
    exist (the first N - 2 steps) each step adds one, as in the paper's warm-up."""
    levels: list[list[int]]
    depth: int  # N - 1, the levels kept once warm

    @property
    def width(self) -> int:
        return len(self.levels[0])

    @property
    def warm(self) -> bool:
        return len(self.levels) == self.depth

    def column_path(self, i: int) -> list[tuple[int, int]]:
        """Column i's root-to-leaf path as (level, column) cells."""
        return [(0, c) for c in range(i + 1)] + [(j, i) for j in range(1, len(self.levels))]

    def token(self, cell: tuple[int, int]) -> int:
        return self.levels[cell[0]][cell[1]]

    def advance(self, next_at: dict[tuple[int, int], int]) -> list[tuple[int, ...]]:
        """One Jacobi iteration from the target's token after each fed cell
        (`next_at`); returns the n-grams of the columns fed whole. A fed cell's
        ancestors were fed too (a tree is ancestor-closed), so a column was fed
        whole when its top cell was. A column whose top cell the step's budget
        cut keeps its old guess there."""
        top = len(self.levels) - 1
        grams = []
        if self.warm:
            for i in range(self.width):
                if (top, i) in next_at:
                    column = tuple(self.levels[j][i] for j in range(top + 1))
                    grams.append(column + (next_at[(top, i)],))
        new_top = [next_at.get((top, i), self.levels[top][i]) for i in range(self.width)]
        self.levels = (self.levels[1:] if self.warm else self.levels) + [new_top]
        return grams


@dataclass
class _TreeBuilder:
    """A trie under construction whose nodes remember which window cells they carry."""
    max_depth: int
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    index: dict[tuple[int, int], int] = field(default_factory=dict)  # (parent, token) -> node

    def insert(self, path: list[int], cap: int) -> list[int]:
        """The nodes of `path` (shared prefixes reused), stopping where a new node
        would pass `cap` nodes or max_depth; returns the nodes the path reached."""
        node, reached = ROOT, []
        for depth, token in enumerate(path, start=1):
            if depth > self.max_depth:
                break
            child = self.index.get((node, token))
            if child is None:
                if len(self.tokens) >= cap:
                    break
                child = len(self.tokens)
                self.index[(node, token)] = child
                self.tokens.append(token)
                self.parents.append(node)
                self.depths.append(depth)
            reached.append(child)
            node = child
        return reached

    def tree(self) -> TokenTree:
        return TokenTree(torch.tensor(self.tokens, dtype=torch.long),
                         torch.tensor(self.parents, dtype=torch.long))


@dataclass
class _Fed:
    """The last proposal: its nodes, and the window cell at each node it placed."""
    tokens: list[int]
    parents: list[int]
    cells: dict[tuple[int, int], int]  # window cell -> node


class LookaheadProposer(Proposer):
    name = "lookahead"
    reads_rows = True

    def __init__(self, eos_token_ids: frozenset[int], settings: LookaheadSettings = LookaheadSettings(),
                 tree_nodes: int = 0, seed: int = 0) -> None:
        self.settings = settings
        self.tree_nodes = tree_nodes or settings.nodes  # SpecConfig.tree caps the step's nodes
        self.eos = frozenset(eos_token_ids)
        self.pool = NgramPool(settings.ngram, settings.guesses)
        self.window: JacobiWindow | None = None
        self._rng = random.Random(seed)  # the window's first guesses: a fixed draw from the prompt
        self._fed: _Fed | None = None
        self.iterations = 0  # Jacobi steps the window took (for tests and stats)
        self.window_grams = 0  # n-grams the window added to the pool

    def _start(self, ctx: DraftContext) -> None:
        prompt = ctx.tokens[: max(ctx.num_prompt, 1)]
        self.pool.add_text(prompt)
        # Sec. 3.1: the window starts from random guesses; prompt tokens are plausible ones.
        first = [self._rng.choice(prompt) for _ in range(self.settings.window)]
        self.window = JacobiWindow([first], self.settings.ngram - 1)

    def _verification(self, last: int, k: int) -> list[list[int]]:
        paths = []
        for continuation in self.pool.continuations(last, self.settings.guesses):
            path = list(continuation[:k])
            # Nothing after EOS can be accepted: propose up to it, never past it.
            cut = next((i for i, t in enumerate(path) if t in self.eos), None)
            paths.append(path if cut is None else path[: cut + 1])
        return paths

    def propose(self, ctx: DraftContext, k: int) -> Proposal:
        self._fed = None
        if k <= 0:
            return Proposal.empty()
        if self.window is None:
            self._start(ctx)
        window = self.window
        nodes = ctx.tree_budget(self.tree_nodes)
        guesses = self._verification(ctx.tokens[-1], k)
        if nodes <= 0:
            return self._chain(guesses, k)
        builder = _TreeBuilder(max_depth=k)
        # The window is what makes next step's n-grams: keep it at least half the budget.
        window_nodes = window.width * len(window.levels)
        cap = nodes - min(window_nodes, nodes // 2)
        for path in guesses:
            builder.insert(path, cap)
        cells: dict[tuple[int, int], int] = {}
        for i in range(window.width):
            path = window.column_path(i)
            reached = builder.insert([window.token(c) for c in path], nodes)
            cells.update(zip(path, reached))
        self._fed = _Fed(builder.tokens, builder.parents, cells)
        tree = builder.tree()
        return Proposal(tree.tokens, tree=tree) if len(tree) else Proposal.empty()

    def _chain(self, guesses: list[list[int]], k: int) -> Proposal:
        """A chain step (`--tree auto` chose no tree, or a grammar): the newest pool
        guess, else the window's first column, whose top cell then moves up a level."""
        if guesses and guesses[0]:
            chain, cells = guesses[0], {}
        else:
            path = self.window.column_path(0)[:k]
            chain = [self.window.token(c) for c in path]
            cells = {cell: i for i, cell in enumerate(path)}
        self._fed = _Fed(list(chain), list(range(-1, len(chain) - 1)), cells)
        return Proposal(torch.tensor(chain, dtype=torch.long))

    def verified(self, rows: VerifiedRows) -> None:
        fed, self._fed = self._fed, None
        n = len(rows.tokens)
        # The engine may have cut the tree to a prefix of its nodes (the cache's room);
        # anything else (a grammar's forced tokens first) was not this proposal.
        if fed is None or rows.tokens != fed.tokens[:n] or rows.parents != fed.parents[:n]:
            return
        next_at = {cell: rows.next_tokens[node + 1] for cell, node in fed.cells.items() if node < n}
        top = len(self.window.levels) - 1
        if not any(level == top for level, _ in next_at):
            return  # no new level to move up to
        for gram in self.window.advance(next_at):
            self.pool.add(gram)
            self.window_grams += 1
        self.iterations += 1


def lookahead_settings(spec) -> LookaheadSettings:
    return LookaheadSettings(spec.lookahead_window, spec.lookahead_ngram, spec.lookahead_guesses)


@register("lookahead")
def _build(setup: ProposerSetup) -> Proposer:
    stop = frozenset() if setup.sampling.ignore_eos else setup.target.eos_token_ids
    return LookaheadProposer(stop, lookahead_settings(setup.spec), tree_nodes=setup.spec.tree)
