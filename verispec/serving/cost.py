"""Draft lengths for a whole batch: speculation that yields to load.

One batched step feeds every running request's last token plus its drafts and
costs T(widths), the time of one `forward_batch`. The step commits
sum_i E_i(k_i) tokens in expectation, E_i(k) = 1 + sum_{j<=k} prod_{d<=j} alpha_i,d
(Leviathan et al. 2023, eq. 1, with request i's per-depth acceptance). The
scheduler picks the k_i that maximise the batch's expected tokens per second

    sum_i E_i(k_i) / (T(widths) + sum_i c_i k_i + H)    (c_i: request i's draft seconds/token).

H is the step's host work that no draft length changes: each request's quote
(its proposer's lookups, its policy), plan and feed, and the scheduler's own. It
belongs in both rates compared, speculating and not: leaving it out prices the
batch's plain step at its forward alone, so the average position looks as cheap as
the marginal one and the drafts that pay are refused. At 16 streams on a CPU,
where the step is compute-bound and every request's host work adds up, that kept
adaptive k far below a fixed k that was measured to pay.

Where T is flat (memory-bound: every weight is read once whatever the width),
extra positions are nearly free and drafts pay. Once the total width crosses
into compute-bound, T grows in proportion to the positions, and a draft whose
acceptance is below one costs more than it yields: as the batch fills, k
shrinks, and when the step is compute-bound it is 0 for everybody.

T comes from the measured cost curve: the `verispec profile` shape T(n)/T(1)
as prior (or, without a profile file, a few forwards timed when the scheduler
starts: `calibrate`), rescaled online by the step times actually observed at
each width (`economics.StepCost`, the one curve `policy.AdaptiveK` keeps for one
request too), so a prior that is off in scale or slope is corrected where the
scheduler has been. The table is
kept non-decreasing in the width: a noisy dip must not make a wider step look
cheaper than a narrower one, or the allocator would chase the noise.

Speculating must beat not speculating by `margin` (predicted), since the
rates compared are estimates: near the break-even point a draft is as likely
to cost as to pay, and `none` is the baseline a server must never fall below.

A backend whose `forward_batch` fuses requests costs T(sum of widths); the
default one runs the requests one after another and costs sum_i T(width_i),
which makes each request's choice independent of the others.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..draft_shape import between
from ..economics import CostModel, StepCost, tokens_per_pass

# Dense just past 16: AMX tiles hold 16 rows, and the step after a full tile of decode
# rows costs a jump that a line through wider widths misses (docs/notebook/rounds.md,
# serving round 6), so the first drafts past a tile must be priced from measurements.
CALIBRATION_WIDTHS = (1, 2, 4, 8, 12, 16, 17, 18, 20, 24, 32, 40, 48, 64, 96, 128)


def calibrate(target, widths: Sequence[int] = CALIBRATION_WIDTHS, context: int = 64,
              repeats: int = 3) -> CostModel | None:
    """The prior shape T(n)/T(1), timed on the target by `verispec profile`'s
    measurement (`bench.profile.measure`) at these widths only, linear in
    between (a few forwards when the scheduler starts); None if the model is too short
    for it."""
    from ..bench.profile import measure

    widths = [w for w in widths if context + w <= target.max_context]
    if len(widths) < 2:
        return None
    vocab = int(getattr(target, "vocab_size", 2))
    ids = [i % max(2, vocab - 1) + 1 for i in range(context + widths[-1])]
    timed = measure(target, ids, context, widths[-1], repeats, warmup=1, widths=widths)
    curve = np.maximum.accumulate(np.interp(np.arange(1, widths[-1] + 1), timed.n, timed.seconds))
    return CostModel(profile=tuple(float(v) for v in curve))


@dataclass(frozen=True)
class Candidate:
    """One running request as the allocator sees it."""
    base_width: int  # positions fed whatever k is: 1 for a decode step, the prompt for a prefill
    k_cap: int  # the most drafts this step may verify (room, the request's k)
    alphas: Sequence[float]  # per-depth acceptance estimates (deeper depths reuse the last)
    fixed: bool = False  # the request asked for a fixed k: it drafts k_cap, not chosen here
    draft_seconds: float | None = None  # measured seconds per requested draft token
    decoding: bool = True  # False for a prefill, which commits no token this step
    # Positions fed and depth reached for k = 0..k_cap (draft_shape.DraftShape.tables):
    # a lookahead step feeds its whole tree at any k. None: a chain of k.
    shape: tuple[Sequence[float], Sequence[float]] | None = None

    def fed(self, k: int) -> int:
        """Positions a step of k drafts feeds, its committed token included."""
        return self.base_width + (k if self.shape is None else round(self.shape[0][k]))

    def gains(self, cap: int) -> list[float]:
        """E(k) - 1 for k = 0..cap, at the depth a step of k reaches (depths past the
        alphas given reuse the last one)."""
        alphas = [float(alpha) for alpha in self.alphas[:cap]]
        alphas += [alphas[-1] if alphas else 0.0] * (cap - len(alphas))
        gain = [tokens - 1.0 for tokens in tokens_per_pass(alphas)]
        if self.shape is None:
            return gain
        return [between(gain, depth) for depth in self.shape[1][:cap + 1]]


def allocate(candidates: Sequence[Candidate], cost: StepCost, margin: float = 0.0,
             overhead: float = 0.0) -> list[int]:
    """Draft length per candidate maximising expected tokens per second of the step.

    Greedy by extensions: starting from k = 0 for adaptive requests (fixed ones
    keep theirs), repeatedly apply, among the extensions (one request, m more
    drafts) that raise the step's rate, the one with the most expected tokens
    per added position, so a free budget is spread where acceptance is highest
    rather than spent on one deep draft. Looking m ahead, not just one, crosses
    a cost step such as T(2) > T(1) that only a longer draft amortises. The
    adaptive requests draft at all only if that lifts the predicted rate by
    more than `margin` (a fraction: the scheduler's default 0.02 is 2%) over
    drafting nothing. `overhead`: H above, in seconds (measured once the cost model is).
    """
    caps = [max(0, c.k_cap) if c.decoding else 0 for c in candidates]
    ks = [cap if c.fixed else 0 for c, cap in zip(candidates, caps)]
    free = [0 if c.fixed else cap for c, cap in zip(candidates, caps)]  # what may still be added
    widths = [c.fed(k) for c, k in zip(candidates, ks)]
    table = cost.table(max(sum(max(c.fed(k) for k in range(cap + 1))
                           for c, cap in zip(candidates, caps)), 1))
    # Draft prices: measured seconds once the cost model is in seconds, else the prior's c.
    price = [c.draft_seconds if (c.draft_seconds is not None and cost.timed)
             else cost.prior.draft_cost * table[1] for c in candidates]
    gains = [c.gains(cap) for c, cap in zip(candidates, caps)]  # E(k) - 1, k = 0..cap
    tokens = sum(1.0 + g[k] for c, g, k in zip(candidates, gains, ks) if c.decoding)
    total = sum(widths)
    verify = table[total] if cost.fused else sum(table[w] for w in widths)
    # Seconds beside the forward: the drafts and H (before the model is in seconds its
    # table is in units of T(1), where a measured H has no scale).
    host = sum(p * k for p, k in zip(price, ks)) + (overhead if cost.timed else 0.0)
    baseline, start = tokens / (verify + host), list(ks)
    while True:
        rate = tokens / (verify + host)
        best = None  # (tokens per position, rate, index, m, verify after)
        # Shortest drafts first, so equal requests share a budget instead of one taking it all.
        for i in sorted(range(len(free)), key=ks.__getitem__):
            k = ks[i]
            for m in range(1, free[i] + 1):
                added = candidates[i].fed(k + m) - widths[i]  # m for a chain
                v = (table[total + added] if cost.fused
                     else verify - table[widths[i]] + table[widths[i] + added])
                gain = gains[i][k + m] - gains[i][k]
                r = (tokens + gain) / (v + host + price[i] * m)
                per_position = gain / max(added, 1)
                # Ties go to fewer drafts: an overestimated alpha then wastes less.
                if r > rate * (1.0 + 1e-9) and (best is None or (per_position, r) > best[:2]):
                    best = (per_position, r, i, m, v)
        if best is None:
            return ks if rate > baseline * (1.0 + margin) else start
        _, _, i, m, verify = best
        tokens += gains[i][ks[i] + m] - gains[i][ks[i]]
        host += price[i] * m
        ks[i] += m
        free[i] -= m
        total += candidates[i].fed(ks[i]) - widths[i]
        widths[i] = candidates[i].fed(ks[i])
