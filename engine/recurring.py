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
from .outbox import Outbox
from .registry import Registry
from .state import IN_DUE, T_RECUR, Pool, Schedule
from .timers import Timers
from .types import (
    RECURRING_TAG,
    AdmissionError,
    ConfigError,
    Dep,
    EdgeCond,
    FixedStart,
    MissPolicy,
    OverlapPolicy,
    RecurringSpec,
    TaskSpec,
    TaskStatus,
    caused_by,
)
from .views import RecurringInfo

if TYPE_CHECKING:
    from .dependencies import Dependencies
    from .dispatch import Dispatcher
    from .holds import Holds
    from .intake import Intake

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


def _next_start(schedule: Schedule, now: int) -> int | None:
    """The schedule's first occurrence after ``now`` that has not been created yet."""
    after = now - 1
    if schedule.last_start is not None and schedule.last_start >= now:
        after = schedule.last_start
    return schedule.cron.next_after(after)


class Recurring:
    """The engine's schedules, by name."""

    def __init__(self, default_pool: Pool, registry: Registry, timers: Timers, outbox: Outbox) -> None:
        self._default_pool = default_pool
        self._registry = registry
        self._timers = timers
        self._outbox = outbox
        self._schedules: dict[str, Schedule] = {}

    def bind(self, intake: Intake, dependencies: Dependencies, dispatcher: Dispatcher, holds: Holds) -> None:
        self._intake = intake
        self._dependencies = dependencies
        self._dispatcher = dispatcher
        self._holds = holds

    @property
    def empty(self) -> bool:
        return not self._schedules

    def set_default_pool(self, pool: Pool) -> None:
        """Where templates naming no pool go from now on (the default pool left the engine)."""
        self._default_pool = pool

    def drop_pool(self, pool: Pool) -> list[str]:
        """Retire the schedules whose template names ``pool`` (it left the engine with their
        stored rows); their armed timers no longer fire. Returns their names."""
        names = [name for name, schedule in self._schedules.items() if schedule.spec.template.pool == pool.name]
        for name in names:
            self._schedules.pop(name).retired = True
        return names

    def _install(self, schedule: Schedule) -> None:
        previous = self._schedules.get(schedule.spec.name)
        if previous is not None:
            previous.retired = True
        self._schedules[schedule.spec.name] = schedule

    def add(self, now: int, spec: RecurringSpec) -> None:
        """Add or replace a schedule; its next occurrence is created ahead of its start."""
        template = spec.template
        pool = self._check_template(template)
        cron = CronSchedule.parse(spec.cron, spec.tz)
        check_values(spec)
        schedule = Schedule(spec, cron)
        previous = self._schedules.get(spec.name)
        if previous is not None:
            schedule.last_task_id = previous.last_task_id
            schedule.last_start = previous.last_start
            schedule.paused = previous.paused  # replacing a paused schedule does not resume it
        self._install(schedule)
        if not schedule.paused:
            schedule.next_at = _next_start(schedule, now)
        self._persist(schedule)
        self._arm(schedule, pool, now)

    def set_paused(self, now: int, name: str, paused: bool) -> bool:
        """Pause or resume a schedule; False if there is none.

        A paused schedule creates no occurrence (one it already created stays, as when it is
        removed). Resumed, it continues with its first occurrence after ``now``: the ones that fell
        while it was paused are not run, whatever the miss policy (pausing is a decision not to run
        them, unlike downtime). Replacing a paused schedule keeps it paused.
        """
        schedule = self._schedules.get(name)
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
                pool = self._check_template(schedule.spec.template)
        if pool is not None:
            schedule.next_at = _next_start(schedule, now)
        self._persist(schedule)
        if pool is not None:
            self._arm(schedule, pool, now)
        return True

    def remove(self, now: int, name: str) -> bool:
        schedule = self._schedules.pop(name, None)
        if schedule is None:
            return False
        schedule.retired = True
        if self._outbox.persist:
            self._outbox.mutations.append(DeleteRecurring(name))
        return True

    def suspend(self, name: str) -> bool:
        """Stop creating occurrences of a schedule whose handling raised (listed as invalid)."""
        schedule = self._schedules.get(name)
        if schedule is None or schedule.invalid:
            return False
        schedule.invalid = True
        schedule.timer_gen += 1  # its armed timer no longer fires
        self._registry.totals["recurring_invalid"] += 1
        return True

    def _check_template(self, template: TaskSpec) -> Pool:
        if template.deadline is not None:
            raise ConfigError("a recurring template may not set an absolute deadline (use deadline_in)")
        if template.fixed_start is not None:
            raise ConfigError("a recurring template may not set a fixed start")
        if template.deps:
            raise ConfigError("a recurring template may not set dependencies (use overlap='queue')")
        try:
            pool = self._intake.pool_for(template)
            self._intake.check_spec(template)
        except AdmissionError as err:
            raise caused_by(ConfigError(err.message), None) from None
        return pool

    def _persist(self, schedule: Schedule) -> None:
        if self._outbox.persist:
            record = PutRecurring(schedule.spec, schedule.next_at, schedule.last_task_id, schedule.paused)
            self._outbox.mutations.append(record)

    def _arm(self, schedule: Schedule, pool: Pool, now: int) -> None:
        if schedule.next_at is None or schedule.paused:
            return
        spec = schedule.spec
        lead = min(self._holds.hold_lead(pool, spec.tolerance, now) + spec.tolerance, pool.config.max_hold)
        create_at = schedule.next_at - lead
        if schedule.last_start is not None:
            create_at = max(create_at, schedule.last_start)
        schedule.timer_gen += 1
        self._timers.push(max(create_at, now), T_RECUR, schedule, schedule.timer_gen)

    def create_occurrence(self, schedule: Schedule, now: int) -> None:
        """The schedule's timer fired: create its next occurrence and arm the one after."""
        start = schedule.next_at
        if start is None:
            return
        spec = schedule.spec
        template = spec.template
        try:
            pool = self._check_template(template)
        except ConfigError:
            schedule.invalid = True
            self._count_invalid(template)
            return
        registry = self._registry
        last = registry.get(schedule.last_task_id) if schedule.last_task_id is not None else None
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
        fixed = FixedStart(start, spec.tolerance, spec.on_miss)
        occurrence = TaskSpec(
            payload=template.payload,
            pool=pool.name,
            kind=template.kind,
            priority=template.priority,
            key=key,
            deadline=limits.add_ns(start, spec.deadline_after) if spec.deadline_after is not None else None,
            fixed_start=fixed,
            duration_hint=template.duration_hint,
            timeout=template.timeout,
            retry=template.retry,
            deps=deps,
            resources=template.resources,
            tags=tags,
            labels=template.labels,
            tenant=template.tenant,
        )
        created_id: int | None = None
        if key is None or registry.key_owner(key) is None:  # else it exists (replaced schedule, or recovered)
            interval = self._intake.reservation_interval(pool, occurrence, fixed)
            if not pool.reservations.fits(*interval):
                registry.count("recurring_conflicts", pool)
            else:
                resolved = self._dependencies.resolve(pool, occurrence) if deps else None
                created = self._intake.create(now, pool, occurrence, resolved, interval)
                created_id = created.id
                if guard is not None and not created.status.terminal:
                    created.guard = guard
                    if created.status is TaskStatus.READY and created.where == IN_DUE:
                        # Its start has already come: decide now.
                        self._dispatcher.unqueue(created)
                        self._dispatcher.make_due(created, now)
        if created_id is not None:
            schedule.last_task_id = created_id
        schedule.last_start = start
        try:
            schedule.next_at = schedule.cron.next_after(max(start, now - 1))
        except ConfigError:
            # No occurrence left within the supported range: the schedule has run its course.
            schedule.next_at = None
            schedule.invalid = True
            registry.totals["recurring_invalid"] += 1
        self._persist(schedule)
        self._arm(schedule, pool, now)

    def _count_invalid(self, template: TaskSpec) -> None:
        """A schedule became invalid: counted for the engine, and for its pool while that exists."""
        self._registry.totals["recurring_invalid"] += 1
        try:
            pool = self._intake.pool_for(template)
        except AdmissionError:
            return
        pool.totals["recurring_invalid"] += 1

    def infos(self) -> list[RecurringInfo]:
        infos = []
        for name in sorted(self._schedules):
            schedule = self._schedules[name]
            spec = schedule.spec
            template = spec.template
            infos.append(
                RecurringInfo(
                    name,
                    spec.cron,
                    spec.tz,
                    template.pool or self._default_pool.name,
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

    # Recovery -----------------------------------------------------------------------------------

    def restore(self, spec: RecurringSpec, next_at: int | None, last_task_id: int | None, now: int, *,
                suspended: bool = False, paused: bool = False) -> None:  # fmt: skip
        """Re-create one recovered schedule; it comes back invalid (listed, never fired) when its
        cron, time zone or template no longer passes, its values are out of range, or it is
        ``suspended``; a ``paused`` one is restored with nothing armed until it is resumed."""
        try:
            cron = CronSchedule.parse(spec.cron, spec.tz)
        except ConfigError:
            cron = None
        schedule = Schedule(spec, cron)  # type: ignore[arg-type]
        schedule.last_task_id = last_task_id
        schedule.next_at = None if paused else next_at
        schedule.paused = paused
        last = self._registry.get(last_task_id) if last_task_id is not None else None
        if last is not None and last.fixed is not None:
            schedule.last_start = last.fixed.start
        self._install(schedule)
        try:
            if cron is None:
                raise ConfigError("invalid cron expression")
            if suspended:
                raise ConfigError("suspended after an internal error")
            check_values(spec)
            if next_at is not None and limits.instant_problem(next_at, "next_at") is not None:
                raise ConfigError("next occurrence out of range")
            pool = self._check_template(spec.template)
        except ConfigError:
            schedule.invalid = True
            self._count_invalid(spec.template)
            return
        if paused:
            return  # nothing to arm until it is resumed
        if next_at is None:
            schedule.next_at = self._next_or_none(schedule, cron, now)
        elif next_at + spec.tolerance < now:
            # Missed during downtime: at most one late run, then resume from the present.
            if spec.on_miss is not MissPolicy.RUN_LATE:
                self._registry.count("missed", pool)
                schedule.next_at = self._next_or_none(schedule, cron, now)
            else:
                self.create_occurrence(schedule, now)
                return
        self._arm(schedule, pool, now)

    def _next_or_none(self, schedule: Schedule, cron: CronSchedule, now: int) -> int | None:
        """The next occurrence after ``now``; None (and the schedule invalid) if none is left."""
        try:
            return cron.next_after(now - 1)
        except ConfigError:
            schedule.invalid = True
            self._count_invalid(schedule.spec.template)
            return None
