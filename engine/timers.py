"""The engine's one timer heap.

A timer is ``(when, kind, subject, generation)``; firing one that no longer applies (its task
ended, its lease was released, its schedule was replaced) does nothing, and ``next_wakeup``
drops such timers from the top so the driver is not woken for them.
"""

from __future__ import annotations

import heapq
from typing import Final

from .state import T_AWAIT, T_HOLD, T_LEASE, T_MISS, T_RECUR, T_RETRY, T_START, T_TIMEOUT, LeaseState, Schedule, Task
from .types import TaskStatus

_RETRYING: Final = TaskStatus.RETRYING

Timer = tuple[int, int, int, object, int]
"""(when, sequence, kind, subject, generation); the sequence keeps equal times in arming order."""


class Timers:
    def __init__(self) -> None:
        self._heap: list[Timer] = []
        self._seq = 0

    def push(self, when: int, kind: int, subject: object, generation: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, kind, subject, generation))

    def pop_due(self, now: int) -> Timer | None:
        """The next timer due at ``now`` that still applies, removed from the heap (or None)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            timer = heapq.heappop(heap)
            if live(timer[2], timer[3], timer[4]):
                return timer
        return None

    def next_wakeup(self) -> int | None:
        """When the earliest timer that still applies is due (None: no timer)."""
        heap = self._heap
        while heap:
            when, _, kind, subject, generation = heap[0]
            if live(kind, subject, generation):
                return when
            heapq.heappop(heap)
        return None


def live(kind: int, subject: object, generation: int) -> bool:
    """Whether a timer still applies to its subject."""
    if kind == T_RETRY:
        assert isinstance(subject, Task)
        return subject.status is _RETRYING and subject.retry_at == generation
    if kind in (T_TIMEOUT, T_LEASE):
        assert isinstance(subject, LeaseState)
        return subject.active
    if kind in (T_START, T_HOLD, T_MISS, T_AWAIT):
        assert isinstance(subject, Task)
        return not subject.status.terminal
    if kind == T_RECUR:
        assert isinstance(subject, Schedule)
        return subject.timer_gen == generation and not subject.retired
    return True
