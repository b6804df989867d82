"""When does speculative decoding pay? Closed-form expectations after
Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding" (ICML), section 3.

Symbols:
  alpha  per-token probability that the target accepts a drafted token, in [0, 1)
  k      draft length: tokens proposed per target pass (k = 0 is plain decoding)
  c      draft cost per drafted token, relative to one plain target decode step
  T(n)   wall time of one target forward over n new positions; T(n)/T(1) is the
         relative verification cost, ~ 1 + overhead * (n - 1) when linear

One target pass verifying k drafts emits E = (1 - alpha^(k+1)) / (1 - alpha)
tokens on average and costs k*c + T(k+1)/T(1) plain-decode steps, so the
expected speedup over plain decoding is E / (k*c + T(k+1)/T(1)).

Cost-profile file (written by `verispec profile`, read by `load_profile`), JSON:

    {"n": [1, 2, ..., N],              # positions verified in one forward pass
     "seconds": [t1, t2, ..., tN],     # measured wall seconds of that forward
     "draft_cost_per_token": 0.05}     # optional; RELATIVE cost c (draft seconds
                                       # per token / t1), not seconds; default 0

`n` must start at 1 and increase strictly; gaps are filled by linear
interpolation, and beyond N the last two points are extrapolated linearly.
"""
from __future__ import annotations

import bisect
import json
import math
import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np


def _check_alpha(alpha: float) -> float:
    if not 0.0 <= alpha < 1.0:
        raise ValueError(f"alpha must be in [0, 1), got {alpha}")
    return float(alpha)


def _check_k(k: int, name: str = "k") -> int:
    try:
        value = operator.index(k)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {k!r}") from None
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _check_cost(name: str, value: float) -> float:
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return float(value)


def tokens_per_pass(alphas: Sequence[float]) -> list[float]:
    """E(k) = 1 + sum_{j<=k} prod_{i<=j} alpha_i for k = 0..len(alphas) (Leviathan et al.
    2023, eq. 1): the accepted prefix plus the one token the target always adds (a
    correction or the bonus), with the acceptance alpha_i of depth i (of a chain, or of a
    tree's accepted path). The one E(k): the adaptive k, the batch allocator, `calc`,
    `simulate` and the replay read it. Plain floats: a policy asks every step for a few
    depths, where numpy's per-call overhead (its caches cold after a target pass) cost
    more than the arithmetic."""
    tokens, reach, total = [1.0], 1.0, 1.0
    for alpha in (alphas.tolist() if isinstance(alphas, np.ndarray) else alphas):
        reach *= alpha
        total += reach
        tokens.append(total)
    return tokens


def expected_tokens(alpha: float, k: int) -> float:
    """E(k) for a user-given alpha in [0, 1) at every depth and k >= 0 (checked):
    (1 - alpha^(k+1)) / (1 - alpha)."""
    return tokens_per_pass([_check_alpha(alpha)] * _check_k(k))[-1]


@dataclass(frozen=True)
class Choice:
    k: int  # draft length
    tokens_per_pass: float  # E(k)
    seconds_per_pass: float  # in seconds once timed, else in units of T(1)

    @property
    def rate(self) -> float:
        return self.tokens_per_pass / self.seconds_per_pass


def best_rate(tokens: Sequence[float], seconds: Sequence[float]) -> Choice:
    """Argmax of tokens[k] / seconds[k] over k, the one rate argmax (the adaptive k,
    `calc`'s best k); ties (within float noise) go to the shorter draft, which wastes
    less if acceptance is overestimated."""
    tokens = tokens.tolist() if isinstance(tokens, np.ndarray) else [float(t) for t in tokens]
    seconds = seconds.tolist() if isinstance(seconds, np.ndarray) else [float(s) for s in seconds]
    rates = [t / s for t, s in zip(tokens, seconds)]
    top = max(rates) * (1.0 - 1e-12)
    k = next(i for i, rate in enumerate(rates) if rate >= top)
    return Choice(k, tokens[k], seconds[k])


# Seconds measured on this machine are discounted with this half-life, in readings: step
# times drift over seconds on a shared CPU (docs/notebook/redesign.md), more slowly than a
# request's text changes character.
COST_HALF_LIFE = 64.0
# A reading above this multiple of the estimate is a one-off stall (a new kernel shape, a
# GC pause) and counts as this multiple: one stall must not price a width out for good.
STALL = 4.0


