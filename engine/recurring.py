"""Recurring schedules: cron expressions turned into fixed-start occurrences.

Each occurrence is created shortly before its start (hold lead + tolerance ahead, capped by the
pool's max_hold), one at a time; the next is armed when the current one is due. The overlap
policy decides against the previous occurrence: Skip at the new occurrence's start, Queue and
QueueOnSuccess through a dependency edge, Allow not at all.
"""

from __future__ import annotations

import contextlib
import re
from typing import TYPE_CHECKING

from . import admission, limits
from .actions import DeleteRecurring, PutRecurring
from .cron import CronSchedule, rfc3339_utc
from .state import IN_DUE, T_RECUR, Pool, Schedule, Task
from .types import (
    RECURRING_TAG,
    AdmissionError,
    ConfigError,
    Dep,
    EdgeCond,
    FixedStart,
    OverlapPolicy,
    RecurringSpec,
    TaskSpec,
    TaskStatus,
)
from .views import RecurringInfo

if TYPE_CHECKING:
    from .core import Core

RUN_KEY_SUFFIX_LEN = len("@2026-03-08T07:30:00Z")
"""What an occurrence's key adds to its schedule's key prefix: ``@`` and the start in UTC."""

_RUN_KEY = re.compile(r"@[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\Z")


def run_key(prefix: str, start: int) -> str:
    """The key of the occurrence starting at ``start`` of a schedule whose template key is ``prefix``."""
    return f"{prefix}@{rfc3339_utc(start)}"


def is_run_key(key: str) -> bool:
    """Whether ``key`` has the form of an occurrence's key (``<prefix>@<UTC RFC 3339 time>``).

    Only schedules may create such keys: a client that took one first would silence that run."""
    return _RUN_KEY.search(key) is not None


def add(core: Core, now: int, spec: RecurringSpec) -> None:
    """Add or replace a schedule; its next occurrence is created ahead of its start."""
    template = spec.template
    pool = check_template(core, template)
    cron = CronSchedule.parse(spec.cron, spec.tz)
    check_values(spec)
    schedule = Schedule(spec, cron)
    previous = core._schedules.get(spec.name)
    if previous is not None:
        schedule.last_task_id = previous.last_task_id
        schedule.last_start = previous.last_start
        schedule.paused = previous.paused  # replacing a paused schedule does not resume it
    core._schedules[spec.name] = schedule
    if not schedule.paused:
        schedule.next_at = _next_start(schedule, now)
    persist(core, schedule)
    arm(core, schedule, pool, now)


def _next_start(schedule: Schedule, now: int) -> int | None:
    """The schedule's first occurrence after ``now`` that has not been created yet."""
    after = now - 1
    if schedule.last_start is not None and schedule.last_start >= now:
        after = schedule.last_start
    return schedule.cron.next_after(after)


def set_paused(core: Core, now: int, name: str, paused: bool) -> bool:
    """Pause or resume a schedule; False if there is none.

    A paused schedule creates no occurrence (one it already created stays, as when it is removed).
    Resumed, it continues with its first occurrence after ``now``: the ones that fell while it was
    paused are not run, whatever the miss policy (pausing is a decision not to run them, unlike
    downtime). Replacing a paused schedule keeps it paused.
    """
    schedule = core._schedules.get(name)
    if schedule is None:
        return False
    if schedule.paused is paused:
        return True
    schedule.paused = paused
    schedule.timer_gen += 1  # a pending creation timer no longer fires
    schedule.next_at = None
    pool = None
    if not paused and not schedule.invalid:
        # A configuration that no longer supports it leaves it unarmed, as on recovery.
        with contextlib.suppress(ConfigError):
            pool = check_template(core, schedule.spec.template)
    if pool is not None:
        schedule.next_at = _next_start(schedule, now)
    persist(core, schedule)
    if pool is not None:
        arm(core, schedule, pool, now)
    return True


def remove(core: Core, now: int, name: str) -> bool:
    schedule = core._schedules.pop(name, None)
    if schedule is None:
        return False
    schedule.timer_gen += 1
    if core._persist:
        core._out.mutations.append(DeleteRecurring(name))
    return True


def check_values(spec: RecurringSpec) -> None:
    """Raise ConfigError when the schedule's own fields (not its template) are malformed."""
    if not spec.name or admission.text_problem("name", spec.name) is not None:
        raise ConfigError("a schedule needs a name without NUL characters")
    if spec.tz is not None and admission.text_problem("tz", spec.tz) is not None:
        raise ConfigError("the time zone must be text without NUL characters")
    if limits.is_int(spec.tolerance) and spec.tolerance < 0:
        raise ConfigError("tolerance must not be negative")
    problem = limits.duration_problem(spec.tolerance, "tolerance")
    if problem is None and spec.deadline_after is not None:
        if limits.is_int(spec.deadline_after) and spec.deadline_after < 0:
            raise ConfigError("deadline_in must not be negative")
        problem = limits.duration_problem(spec.deadline_after, "deadline_in")
    if problem is not None:
        raise ConfigError(problem)


def suspend(core: Core, name: str) -> bool:
    schedule = core._schedules.get(name)
    if schedule is None or schedule.invalid:
        return False
    schedule.invalid = True
    schedule.timer_gen += 1  # its armed timer no longer fires
    core.totals["recurring_invalid"] += 1
    return True


