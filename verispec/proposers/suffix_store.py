"""Token sequences indexed for suffix matching (SuffixDecoding, Oliaro et al.,
NeurIPS 2025): what suffix decoding drafts from.

`SuffixIndex` keeps sequences in one token stream, each followed by a
sentinel, and an index from short anchor n-grams to the stream positions where
they end. A lookup takes the most recent occurrences of the context's longest
anchor and extends each match backwards token by token (the sentinel stops
it), which finds what a suffix tree's walk finds: the occurrences of the
context's suffix of length m, and what followed each. Counts are taken over
the `recent` newest occurrences of the anchor, so a frequent anchor costs a
bounded scan; on text whose outputs repeat, the newest occurrences are the
ones that predict.

The occurrences of an anchor are a hash chain, as in LZ77 compressors: a dict
from the anchor to its newest end position, and per anchor length an array
parallel to the stream holding each position's previous occurrence. Neither
holds a Python container per anchor, so a large store gives the garbage
collector nothing to walk; a list per anchor did, and each full collection's
pause landed inside some request's step (docs/notebook/suffix.md, "The index
before the hash chains").

`SuffixStore` is the global store over past outputs: bounded by requests and
tokens, oldest evicted first, safe to share between threads, saved to and
loaded from a file (`--suffix-cache`). Its index takes its whole bound with the
first output, in buffers written in place (`anchor_table`): a server's store fills
for tens of minutes, and growing containers would move up the heaps all that time.
"""
from __future__ import annotations

import copy
import json
import os
import sys
import threading
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Callable, TypeVar

import numpy as np

from verispec.config import SUFFIX_STORE_REQUESTS, SUFFIX_STORE_TOKENS
from verispec.proposers.anchor_table import AnchorTable, fill, filled, move_down

SENTINEL = -1  # ends every sequence; never equal to a token, so matches stop there
NONE = -1  # a chain's end: no earlier occurrence
ANCHORS = (3, 1)  # anchor n-gram lengths, longest first: 3 finds long matches among a
# frequent token's occurrences, 1 finds the short ones
_BITS = 21  # anchor keys pack n tokens of < 2**21 ids into one int, exactly
CACHE_VERSION = 1
T = TypeVar("T")


@dataclass(frozen=True)
class Match:
    position: int  # stream position of the matched suffix's last token
    length: int  # tokens matched, up to the index's max_depth


@dataclass(frozen=True)
class StoreStats:
    requests: int
    tokens: int
    index_entries: int  # live and not yet swept
    memory_bytes: int  # the stream, the index and their containers (sys.getsizeof)


def _anchor_key(tokens) -> int:
    """The n tokens of an anchor packed into one int, exactly (ids < 2**_BITS)."""
    key = 0
    for token in tokens:
        key = (key << _BITS) | token
    return key


def _exchanger(newest: dict[int, int] | AnchorTable) -> Callable[[int, int, int], int]:
    """`newest`'s exchange(key, position, default): set key's newest position, return the
    one it replaces."""
    if isinstance(newest, AnchorTable):
        return newest.exchange

    def exchange(key: int, position: int, default: int) -> int:
        before = newest.get(key, default)
        newest[key] = position
        return before
    return exchange


