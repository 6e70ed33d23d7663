"""Capacity reservations of fixed-start tasks in one pool.

Each reservation is a half-open interval [start, end) in int ns, owned by a task id. The book
answers "how many reservations overlap at the busiest instant of [start, end)" by looking only at
reservations that can overlap the query: intervals are kept sorted by start, and the longest
interval in the book bounds how far back an overlapping one can begin.
"""

from __future__ import annotations

from bisect import bisect_left, insort

__all__ = ["ReservationBook"]


def _normalize(start: int, end: int) -> int:
    """End of an interval, widened to at least one nanosecond: a zero-length reservation still
    needs a slot at its instant."""
    return end if end > start else start + 1


class ReservationBook:
    """Reservations of one pool, at most ``limit`` overlapping at any instant (checked by the
    caller through ``fits`` before ``add``)."""

    __slots__ = ("_by_owner", "_intervals", "_lengths", "_max_length", "limit")

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("limit must not be negative")
        self.limit = limit
        # (start, end, owner), sorted.
        self._intervals: list[tuple[int, int, int]] = []
        self._by_owner: dict[int, tuple[int, int]] = {}
        # Multiset of interval lengths, to know the longest one.
        self._lengths: dict[int, int] = {}
        self._max_length = 0

    def __len__(self) -> int:
        return len(self._by_owner)

    def __contains__(self, owner: object) -> bool:
        return owner in self._by_owner

    def get(self, owner: int) -> tuple[int, int] | None:
        """The [start, end) interval of ``owner``'s reservation, if it has one."""
        return self._by_owner.get(owner)

    def fits(self, start: int, end: int) -> bool:
        """Whether one more reservation over [start, end) keeps every instant within the limit."""
        return self.peak(start, end) < self.limit

    def add(self, owner: int, start: int, end: int) -> None:
        """Book [start, end) for ``owner``. Does not check the limit; call ``fits`` first."""
        if owner in self._by_owner:
            raise ValueError(f"task {owner} already holds a reservation")
        end = _normalize(start, end)
        insort(self._intervals, (start, end, owner))
        self._by_owner[owner] = (start, end)
        length = end - start
        self._lengths[length] = self._lengths.get(length, 0) + 1
        if length > self._max_length:
            self._max_length = length

    def remove(self, owner: int) -> bool:
        """Release ``owner``'s reservation; False when it had none."""
        interval = self._by_owner.pop(owner, None)
        if interval is None:
            return False
        start, end = interval
        item = (start, end, owner)
        intervals = self._intervals
        index = bisect_left(intervals, item)
        del intervals[index]
        length = end - start
        lengths = self._lengths
        left = lengths[length] - 1
        if left:
            lengths[length] = left
        else:
            del lengths[length]
            if length == self._max_length:
                self._max_length = max(lengths) if lengths else 0
        return True

    def peak(self, start: int, end: int) -> int:
        """Largest number of reservations overlapping one instant of [start, end)."""
        end = _normalize(start, end)
        intervals = self._intervals
        if not intervals:
            return 0
        # An overlapping interval starts before ``end`` and, being at most _max_length long,
        # after ``start - _max_length``.
        lo = bisect_left(intervals, (start - self._max_length + 1,))
        hi = bisect_left(intervals, (end,))
        if lo >= hi:
            return 0
        # Sweep over the overlaps clipped to the query: -1 sorts before +1 at equal times, so
        # touching half-open intervals do not count as overlapping.
        events: list[tuple[int, int]] = []
        for s, e, _ in intervals[lo:hi]:
            if e > start:
                events.append((s if s > start else start, 1))
                events.append((e if e < end else end, -1))
        if len(events) <= 2:
            return len(events) >> 1
        events.sort()
        level = 0
        best = 0
        for _, delta in events:
            level += delta
            if level > best:
                best = level
        return best

    def owners(self) -> list[int]:
        """Owners in order of reservation start."""
        return [owner for _, _, owner in self._intervals]
