"""When an estimate looks again where it is not looking: the two cadences every
policy shares, written once.

- `Backoff`: an interval between looks that doubles while the looks keep saying
  "nothing here" and returns to its start when one says otherwise, so a hopeless
  option costs about 1/limit of the steps and a recovered one is seen again soon.
  AdaptiveK's probes at k = 0, `auto`'s probes of a costly candidate and serving's
  guard probes all back off this way.
- `Explore`: every `every`-th step a policy tries a neighbour of its choice
  instead, because estimates beyond the choice are extrapolated and a
  pessimistic one would never be corrected; near the optimum the rate curve is
  flat, so this costs little. AdaptiveK (k + 1 or k - 1), the tree policy (a
  neighbouring node budget) and the batch scheduler (one request's k) use it.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Backoff:
    start: int  # the interval after a look that found something
    limit: int  # the longest interval
    interval: int = field(init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.start <= self.limit:
            raise ValueError(f"Backoff needs 1 <= start <= limit, got {self.start}, {self.limit}")
        self.interval = self.start

    def longer(self) -> None:
        """The look found nothing new: wait twice as long before the next."""
        self.interval = min(2 * self.interval, self.limit)

    def reset(self) -> None:
        """The look found something (or the situation changed): look again soon."""
        self.interval = self.start


@dataclass
class Explore:
    every: int  # steps between explorations; 0 never explores
    steps: int = 0  # steps counted so far

    def tick(self) -> int | None:
        """Count a step; the exploration's turn number (1, 2, ...) when this step
        explores, else None. Callers alternate directions by the turn's parity."""
        self.steps += 1
        if not self.every or self.steps % self.every:
            return None
        return self.steps // self.every
