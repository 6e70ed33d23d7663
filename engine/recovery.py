"""Re-creating an engine's state from what a durable store recovered.

The rules of the durability chapter: tasks keep their ids, submission order and attempt counts;
an attempt that was running when the previous leader died counts as used; fixed starts that
passed apply their miss policy; dependencies on parents no longer known count as satisfied;
schedules keep their overlap guard and run at most one missed occurrence late.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import recurring
from .actions import Recovered, SetStatus
from .config import UnknownDependencyPolicy
from .cron import CronSchedule
from .state import T_AWAIT, T_RETRY, Schedule, Task, edge_satisfied
from .types import ConfigError, MissPolicy, RecurringSpec, TaskStatus

if TYPE_CHECKING:
    from .core import Core

_FAILED = TaskStatus.FAILED
_RUNNING = TaskStatus.RUNNING
_RETRYING = TaskStatus.RETRYING
_BLOCKED = TaskStatus.BLOCKED
_DEAD = TaskStatus.DEAD_LETTERED
_SKIPPED = TaskStatus.SKIPPED


def restore(core: Core, now: int, recovered: Recovered) -> None:
    """Re-create the state a durable store recovered, applying the recovery rules.

    Tasks keep their ids, submission order and attempt counts; an attempt that was running
    counts as used; fixed starts that passed apply their miss policy; schedules keep their
    overlap guard. Must be called on a fresh engine, before any submission.
    """
    if core._tasks or core._schedules:
        raise ConfigError("restore needs a fresh engine")
    high = recovered.id_high_water
    live: list[tuple[Task, TaskStatus]] = []
    terminal: list[Task] = []
    for item in sorted(recovered.tasks, key=lambda rt: rt.record.id):
        record = item.record
        high = max(high, record.id)
        pool = core._pools.get(record.pool)
        spec = record.spec
        retry = spec.retry if spec.retry is not None else (pool or core._default_pool).config.retry
        task = Task(record.id, pool or core._default_pool, spec, record.submitted_at, retry)
        task.max_attempts = record.max_attempts
        task.attempt = item.attempt
        task.message = item.message
        task.started_at = item.started_at
        task.retry_at = item.retry_at
        if task.fixed is not None and (item.attempt > 0 or item.started_at is not None):
            task.fixed_done = True
        core._tasks[task.id] = task
        core._index(task)
        if task.key is not None:
            core._keys[task.key] = task.id
        if item.status.terminal:
            task.status = item.status
            task.finished_at = item.finished_at if item.finished_at is not None else now
            task.has_output = item.has_output
            task.spec = None
            terminal.append(task)
            continue
        if pool is None:
            terminal.append(task)
            task.status = _FAILED
            task.finished_at = now
            task.message = f"pool {record.pool!r} is no longer configured"
            task.spec = None
            if core._persist:
                core._mutations.append(SetStatus(task.id, _FAILED, task.attempt, now, task.message))
            continue
        live.append((task, item.status))
    core._ids.raise_floor(high)
    core._lease_ids.raise_floor(recovered.lease_high_water)
    terminal.sort(key=lambda t: t.finished_at or 0)
    core._retained.extend(terminal)
    # Register live tasks as pending, then link their dependencies.
    doomed: list[tuple[Task, Task]] = []
    for task, _ in live:
        pool = task.pool
        cls = task.cls
        task.status = _BLOCKED
        pool.counts[0][cls] += 1
        pool.pending += 1
        pool.pending_by_class[cls] += 1
        core._pending += 1
        shed = core._shed_index.get(pool)
        if shed is not None and task.fixed is None:
            shed[cls][task.id] = task
        if task.spec is not None and task.spec.deadline is not None:
            core._set_estimate(task, task.spec)
    for task, _ in live:
        assert task.spec is not None
        for dep in task.spec.deps:
            parent = core._lookup(dep.target)
            if parent is None:
                # Finished before the retention window (it was accepted), or an awaited key.
                if isinstance(dep.target, str) and \
                        task.pool.config.unknown_dependency is UnknownDependencyPolicy.AWAIT:
                    if task.awaiting is None:
                        task.awaiting = set()
                    task.awaiting.add(dep.target)
                    core._awaiting.setdefault(dep.target, []).append((task, dep.cond))
                continue
            if parent.status.terminal:
                if not edge_satisfied(dep.cond, parent.status):
                    doomed.append((task, parent))
                continue
            if parent.children is None:
                parent.children = []
            parent.children.append((task, dep.cond))
            task.unmet += 1
    for task, status in live:
        if task.status.terminal:
            continue
        pool = task.pool
        fixed = task.fixed
        if fixed is not None and not task.fixed_done:
            assert task.spec is not None
            pool.reservations.add(task.id, *core._reservation_interval(pool, task.spec, fixed))
            core._arm_fixed(task, now)
        if task.awaiting is not None and pool.config.await_timeout is not None:
            core._push_timer(now + pool.config.await_timeout, T_AWAIT, task, 0)
        if status is _RUNNING:
            # The attempt that was running when the previous leader died counts as used.
            message = "attempt interrupted by a leader change"
            if task.attempt < task.max_attempts:
                task.started_at = task.started_at or now
                core._fail_attempt(task, now, message, None)
            else:
                core._finish(task, _DEAD, now, message)
            continue
        if status is _RETRYING:
            retry_at = task.retry_at if task.retry_at is not None else now
            task.retry_at = retry_at
            core._move(task, _RETRYING)
            core._push_timer(retry_at, T_RETRY, task, retry_at)
            continue
        if task.unmet == 0 and task.awaiting is None:
            core._release(task, now, fresh=True)
    for task, parent in doomed:
        core._finish(task, _SKIPPED, now, f"dependency {parent.id} ended as {parent.status.value}")
    for schedule in recovered.recurring:
        restore_schedule(core, schedule.spec, schedule.next_at, schedule.last_task_id, now, schedule.paused)


def restore_schedule(core: Core, spec: RecurringSpec, next_at: int | None, last_task_id: int | None,
                     now: int, paused: bool = False) -> None:  # fmt: skip
    try:
        cron = CronSchedule.parse(spec.cron, spec.tz)
    except ConfigError:
        cron = None
    schedule = Schedule(spec, cron)  # type: ignore[arg-type]
    schedule.last_task_id = last_task_id
    schedule.next_at = None if paused else next_at
    schedule.paused = paused
    last = core._tasks.get(last_task_id) if last_task_id is not None else None
    if last is not None and last.fixed is not None:
        schedule.last_start = last.fixed.start
    core._schedules[spec.name] = schedule
    try:
        if cron is None:
            raise ConfigError("invalid cron expression")
        pool = recurring.check_template(core, spec.template)
    except ConfigError:
        schedule.invalid = True
        recurring.count_invalid(core, spec.template)
        return
    if paused:
        return  # nothing to arm until it is resumed
    if next_at is None:
        schedule.next_at = cron.next_after(now - 1)
    elif next_at + spec.tolerance < now:
        # Missed during downtime: at most one late run, then resume from the present.
        if spec.on_miss is not MissPolicy.RUN_LATE:
            core.totals["missed"] += 1
            pool.totals["missed"] += 1
            schedule.next_at = cron.next_after(now - 1)
        else:
            recurring.create_occurrence(core, schedule, now)
            return
    recurring.arm(core, schedule, pool, now)
