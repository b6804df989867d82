"""What a step of draft length k feeds and reaches: the estimator that prices a tree
step as the pass it is.

A chain of k drafts feeds k positions and can be accepted to depth k. A tree step
does not: lookahead's window and pool guesses feed up to (W + G)(N - 1) nodes at any
k, and reach no deeper than its window's W + N - 2; a fixed `--tree N` budget with an
adaptive depth feeds about N nodes at every k. A policy that priced k as a chain of k would see a
3-node lookahead step as a 2-row pass, and on a CPU whose T(n) rises steeply it
would draft where plain decoding is faster. So a policy learns, per requested k,
the discounted mean of positions fed and of the depth the proposal reached, prices
k at that width and expects tokens only down to that depth (verispec.policy.AdaptiveK;
a batch allocator reads the same tables from the request's quote).

A k never seen borrows from the nearest seen k: its depth, cut at k or extended as far
as that k's proposals filled their levels, and its width, one node per depth gained or
lost. That is exact for a chain and keeps a tree's width; exploration measures the
k next to the choice, which corrects the rest.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    nodes: float  # positions fed below the committed token
    depth: float  # the deepest node's depth, <= k


class DraftShape:
    """Per requested draft length k: discounted means of the positions a step fed and
    the depth its proposal reached. Unobserved, every k is a chain of k."""

    def __init__(self, half_life: float) -> None:
        if half_life <= 0:
            raise ValueError(f"half_life must be > 0, got {half_life}")
        self._gamma = 0.5 ** (1.0 / half_life)
        self._seen: dict[int, tuple[float, float, float]] = {}  # k -> (weight, fed, reached)
        # Tables per max_k until the next observation: a policy asks every step, and
        # most steps observe nothing new (plain steps) or the same few lengths.
        self._tables: dict[int, tuple[list[float], list[float]]] = {}

    @property
    def observed(self) -> bool:
        return bool(self._seen)

    @property
    def lengths(self) -> list[int]:
        """The draft lengths k observed."""
        return sorted(self._seen)

    def observe(self, k: int, fed: int, reached: int) -> None:
        """A step that asked for `k` drafts fed `fed` positions (a tree's nodes) and its
        proposal reached depth `reached` (counted up to k)."""
        if k < 1 or fed < 0 or reached < 0:
            raise ValueError(f"DraftShape: need k >= 1, fed >= 0 and reached >= 0, "
                             f"got k={k}, fed={fed}, reached={reached}")
        weight, nodes, depth = self._seen.get(k, (0.0, 0.0, 0.0))
        g = self._gamma
        self._seen[k] = (g * weight + 1.0, g * nodes + fed, g * depth + min(reached, k))
        self._tables.clear()

    def at(self, k: int) -> Shape:
        nodes, depth = self._row(k)
        return Shape(nodes, depth)

    def _row(self, k: int) -> tuple[float, float]:
        if k <= 0:
            return 0.0, 0.0
        seen = self._seen.get(k)
        if seen is not None:
            weight, nodes, depth = seen
            return nodes / weight, depth / weight
        if not self._seen:
            return float(k), float(k)
        j = min(self._seen, key=lambda j: (abs(j - k), j))
        weight, nodes, depth = self._seen[j]
        nodes, depth = nodes / weight, depth / weight
        # Proposals are cut at depth k, so a shorter k reaches at most k; a longer one
        # goes deeper only as far as j's proposals filled their j levels. Each depth
        # gained or lost moves one node, as in a chain: a tree's width stays.
        near = min(float(k), depth) if k < j else min(float(k), depth + (k - j) * depth / j)
        return max(near, nodes + near - depth), near

    def tables(self, max_k: int) -> tuple[list[float], list[float]]:
        """Positions fed and depth reached for k = 0..max_k, as plain floats (a policy
        asks every step). The lists are shared: do not modify them."""
        tables = self._tables.get(max_k)
        if tables is None:
            rows = [self._row(k) for k in range(max_k + 1)]
            tables = ([nodes for nodes, _ in rows], [depth for _, depth in rows])
            self._tables[max_k] = tables
        return tables


def between(table: list[float], x: float) -> float:
    """`table` at a fractional index x >= 0, linear between its neighbours (the last entry
    beyond the end): what a policy reads at a shape's fractional width or depth."""
    low = min(int(x), len(table) - 1)
    if low == len(table) - 1:
        return table[low]
    return table[low] + (table[low + 1] - table[low]) * (x - low)
