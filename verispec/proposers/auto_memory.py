"""What `auto` carries from one request of an Engine to the next (`Engine.auto_memory`,
shared by every request a server runs), and the rests of a costly proposer under
adaptive k (`Engine.rests`, verispec.request.SpecRequest), judged the same way.

- Each candidate's prices: seconds per requested draft token and per probe. A call's
  price is the machine's and the model's, not the text's, so a new request starts from
  them; unseeded, a head's first calls in every request were priced at the prior, free.
- A rest for each costly candidate that did not earn its place. A costly candidate taxes
  every step of a request it is part of, chosen or not: the target's hidden rows it
  reads are kept for it, its probes run, and the plan prices it. When its drafts in a
  request saved less time than its calls and passes took (`Ledger.verdict`), the next
  `rest.interval` requests are built without it, an interval that doubles while it keeps
  losing and returns to its start when it earns (cadence.Backoff): on text where a head
  never pays it is part of about one request in `rest_limit`, and when the text changes
  it is back within that many requests. A costly proposer drafting alone under adaptive
  k (`--proposer lookahead`, a draft model) taxes its request the same way: its probes
  and its policy's host work on every step, plain or not. While it rests its requests
  decode plainly.
"""
from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass

from ..cadence import Backoff
from ..economics import DraftPrice

log = logging.getLogger(__name__)


@dataclass
class CandidatePrices:
    draft: DraftPrice  # seconds per requested draft token
    probe: DraftPrice  # seconds per probe


@dataclass
class Ledger:
    """One request's account of one candidate, against the request's other steps."""
    tokens: int = 0  # tokens committed by the steps it drafted
    seconds: float = 0.0  # those steps' wall time (its draft calls included)
    probes: float = 0.0  # seconds of its probes (guesses made on other steps)

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds

    def verdict(self, all_tokens: int, all_seconds: float) -> float | None:
        """Seconds its drafting saved in a request whose steps committed `all_tokens` in
        `all_seconds`: its steps' tokens at the rate of the request's other steps, less
        what its steps and probes took. None where there is nothing to weigh (it was
        never called, or it drafted every step). The hidden rows kept for it on every
        step are not counted, so the verdict leans towards keeping it."""
        other_tokens = all_tokens - self.tokens
        other_seconds = all_seconds - self.seconds - self.probes
        if not (self.seconds or self.probes) or other_tokens <= 0 or other_seconds <= 0:
            return None
        return self.tokens * other_seconds / other_tokens - self.seconds - self.probes


@dataclass
class CandidateMemory:
    rest: Backoff  # requests left out after a loss (AutoMemory's rest_start, rest_limit)
    prices: CandidatePrices | None = None
    resting: int = 0  # requests still to be built without it


class AutoMemory:
    def __init__(self, rest_start: int = 1, rest_limit: int = 16) -> None:
        if not 1 <= rest_start <= rest_limit:
            raise ValueError(f"need 1 <= rest_start <= rest_limit, got {rest_start}, {rest_limit}")
        self.rest_start, self.rest_limit = rest_start, rest_limit
        self.candidates: dict[str, CandidateMemory] = {}
        self._scopes: dict[str, AutoMemory] = {}
        self._lock = threading.Lock()  # a server's requests start and end on several threads

    def scope(self, name: str) -> "AutoMemory":
        """A separate memory for requests that draft differently (trees, whose calls
        cost more per requested token than chains'), with the same rests."""
        with self._lock:
            if name not in self._scopes:
                self._scopes[name] = AutoMemory(self.rest_start, self.rest_limit)
            return self._scopes[name]

    def _of(self, name: str) -> CandidateMemory:
        if name not in self.candidates:
            self.candidates[name] = CandidateMemory(Backoff(self.rest_start, self.rest_limit))
        return self.candidates[name]

    def skip(self, name: str) -> bool:
        """Whether a new request is built without costly candidate `name` (one request
        of its rest is spent)."""
        with self._lock:
            memory = self.candidates.get(name)
            if memory is None or memory.resting <= 0:
                return False
            memory.resting -= 1
            return True

    def prices(self, name: str) -> CandidatePrices | None:
        """Copies of `name`'s prices, for a new request to start from."""
        with self._lock:
            memory = self.candidates.get(name)
            return None if memory is None or memory.prices is None else copy.deepcopy(memory.prices)

    def finished(self, name: str, draft: DraftPrice, probe: DraftPrice,
                 saved: float | None = None) -> None:
        """A request ended: keep `name`'s prices, and for a costly candidate its verdict
        (`saved` seconds; None gives none): a loss starts a rest, a gain ends them."""
        with self._lock:
            if draft.measured is not None:
                self._of(name).prices = CandidatePrices(copy.deepcopy(draft),
                                                        copy.deepcopy(probe))
        self.judge(name, saved)

    def judge(self, name: str, saved: float | None) -> None:
        """A request's verdict on `name` (`Ledger.verdict`, seconds its drafting saved;
        None gives none): a loss starts a rest, a gain ends them."""
        if saved is None:
            return
        with self._lock:
            memory = self._of(name)
            if saved > 0:
                memory.rest.reset()
                return
            memory.resting = memory.rest.interval
            memory.rest.longer()
        log.debug("%s rests for %d requests (its drafts lost %.1f ms)", name,
                  memory.resting, -1e3 * saved)