class WarmUp:
    """The first reading an estimate is given may carry warm-up (a kernel's first shape,
    cold caches): it is skipped. The one place a first reading is skipped; the estimates
    that skip theirs hold one."""

    def __init__(self) -> None:
        self.done = False

    def skip(self) -> bool:
        """True for the first reading (which the caller then ignores), False after."""
        first, self.done = not self.done, True
        return first


class SecondsPerUnit:
    """Seconds spent per unit of work: discounted measured seconds over discounted units.
    A request's draft price is one (seconds per requested draft token: the request is what
    a policy chooses, and a proposer spends its time even when it finds nothing), and the
    scheduler's host work per decoding request another. The first reading is skipped
    (`WarmUp`) and a later stall clipped (`STALL`)."""

    def __init__(self, half_life: float = COST_HALF_LIFE) -> None:
        self._gamma = 0.5 ** (1.0 / half_life)
        self._seconds = 0.0
        self._units = 0.0
        self._warm_up = WarmUp()

    @property
    def measured(self) -> float | None:
        """The measured mean alone; None before any measurement."""
        return self._seconds / self._units if self._units else None

    def per_unit(self, prior: float = 0.0) -> float:
        """The estimate with `prior` seconds per unit worth one unit."""
        return (self._seconds + prior) / (self._units + 1.0)

    def observe(self, seconds: float, units: int, prior: float = 0.0) -> None:
        """`seconds` for `units` units of work (0 seconds is a reading: a free lookup; the
        caller leaves out what its clock did not time)."""
        if units <= 0 or not (seconds >= 0.0 and math.isfinite(seconds)):
            return
        if self._warm_up.skip():
            return
        limit = STALL * self.per_unit(prior) * units if self._units else math.inf
        self._seconds = self._seconds * self._gamma + min(seconds, limit)
        self._units = self._units * self._gamma + units


@dataclass(frozen=True)
class CostModel:
    """Cost of one speculative round in units of one plain target decode step.

    Give either `verify_overhead` (T(n)/T(1) = 1 + verify_overhead * (n - 1))
    or `profile` (T(n)/T(1) for n = 1..N, normalised so profile[0] == 1), not both.
    """

    draft_cost: float = 0.0
    verify_overhead: float | None = None
    profile: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        _check_cost("draft_cost", self.draft_cost)
        if self.verify_overhead is not None and self.profile is not None:
            raise ValueError("give verify_overhead or profile, not both")
        if self.verify_overhead is not None:
            _check_cost("verify_overhead", self.verify_overhead)
        if self.profile is not None:
            values = tuple(float(v) for v in self.profile)
            if len(values) < 2:
                raise ValueError(f"profile needs at least 2 points (n = 1, 2), got {len(values)}")
            if not all(v > 0.0 and math.isfinite(v) for v in values):
                raise ValueError(f"profile values must be finite and > 0, got {values}")
            object.__setattr__(self, "profile", tuple(v / values[0] for v in values))

    @property
    def marginal_overhead(self) -> float:
        """d/dn of T(n)/T(1) for large n: what each extra verified position costs."""
        if self.profile is None:
            return self.verify_overhead or 0.0
        # Noisy timings can dip at the tail; a longer pass is never cheaper.
        return max(0.0, self.profile[-1] - self.profile[-2])

    def relative_time(self, n: int) -> float:
        """T(n)/T(1) for a forward over n >= 1 positions."""
        n = _check_k(n, "n")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if self.profile is None:
            return 1.0 + (self.verify_overhead or 0.0) * (n - 1)
        if n <= len(self.profile):
            return self.profile[n - 1]
        return self.profile[-1] + self.marginal_overhead * (n - len(self.profile))

    def pass_cost(self, k: int) -> float:
        """Plain-decode steps spent on one round: k drafts plus a (k+1)-wide verify."""
        k = _check_k(k)
        return k * self.draft_cost + self.relative_time(k + 1)


TABLE_WIDTHS = 16  # widths StepCost.table computes at least (a chain step asks for k + 1)
# Without a measured profile a forward's time is assumed nearly flat in its width
# (memory-bound decoding); the first measured widths rescale it.
FLAT = CostModel(verify_overhead=0.02)
# A predicted speedup over plain decoding that an extrapolated T(1) could be hiding: a flat
# prior stretched from a 9-row pass misjudges T(1) by up to T(9)/T(1) (the measured curves
# are in docs/lookahead.md and docs/suffix.md).
PLAIN_RECHECK_GAIN = 2.0


