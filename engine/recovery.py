"""Re-creating an engine's state from what a durable store recovered.

The rules of the durability chapter: tasks keep their ids, submission order and attempt counts;
an attempt that was running when the previous leader died counts as used; fixed starts that
passed apply their miss policy; dependencies on parents no longer known count as satisfied;
schedules keep their overlap guard and run at most one missed occurrence late.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import TYPE_CHECKING

from . import admission, limits
from .actions import Recovered, RecoveredTask, Resolve, SetStatus
from .state import T_AWAIT, Task
from .types import TERMINAL_VALUES, AdmissionError, ConfigError, EngineFault, TaskStatus

if TYPE_CHECKING:
    from .parts import Parts

_FAILED = TaskStatus.FAILED
_RUNNING = TaskStatus.RUNNING
_RETRYING = TaskStatus.RETRYING
_BLOCKED = TaskStatus.BLOCKED
_DEAD = TaskStatus.DEAD_LETTERED
_SKIPPED = TaskStatus.SKIPPED
_READY = TaskStatus.READY
_BY_ID = operator.attrgetter("record.id")


def restore(parts: Parts, now: int, recovered: Recovered, dead: Mapping[int, str] | None = None,
            suspended: frozenset[str] = frozenset(), *, running: bool = False) -> list[tuple[int, str]]:  # fmt: skip
    """Re-create the state a durable store recovered, applying the recovery rules.

    Tasks keep their ids, submission order and attempt counts; an attempt that was running
    counts as used; fixed starts that passed apply their miss policy; schedules keep their
    overlap guard. Must be called on a fresh engine, before any submission.

    A live task that cannot be restored (a value out of range, or listed in ``dead``) comes back
    dead-lettered with a message, and that status is persisted. An exception while a task or
    schedule is being restored is raised as ``EngineFault`` naming it: the caller restores again
    on a fresh engine with that task in ``dead`` (or that schedule in ``suspended``). Returns the
    tasks it dead-lettered because of their values: ``(id, message)``.

    ``running``: the engine already runs (a pool handed over from another shard joins it, see
    ``handover.py``); ``recovered`` then holds only that pool's rows, and its terminal tasks join
    the retained ones in the order they ended.
    """
    registry = parts.registry
    if not running and (not registry.empty or not parts.recurring.empty):
        raise ConfigError("restore needs a fresh engine")
    dead = dead or {}
    rejected: list[tuple[int, str]] = []
    high = recovered.id_high_water
    # Live tasks with the status they were recovered in, and whether they are simple: nothing to
    # link or arm, they only wait in their lane (most of a large backlog). Without transition
    # events to publish, a simple task is entered Ready at once and queued, which leaves the
    # same state as entering Blocked, linking, resuming and releasing it, for less work.
    live: list[tuple[Task, TaskStatus, bool]] = []
    terminal: list[Task] = []
    quiet = not parts.outbox.transitions
    for item in sorted(recovered.tasks, key=_BY_ID):
        record = item.record
        if record.id > high:
            high = record.id
        try:
            task = _load(parts, now, item, dead.get(record.id), rejected)
        except Exception as error:
            raise EngineFault.wrap(error, task_id=record.id) from error
        if task.status._value_ in TERMINAL_VALUES:
            terminal.append(task)
            continue
        status = item.status
        spec = task.spec
        assert spec is not None
        simple = quiet and status is not _RUNNING and status is not _RETRYING and not spec.deps and task.fixed is None
        live.append((task, status, simple))
    registry.raise_id_floor(high)
    parts.outcomes.raise_lease_floor(recovered.lease_high_water)
    terminal.sort(key=lambda t: t.finished_at or 0)
    if running:
        parts.outcomes.retain_more(terminal)
    else:
        parts.outcomes.retain(terminal)
    # Register live tasks as pending, then link their dependencies.
    enter = registry.enter
    for task, _, simple in live:
        enter(task, _READY if simple else _BLOCKED)
        if task.deadline is not None:
            assert task.spec is not None
            parts.intake.set_estimate(task, task.spec)
    doomed: list[tuple[Task, Task]] = []
    link = parts.dependencies.link_recovered
    for task, _, simple in live:
        if simple:
            continue  # no dependencies to link
        try:
            parent = link(task)
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
        if parent is not None:
            doomed.append((task, parent))
    enqueue = parts.dispatcher.enqueue_ready
    # Interrupted attempts are settled last: one may end its task (no attempt left), and that end
    # must find the task's children in place, as at run time, not release a child that its own
    # turn in this loop would then release again.
    interrupted: list[Task] = []
    for task, status, simple in live:
        if task.status._value_ in TERMINAL_VALUES:
            continue
        if status is _RUNNING:
            interrupted.append(task)
            continue
        try:
            if simple:
                enqueue(task, now)  # what ``_resume`` comes to for it
            else:
                _resume(parts, now, task, status)
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
    for task in interrupted:
        if task.status._value_ in TERMINAL_VALUES:
            continue
        try:
            _resume(parts, now, task, _RUNNING)
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
    for task, parent in doomed:
        try:
            parts.outcomes.finish(task, _SKIPPED, now, f"dependency {parent.id} ended as {parent.status.value}")
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
    for schedule in recovered.recurring:
        name = schedule.spec.name
        try:
            parts.recurring.restore(schedule.spec, schedule.next_at, schedule.last_task_id, now,
                                    suspended=name in suspended, paused=schedule.paused)  # fmt: skip
        except Exception as error:
            raise EngineFault.wrap(error, schedule=name) from error
    return rejected


def _load(parts: Parts, now: int, item: RecoveredTask, dead_message: str | None,
          rejected: list[tuple[int, str]]) -> Task:  # fmt: skip
    """The task of one recovered row, registered by id and key; a live one that must not run again
    (its pool is gone, a value is out of range, or the caller listed it) is made terminal here."""
    record = item.record
    pool = parts.pools.get(record.pool)
    home = pool or parts.default_pool
    spec = record.spec
    retry = spec.retry if spec.retry is not None else home.config.retry
    task = Task(record.id, home, spec, record.submitted_at, retry)
    task.max_attempts = record.max_attempts
    task.attempt = item.attempt
    task.message = item.message
    task.started_at = item.started_at
    task.retry_at = item.retry_at
    if task.fixed is not None and (item.attempt > 0 or item.started_at is not None):
        task.fixed_done = True
    registry = parts.registry
    registry.add(task)
    if item.status._value_ in TERMINAL_VALUES:
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
            registry.totals["engine_errors"] += 1
            rejected.append((task.id, message))
    if status is None:
        return task
    task.status = status
    task.finished_at = now
    task.message = message
    task.spec = None
    if status is _DEAD:
        registry.count(status.value, task.pool)
    outbox = parts.outbox
    if outbox.persist:
        outbox.mutations.append(SetStatus(task.id, status, task.attempt, now, message))
    # Whoever waits for the task (a driver rebuilding its engine keeps its waiters) learns the end.
    outbox.resolves.append(Resolve(task.id, task.pool.name, task.key, status, task.attempt, now, message))
    return task


def _unrunnable(item: RecoveredTask) -> str | None:
    """Why a recovered live task cannot safely run again (values out of range), or None."""
    try:
        admission.check_values(item.record.spec)
    except AdmissionError as error:
        return error.message
    record = item.record
    attempts, attempt = record.max_attempts, item.attempt
    if (type(attempts) is int and 1 <= attempts <= limits.MAX_COUNT and type(attempt) is int
            and 0 <= attempt <= attempts and item.retry_at is None and item.started_at is None):  # fmt: skip
        return None  # the common case, checked in one go
    problem = limits.count_problem(record.max_attempts, "max_attempts", low=1)
    if problem is None and not (limits.is_int(item.attempt) and 0 <= item.attempt <= record.max_attempts):
        problem = f"attempt {item.attempt!r} is not between 0 and max_attempts"
    if problem is None and item.retry_at is not None:
        problem = limits.instant_problem(item.retry_at, "retry_at")
    if problem is None and item.started_at is not None:
        problem = limits.instant_problem(item.started_at, "started_at")
    return problem


def _resume(parts: Parts, now: int, task: Task, status: TaskStatus) -> None:
    """Arm a linked live task's timers and put it where its recovered status says."""
    pool = task.pool
    fixed = task.fixed
    if fixed is not None and not task.fixed_done:
        assert task.spec is not None
        pool.reservations.add(task.id, *parts.intake.reservation_interval(pool, task.spec, fixed))
        parts.holds.arm(task, now)
    if task.awaiting is not None and pool.config.await_timeout is not None:
        parts.timers.push(now + pool.config.await_timeout, T_AWAIT, task, 0)
    if status is _RUNNING:
        # The attempt that was running when the previous leader died counts as used.
        message = "attempt interrupted by a leader change"
        if task.attempt < task.max_attempts:
            task.started_at = task.started_at or now
            parts.outcomes.fail_attempt(task, now, message, None)
        else:
            parts.outcomes.finish(task, _DEAD, now, message)
        return
    if status is _RETRYING:
        parts.outcomes.wait_retry(task, task.retry_at if task.retry_at is not None else now)
        return
    if task.unmet == 0 and task.awaiting is None:
        parts.dispatcher.release(task, now, fresh=True)