class SuffixIndex:
    """Sequences and their anchor index; the last sequence may stay open and grow."""

    def __init__(self, max_depth: int = 32, recent: int = 64, capacity: int | None = None,
                 table_slots: int | None = None) -> None:
        """`capacity`: a fixed stream of that many slots, written in place, and anchor
        tables of `table_slots` slots (the store's); None: containers that grow (a
        request's own text)."""
        self.max_depth, self.recent = max_depth, recent
        self.capacity = capacity
        slots = capacity or 64
        # The stream is tokens[:size], from global position `offset`; slots past it are
        # spare room (their values are never read).
        self.tokens = filled(slots)
        self.size = 1  # the stream starts with a sentinel
        self.offset = 0
        self.bounds: deque[tuple[int, int]] = deque()  # global [start, end) of each sequence
        # Per anchor length n: the newest end position of each anchor key, and, parallel to
        # `tokens`, the previous end position of the anchor ending at each position (NONE).
        self.newest: dict[int, dict[int, int] | AnchorTable] = {
            n: {} if capacity is None else AnchorTable(table_slots) for n in ANCHORS}
        self.previous: dict[int, array] = {n: filled(slots) for n in ANCHORS}
        self.entries = 0  # index entries appended since the last sweep, dead ones included
        self.count = 0  # live tokens
        self.open = False  # the last sequence may still be extended

    # -- building -------------------------------------------------------------
    def add(self, tokens: list[int], keep_open: bool = False) -> None:
        """A new sequence; `keep_open`: `extend` may append to it later."""
        self._seal()
        self._append([SENTINEL])  # the new sequence's own, at its end
        start = self.offset + self.size - 1
        self.bounds.append((start, start))
        self.open = True
        self.extend(tokens)
        if not keep_open:
            self._seal()

    def extend(self, tokens: list[int]) -> None:
        """Append to the open last sequence, indexing every position that now has a
        continuation (the last token waits for the next one)."""
        if not self.open:
            raise RuntimeError("extend() needs an open sequence")
        if not tokens:
            return
        if self.capacity is not None and any(t.full(len(tokens)) for t in self.newest.values()):
            self._sweep()  # the tables' dead anchors make way for the new ones
        start, end = self.bounds[-1]
        self.size -= 1  # the open sequence's sentinel, written again after the new tokens
        self._append([*tokens, SENTINEL])
        self.bounds[-1] = (start, end + len(tokens))
        self.count += len(tokens)
        self._index_range(start, max(start, end - 1), end + len(tokens) - 1)

    def _seal(self) -> None:
        self.open = False

    def _append(self, tokens: list[int]) -> None:
        """Write `tokens` after the stream, their chain links NONE."""
        begin = self._room(len(tokens))
        self.tokens[begin:self.size] = array("q", tokens)
        for chain in self.previous.values():
            fill(chain, begin, self.size)

    def _room(self, n: int) -> int:
        """Make room for `n` more slots and take them; returns where they begin. A fixed
        stream moves its live part down over the evicted prefix (keeping the sentinel
        before the first live token); a growing one doubles."""
        if self.size + n > len(self.tokens):
            dead = self.live_start - self.offset - 1
            if self.capacity is not None and self.size - dead + n <= self.capacity:
                for buffer in (self.tokens, *self.previous.values()):
                    move_down(buffer, dead, self.size)
                self.offset += dead
                self.size -= dead
            elif self.capacity is not None:
                raise RuntimeError(f"a suffix index of {self.capacity} slots has no room for "
                                   f"{n} more past {self.size - dead} live ones")
            else:
                grow = filled(max(n, len(self.tokens)))
                for buffer in (self.tokens, *self.previous.values()):
                    buffer.extend(grow)
        begin = self.size
        self.size += n
        return begin

    def _index_range(self, start: int, first: int, stop: int) -> None:
        """Index the anchors ending at positions [first, stop) of a sequence from `start`.
        Positions only ever grow, so every chain runs from newest to oldest."""
        tokens, off = self.tokens, self.offset
        for n, newest in self.newest.items():
            chain, exchange = self.previous[n], _exchanger(newest)
            for i in range(max(first, start + n - 1), stop):
                chain[i - off] = exchange(_anchor_key(tokens[i - n + 1 - off:i + 1 - off]), i, NONE)
                self.entries += 1

    def evict_oldest(self) -> None:
        """Drop the oldest sequence; its slots are reused when the stream needs room, and
        its index entries are swept lazily."""
        start, end = self.bounds.popleft()
        self.count -= end - start
        if not self.bounds:
            self.open = False
        if self.entries > 2 * len(ANCHORS) * self.count + 1024:
            self._sweep()

    def _sweep(self) -> None:
        """Index the live sequences again, in place: keeps the index within twice its
        live size, so memory follows the bounds however many sequences passed."""
        for newest in self.newest.values():
            newest.clear()
        for chain in self.previous.values():
            fill(chain, 0, self.size)
        self.entries = 0
        for start, end in self.bounds:
            self._index_range(start, start, end - 1)

    def clone(self) -> "SuffixIndex":
        """An independent copy: arrays and flat tables of ints, copied whole."""
        twin = copy.copy(self)
        twin.tokens = array("q", self.tokens)
        twin.bounds = deque(self.bounds)
        twin.newest = {n: newest.copy() for n, newest in self.newest.items()}
        twin.previous = {n: array("q", chain) for n, chain in self.previous.items()}
        return twin

    # -- reading --------------------------------------------------------------
    @property
    def live_start(self) -> int:
        return self.bounds[0][0] if self.bounds else self.offset + self.size

    def matches(self, context: list[int]) -> list[Match]:
        """Occurrences of the context's suffix with a continuation, from the newest
        `recent` occurrences of its longest anchor found, longest match first."""
        query = context[-self.max_depth:]
        tokens, off, live = self.tokens, self.offset, self.live_start
        for n, i in zip(ANCHORS, self.heads(query)):
            chain, found = self.previous[n], []
            while i >= live and len(found) < self.recent:  # newest first; evicted ones end it
                m = n
                while m < len(query) and tokens[i - m - off] == query[-1 - m]:
                    m += 1
                found.append(Match(i, m))
                i = chain[i - off]
            if found:
                found.sort(key=lambda match: -match.length)
                return found
        return []

    def heads(self, query: list[int]) -> list[int]:
        """Per anchor length (ANCHORS), the newest end position of the query's last n
        tokens (NONE: absent or too short): where each of `matches`' chains starts."""
        return [self.newest[n].get(_anchor_key(query[-n:]), NONE) if len(query) >= n else NONE
                for n in ANCHORS]

    def continuation(self, position: int, length: int) -> list[int]:
        """Up to `length` tokens after stream position `position`, within its sequence."""
        begin = position + 1 - self.offset
        out = self.tokens[begin:begin + length].tolist()
        return out[:out.index(SENTINEL)] if SENTINEL in out else out

    def sequences(self) -> list[list[int]]:
        return [self.tokens[s - self.offset:e - self.offset].tolist() for s, e in self.bounds]

    def memory_bytes(self) -> int:
        size = sys.getsizeof(self.tokens) + sys.getsizeof(self.bounds)
        for n, newest in self.newest.items():
            size += sys.getsizeof(self.previous[n])
            if isinstance(newest, AnchorTable):
                size += newest.memory_bytes()
            else:
                size += sys.getsizeof(newest)
                size += sum(sys.getsizeof(key) + sys.getsizeof(i) for key, i in newest.items())
        return size


