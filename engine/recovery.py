"""Re-creating an engine's state from what a durable store recovered.

The rules of the durability chapter: tasks keep their ids, submission order and attempt counts;
an attempt that was running when the previous leader died counts as used; fixed starts that
passed apply their miss policy; dependencies on parents no longer known count as satisfied;
schedules keep their overlap guard and run at most one missed occurrence late.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import admission, limits, recurring
from .actions import Recovered, RecoveredTask, Resolve, SetStatus
from .config import UnknownDependencyPolicy
from .cron import CronSchedule
from .state import T_AWAIT, T_RETRY, Schedule, Task, edge_satisfied
from .types import AdmissionError, ConfigError, EngineFault, MissPolicy, RecurringSpec, TaskStatus

if TYPE_CHECKING:
    from .core import Core

_FAILED = TaskStatus.FAILED
_RUNNING = TaskStatus.RUNNING
_RETRYING = TaskStatus.RETRYING
_BLOCKED = TaskStatus.BLOCKED
_DEAD = TaskStatus.DEAD_LETTERED
_SKIPPED = TaskStatus.SKIPPED


def restore(core: Core, now: int, recovered: Recovered, dead: Mapping[int, str] | None = None,
            suspended: frozenset[str] = frozenset()) -> list[tuple[int, str]]:  # fmt: skip
    """Re-create the state a durable store recovered, applying the recovery rules.

    Tasks keep their ids, submission order and attempt counts; an attempt that was running
    counts as used; fixed starts that passed apply their miss policy; schedules keep their
    overlap guard. Must be called on a fresh engine, before any submission.

    A live task that cannot be restored (a value out of range, or listed in ``dead``) comes back
    dead-lettered with a message, and that status is persisted. An exception while a task or
    schedule is being restored is raised as ``EngineFault`` naming it: the caller restores again
    on a fresh engine with that task in ``dead`` (or that schedule in ``suspended``). Returns the
    tasks it dead-lettered because of their values: ``(id, message)``.
    """
    if core._tasks or core._schedules:
        raise ConfigError("restore needs a fresh engine")
    dead = dead or {}
    rejected: list[tuple[int, str]] = []
    high = recovered.id_high_water
    live: list[tuple[Task, TaskStatus]] = []
    terminal: list[Task] = []
    for item in sorted(recovered.tasks, key=lambda rt: rt.record.id):
        record = item.record
        high = max(high, record.id)
        try:
            task = _load(core, now, item, dead.get(record.id), rejected)
        except Exception as error:
            raise EngineFault.wrap(error, task_id=record.id) from error
        if task.status.terminal:
            terminal.append(task)
        else:
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
        try:
            _link(core, task, doomed)
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
    for task, status in live:
        if task.status.terminal:
            continue
        try:
            _resume(core, now, task, status)
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
    for task, parent in doomed:
        try:
            core._finish(task, _SKIPPED, now, f"dependency {parent.id} ended as {parent.status.value}")
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
    for schedule in recovered.recurring:
        name = schedule.spec.name
        try:
            restore_schedule(core, schedule.spec, schedule.next_at, schedule.last_task_id, now,
                             suspended=name in suspended, paused=schedule.paused)
        except Exception as error:
            raise EngineFault.wrap(error, schedule=name) from error
    return rejected


def _load(core: Core, now: int, item: RecoveredTask, dead_message: str | None,
          rejected: list[tuple[int, str]]) -> Task:  # fmt: skip
    """The task of one recovered row, registered by id and key; a live one that must not run again
    (its pool is gone, a value is out of range, or the caller listed it) is made terminal here."""
    record = item.record
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
        return task
    status: TaskStatus | None = None
    if pool is None:
        status, message = _FAILED, f"pool {record.pool!r} is no longer configured"
    elif dead_message is not None:
        status, message = _DEAD, dead_message
    else:
        problem = _unrunnable(item)
        if problem is not None:
            status, message = _DEAD, f"cannot be restored: {problem}"
            core.totals["engine_errors"] += 1
            rejected.append((task.id, message))
    if status is None:
        return task
    task.status = status
    task.finished_at = now
    task.message = message
    task.spec = None
    if status is _DEAD:
        core.totals[status.value] += 1
        task.pool.totals[status.value] += 1
    if core._persist:
        core._out.mutations.append(SetStatus(task.id, status, task.attempt, now, message))
    # Whoever waits for the task (a driver rebuilding its engine keeps its waiters) learns the end.
    core._out.resolves.append(Resolve(task.id, task.pool.name, task.key, status, task.attempt, now, message))
    return task


def _unrunnable(item: RecoveredTask) -> str | None:
    """Why a recovered live task cannot safely run again (values out of range), or None."""
    try:
        admission.check_values(item.record.spec)
    except AdmissionError as error:
        return error.message
    record = item.record
    problem = limits.count_problem(record.max_attempts, "max_attempts", low=1)
    if problem is None and not (limits.is_int(item.attempt) and 0 <= item.attempt <= record.max_attempts):
        problem = f"attempt {item.attempt!r} is not between 0 and max_attempts"
    if problem is None and item.retry_at is not None:
        problem = limits.instant_problem(item.retry_at, "retry_at")
    if problem is None and item.started_at is not None:
        problem = limits.instant_problem(item.started_at, "started_at")
    return problem


def _link(core: Core, task: Task, doomed: list[tuple[Task, Task]]) -> None:
    """Connect a live task to its parents (or to the keys it awaits)."""
    assert task.spec is not None
    for dep in task.spec.deps:
        parent = core._lookup(dep.target)
        if parent is None:
            # Finished before the retention window (it was accepted), or an awaited key.
            if isinstance(dep.target, str) and task.pool.config.unknown_dependency is UnknownDependencyPolicy.AWAIT:
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


def _resume(core: Core, now: int, task: Task, status: TaskStatus) -> None:
    """Arm a linked live task's timers and put it where its recovered status says."""
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
        return
    if status is _RETRYING:
        retry_at = task.retry_at if task.retry_at is not None else now
        task.retry_at = retry_at
        core._move(task, _RETRYING)
        core._push_timer(retry_at, T_RETRY, task, retry_at)
        return
    if task.unmet == 0 and task.awaiting is None:
        core._release(task, now, fresh=True)


