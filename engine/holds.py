"""Fixed starts: the timers of a fixed-start task, the holds that keep a slot free for it, and
the miss policy when its start passes without it.

Shortly before its start a task asks for a hold: a free slot of its pool is kept idle for it
(``Pool.held``), or it waits for one in the pool's hold queue. How early depends on the pool's
run times (``hold_lead``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .state import NOWHERE, T_HOLD, T_MISS, T_START, WAITING_HOLD, Pool, Task
from .timers import Timers
from .types import NS_PER_S, MissPolicy, TaskStatus

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .outcomes import Outcomes

_SCHEDULED: Final = TaskStatus.SCHEDULED
_RUNNING: Final = TaskStatus.RUNNING
_BLOCKED: Final = TaskStatus.BLOCKED
_MISSED: Final = TaskStatus.MISSED
_FAILED: Final = TaskStatus.FAILED


class Holds:
    def __init__(self, timers: Timers) -> None:
        self._timers = timers

    def bind(self, dispatcher: Dispatcher, outcomes: Outcomes) -> None:
        self._dispatcher = dispatcher
        self._outcomes = outcomes

    def arm(self, task: Task, now: int) -> None:
        """Timers of a fixed start: the miss deadline, the first hold check and the start."""
        fixed = task.fixed
        assert fixed is not None
        push = self._timers.push
        # A start at exactly start + tolerance is still on time: the miss is one tick later.
        push(fixed.start + fixed.tolerance + 1, T_MISS, task, 0)
        if fixed.start > now:
            push(max(now, fixed.start - task.pool.config.max_hold), T_HOLD, task, 0)
            push(fixed.start, T_START, task, 0)

    def check_soon(self, task: Task, now: int) -> None:
        """Look at once whether a task that waits for its start needs a hold."""
        self._timers.push(now, T_HOLD, task, 0)

    @staticmethod
    def hold_lead(pool: Pool, tolerance: int, now: int) -> int:
        """How long before its start a fixed-start task of ``pool`` asks for a hold."""
        totals = pool.window.totals(now, pool.busy, pool.capacity)
        regular = totals.run.copy()
        regular.subtract(totals.fixed_run)
        p90 = regular.quantile(0.9)
        return min(max(tolerance, p90), pool.config.max_hold)

    def on_hold_timer(self, task: Task, now: int) -> None:
        if task.status is not _SCHEDULED or task.fixed_done or task.holding:
            return
        fixed = task.fixed
        assert fixed is not None
        hold_at = fixed.start - self.hold_lead(task.pool, fixed.tolerance, now)
        if hold_at <= now:
            self._request(task)
        else:
            # Look again before then: the pool's run times (and so the lead) may grow.
            recheck = now + max((hold_at - now) // 2, NS_PER_S)
            self._timers.push(min(hold_at, recheck), T_HOLD, task, 0)

    def _request(self, task: Task) -> None:
        if task.holding or task.where == WAITING_HOLD:
            return
        pool = task.pool
        if pool.free > 0:
            pool.held += 1
            task.holding = True
            return
        fixed = task.fixed
        assert fixed is not None
        pool.hold_waiters.push(float(fixed.start), task.id, task)
        task.where = WAITING_HOLD

    def drop(self, task: Task) -> None:
        """The task no longer needs its hold (or its place in the hold queue)."""
        if task.holding:
            task.holding = False
            task.pool.held -= 1
            self._dispatcher.mark_dirty(task.pool)
        elif task.where == WAITING_HOLD:
            self._dispatcher.unqueue(task)

    @staticmethod
    def grant(pool: Pool) -> None:
        """Free slots go to the tasks waiting for a hold, earliest start first."""
        waiters = pool.hold_waiters
        while pool.free > 0:
            task = waiters.peek()
            if task is None:
                return
            waiters.pop()
            task.qgen += 1
            task.where = NOWHERE
            task.holding = True
            pool.held += 1

    def on_miss_timer(self, task: Task, now: int) -> None:
        """The start passed its tolerance: apply the task's miss policy unless it started."""
        if task.fixed_done or task.status is _RUNNING or task.started_at is not None:
            return
        fixed = task.fixed
        assert fixed is not None
        policy = fixed.on_miss
        task.pool.window.current(now).fixed_total += 1
        if policy is MissPolicy.RUN_LATE:
            task.fixed_done = True
            if task.status is _BLOCKED:
                self.drop(task)
            return
        late = f"missed its fixed start by more than {fixed.tolerance / NS_PER_S:g}s"
        self._outcomes.finish(task, _MISSED if policy is MissPolicy.SKIP else _FAILED, now, late)
