"""Ordered task ids per pool, so that a page of a listing costs O(page), not a sort of every id.

Task ids grow (the sequence grows within a leader term, the epoch across terms), so each pool's
ids are appended in order; an out-of-order id (none is expected) is inserted in place. Ids of
tasks that left the engine stay until ``compact`` drops them, once they are most of the list, so
removal is O(1) amortised.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Container, Iterable, Iterator

__all__ = ["IdIndex", "merged"]

_COMPACT_MIN = 64


class IdIndex:
    """The ids of one pool's tasks in ascending order (some possibly gone; see ``compact``)."""

    __slots__ = ("dead", "ids")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.dead = 0

    def add(self, task_id: int) -> None:
        ids = self.ids
        if not ids or task_id > ids[-1]:
            ids.append(task_id)
        else:
            bisect.insort(ids, task_id)

    def removed(self, alive: Container[int]) -> None:
        """One id of this index left the engine; drop the gone ones once they are most ids."""
        self.dead += 1
        if self.dead >= _COMPACT_MIN and self.dead * 2 > len(self.ids):
            self.ids = [task_id for task_id in self.ids if task_id in alive]
            self.dead = 0

    def walk(self, after: int, descending: bool) -> Iterator[int]:
        """Ids after ``after`` (exclusive) ascending, or, descending, ids below ``after`` (all
        of them when ``after`` is 0), newest first."""
        ids = self.ids
        if descending:
            end = bisect.bisect_left(ids, after) if after else len(ids)
            return _lazily(ids, range(end - 1, -1, -1))
        return _lazily(ids, range(bisect.bisect_right(ids, after), len(ids)))


def _lazily(ids: list[int], positions: range) -> Iterator[int]:
    """``ids`` at ``positions``, one at a time: a page reads only the ids it shows. (A generator
    function, not a generator expression: mypyc compiles the latter into a whole list.)"""
    for position in positions:
        yield ids[position]


def merged(indexes: Iterable[IdIndex], after: int, descending: bool) -> Iterator[int]:
    """The ids of several indexes in one order (see ``IdIndex.walk``)."""
    walks = [index.walk(after, descending) for index in indexes]
    if len(walks) == 1:
        return walks[0]
    return heapq.merge(*walks, reverse=descending)
