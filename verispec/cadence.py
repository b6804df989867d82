"""When a policy looks again where it is not looking: the one mechanism, written once.

An estimate is only corrected where a policy acts, so now and then it must act
elsewhere: adaptive k at k = 0 probes with a short draft, since k = 0 yields no
acceptance evidence; while drafting it tries a neighbour of its k, since estimates
beyond the choice are extrapolated and a pessimistic one would never be corrected
(near the optimum the rate curve is flat, so this costs little); the batch scheduler
moves one request's k by one. `LookAgain` counts the steps between looks; its
interval doubles while the looks find nothing, up to a limit, and returns to its
start when one finds something, so a hopeless option costs about 1/limit of the
steps and a recovered one is seen again soon. A cadence whose limit is its start
looks at a fixed interval (exploration).
"""
from __future__ import annotations


class LookAgain:
    def __init__(self, start: int, limit: int | None = None) -> None:
        """`start`: steps between looks (0: never look); `limit`: the longest interval
        (None: `start`, a fixed interval)."""
        limit = start if limit is None else limit
        if start < 0 or (start and not start <= limit):
            raise ValueError(f"LookAgain needs 0 <= start <= limit, got {start}, {limit}")
        self.start, self.limit = start, limit
        self.interval = start
        self.waited = 0  # steps counted since the last look
        self.looks = 0  # looks so far

    def due(self) -> bool:
        """Count a step; True when this step looks again (the count then starts over)."""
        if not self.interval:
            return False
        self.waited += 1
        if self.waited < self.interval:
            return False
        self.waited = 0
        self.looks += 1
        return True

    def found_nothing(self) -> None:
        """The look found nothing new: wait twice as long before the next."""
        self.interval = min(2 * self.interval, self.limit)

    def found(self) -> None:
        """The look found something (or the situation changed): look again soon."""
        self.interval = self.start