def check_template(core: Core, template: TaskSpec) -> Pool:
    if template.deadline is not None:
        raise ConfigError("a recurring template may not set an absolute deadline (use deadline_in)")
    if template.fixed_start is not None:
        raise ConfigError("a recurring template may not set a fixed start")
    if template.deps:
        raise ConfigError("a recurring template may not set dependencies (use overlap='queue')")
    try:
        pool = core._pool_for(template)
        admission.check_spec(template, core._resources)
    except AdmissionError as err:
        raise ConfigError(err.message) from None
    return pool


def persist(core: Core, schedule: Schedule) -> None:
    if core._persist:
        record = PutRecurring(schedule.spec, schedule.next_at, schedule.last_task_id, schedule.paused)
        core._out.mutations.append(record)


def arm(core: Core, schedule: Schedule, pool: Pool, now: int) -> None:
    if schedule.next_at is None or schedule.paused:
        return
    spec = schedule.spec
    fake = Task(0, pool, TaskSpec(fixed_start=FixedStart(schedule.next_at, spec.tolerance)), now, pool.config.retry)
    lead = min(core._hold_lead(pool, fake, now) + spec.tolerance, pool.config.max_hold)
    create_at = schedule.next_at - lead
    if schedule.last_start is not None:
        create_at = max(create_at, schedule.last_start)
    schedule.timer_gen += 1
    core._push_timer(max(create_at, now), T_RECUR, schedule, schedule.timer_gen)


def create_occurrence(core: Core, schedule: Schedule, now: int) -> None:
    start = schedule.next_at
    if start is None:
        return
    spec = schedule.spec
    template = spec.template
    try:
        pool = check_template(core, template)
    except ConfigError:
        schedule.invalid = True
        count_invalid(core, template)
        return
    last = core._tasks.get(schedule.last_task_id) if schedule.last_task_id is not None else None
    last_live = last is not None and not last.status.terminal
    tags = dict(template.tags)
    tags[RECURRING_TAG] = spec.name
    key = run_key(template.key, start) if template.key is not None else None
    deps: tuple[Dep, ...] = ()
    guard: int | None = None
    if last_live and last is not None:
        if spec.overlap is OverlapPolicy.SKIP:
            guard = last.id  # decided at the start: skipped only if the previous still runs
        elif spec.overlap is OverlapPolicy.QUEUE:
            deps = (Dep(last.id, EdgeCond.ON_COMPLETE),)
        elif spec.overlap is OverlapPolicy.QUEUE_ON_SUCCESS:
            deps = (Dep(last.id, EdgeCond.ON_SUCCESS),)
    occurrence = TaskSpec(
        payload=template.payload,
        pool=pool.name,
        kind=template.kind,
        priority=template.priority,
        key=key,
        deadline=limits.add_ns(start, spec.deadline_after) if spec.deadline_after is not None else None,
        fixed_start=FixedStart(start, spec.tolerance, spec.on_miss),
        duration_hint=template.duration_hint,
        timeout=template.timeout,
        retry=template.retry,
        deps=deps,
        resources=template.resources,
        tags=tags,
        labels=template.labels,
        tenant=template.tenant,
    )
    created: Task | None = None
    if key is not None and key in core._keys:
        created = None  # this occurrence already exists (replaced schedule, or recovered)
    else:
        interval = core._reservation_interval(pool, occurrence, occurrence.fixed_start)  # type: ignore[arg-type]
        if not pool.reservations.fits(*interval):
            core.totals["recurring_conflicts"] += 1
            pool.totals["recurring_conflicts"] += 1
        else:
            resolved = core._resolve_deps(pool, occurrence) if deps else None
            created = core._create(now, pool, occurrence, resolved, interval)
            if guard is not None and not created.status.terminal:
                created.guard = guard
                if created.status is TaskStatus.READY and created.where == IN_DUE:
                    # Its start has already come: decide now.
                    core._unqueue(created)
                    core._make_due(created, now)
    if created is not None:
        schedule.last_task_id = created.id
    schedule.last_start = start
    try:
        schedule.next_at = schedule.cron.next_after(max(start, now - 1))
    except ConfigError:
        # No occurrence left within the supported range: the schedule has run its course.
        schedule.next_at = None
        schedule.invalid = True
        core.totals["recurring_invalid"] += 1
    persist(core, schedule)
    arm(core, schedule, pool, now)


def count_invalid(core: Core, template: TaskSpec) -> None:
    """A schedule became invalid: counted for the engine, and for its pool while that exists."""
    core.totals["recurring_invalid"] += 1
    pool = core._pools.get(template.pool) if template.pool is not None else core._default_pool
    if pool is not None:
        pool.totals["recurring_invalid"] += 1


def infos(core: Core) -> list[RecurringInfo]:
    infos = []
    for name in sorted(core._schedules):
        schedule = core._schedules[name]
        spec = schedule.spec
        template = spec.template
        infos.append(
            RecurringInfo(
                name,
                spec.cron,
                spec.tz,
                template.pool or core._default_pool.name,
                template.kind,
                spec.overlap,
                schedule.next_at,
                schedule.last_task_id,
                not schedule.invalid and not schedule.paused,
                template.key,
                schedule.paused,
            )
        )
    return infos
