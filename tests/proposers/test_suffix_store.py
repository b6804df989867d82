"""Suffix decoding's store: it finds what a full scan finds, reads the newest live
occurrences past evictions, stays within its bounds and out of the garbage
collector's way, and survives a corrupt cache file."""
from __future__ import annotations

import gc
import random
import tracemalloc

import numpy as np
import pytest

from verispec.proposers.suffix_store import ANCHORS, SuffixCacheError, SuffixIndex, SuffixStore

# -- the store -------------------------------------------------------------------

def _scan(sequences: list[list[int]], context: list[int], depth: int) -> dict[tuple[int, int], int]:
    """(sequence, index of the matched suffix's last token) -> match length, for every
    occurrence of the context's longest anchor that has a continuation: a full scan."""
    for n in ANCHORS:
        found = {}
        for s, seq in enumerate(sequences):
            for i in range(n - 1, len(seq) - 1):
                m = 0
                while m < min(depth, len(context)) and m <= i and seq[i - m] == context[-1 - m]:
                    m += 1
                if m >= n:
                    found[(s, i)] = m
        if found:
            return found
    return {}


def test_store_matches_equal_a_full_scan():
    rng = random.Random(1)
    for trial in range(40):
        sequences = [[rng.randrange(5) for _ in range(rng.randrange(1, 30))] for _ in range(6)]
        store = SuffixStore(max_depth=8, recent=10_000)
        for seq in sequences:
            store.add(seq)
        context = [rng.randrange(5) for _ in range(rng.randrange(1, 12))]
        starts = np.cumsum([1] + [len(s) + 1 for s in sequences])  # stream position of each
        want = _scan(sequences, context, 8)
        got = {}
        for match in store.matches(context):
            s = int(np.searchsorted(starts, match.position, side="right")) - 1
            got[(s, match.position - int(starts[s]))] = match.length
        assert got == want, (sequences, context)
        for (s, i), m in want.items():
            position = int(starts[s]) + i
            assert store._index.continuation(position, 3) == sequences[s][i + 1:i + 4]


@pytest.mark.parametrize("vocab", [4, 60])
def test_store_reads_the_newest_live_occurrences_past_evictions(vocab):
    """With eviction and a small `recent`, a lookup finds exactly the newest `recent`
    occurrences of the longest anchor among the outputs still cached (a full scan of
    the live outputs), however many outputs came and went; with 60 token ids the dead
    anchors fill the store's anchor tables, which are cleared and filled again."""
    rng = random.Random(2)
    store = SuffixStore(max_requests=12, max_tokens=150, max_depth=8, recent=5)
    for step in range(2000):
        store.add([rng.randrange(vocab) for _ in range(rng.randrange(1, 25))])
        if step % 25:
            continue
        context = [rng.randrange(vocab) for _ in range(rng.randrange(1, 12))]
        live = store.sequences()
        starts = [start for start, _ in store._index.bounds]
        newest = sorted(_scan(live, context, 8).items(), reverse=True)[:5]
        got = {(starts.index(max(b for b in starts if b <= m.position)),
                m.position - max(b for b in starts if b <= m.position)): m.length
               for m in store.matches(context)}
        assert got == dict(newest), (live, context)


def test_a_large_store_adds_nothing_for_the_garbage_collector_to_walk():
    """The index holds arrays and flat dicts of ints: a store of 10^5 tokens tracks a
    handful of objects, not one per anchor (each full collection would walk them all,
    and its pause lands inside some request's step)."""
    rng = random.Random(3)
    gc.collect()
    before = len(gc.get_objects())
    store = SuffixStore(max_requests=10_000, max_tokens=200_000)
    for _ in range(1000):
        store.add([rng.randrange(2000) for _ in range(100)])
    gc.collect()
    assert store.stats().tokens == 100_000
    assert len(gc.get_objects()) - before < 100
    twin = store.copy()
    assert twin.sequences() == store.sequences()
    twin.add([1, 2, 3])
    assert len(twin.sequences()) == len(store.sequences()) + 1


