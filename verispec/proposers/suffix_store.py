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
loaded from a file (`--suffix-cache`).
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


class SuffixIndex:
    """Sequences and their anchor index; the last sequence may stay open and grow."""

    def __init__(self, max_depth: int = 32, recent: int = 64) -> None:
        self.max_depth, self.recent = max_depth, recent
        self.tokens = array("q", [SENTINEL])  # the stream, from global position `offset`
        self.offset = 0
        self.bounds: deque[tuple[int, int]] = deque()  # global [start, end) of each sequence
        # Per anchor length n: the newest end position of each anchor key, and, parallel to
        # `tokens`, the previous end position of the anchor ending at each position (NONE).
        self.newest: dict[int, dict[int, int]] = {n: {} for n in ANCHORS}
        self.previous: dict[int, array] = {n: array("q", [NONE]) for n in ANCHORS}
        self.entries = 0  # index entries appended since the last sweep, dead ones included
        self.count = 0  # live tokens
        self.open = False  # the last sequence may still be extended

    # -- building -------------------------------------------------------------
    def add(self, tokens: list[int], keep_open: bool = False) -> None:
        """A new sequence; `keep_open`: `extend` may append to it later."""
        self._seal()
        start = self.offset + len(self.tokens)
        self._append([SENTINEL])  # the new sequence's own, at its end
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
        start, end = self.bounds[-1]
        self._cut(len(self.tokens) - 1, len(self.tokens))  # the open sequence's sentinel
        self._append([*tokens, SENTINEL])
        self.bounds[-1] = (start, end + len(tokens))
        self.count += len(tokens)
        self._index_range(start, max(start, end - 1), end + len(tokens) - 1)

    def _seal(self) -> None:
        self.open = False

    def _append(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        for chain in self.previous.values():
            chain.extend([NONE] * len(tokens))

    def _cut(self, begin: int, end: int) -> None:
        """Drop stream slots [begin, end) (offsets into `tokens`) and their chain links."""
        del self.tokens[begin:end]
        for chain in self.previous.values():
            del chain[begin:end]

    def _index_range(self, start: int, first: int, stop: int) -> None:
        """Index the anchors ending at positions [first, stop) of a sequence from `start`.
        Positions only ever grow, so every chain runs from newest to oldest."""
        tokens, off = self.tokens, self.offset
        for n, newest in self.newest.items():
            chain = self.previous[n]
            for i in range(max(first, start + n - 1), stop):
                key = _anchor_key(tokens[i - n + 1 - off:i + 1 - off])
                chain[i - off] = newest.get(key, NONE)
                newest[key] = i
                self.entries += 1

    def evict_oldest(self) -> None:
        """Drop the oldest sequence; its index entries are swept lazily."""
        start, end = self.bounds.popleft()
        self.count -= end - start
        if not self.bounds:
            self.open = False
        live = self.live_start
        dead = live - self.offset - 1  # keep the sentinel before the first live token
        if dead > len(self.tokens) // 2:
            self._cut(0, dead)
            self.offset += dead
        if self.entries > 2 * len(ANCHORS) * self.count + 1024:
            self._sweep()

    def _sweep(self) -> None:
        """Rebuild the index from the live sequences: keeps it within twice its
        live size, so memory follows the bounds however many sequences passed."""
        self.newest = {n: {} for n in ANCHORS}
        self.previous = {n: array("q", [NONE]) * len(self.tokens) for n in ANCHORS}
        self.entries = 0
        for start, end in self.bounds:
            self._index_range(start, start, end - 1)

    def clone(self) -> "SuffixIndex":
        """An independent copy: arrays and flat dicts of ints, copied whole."""
        twin = copy.copy(self)
        twin.tokens = array("q", self.tokens)
        twin.bounds = deque(self.bounds)
        twin.newest = {n: dict(newest) for n, newest in self.newest.items()}
        twin.previous = {n: array("q", chain) for n, chain in self.previous.items()}
        return twin

    # -- reading --------------------------------------------------------------
    @property
    def live_start(self) -> int:
        return self.bounds[0][0] if self.bounds else self.offset + len(self.tokens)

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
            size += sys.getsizeof(newest) + sys.getsizeof(self.previous[n])
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
        self._index = SuffixIndex(max_depth, recent)
        self._lock = threading.Lock()
        self.inserted = 0  # sequences ever added, evicted ones included

    @property
    def max_depth(self) -> int:
        return self._index.max_depth

    def add(self, tokens: list[int]) -> None:
        """Cache one output (the newest); a sequence over max_tokens keeps its tail."""
        tokens = [int(t) for t in tokens[-self.max_tokens:]]
        if not tokens:
            return
        with self._lock:
            index = self._index
            index.add(tokens)
            self.inserted += 1
            while len(index.bounds) > self.max_requests or index.count > self.max_tokens:
                index.evict_oldest()

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