class StepCost:
    """Predicted seconds of one batched forward, from a prior shape and observed steps.
    `skip_first`: a request's curve skips its first reading (`WarmUp`), whose forward may
    carry warm-up; a server's curve starts from timed forwards (serving.cost.calibrate)."""

    def __init__(self, prior: CostModel | None = None, fused: bool = True,
                 half_life: float = COST_HALF_LIFE, skip_first: bool = False) -> None:
        self.prior = prior if prior is not None else FLAT
        self.fused = fused
        self._warm_up = WarmUp() if skip_first else None
        self._gamma = 0.5 ** (1.0 / half_life)
        # Plain lists, not arrays: a request observes one step and reads the table once per
        # step, and numpy's per-call overhead (its caches cold after a target pass) cost
        # more than the arithmetic over the few widths a request ever runs.
        self._rel: list[float] = []
        self._sum: list[float] = []  # index w - 1: discounted seconds observed at width w
        self._weight: list[float] = []  # and the discounted count
        self._seen: list[int] = []  # w - 1 of every width ever observed, ascending: the
        # only entries discounting can change (the others stay 0)
        self._table: list[float] | None = None  # every width's prediction, until the next change
        self._array: np.ndarray | None = None  # the same, for `table`

    @property
    def timed(self) -> bool:
        """Whether predictions are in seconds (some step was measured) or in T(1) units."""
        return any(self._weight[i] > 0 for i in self._seen)

    def plain_due(self, rate: float) -> bool:
        """Whether a plan at `rate` should give way to a plain step that times T(1) again:
        wider passes were measured, no one-row pass within about a half-life, and the
        plan's predicted gain is under PLAIN_RECHECK_GAIN. Without a recent reading T(1)
        is extrapolated down from wider passes along the prior's shape, and a flat prior
        makes plain decoding look slower than it is, which no drafting step corrects. A
        plain step is never slower than plain decoding."""
        # A one-row reading's weight halves every half-life: under one half, none is recent.
        if not self.timed or self._weight[0] >= 0.5:
            return False
        return rate * self.table_list(1)[1] < PLAIN_RECHECK_GAIN

    def _grow(self, width: int) -> None:
        if width <= len(self._rel):
            return
        size = max(width, 2 * len(self._rel), 64)
        self._rel = [self.prior.relative_time(n) for n in range(1, size + 1)]
        pad = size - len(self._sum)
        self._sum += [0.0] * pad
        self._weight += [0.0] * pad
        self._table = self._array = None

    def table(self, max_width: int) -> np.ndarray:
        """Predicted seconds of one forward over w positions, at index w, for w = 0..max_width
        (index 0 is 0). A measured width uses its discounted mean; between measured widths
        the prior's shape is rescaled by the interpolated measured/prior ratio. Beyond the
        widest measured one, the curve grows at least as fast as the last measured slope:
        step time is convex in the width (flat while memory-bound, then linear), so a flat
        prior must not make unmeasured widths look free. Read-only, and kept until the
        next change for the widths asked so far (each entry depends on its own width, the
        measured ones and the running maximum of the narrower ones), since a policy reads
        it several times a step."""
        table = self.table_list(max_width)
        if self._array is None:
            self._array = np.array(table)
            self._array.flags.writeable = False
        return self._array[: max_width + 1]

    def table_list(self, max_width: int) -> list[float]:
        """`table` as plain floats, shared (not to be modified), for widths 0..max_width
        at least (it may hold more): a request's policy reads it once a step."""
        self._grow(max(max_width, 1))
        if self._table is None or len(self._table) <= max_width:
            self._table = self._predict(max(max_width, TABLE_WIDTHS))
            self._array = None
        return self._table

    def _predict(self, max_width: int) -> list[float]:
        # Plain floats over the few widths a step asks for: numpy's per-call overhead,
        # paid every step after every observation, cost more than the arithmetic.
        rel = self._rel[:max_width]
        seen = [i for i in self._seen if self._weight[i] > 0]  # width - 1 of each measured width
        if seen:
            means = [self._sum[i] / self._weight[i] for i in seen]
            ratio = [mean / self._rel[i] for mean, i in zip(means, seen)]
            j = 0
            for x in range(max_width):  # np.interp(x, seen, ratio)
                while j < len(seen) and seen[j] < x:
                    j += 1
                if j == len(seen):
                    factor = ratio[-1]
                elif j == 0 or seen[j] == x:
                    factor = ratio[j]
                else:
                    lo, hi = seen[j - 1], seen[j]
                    factor = ratio[j - 1] + (x - lo) / (hi - lo) * (ratio[j] - ratio[j - 1])
                rel[x] *= factor
            if len(seen) >= 2 and max_width > seen[-1] + 1:
                slope = max(0.0, (means[-1] - means[-2]) / (seen[-1] - seen[-2]))
                for x in range(seen[-1] + 1, max_width):
                    rel[x] = max(rel[x], means[-1] + slope * (x - seen[-1]))
        out, top = [0.0], -math.inf
        for value in rel:
            top = max(top, value)
            out.append(top)
        return out

    def predict(self, widths: Sequence[int]) -> float:
        table = self.table_list(max(sum(widths), 1))
        return float(table[sum(widths)] if self.fused else sum(table[w] for w in widths))

    def observe(self, widths: Sequence[int], seconds: float) -> None:
        """Record one measured `forward_batch` over items of these widths."""
        if not widths or not (seconds > 0.0 and math.isfinite(seconds)):
            return
        if self._warm_up is not None and self._warm_up.skip():
            return
        total = sum(widths)
        self._grow(total)
        predicted = self.predict(widths)
        if self.timed:
            seconds = min(seconds, STALL * predicted)
        for i in self._seen:
            self._sum[i] *= self._gamma
            self._weight[i] *= self._gamma
        self._table = self._array = None
        if self.fused:
            self._add(total - 1, seconds)
            return
        # Sequential items: split the step time by the prior's shape.
        shares = [self._rel[w - 1] for w in widths]
        whole = sum(shares)
        for w, share in zip(widths, shares):
            self._add(w - 1, seconds * share / whole)

    def _add(self, index: int, seconds: float) -> None:
        if index not in self._seen:
            bisect.insort(self._seen, index)
        self._sum[index] += seconds
        self._weight[index] += 1.0