def test_store_takes_its_memory_with_the_first_output_and_never_moves_it():
    """A long-running server's store fills for tens of minutes; growing containers would
    move their blocks up the heaps all that time (docs/notebook/soak_rss.md, round 2).
    The store allocates its bounds with its first output and writes in place from then
    on: through filling, evictions, moves of the live part over evicted outputs and sweeps
    of the anchor tables, no buffer is reallocated and the memory stays as it was."""
    rng = random.Random(4)
    store = SuffixStore(max_requests=100, max_tokens=2000)
    empty = store.stats().memory_bytes
    store.add([1, 2, 3])
    index = store._index
    buffers = [index.tokens, *index.previous.values()]
    buffers += [b for table in index.newest.values() for b in (table.keys, table.positions)]
    addresses = [b.buffer_info() for b in buffers]
    first = store.stats().memory_bytes
    for _ in range(3000):
        store.add([rng.randrange(500) for _ in range(rng.randrange(1, 80))])
    assert store._index is index and index.offset > 0  # the live part moved down
    assert store.inserted - store.stats().requests > 2900  # outputs evicted
    assert [b.buffer_info() for b in buffers] == addresses
    # Only the deque of the outputs' bounds grows, with the outputs kept (one tuple each).
    assert first < store.stats().memory_bytes < first + 8 * 1024 and first > 10 * empty


def test_open_sequence_indexes_as_it_grows():
    """The per-request index, fed step by step, matches the same index built at once."""
    rng = random.Random(2)
    tokens = [rng.randrange(4) for _ in range(60)]
    grown = SuffixIndex(max_depth=16)
    grown.add(tokens[:5], keep_open=True)
    for i in range(5, 60, 3):
        grown.extend(tokens[i:i + 3])
    whole = SuffixIndex(max_depth=16)
    whole.add(tokens)
    assert grown.matches(tokens) == whole.matches(tokens) != []


def test_store_memory_stays_bounded_over_1e5_requests():
    """10^5 inserted outputs into a store bounded at 1000 outputs and 5000 tokens:
    the bounds hold throughout, the index is swept so memory plateaus, the
    reported memory is what the store really allocates, and old outputs are gone."""
    rng = random.Random(0)
    store = SuffixStore(max_requests=1000, max_tokens=5000)
    first_full = None
    for i in range(100_000):
        store.add([rng.randrange(300) for _ in range(rng.randrange(1, 10))])
        if i % 10_000 == 9_999:
            stats = store.stats()
            assert stats.requests <= 1000 and stats.tokens <= 5000
            assert stats.index_entries <= 2 * len(ANCHORS) * 5000 + 1024
            first_full = first_full or stats.memory_bytes
            assert stats.memory_bytes < 1.5 * first_full
    assert store.inserted == 100_000
    assert store.stats().requests == len(store.sequences())
    store.add([301, 302, 303, 304])
    assert store.matches([301, 302, 303])
    # The report against the allocator: copy the live outputs into a fresh store under
    # tracemalloc (a fresh store has no dead entries, so it reports its live size).
    kept = store.sequences()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    copy = SuffixStore(max_requests=1000, max_tokens=5000)
    for seq in kept:
        copy.add(seq)
    allocated = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert 0.5 < copy.stats().memory_bytes / allocated < 1.5


def test_cache_file_round_trip_and_corruption(tmp_path):
    store = SuffixStore()
    for seq in ([1, 2, 3], [4, 5], [6]):
        store.add(seq)
    path = str(tmp_path / "suffix.npz")
    store.save(path)
    loaded = SuffixStore()
    assert loaded.load(path, vocab_size=10) == 3
    assert loaded.sequences() == [[1, 2, 3], [4, 5], [6]]
    with pytest.raises(SuffixCacheError, match="another model's vocabulary"):
        SuffixStore().load(path, vocab_size=5)
    bad = tmp_path / "bad.npz"
    for payload in (b"not a cache at all", open(path, "rb").read()[:100]):
        bad.write_bytes(payload)
        fresh = SuffixStore()
        with pytest.raises(SuffixCacheError) as caught:
            fresh.load(str(bad))
        assert "\n" not in str(caught.value) and "not a readable suffix cache" in str(caught.value)
        assert fresh.sequences() == []
