"""The 64-bit id layout shared by task ids and lease ids.

Unsharded: ``epoch << 48 | sequence``. Sharded: ``shard << 56 | epoch << 40 | sequence``. A new
leader runs with a higher epoch, so its ids are larger than every id its predecessors issued.
"""

from __future__ import annotations

from typing import Final

EPOCH_BITS: Final = 16
MAX_EPOCH: Final = (1 << EPOCH_BITS) - 1


def id_base(epoch: int, shard: int | None) -> int:
    if not 0 <= epoch <= MAX_EPOCH:
        raise ValueError(f"epoch {epoch} does not fit in {EPOCH_BITS} bits")
    if shard is None:
        return epoch << 48
    if not 0 <= shard <= 255:
        raise ValueError(f"shard number {shard} does not fit in 8 bits")
    return (shard << 56) | (epoch << 40)


def shard_of(task_id: int) -> int:
    """The shard number carried in the top 8 bits of a sharded id."""
    return (task_id >> 56) & 0xFF


def sequence_limit(shard: int | None) -> int:
    return 1 << (48 if shard is None else 40)


class IdAllocator:
    """Hands out increasing ids of one epoch, never at or below a recovered high-water mark."""

    __slots__ = ("_limit", "_next")

    def __init__(self, epoch: int, shard: int | None, high_water: int = 0) -> None:
        base = id_base(epoch, shard)
        self._next = max(base, high_water) + 1
        self._limit = base + sequence_limit(shard)

    def allocate(self) -> int:
        value = self._next
        if value >= self._limit:
            raise OverflowError("id sequence of this epoch is exhausted")
        self._next = value + 1
        return value

    def raise_floor(self, high_water: int) -> None:
        if high_water >= self._limit:
            # An id above this epoch's range can only be another shard's: tasks of a pool moved
            # here keep the ids their first shard gave them (docs/pool-moves.md).
            return
        if high_water >= self._next:
            self._next = high_water + 1

    @property
    def high_water(self) -> int:
        return self._next - 1
