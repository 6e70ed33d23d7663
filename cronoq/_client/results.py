"""The dataclasses calls return (built from their wire messages) and the ``Lease`` a handler gets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cronoq._client.common import Payload
from cronoq._client.encoding import overlap_text, priority_text, status_text
from cronoq.proto import cronoq_pb2 as pb

_NS_PER_S = 1_000_000_000
_TERMINAL = frozenset({"succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"})


def _ns_to_s(ns: int) -> float:
    return ns / _NS_PER_S


def _optional_s(message: Any, name: str) -> float | None:
    return _ns_to_s(getattr(message, name)) if message.HasField(name) else None


@dataclass(frozen=True)
class Result:
    """The outcome of a finished task. ``output`` is None when there is none."""

    id: int
    status: str
    output: bytes | None
    message: str = ""
    output_available: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def json(self) -> Any:
        """The output decoded as JSON (``None`` for an empty output); ValueError without output."""
        if self.output is None:
            raise ValueError(f"task {self.id} has no output (status {self.status})")
        if not self.output:
            return None
        return json.loads(self.output)

    def text(self) -> str:
        return "" if self.output is None else self.output.decode("utf-8")

    @classmethod
    def from_pb(cls, m: pb.TaskResult) -> Result:
        return cls(
            id=m.id,
            status=status_text(m.status),
            output=m.output if m.HasField("output") else None,
            message=m.message,
            output_available=m.output_available,
        )


@dataclass(frozen=True)
class Submitted:
    """A submission's answer: the task id, whether the key already existed, and the result if waited."""

    id: int
    duplicate: bool
    result: Result | None = None

    @classmethod
    def from_pb(cls, m: pb.SubmitResponse, *, with_result: bool = True) -> Submitted:
        result = Result.from_pb(m.result) if with_result and m.HasField("result") else None
        return cls(id=m.id, duplicate=m.duplicate, result=result)


@dataclass(frozen=True)
class TaskInfo:
    """What the server knows about a task. Times are Unix seconds."""

    id: int
    status: str
    pool: str = ""
    key: str = ""
    kind: str = ""
    attempt: int = 0
    max_attempts: int = 0
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    message: str = ""
    output_available: bool = False
    tenant: str = ""
    priority: str | None = None

    @property
    def done(self) -> bool:
        return self.status in _TERMINAL

    @classmethod
    def from_pb(cls, m: pb.TaskInfo) -> TaskInfo:
        return cls(
            id=m.id,
            status=status_text(m.status),
            pool=m.pool,
            key=m.key,
            kind=m.kind,
            attempt=m.attempt,
            max_attempts=m.max_attempts,
            created_at=_optional_s(m, "created_unix_ns"),
            started_at=_optional_s(m, "started_unix_ns"),
            finished_at=_optional_s(m, "finished_unix_ns"),
            message=m.message,
            output_available=m.output_available,
            tenant=m.tenant,
            priority=priority_text(m.priority),
        )


@dataclass(frozen=True)
class TaskPage:
    """One page of ``list_tasks``; ``next_after`` is the cursor of the next page, None on the last."""

    tasks: tuple[TaskInfo, ...]
    next_after: int | None
    unavailable_shards: tuple[str, ...] = ()

    @classmethod
    def from_pb(cls, m: pb.ListTasksResponse) -> TaskPage:
        return cls(
            tasks=tuple(TaskInfo.from_pb(t) for t in m.tasks),
            next_after=m.next_after or None,
            unavailable_shards=tuple(m.unavailable_shards),
        )


@dataclass(frozen=True)
class WorkerInfo:
    """A connected worker; ``connected_at`` is Unix seconds."""

    id: int
    name: str
    pool: str
    labels: dict[str, str]
    slots: int
    busy: int
    connected_at: float

    @classmethod
    def from_pb(cls, m: pb.WorkerInfo) -> WorkerInfo:
        return cls(
            id=m.id,
            name=m.name,
            pool=m.pool,
            labels=dict(m.labels),
            slots=m.slots,
            busy=m.busy,
            connected_at=_ns_to_s(m.connected_unix_ns),
        )


@dataclass(frozen=True)
class RecurringInfo:
    """A recurring schedule. ``tz`` empty means UTC; ``next_at`` is Unix seconds."""

    name: str
    cron: str
    tz: str
    pool: str
    kind: str
    overlap: str
    next_at: float | None
    last_task_id: int | None

    @classmethod
    def from_pb(cls, m: pb.RecurringInfo) -> RecurringInfo:
        return cls(
            name=m.name,
            cron=m.cron,
            tz=m.tz,
            pool=m.pool,
            kind=m.kind,
            overlap=overlap_text(m.overlap),
            next_at=_optional_s(m, "next_unix_ns"),
            last_task_id=m.last_task_id if m.HasField("last_task_id") else None,
        )


@dataclass(frozen=True)
class Event:
    """A task status change from ``Client.watch``; ``at`` is Unix seconds."""

    id: int
    pool: str
    key: str
    status: str
    attempt: int
    at: float
    message: str

    @classmethod
    def from_pb(cls, m: pb.StatusEvent) -> Event:
        return cls(
            id=m.id,
            pool=m.pool,
            key=m.key,
            status=status_text(m.status),
            attempt=m.attempt,
            at=_ns_to_s(m.at_unix_ns),
            message=m.message,
        )