def expected_speedup(alpha: float, k: int, cost: CostModel) -> float:
    """Expected tokens per unit time relative to plain decoding (1.0 = break-even)."""
    return expected_tokens(alpha, k) / cost.pass_cost(k)


@dataclass(frozen=True)
class OptimalK:
    k: int
    speedup: float


def optimal_k(alpha: float, cost: CostModel, k_max: int = 32) -> OptimalK:
    """Best draft length in 0..k_max (`best_rate` over E(k) and the pass cost in plain
    decode steps, so the rate is the speedup)."""
    k_max = _check_k(k_max, "k_max")
    best = best_rate(tokens_per_pass([_check_alpha(alpha)] * k_max),
                     [cost.pass_cost(k) for k in range(k_max + 1)])
    return OptimalK(best.k, best.rate)


def ceiling(cost: CostModel) -> float:
    """Least upper bound of the speedup over every alpha < 1 and every k.

    As alpha -> 1, E -> k + 1, so the bound is sup_k (k+1) / pass_cost(k). For a
    linear cost this is max(1, 1 / (c + overhead)), i.e. 1/overhead when c = 0;
    inf when extra positions are free.
    """
    slope = cost.draft_cost + cost.marginal_overhead
    asymptote = math.inf if slope == 0.0 else 1.0 / slope
    measured = len(cost.profile) if cost.profile is not None else 1
    return max(asymptote, max((k + 1) / cost.pass_cost(k) for k in range(measured)))


def load_profile(path: str | Path, draft_cost: float | None = None) -> CostModel:
    """Read a cost-profile JSON (format in the module docstring). `draft_cost`,
    when given, overrides the file's `draft_cost_per_token`."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or "n" not in data or "seconds" not in data:
        raise ValueError(f"{path}: expected a JSON object with keys 'n' and 'seconds'")
    n = np.asarray(data["n"], dtype=float)
    seconds = np.asarray(data["seconds"], dtype=float)
    if n.ndim != 1 or n.shape != seconds.shape or n.size < 2:
        raise ValueError(f"{path}: 'n' and 'seconds' must be equal-length lists of >= 2 numbers")
    if n[0] != 1 or not np.all(np.diff(n) > 0) or not np.all(n == np.round(n)):
        raise ValueError(f"{path}: 'n' must be increasing integers starting at 1, got {data['n']}")
    grid = np.arange(1, int(n[-1]) + 1, dtype=float)
    profile = tuple(float(v) for v in np.interp(grid, n, seconds))
    if draft_cost is None:
        draft_cost = float(data.get("draft_cost_per_token", 0.0))
    return CostModel(draft_cost=draft_cost, profile=profile)
