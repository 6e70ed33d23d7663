"""The scheduling core: a deterministic state machine with no I/O and no clock.

Every call takes ``now`` (int ns since the Unix epoch). Mutating calls only change state and mark
work to do; ``tick(now)`` fires due timers and dispatches. ``drain()`` hands the driver what to do
next as one ``StepOutput``: the step's mutations to commit (when persisting), then dispatches,
aborts, events, resolutions and scale requests.

``Core`` coordinates the engine's parts (see ``parts.py``), each of which owns its state:
``Intake`` (submissions), ``AdmissionControl`` (bounds), ``Dependencies``, ``Dispatcher`` (lanes
and starts), ``Outcomes`` (leases, ends, retention), ``Holds`` (fixed starts), ``Timers``,
``Capacity``, ``Recurring``, ``Queries`` and the ``Registry`` of tasks and their statuses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from . import handover, invariants, recovery
from .actions import Recovered, StepOutput
from .config import CoreConfig, PoolConfig
from .parts import build
from .snapshot import Snapshot
from .state import (
    T_AWAIT,
    T_HOLD,
    T_LEASE,
    T_MISS,
    T_RECUR,
    T_REFILL,
    T_RETRY,
    T_SCALE,
    T_START,
    T_TIMEOUT,
    LeaseState,
    Pool,
    Schedule,
    Task,
)
from .types import (
    AdmissionError,
    EngineFault,
    Outcome,
    RecurringSpec,
    TaskRef,
    TaskSpec,
    TaskStatus,
    UnknownTask,
)
from .views import RecurringInfo, Submitted, TaskInfo, TaskQuery

_CANCELLED = TaskStatus.CANCELLED
_DEAD = TaskStatus.DEAD_LETTERED
_SKIPPED = TaskStatus.SKIPPED
_SCHEDULED = TaskStatus.SCHEDULED


class Core:
    """One shard's (or one embedded scheduler's) engine."""

    def __init__(self, config: CoreConfig, *, now: int = 0) -> None:
        config.validate()
        self.config = config
        parts = self._parts = build(config, now)
        self._pools = parts.pools
        self._pool_list = parts.pool_list
        self._outbox = parts.outbox
        self._registry = parts.registry
        self._timers = parts.timers
        self._intake = parts.intake
        self._dispatcher = parts.dispatcher
        self._outcomes = parts.outcomes
        self._holds = parts.holds
        self._capacity = parts.capacity
        self._recurring = parts.recurring
        self._queries = parts.queries

    # ------------------------------------------------------------------------------------------
    # Properties

    @property
    def pools(self) -> list[str]:
        return [pool.name for pool in self._pool_list]

    @property
    def default_pool(self) -> str:
        return self._parts.default_pool.name

    def pool_config(self, name: str) -> PoolConfig:
        return self._pools[name].config

    @property
    def totals(self) -> dict[str, int]:
        """Engine-wide counters by name (``snapshot.TOTAL_NAMES``); read-only for callers."""
        return self._registry.totals

    @property
    def live_tasks(self) -> int:
        return self._registry.pending + self._registry.running

    @property
    def running(self) -> int:
        return self._registry.running

    @property
    def emit_transitions(self) -> bool:
        """Publish every intermediate transition (terminal ones are always resolved)."""
        return self._outbox.transitions

    @emit_transitions.setter
    def emit_transitions(self, enabled: bool) -> None:
        self._outbox.transitions = enabled

    @property
    def dispatch_enabled(self) -> bool:
        """Whether ``tick`` starts attempts (a driver that lost its leadership turns it off)."""
        return self._dispatcher.enabled

    @dispatch_enabled.setter
    def dispatch_enabled(self, enabled: bool) -> None:
        self._dispatcher.enabled = enabled

    @property
    def last_id(self) -> int:
        """The latest task id handed out (ids only grow): the tasks a call created have the ids
        above the value read before it."""
        return self._registry.last_id

    @property
    def last_lease_id(self) -> int:
        """The latest lease id handed out."""
        return self._outcomes.last_lease_id

    def active_leases(self) -> list[tuple[int, int]]:
        """(lease id, task id) of every running attempt."""
        return self._outcomes.active_leases()

    # ------------------------------------------------------------------------------------------
    # Submission

    def submit(self, now: int, spec: TaskSpec) -> Submitted:
        """Admit one task, or raise AdmissionError. A known key returns the existing task."""
        return self._intake.submit(now, spec)

    def submit_many(self, now: int, specs: Iterable[TaskSpec]) -> list[Submitted | AdmissionError]:
        """``submit`` for each spec in order, in one call (not atomic, unlike ``submit_batch``):
        each answer is what that ``submit`` would return, or the AdmissionError it would raise,
        with the spec's index."""
        return self._intake.submit_many(now, specs)

    def submit_batch(self, now: int, specs: Sequence[TaskSpec]) -> list[Submitted]:
        """Admit every task or none; errors name the offending index."""
        return self._intake.submit_batch(now, specs)

    # ------------------------------------------------------------------------------------------
    # Time

    def tick(self, now: int) -> None:
        """Fire every timer due at ``now`` and start whatever can start."""
        timers = self._timers
        while True:
            timer = timers.pop_due(now)
            if timer is None:
                break
            _, _, kind, subject, generation = timer
            try:
                self._fire(kind, subject, generation, now)
            except Exception as error:
                raise _fault(error, subject) from error
        outcomes = self._outcomes
        if outcomes.has_retained:
            outcomes.expire_retained(now)
        self._dispatcher.dispatch(now)

    def next_wakeup(self) -> int | None:
        """The earliest time ``tick`` has something to do (None: nothing until the next call)."""
        if self._dispatcher.has_work:
            return 0
        return self._timers.next_wakeup()

    def _fire(self, kind: int, subject: object, generation: int, now: int) -> None:
        """Hand a due timer to the part it belongs to."""
        if kind == T_RETRY:
            assert isinstance(subject, Task)
            self._outcomes.on_retry_timer(subject, now)
        elif kind == T_TIMEOUT:
            assert isinstance(subject, LeaseState)
            self._outcomes.on_timeout(subject, now)
        elif kind == T_LEASE:
            assert isinstance(subject, LeaseState)
            self._outcomes.on_lease_timer(subject, generation, now)
        elif kind == T_START:
            assert isinstance(subject, Task)
            if subject.status is _SCHEDULED:
                self._dispatcher.make_due(subject, now)
        elif kind == T_HOLD:
            assert isinstance(subject, Task)
            self._holds.on_hold_timer(subject, now)
        elif kind == T_MISS:
            assert isinstance(subject, Task)
            self._holds.on_miss_timer(subject, now)
        elif kind == T_AWAIT:
            assert isinstance(subject, Task)
            if subject.awaiting:
                keys = ", ".join(sorted(subject.awaiting))
                self._outcomes.finish(subject, _SKIPPED, now, f"awaited dependency never appeared: {keys}")
        elif kind == T_REFILL:
            self._dispatcher.on_refill_timer(now)
        elif kind == T_SCALE:
            assert isinstance(subject, Pool)
            self._capacity.on_scale_timer(subject, now)
        elif kind == T_RECUR:
            assert isinstance(subject, Schedule)
            self._recurring.create_occurrence(subject, now)

    # ------------------------------------------------------------------------------------------
    # Attempts and ends

    def complete(self, now: int, lease_id: int, outcome: Outcome) -> bool:
        """Report the outcome of an attempt. Stale reports change nothing and return False."""
        return self._outcomes.complete(now, lease_id, outcome)

    def complete_many(self, now: int, reports: Iterable[tuple[int, Outcome]]) -> list[bool]:
        """``complete`` for each (lease id, outcome) in order, in one call; the answers in order."""
        return self._outcomes.complete_many(now, reports)

    def heartbeat(self, now: int, lease_id: int) -> bool:
        return self._outcomes.heartbeat(now, lease_id)

    def cancel(self, now: int, ref: TaskRef) -> bool:
        """End a task as Cancelled. False when it had already finished."""
        task = self._registry.lookup(ref)
        if task is None:
            raise UnknownTask(f"unknown task {ref!r}")
        if task.status.terminal:
            return False
        try:
            self._outcomes.finish(task, _CANCELLED, now, "cancelled")
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
        return True

    def dead_letter(self, now: int, task_id: int, message: str) -> bool:
        """End a live task as DeadLettered with ``message`` (its attempt, if any, is aborted).

        How a driver contains a task whose handling raised (see ``EngineFault``); every pool is
        dispatched again on the next tick, since the step that raised may have stopped half-way.
        False when the task is unknown or already finished.
        """
        self._dispatcher.mark_all_dirty(self._pool_list)
        task = self._registry.get(task_id)
        if task is None or task.status.terminal:
            return False
        self._outcomes.finish(task, _DEAD, now, message)
        return True

    # ------------------------------------------------------------------------------------------
    # Capacity

    def set_capacity(self, now: int, pool_name: str, capacity: int) -> None:
        self._capacity.set_group_capacity(now, pool_name, {}, capacity)

    def set_group_capacity(self, now: int, pool_name: str, labels: Mapping[str, str], capacity: int) -> None:
        self._capacity.set_group_capacity(now, pool_name, labels, capacity)

    def withhold(self, pool_name: str, withheld: bool = True) -> None:
        """Start no attempt of pool ``pool_name`` while ``withheld`` (its running attempts go on and
        end as usual; tasks are still admitted and wait). A pool moving to another shard drains
        this way (docs/pool-moves.md), so that no attempt of it is running when it is handed over.
        A pool this engine no longer has (it was handed over meanwhile) is left alone."""
        pool = self._pools.get(pool_name)
        if pool is None:
            return
        if withheld:
            self._dispatcher.withheld.add(pool)
        elif pool in self._dispatcher.withheld:
            self._dispatcher.withheld.discard(pool)
            self._dispatcher.mark_dirty(pool)

    def running_in(self, pool_name: str) -> int:
        """How many attempts of pool ``pool_name`` are running (none: a pool this engine lacks)."""
        pool = self._pools.get(pool_name)
        return 0 if pool is None else pool.busy

    # ------------------------------------------------------------------------------------------
    # Recurring schedules

    def add_recurring(self, now: int, spec: RecurringSpec) -> None:
        """Add or replace a schedule; its next occurrence is created ahead of its start."""
        self._recurring.add(now, spec)

    def remove_recurring(self, now: int, name: str) -> bool:
        """Stop a schedule (an occurrence already created stays). False if there was none."""
        return self._recurring.remove(now, name)

    def pause_recurring(self, now: int, name: str, paused: bool = True) -> bool:
        """Pause (or, with ``paused=False``, resume) a schedule. False if there is none."""
        return self._recurring.set_paused(now, name, paused)

    def list_recurring(self) -> list[RecurringInfo]:
        return self._recurring.infos()

    def suspend_recurring(self, name: str) -> bool:
        """Stop creating occurrences of a schedule whose handling raised; it is listed as invalid
        until it is added again. False when there is no such (valid) schedule."""
        return self._recurring.suspend(name)

    # ------------------------------------------------------------------------------------------
    # Reads

    def get(self, ref: TaskRef) -> TaskInfo | None:
        return self._queries.get(ref)

    def ended(self, task_id: int) -> tuple[TaskStatus, str | None] | None:
        """(status, message) of a task that reached a terminal status; None if live or unknown."""
        return self._queries.ended(task_id)

    def list_tasks(
        self,
        pools: Iterable[str] | None = None,
        statuses: Iterable[TaskStatus] | None = None,
        after: int = 0,
        limit: int = 100,
        *,
        query: TaskQuery | None = None,
        descending: bool = False,
    ) -> list[TaskInfo]:
        """Live and retained tasks in id order after ``after`` (exclusive), or, ``descending``,
        newest first below ``after`` (0: from the newest). ``query`` filters further; ``pools``
        and ``statuses`` narrow it. A page walks only the ids of the pools asked for, from the
        cursor on, so it costs the page plus the tasks the other filters skip."""
        return self._queries.list_tasks(pools, statuses, after, limit, query, descending)

    def snapshot(self, now: int) -> Snapshot:
        return self._queries.snapshot(now)

    def urgency(self, ref: TaskRef, now: int) -> float:
        """The deadline urgency term of a task's dispatch score at ``now`` (0 without a deadline)."""
        task = self._registry.lookup(ref)
        if task is None:
            raise UnknownTask(f"unknown task {ref!r}")
        return self._dispatcher.urgency(task, now) if task.deadline is not None else 0.0

    # ------------------------------------------------------------------------------------------
    # Recovery and hand-over

    def restore(self, now: int, recovered: Recovered, *, dead: Mapping[int, str] | None = None,
                suspended: Iterable[str] = ()) -> list[tuple[int, str]]:  # fmt: skip
        """Re-create what a durable store recovered (see ``recovery.restore``); fresh engines only.

        Tasks in ``dead`` (id -> message) come back dead-lettered and schedules in ``suspended``
        come back invalid: how a driver leaves out what made an earlier engine fault. A task or
        schedule that faults while it is restored raises ``EngineFault`` naming it. Returns the
        tasks restore dead-lettered because their values are out of range: ``(id, message)``.
        """
        return recovery.restore(self._parts, now, recovered, dead or {}, frozenset(suspended))

    def adopt(self, old: Core, now: int) -> None:
        """Take over the run-time state of ``old``, the engine this freshly restored one replaces:
        worker capacities, the id floors (no task or lease id is handed out twice), the totals and
        the dispatch and transition switches."""
        self._registry.raise_id_floor(old.last_id)
        self._outcomes.raise_lease_floor(old.last_lease_id)
        totals = self._registry.totals
        for name, count in old.totals.items():
            totals[name] = totals.get(name, 0) + count
        for old_pool in old.snapshot(now).pools:
            pool = self._pools.get(old_pool.name)
            if pool is None:
                continue
            for name, count in old_pool.totals.items():
                pool.totals[name] = pool.totals.get(name, 0) + count
            for group in old_pool.groups:
                self.set_group_capacity(now, old_pool.name, group.labels, group.capacity)
        self.dispatch_enabled = old.dispatch_enabled
        self.emit_transitions = old.emit_transitions

    def join_pool(self, now: int, config: PoolConfig, recovered: Recovered) -> handover.Adopted:
        """Add a pool handed over from another shard to this running engine, with its stored tasks
        and schedules (``recovered`` holds only that pool's rows); see ``handover.py``."""
        handover.join(self._parts, config, self.config.metrics_window, now)
        self.config = replace(self.config, pools=(*self.config.pools, config))
        return handover.adopt(self._parts, now, recovered)

    def release_pool(self, pool_name: str) -> handover.Released:
        """Let go of a drained pool handed over to another shard, and of everything of it; the
        engine's other pools are untouched (see ``handover.py``)."""
        released = handover.release(self._parts, pool_name)
        if self._parts.default_pool.name == pool_name:
            self._parts = replace(self._parts, default_pool=self._pool_list[0])
        self.config = replace(self.config, pools=tuple(p for p in self.config.pools if p.name != pool_name))
        return released

    def note_engine_errors(self, count: int) -> None:
        """Count internal errors its driver contained (they belong to no pool)."""
        self._registry.totals["engine_errors"] += count

    def check_invariants(self) -> None:
        """Raise AssertionError if the engine's bookkeeping is inconsistent (tests, debugging)."""
        invariants.check_invariants(self._parts)

    # ------------------------------------------------------------------------------------------
    # Output

    def drain(self) -> StepOutput:
        """Everything the driver must do since the last drain (mutations to commit first)."""
        return self._outbox.take()


def _fault(error: Exception, subject: object) -> EngineFault:
    """A fault for an exception raised while a timer of ``subject`` fired, naming its task or schedule."""
    if isinstance(subject, Task):
        return EngineFault.wrap(error, task_id=subject.id)
    if isinstance(subject, LeaseState):
        return EngineFault.wrap(error, task_id=subject.task.id)
    if isinstance(subject, Schedule):
        return EngineFault.wrap(error, schedule=subject.spec.name)
    return EngineFault.wrap(error)
