"""Fixed-size int64 buffers for the global suffix store's index: an anchor table, and the
byte-level fills and moves that keep a buffer where it was allocated.

A server's store fills over tens of minutes. Held in growing containers (arrays that
extend, dicts that double), it would reallocate its blocks the whole time, and each
long-lived block that moves up a heap pins the heap's top above the holes it left
(docs/notebook/soak_rss.md, round 2). Allocated once at its bound and written in place,
the store's memory is resident from its first output and never moves.
"""
from __future__ import annotations

import ctypes
from array import array

EMPTY = -1  # a free slot's key: anchor keys are >= 0
_GOLDEN = 0x9E3779B97F4A7C15  # Fibonacci hashing: the high bits of key * 2**64 / phi
_MASK64 = (1 << 64) - 1
FILL_BYTE = 0xFF  # every byte of an int64 -1: EMPTY, and the index's SENTINEL and NONE


def filled(slots: int) -> array:
    """An int64 buffer of `slots` -1s, every page written (resident now, not at first use)."""
    return array("q", [-1]) * slots


def fill(buffer: array, begin: int, end: int) -> None:
    """Set buffer[begin:end] to -1 in place."""
    if end > begin:
        address, _ = buffer.buffer_info()
        ctypes.memset(address + 8 * begin, FILL_BYTE, 8 * (end - begin))


def move_down(buffer: array, begin: int, end: int) -> None:
    """Move buffer[begin:end] to the buffer's start in place (the ranges may overlap)."""
    if end > begin > 0:
        address, _ = buffer.buffer_info()
        ctypes.memmove(address, address + 8 * begin, 8 * (end - begin))


class AnchorTable:
    """Anchor key -> newest end position over two preallocated int64 arrays (open
    addressing, linear probing): `get`, `exchange`, `items`, `len`, `clear` and `copy`.

    Nothing is ever deleted: a dead anchor keeps its slot until `clear`, and the owner
    clears and re-indexes before `full(n)` (n more keys could take over 3/4 of the
    slots), which keeps probe runs short and a free slot always there.
    """

    def __init__(self, slots: int) -> None:
        if slots < 4 or slots & (slots - 1):
            raise ValueError(f"an anchor table needs a power of two >= 4 slots, got {slots}")
        self.keys, self.positions = filled(slots), filled(slots)
        self._shift = 64 - (slots.bit_length() - 1)
        self._mask = slots - 1
        self.used = 0

    def _slot(self, key: int) -> int:
        """The slot holding `key`, or the free slot where it would go."""
        keys, mask = self.keys, self._mask
        i = ((key * _GOLDEN) & _MASK64) >> self._shift
        while keys[i] != key and keys[i] != EMPTY:
            i = (i + 1) & mask
        return i

    def get(self, key: int, default: int) -> int:
        i = self._slot(key)
        return self.positions[i] if self.keys[i] == key else default

    def exchange(self, key: int, position: int, default: int) -> int:
        """Set key's newest position; returns the one it replaces (`default`: none)."""
        i = self._slot(key)
        if self.keys[i] == EMPTY:
            self.keys[i] = key
            self.used += 1
            before = default
        else:
            before = self.positions[i]
        self.positions[i] = position
        return before

    def __len__(self) -> int:
        return self.used

    def items(self):
        return ((key, position) for key, position in zip(self.keys, self.positions)
                if key != EMPTY)

    def full(self, more: int) -> bool:
        return 4 * (self.used + more) > 3 * len(self.keys)

    def clear(self) -> None:
        fill(self.keys, 0, len(self.keys))
        fill(self.positions, 0, len(self.positions))
        self.used = 0

    def copy(self) -> "AnchorTable":
        twin = AnchorTable.__new__(AnchorTable)
        twin.keys, twin.positions = array("q", self.keys), array("q", self.positions)
        twin._shift, twin._mask, twin.used = self._shift, self._mask, self.used
        return twin

    def memory_bytes(self) -> int:
        return self.keys.buffer_info()[1] * 16
