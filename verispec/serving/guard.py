"""A measured check on the batch k chooser: speculate only where it has paid.

`cost.allocate` predicts, from per-request acceptance estimates and the
step-cost table, whether drafts raise the batch's tokens per second. Near the
break-even point (a full batch on a compute-bound CPU, where the first draft
past a 16-row AMX tile costs a quarter of a step) both inputs are noisy: a
request's acceptance comes from a handful of its own drafts, and step times
drift on a shared machine by more than the margin at stake. A prediction a little
wrong on each side turns a predicted gain into a realized loss, and `none` is the baseline a server must
never fall below.

So the scheduler also measures what it gets. Steps are grouped into windows of
`window` steps, per load level (the number of decoding requests, in powers of
two). A window either runs the leading mode throughout, or is a probe: its
steps alternate between "on" (the allocator chooses as it predicts) and "off"
(every adaptive request decodes plainly). Only probes are measured, and each
mode's realized rate, committed tokens per second of step time, is the
discounted sum over probes. Alternating step by step pairs the two modes under
the same machine conditions: on a shared machine the step time drifts over
seconds, which decided the comparison when whole windows of one mode were set
against whole windows of the other. Probes come every
`interval` leader windows; the interval doubles up to `max_interval` while the
probes side with the leader (like `policy.AdaptiveK`'s probes at k = 0) and
returns to `min_interval` when one sides clearly (by an `edge` past the
threshold) with the other mode or the leader changes. Half a probe runs the
losing mode, so with a clear winner the cost is half a window in `max_interval`.

Steps that prefill a prompt are not measured (`record(..., measured=False)`): one
costs several decode steps whatever the drafts, and one landing in a mode's half
of a probe would outweigh the drafts.

Speculating must lead by `edge`: within that, noise decides, and plain
decoding is the safe side of a tie. Outputs never depend on the guard: it only
changes k.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..cadence import LookAgain


@dataclass
class _Level:
    """One load level's measurements and the state of its current window."""
    rate: dict[bool, tuple[float, float]]  # mode -> discounted (tokens, seconds) over probes
    probes: LookAgain  # leader windows between probes
    probing: bool = True  # the current window alternates the modes (the first one does)
    leader: bool = True  # the mode of a window that is not a probe (True: on)
    steps: int = 0  # measured steps into the current window
    tokens: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})
    seconds: dict[bool, float] = field(default_factory=lambda: {True: 0.0, False: 0.0})

    def mode(self) -> bool:
        return self.steps % 2 == 0 if self.probing else self.leader


class SpeculationGuard:
    """Per load level: which mode, speculating or not, the next steps run."""

    def __init__(self, window: int = 16, min_interval: int = 1, max_interval: int = 32,
                 decay: float = 0.5, edge: float = 0.03) -> None:
        if (window < 2 or not 1 <= min_interval <= max_interval or not 0.0 < decay < 1.0
                or not 0.0 <= edge < 1.0):
            raise ValueError("SpeculationGuard: need window >= 2 (a probe alternates the modes), "
                             "1 <= min_interval <= max_interval, 0 < decay < 1, 0 <= edge < 1")
        self.window, self.decay = window, decay
        self.edge = edge  # "on" leads only when faster by this fraction: ties go to plain decoding
        self.min_interval, self.max_interval = min_interval, max_interval
        self._levels: dict[int, _Level] = {}

    @staticmethod
    def level(decoding: int) -> int:
        """Load level of a step: its decoding requests rounded up to a power of two."""
        return 1 << max(0, decoding - 1).bit_length()

    def allow(self, decoding: int) -> bool:
        """Whether adaptive requests may draft in a step with `decoding` decoding requests."""
        return self._state(decoding).mode()

    def rates(self, decoding: int) -> tuple[float | None, float | None]:
        """Measured (on, off) tokens per second at this load level; None where unmeasured."""
        state = self._state(decoding)
        return tuple(t / s if s > 0 else None for t, s in (state.rate[True], state.rate[False]))

    def record(self, decoding: int, tokens: int, seconds: float, measured: bool = True) -> None:
        """One finished step run under `allow(decoding)`'s answer; `measured=False` for a
        step whose time says little about the drafts (a prefill): it neither counts nor
        advances the window, so the next step runs the same mode."""
        state = self._state(decoding)
        if not measured or not seconds > 0.0:
            return
        mode = state.mode()
        state.steps += 1
        if state.probing:
            state.tokens[mode] += tokens
            state.seconds[mode] += seconds
        if state.steps < self.window:
            return
        state.steps = 0
        if not state.probing:
            state.probing = state.probes.due()
            return
        before = self._leader(state)
        ratio = ((state.tokens[True] / state.seconds[True])
                 / max(state.tokens[False] / state.seconds[False], 1e-9))  # this probe's on / off
        for m in (True, False):
            t, s = state.rate[m]
            state.rate[m] = (self.decay * t + state.tokens[m], self.decay * s + state.seconds[m])
            state.tokens[m] = state.seconds[m] = 0.0
        state.leader = self._leader(state)
        # A probe that sides with the standing leader: probe less often. One that sides
        # clearly with the other mode (the text may have changed character): probe again
        # soon, so the discounted rates catch up within a few probes. "Clearly" is an edge
        # beyond the threshold: when both modes run alike (drafts rarely allotted), a probe
        # lands on either side of it by noise, and must not keep the probes frequent.
        contrary = ratio < 1.0 if before else ratio > 1.0 + 2.0 * self.edge
        steady = before is not None and state.leader == before and not contrary
        if steady:
            state.probes.found_nothing()
        else:
            state.probes.found()
        state.probing = False

    def _leader(self, state: _Level) -> bool | None:
        """The mode with the higher measured rate (True: on); None until measured."""
        (t_on, s_on), (t_off, s_off) = state.rate[True], state.rate[False]
        if s_on == 0.0 or s_off == 0.0:
            return None
        return t_on / s_on > (1.0 + self.edge) * t_off / s_off

    def _state(self, decoding: int) -> _Level:
        key = self.level(decoding)
        if key not in self._levels:
            self._levels[key] = _Level({True: (0.0, 0.0), False: (0.0, 0.0)},
                                       LookAgain(self.min_interval, self.max_interval))
        return self._levels[key]