@dataclass(frozen=True)
class WorkerGroup:
    """Connected workers of a pool that share one label set."""

    labels: Mapping[str, str]
    capacity: int
    busy: int

    @classmethod
    def from_pb(cls, m: pb.WorkerGroup) -> WorkerGroup:
        return cls(labels=dict(m.labels), capacity=m.capacity, busy=m.busy)


@dataclass(frozen=True)
class PoolSnapshot:
    """One pool in a ``Snapshot``. Waits are seconds."""

    name: str
    capacity: int
    busy: int
    held: int
    desired: int
    pending_by_class: tuple[int, ...]
    reservations: int
    dispatched: int
    succeeded: int
    failed: int
    priority_adherence: float
    fixed_start_hit_rate: float
    utilization: float
    schedule_efficiency: float
    wait_p50: float
    wait_p90: float
    wait_p99: float
    cost: float
    workers_connected: int = 0
    groups: tuple[WorkerGroup, ...] = ()

    @property
    def pending(self) -> int:
        return sum(self.pending_by_class)

    @classmethod
    def from_pb(cls, m: pb.PoolSnapshot) -> PoolSnapshot:
        return cls(
            name=m.name,
            capacity=m.capacity,
            busy=m.busy,
            held=m.held,
            desired=m.desired,
            pending_by_class=tuple(m.pending_by_class),
            reservations=m.reservations,
            dispatched=m.dispatched,
            succeeded=m.succeeded,
            failed=m.failed,
            priority_adherence=m.priority_adherence,
            fixed_start_hit_rate=m.fixed_start_hit_rate,
            utilization=m.utilization,
            schedule_efficiency=m.schedule_efficiency,
            wait_p50=m.wait_p50_s,
            wait_p90=m.wait_p90_s,
            wait_p99=m.wait_p99_s,
            cost=m.cost,
            workers_connected=m.workers_connected,
            groups=tuple(WorkerGroup.from_pb(g) for g in m.groups),
        )


@dataclass(frozen=True)
class Totals:
    """Server-wide counters since start."""

    submitted: int = 0
    dispatched: int = 0
    succeeded: int = 0
    failed: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    skipped: int = 0
    missed: int = 0
    shed: int = 0
    retries: int = 0
    timeouts: int = 0
    lease_expiries: int = 0
    stale_completions: int = 0

    @classmethod
    def from_pb(cls, m: pb.Totals) -> Totals:
        return cls(
            submitted=m.submitted,
            dispatched=m.dispatched,
            succeeded=m.succeeded,
            failed=m.failed,
            dead_lettered=m.dead_lettered,
            cancelled=m.cancelled,
            skipped=m.skipped,
            missed=m.missed,
            shed=m.shed,
            retries=m.retries,
            timeouts=m.timeouts,
            lease_expiries=m.lease_expiries,
            stale_completions=m.stale_completions,
        )


@dataclass(frozen=True)
class Snapshot:
    """The server's state: pools, task counts and totals."""

    pools: tuple[PoolSnapshot, ...]
    live_tasks: int
    running: int
    pending: int
    totals: Totals = field(default_factory=Totals)
    workers_connected: int = 0
    unavailable_shards: tuple[str, ...] = ()

    def pool(self, name: str) -> PoolSnapshot | None:
        for p in self.pools:
            if p.name == name:
                return p
        return None

    @classmethod
    def from_pb(cls, m: pb.SnapshotResponse) -> Snapshot:
        return cls(
            pools=tuple(PoolSnapshot.from_pb(p) for p in m.pools),
            live_tasks=m.live_tasks,
            running=m.running,
            pending=m.pending,
            totals=Totals.from_pb(m.totals),
            workers_connected=m.workers_connected,
            unavailable_shards=tuple(m.unavailable_shards),
        )


@dataclass
class Lease:
    """One attempt handed to a worker handler. ``id`` is the lease number, not the task id.

    ``timeout`` is seconds, ``deadline`` Unix seconds; both None when the server sent none.
    ``cancelled`` is set when the attempt is aborted (the handler's task is cancelled too).
    """

    id: int
    task_id: int
    attempt: int
    payload: bytes
    content_type: str
    kind: str
    key: str
    tags: dict[str, str]
    timeout: float | None
    deadline: float | None
    pool: str = ""
    priority: str | None = None
    lease_ttl: float | None = None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    def json(self) -> Any:
        """The payload decoded as JSON (``None`` when empty)."""
        if not self.payload:
            return None
        return json.loads(self.payload)

    def text(self) -> str:
        return self.payload.decode("utf-8")

    @classmethod
    def from_pb(cls, m: pb.Lease, default_pool: str) -> Lease:
        # Built for every lease: positional arguments, and no copy of an empty tag map.
        tags = m.tags
        return cls(
            m.lease,
            m.task_id,
            m.attempt,
            m.payload,
            m.content_type,
            m.kind,
            m.key,
            dict(tags) if tags else {},
            m.timeout_s if m.HasField("timeout_s") else None,
            m.deadline_unix_ns / _NS_PER_S if m.HasField("deadline_unix_ns") else None,
            m.pool or default_pool,
            priority_text(m.priority),
            m.lease_ttl_s if m.HasField("lease_ttl_s") else None,
        )


Handler = Callable[[Lease], Awaitable[Payload]]
