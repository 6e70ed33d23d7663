"""Dispatch queues. Each holds ``(key..., seq, gen, task)`` entries with lazy deletion: an entry is
live only while its ``gen`` equals the task's current queue generation, so removing a task from a
queue is O(1) (bump the generation) and stale entries are dropped when they reach the head.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Generic, Protocol, TypeVar


class Queued(Protocol):
    qgen: int


T = TypeVar("T", bound=Queued)


class FifoLane(Generic[T]):
    """Tasks in submission order. Fresh tasks append to a deque in O(1); a task returning to an
    earlier place (retried, woken, unblocked) goes into a heap merged at the head."""

    __slots__ = ("_back", "_tail")

    def __init__(self) -> None:
        self._tail: deque[tuple[int, int, T]] = deque()
        self._back: list[tuple[int, int, T]] = []

    def push(self, seq: int, task: T) -> None:
        entry = (seq, task.qgen, task)
        tail = self._tail
        if not tail or seq > tail[-1][0]:
            tail.append(entry)
        else:
            heapq.heappush(self._back, entry)

    def peek(self) -> T | None:
        tail = self._tail
        while tail and tail[0][1] != tail[0][2].qgen:
            tail.popleft()
        back = self._back
        while back and back[0][1] != back[0][2].qgen:
            heapq.heappop(back)
        if tail:
            if back and back[0][0] < tail[0][0]:
                return back[0][2]
            return tail[0][2]
        if back:
            return back[0][2]
        return None

    def pop(self) -> None:
        """Remove the head returned by the last ``peek``."""
        tail = self._tail
        back = self._back
        if tail and (not back or tail[0][0] < back[0][0]):
            tail.popleft()
        else:
            heapq.heappop(back)

    def __len__(self) -> int:
        """Entries, including stale ones (an upper bound on live tasks)."""
        return len(self._tail) + len(self._back)


class KeyedLane(Generic[T]):
    """Tasks ordered by a key (latest start time, fair-share start tag, start time), then seq."""

    __slots__ = ("heap",)

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, int, T]] = []  # non-empty: maybe live entries

    def push(self, key: float, seq: int, task: T) -> None:
        heapq.heappush(self.heap, (key, seq, task.qgen, task))

    def peek(self) -> T | None:
        heap = self.heap
        while heap and heap[0][2] != heap[0][3].qgen:
            heapq.heappop(heap)
        return heap[0][3] if heap else None

    def live(self) -> list[T]:
        return [entry[3] for entry in self.heap if entry[2] == entry[3].qgen]

    def peek_key(self) -> float:
        return self.heap[0][0]

    def pop(self) -> None:
        heapq.heappop(self.heap)

    def __len__(self) -> int:
        return len(self.heap)