class SuffixCacheError(ValueError):
    """A `--suffix-cache` file that cannot be used; the message is one line."""


class SuffixStore:
    """The global store over past outputs, shared by every request of an Engine.

    Bounded by `max_requests` sequences and `max_tokens` tokens: adding past
    either evicts the oldest sequences first. A lock makes every read and
    write atomic, so requests served from several threads see one store.
    """

    def __init__(self, max_requests: int = SUFFIX_STORE_REQUESTS,
                 max_tokens: int = SUFFIX_STORE_TOKENS,
                 max_depth: int = 32, recent: int = 64) -> None:
        if max_requests < 1 or max_tokens < 1:
            raise ValueError(f"a suffix store needs max_requests and max_tokens >= 1, "
                             f"got {max_requests}, {max_tokens}")
        self.max_requests, self.max_tokens = max_requests, max_tokens
        # Empty until the first output: then the index takes its full bound at once.
        self._index = SuffixIndex(max_depth, recent)
        self._lock = threading.Lock()
        self.inserted = 0  # sequences ever added, evicted ones included

    @property
    def max_depth(self) -> int:
        return self._index.max_depth

    def _bounded_index(self) -> SuffixIndex:
        """An index allocated at the store's bounds: a stream with room for every live
        output and its sentinel plus half as much again (so that moving the live part
        down over evicted ones is rare), and anchor tables with twice as many slots as
        live anchors can take."""
        live = self.max_tokens + self.max_requests + 1
        return SuffixIndex(self._index.max_depth, self._index.recent, capacity=live + live // 2,
                           table_slots=max(4, 1 << (2 * self.max_tokens - 1).bit_length()))

    def add(self, tokens: list[int]) -> None:
        """Cache one output (the newest); a sequence over max_tokens keeps its tail. The
        oldest outputs are evicted first, as many as the new one needs room for."""
        tokens = [int(t) for t in tokens[-self.max_tokens:]]
        if not tokens:
            return
        with self._lock:
            if self._index.capacity is None:
                self._index = self._bounded_index()
            index = self._index
            while index.bounds and (len(index.bounds) >= self.max_requests
                                    or index.count + len(tokens) > self.max_tokens):
                index.evict_oldest()
            index.add(tokens)
            self.inserted += 1

    def copy(self) -> "SuffixStore":
        """An independent store holding the same sequences: what a benchmark
        restores before each timed run of one prompt, so that a repeat never
        drafts from the output of the run before it."""
        twin = SuffixStore(self.max_requests, self.max_tokens, self.max_depth, self._index.recent)
        with self._lock:
            twin._index = self._index.clone()
            twin.inserted = self.inserted
        return twin

    def matches(self, context: list[int]) -> list[Match]:
        with self._lock:
            return self._index.matches(context)

    def read(self, lookup: Callable[[SuffixIndex], T]) -> T:
        """`lookup(index)` under the store's lock: a reader that needs several of the
        index's arrays to agree."""
        with self._lock:
            return lookup(self._index)

    def sequences(self) -> list[list[int]]:
        with self._lock:
            return self._index.sequences()

    def stats(self) -> StoreStats:
        with self._lock:
            index = self._index
            return StoreStats(len(index.bounds), index.count, index.entries, index.memory_bytes())

    # -- the --suffix-cache file ---------------------------------------------
    def save(self, path: str) -> None:
        """Write the cached outputs atomically (a temporary file, then a rename)."""
        sequences = self.sequences()
        lengths = np.array([len(s) for s in sequences], dtype=np.int64)
        flat = np.array([t for s in sequences for t in s], dtype=np.int64)
        meta = json.dumps({"version": CACHE_VERSION, "max_requests": self.max_requests,
                           "max_tokens": self.max_tokens})
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as fh:
            np.savez(fh, tokens=flat, lengths=lengths, meta=np.array(meta))
        os.replace(tmp, path)

    def load(self, path: str, vocab_size: int | None = None) -> int:
        """Add the outputs saved in `path`, oldest first; returns how many. Raises
        SuffixCacheError (one line) for a file that is not a suffix cache, or whose
        tokens do not fit `vocab_size`; the store is then left unchanged."""
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                flat, lengths = data["tokens"], data["lengths"]
        except FileNotFoundError:
            raise
        except Exception as exc:  # a corrupt zip, a missing array, bad JSON: all one message
            raise SuffixCacheError(f"{path} is not a readable suffix cache "
                                   f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'})") from None
        if not isinstance(meta, dict) or meta.get("version") != CACHE_VERSION:
            raise SuffixCacheError(f"{path}: unknown suffix cache version "
                                   f"{meta.get('version') if isinstance(meta, dict) else meta!r}")
        if (flat.ndim != 1 or lengths.ndim != 1 or flat.dtype.kind != "i"
                or lengths.dtype.kind != "i" or (lengths < 0).any()
                or int(lengths.sum()) != flat.shape[0]):
            raise SuffixCacheError(f"{path}: the cached sequences do not add up (a damaged file)")
        if flat.size and (flat.min() < 0 or (vocab_size is not None and flat.max() >= vocab_size)):
            raise SuffixCacheError(f"{path}: token ids outside [0, {vocab_size}): the cache was "
                                   f"written for another model's vocabulary")
        starts = np.concatenate([[0], np.cumsum(lengths)])
        tokens = flat.tolist()
        for begin, end in zip(starts[:-1].tolist(), starts[1:].tolist()):
            self.add(tokens[begin:end])
        return int(lengths.shape[0])
