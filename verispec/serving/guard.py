"""A measured check on the batch k chooser: speculate only where it has paid.

`cost.allocate` predicts, from per-request acceptance estimates and the
step-cost table, whether drafts raise the batch's tokens per second. Near the
break-even point (a full batch on a compute-bound CPU, where the first draft
past a 16-row AMX tile costs a quarter of a step) both inputs are noisy: a
request's acceptance comes from a handful of its own drafts, and step times
drift by 10-25% on a shared machine. A prediction 5% wrong on each side turns a
predicted gain into a realized loss, and `none` is the baseline a server must
never fall below.

So the scheduler also measures what it gets. Steps are grouped into windows of
`window` steps, per load level (the number of decoding requests, in powers of
two). A window runs "on" (the allocator chooses as it predicts) or "off"
(every adaptive request decodes plainly), and the realized rate, committed
tokens per second of step time, is kept for each mode and level as a
discounted mean over windows. The next window runs the better mode; every
`interval`-th window runs the other one, to notice when the answer changes.
The interval doubles up to `max_interval` while the same mode keeps winning
(the probes' cost shrinks, like `policy.AdaptiveK`'s probes at k = 0) and
returns to `min_interval` when a probe reverses the order.

Speculating must lead by `edge` (3%): within that, window-to-window noise
decides, and plain decoding is the safe side of a tie. The cost is the probes:
with a clear winner, one window in `max_interval` runs the worse mode.
Outputs never depend on it: it only changes k.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Level:
    """One load level's measurements and the state of its current window."""
    rate: dict[bool, tuple[float, float]]  # mode -> discounted (tokens, seconds)
    mode: bool = True  # the mode of the current window (True: on)
    steps: int = 0  # steps into the current window
    tokens: float = 0.0  # committed in the current window
    seconds: float = 0.0
    windows: int = 0  # windows since the last probe
    interval: int = 2  # windows between probes of the losing mode


class SpeculationGuard:
    """Per load level: which mode, speculating or not, the next steps run."""

    def __init__(self, window: int = 16, min_interval: int = 2, max_interval: int = 32,
                 decay: float = 0.7, edge: float = 0.03) -> None:
        if (window < 1 or not 1 <= min_interval <= max_interval or not 0.0 < decay < 1.0
                or not 0.0 <= edge < 1.0):
            raise ValueError("SpeculationGuard: need window >= 1, "
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
        return self._state(decoding).mode

    def rates(self, decoding: int) -> tuple[float | None, float | None]:
        """Measured (on, off) tokens per second at this load level; None where unmeasured."""
        state = self._state(decoding)
        return tuple(t / s if s > 0 else None for t, s in (state.rate[True], state.rate[False]))

    def record(self, decoding: int, tokens: int, seconds: float) -> None:
        """One finished step run under `allow(decoding)`'s answer."""
        state = self._state(decoding)
        state.steps += 1
        state.tokens += tokens
        state.seconds += seconds
        if state.steps < self.window:
            return
        before = self._leader(state)
        tokens_sum, seconds_sum = state.rate[state.mode]
        state.rate[state.mode] = (self.decay * tokens_sum + state.tokens,
                                  self.decay * seconds_sum + state.seconds)
        state.steps, state.tokens, state.seconds = 0, 0.0, 0.0
        leader = self._leader(state)
        if leader is None:
            state.mode = state.rate[True][1] == 0.0  # measure both modes first
            return
        if before is not None and state.mode != before:
            # This window probed the trailing mode. Still behind: probe it less often.
            # Ahead now: the order changed, so keep checking often.
            state.interval = (min(2 * state.interval, self.max_interval) if leader == before
                              else self.min_interval)
        state.windows += 1
        probe = state.windows >= state.interval
        if probe:
            state.windows = 0
        state.mode = leader != probe

    def _leader(self, state: _Level) -> bool | None:
        """The mode with the higher measured rate (True: on); None until both are measured."""
        (t_on, s_on), (t_off, s_off) = state.rate[True], state.rate[False]
        if s_on == 0.0 or s_off == 0.0:
            return None
        return t_on / s_on > (1.0 + self.edge) * t_off / s_off

    def _state(self, decoding: int) -> _Level:
        key = self.level(decoding)
        if key not in self._levels:
            self._levels[key] = _Level({True: (0.0, 0.0), False: (0.0, 0.0)},
                                       interval=self.min_interval)
        return self._levels[key]
