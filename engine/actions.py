"""What the engine asks its driver to do, and the mutations it asks it to persist.

One engine step hands its driver a ``StepOutput``. The driver commits its ``mutations`` first;
only after they are durable does it resolve acknowledgements, hand ``Dispatch`` leases to
executors or workers and publish events.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from .types import Opaque, Priority, RecurringSpec, TaskSpec, TaskStatus

# The classes built for every task (here and `views.Submitted`) write their `__init__` out: the
# one `dataclass` generates stays interpreted Python under mypyc (scripts/build_engine.py), a
# call that cost more than the rest of building the object. `dataclass` keeps an `__init__` it
# finds; tests/engine/test_native.py checks that each one takes the fields, in order, with their
# defaults.


@dataclass(slots=True)
class StatusEvent:
    id: int
    pool: str
    key: str | None
    status: TaskStatus
    attempt: int
    at: int
    message: str | None = None

    def __init__(
        self, id: int, pool: str, key: str | None, status: TaskStatus, attempt: int, at: int, message: str | None = None
    ) -> None:
        self.id = id
        self.pool = pool
        self.key = key
        self.status = status
        self.attempt = attempt
        self.at = at
        self.message = message


# ---------------------------------------------------------------------------------------------
# Persisted mutations (the store is a write-ahead log of these)


@dataclass(slots=True)
class TaskRecord:
    """A task as submitted: everything needed to re-create it after a restart."""

    id: int
    pool: str
    spec: TaskSpec
    submitted_at: int
    status: TaskStatus
    max_attempts: int

    def __init__(
        self, id: int, pool: str, spec: TaskSpec, submitted_at: int, status: TaskStatus, max_attempts: int
    ) -> None:
        self.id = id
        self.pool = pool
        self.spec = spec
        self.submitted_at = submitted_at
        self.status = status
        self.max_attempts = max_attempts


@dataclass(slots=True)
class PutTask:
    task: TaskRecord

    def __init__(self, task: TaskRecord) -> None:
        self.task = task


@dataclass(slots=True)
class SetStatus:
    """A status change. ``attempt`` is the number of attempts started so far.

    Terminal statuses carry the final ``message``; ``Succeeded`` carries ``output``.
    """

    id: int
    status: TaskStatus
    attempt: int
    at: int
    message: str | None = None
    retry_at: int | None = None
    output: Opaque = None
    has_output: bool = False

    def __init__(
        self,
        id: int,
        status: TaskStatus,
        attempt: int,
        at: int,
        message: str | None = None,
        retry_at: int | None = None,
        output: Opaque = None,
        has_output: bool = False,
    ) -> None:
        self.id = id
        self.status = status
        self.attempt = attempt
        self.at = at
        self.message = message
        self.retry_at = retry_at
        self.output = output
        self.has_output = has_output


@dataclass(frozen=True, slots=True)
class PutRecurring:
    spec: RecurringSpec
    next_at: int | None
    last_task_id: int | None
    paused: bool = False


@dataclass(frozen=True, slots=True)
class DeleteRecurring:
    name: str


Mutation = PutTask | SetStatus | PutRecurring | DeleteRecurring


# ---------------------------------------------------------------------------------------------
# Actions


@dataclass(slots=True)
class Lease:
    """One attempt handed to a pool. ``(task_id, attempt)`` is the fencing token."""

    id: int
    task_id: int
    attempt: int
    pool: str
    group: Mapping[str, str]
    payload: Opaque
    kind: str
    key: str | None
    priority: Priority
    tags: Mapping[str, str]
    timeout: int | None
    deadline: int | None
    lease_ttl: int | None
    started_at: int

    def __init__(
        self,
        id: int,
        task_id: int,
        attempt: int,
        pool: str,
        group: Mapping[str, str],
        payload: Opaque,
        kind: str,
        key: str | None,
        priority: Priority,
        tags: Mapping[str, str],
        timeout: int | None,
        deadline: int | None,
        lease_ttl: int | None,
        started_at: int,
    ) -> None:
        self.id = id
        self.task_id = task_id
        self.attempt = attempt
        self.pool = pool
        self.group = group
        self.payload = payload
        self.kind = kind
        self.key = key
        self.priority = priority
        self.tags = tags
        self.timeout = timeout
        self.deadline = deadline
        self.lease_ttl = lease_ttl
        self.started_at = started_at


class Dispatch(Lease):
    """Start an attempt: hand this lease to an executor or worker of its pool (and group)."""

    __slots__ = ()

    @property
    def lease(self) -> Lease:
        return self


@dataclass(slots=True)
class Abort:
    """Stop the attempt behind ``lease_id`` (timeout, cancellation, lease expiry)."""

    lease_id: int
    task_id: int
    reason: str
    """An ``AbortReason`` when the engine stopped the attempt by itself, else the text of what
    ended the task (a cancellation's message, for example)."""

    def __init__(self, lease_id: int, task_id: int, reason: str) -> None:
        self.lease_id = lease_id
        self.task_id = task_id
        self.reason = reason


class AbortReason(StrEnum):
    """Why the engine stops an attempt by itself (the text is what workers are told)."""

    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease expired"
    """No heartbeat within the lease's TTL: the worker holding it is stalled or cut off."""


@dataclass(slots=True)
class Resolve:
    """A task reached a terminal status: publish its event and resolve anything awaiting it."""

    id: int
    pool: str
    key: str | None
    status: TaskStatus
    attempt: int
    at: int
    message: str | None = None
    output: Opaque = None
    has_output: bool = False

    def __init__(
        self,
        id: int,
        pool: str,
        key: str | None,
        status: TaskStatus,
        attempt: int,
        at: int,
        message: str | None = None,
        output: Opaque = None,
        has_output: bool = False,
    ) -> None:
        self.id = id
        self.pool = pool
        self.key = key
        self.status = status
        self.attempt = attempt
        self.at = at
        self.message = message
        self.output = output
        self.has_output = has_output

    @property
    def event(self) -> StatusEvent:
        return StatusEvent(self.id, self.pool, self.key, self.status, self.attempt, self.at, self.message)


@dataclass(frozen=True, slots=True)
class Scale:
    pool: str
    desired: int


@dataclass(slots=True)
class StepOutput:
    """Everything one engine step asks of its driver, by kind, each list in the order it arose.

    ``mutations`` are committed in one transaction before anything else is acted on.
    """

    mutations: list[Mutation] = field(default_factory=list)
    dispatches: list[Dispatch] = field(default_factory=list)
    """Attempts to start."""
    aborts: list[Abort] = field(default_factory=list)
    """Attempts to stop."""
    resolves: list[Resolve] = field(default_factory=list)
    """Tasks that reached a terminal status."""
    events: list[StatusEvent] = field(default_factory=list)
    """Intermediate transitions (only with ``emit_transitions``); terminal ones are ``resolves``."""
    scales: list[Scale] = field(default_factory=list)
    """Autoscaler decisions: the desired worker count of a pool."""
    space: list[str | None] = field(default_factory=list)
    """Pools (None: the global bound) that had refused a submission with Full and have room again."""

    def __bool__(self) -> bool:
        return bool(
            self.mutations
            or self.dispatches
            or self.aborts
            or self.resolves
            or self.events
            or self.scales
            or self.space
        )


# ---------------------------------------------------------------------------------------------
# Recovery input for Core.restore()


@dataclass(slots=True)
class RecoveredTask:
    record: TaskRecord
    status: TaskStatus
    attempt: int
    message: str | None = None
    started_at: int | None = None
    finished_at: int | None = None
    retry_at: int | None = None
    has_output: bool = False

    def __init__(
        self,
        record: TaskRecord,
        status: TaskStatus,
        attempt: int,
        message: str | None = None,
        started_at: int | None = None,
        finished_at: int | None = None,
        retry_at: int | None = None,
        has_output: bool = False,
    ) -> None:
        self.record = record
        self.status = status
        self.attempt = attempt
        self.message = message
        self.started_at = started_at
        self.finished_at = finished_at
        self.retry_at = retry_at
        self.has_output = has_output


@dataclass(frozen=True, slots=True)
class RecoveredRecurring:
    spec: RecurringSpec
    next_at: int | None
    last_task_id: int | None
    paused: bool = False


@dataclass(slots=True)
class Recovered:
    tasks: list[RecoveredTask] = field(default_factory=list)
    recurring: list[RecoveredRecurring] = field(default_factory=list)
    id_high_water: int = 0
    lease_high_water: int = 0
    quarantined: int = 0
    """Rows the store could not decode: tasks it dead-lettered and schedules it skipped."""