def restore_schedule(core: Core, spec: RecurringSpec, next_at: int | None, last_task_id: int | None,
                     now: int, *, suspended: bool = False, paused: bool = False) -> None:  # fmt: skip
    """Re-create one schedule; it comes back invalid (listed, never fired) when its cron, time
    zone or template no longer passes, its values are out of range, or it is ``suspended``; a
    ``paused`` one is restored with nothing armed until it is resumed."""
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
        if suspended:
            raise ConfigError("suspended after an internal error")
        recurring.check_values(spec)
        if next_at is not None and limits.instant_problem(next_at, "next_at") is not None:
            raise ConfigError("next occurrence out of range")
        pool = recurring.check_template(core, spec.template)
    except ConfigError:
        schedule.invalid = True
        recurring.count_invalid(core, spec.template)
        return
    if paused:
        return  # nothing to arm until it is resumed
    if next_at is None:
        schedule.next_at = _next_or_none(core, schedule, cron, now)
    elif next_at + spec.tolerance < now:
        # Missed during downtime: at most one late run, then resume from the present.
        if spec.on_miss is not MissPolicy.RUN_LATE:
            core.totals["missed"] += 1
            pool.totals["missed"] += 1
            schedule.next_at = _next_or_none(core, schedule, cron, now)
        else:
            recurring.create_occurrence(core, schedule, now)
            return
    recurring.arm(core, schedule, pool, now)


def _next_or_none(core: Core, schedule: Schedule, cron: CronSchedule, now: int) -> int | None:
    """The schedule's next occurrence after ``now``; None (and the schedule invalid) if none is left."""
    try:
        return cron.next_after(now - 1)
    except ConfigError:
        schedule.invalid = True
        recurring.count_invalid(core, schedule.spec.template)
        return None
