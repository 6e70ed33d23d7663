"""Talk to a cronoq server over gRPC: ``Client`` submits and follows tasks, ``Worker`` serves a pool.

Needs the ``client`` extra (``pip install "cronoq[client]"``), which brings grpcio and protobuf.
Everything here is asyncio-based (``grpc.aio``). Channels are opened lazily on the event loop that
first uses them and reopened when an object is used from another loop.

Errors: a failed RPC raises ``ClientError`` whose ``code`` is the lower-case gRPC status name
(``not_found``, ``unavailable``, ...); an expired deadline raises the builtin ``TimeoutError``.

A ``Worker`` opens one ``cronoq.v1.Workers/Work`` stream, registers for its pool and runs the
handler for every lease it receives. It announces batching (``Register.batch_bytes``): a cronoq
server that takes it up sends the leases ready at once in one message, and the Worker reports the
outcomes and heartbeats ready at once in one message; with any other server it speaks the
published one-message-per-lease protocol. The handler's outcome decides what is reported back:

* a return value (bytes, str, None or anything JSON-serialisable) completes the attempt;
* ``cronoq.Retryable`` fails it retryably (honouring ``retry_after``), ``cronoq.Permanent`` for good,
  any other exception retryably;
* ``Reject`` hands the lease back unrun, ``CancelTask`` ends the task as cancelled.

OpenTelemetry (when its API is installed; nothing of it is imported otherwise): a ``Client`` call
made while a span is active sends that span's context (``traceparent`` metadata, through the
global propagator), so the server links the tasks it admits to the caller's trace. A ``Worker``
runs each attempt inside a ``cronoq.task`` span (attributes ``task.id``, ``task.pool``,
``task.kind``, ``task.attempt``; error status when the attempt fails) parented to the lease's
``traceparent`` tag, on the application's global tracer provider; when the application set none,
attempts get no span at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import heapq
import inspect
import ipaddress
import itertools
import json
import logging
import math
import numbers
import warnings
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from urllib.parse import urlsplit

try:
    import grpc
    import grpc.aio

    from cronoq.proto import cronoq_pb2 as pb
    from cronoq.proto import cronoq_pb2_grpc
except ImportError as _missing:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "cronoq.client needs grpcio and protobuf; install the client extra: pip install 'cronoq[client]'"
    ) from _missing

from cronoq.errors import CronoqError, Permanent, Retryable
from cronoq.grpc_transport import prefer_poller_endpoints as prefer_poller_endpoints  # workers may opt in

# The generated service module carries no annotations.
pb_grpc: Any = cronoq_pb2_grpc

__all__ = [
    "PROTOCOL_VERSION",
    "CancelTask",
    "Client",
    "ClientError",
    "Event",
    "Lease",
    "PoolSnapshot",
    "RecurringInfo",
    "Reject",
    "Result",
    "Snapshot",
    "Submitted",
    "TaskInfo",
    "TaskPage",
    "Totals",
    "Worker",
    "WorkerGroup",
    "WorkerInfo",
    "task",
]

#: Worker protocol version sent in ``Register.protocol_version``.
PROTOCOL_VERSION = 3

#: How many shard redirects in a row a worker follows before giving up.
MAX_REDIRECTS = 3

Payload = bytes | bytearray | memoryview | str | dict[str, Any] | list[Any] | int | float | bool | None
TaskRef = int | str

log = logging.getLogger("cronoq.client")

_NS_PER_S = 1_000_000_000
_SHARD_ENDPOINT_KEY = "cronoq-shard-endpoint"
_RETRYABLE_CODES = frozenset({"unavailable", "resource_exhausted"})
_TERMINAL = frozenset({"succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"})
_REDIRECT_ONLY_OPTIONS = frozenset({"grpc.ssl_target_name_override", "grpc.default_authority"})
_OUTPUT_HEADROOM = 1024
_CLOSE_WAIT_S = 5.0
_SESSION_RESET_FACTOR = 10.0
_CLOSED_BY_SERVER = "stream closed by the server"
_GRPC_DEFAULT_RECEIVE = 4 * 1024 * 1024
"""gRPC's limit on a received message when the channel options set none."""
_BATCH_HEADROOM = 4096
"""Bytes a batch of outcomes leaves unused below the server's message limit."""
_WORK_METHOD = "/cronoq.v1.Workers/Work"


def _batch_tag(field: str) -> bytes:
    """The tag of ``WorkerBatch.<field>`` entries (a length-delimited field, number below 16)."""
    number = pb.WorkerBatch.DESCRIPTOR.fields_by_name[field].number
    return bytes([number << 3 | 2])


_BATCHED = {
    "heartbeat": _batch_tag("heartbeats"),
    "complete": _batch_tag("completes"),
    "fail": _batch_tag("fails"),
    "nack": _batch_tag("nacks"),
    "cancelled": _batch_tag("cancelled"),
}
"""The WorkerMessage kinds a batch carries, and the tag of their field in ``WorkerBatch``."""
_BATCH_FIELD_TAG = bytes([pb.WorkerMessage.DESCRIPTOR.fields_by_name["batch"].number << 3 | 2])


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _serialize_outgoing(message: pb.WorkerMessage | bytes) -> bytes:
    """What the Work stream sends: a message, or a batch already encoded (``_Session._batch``)."""
    return message if type(message) is bytes else message.SerializeToString()  # type: ignore[union-attr]


_PRIORITY_NAMES = ("critical", "high", "normal", "low")
_MISS_POLICIES = {
    "run_late": pb.MISS_POLICY_RUN_LATE,
    "skip": pb.MISS_POLICY_SKIP,
    "fail": pb.MISS_POLICY_FAIL,
}
_EDGE_CONDS = {
    "success": pb.EDGE_COND_ON_SUCCESS,
    "on_success": pb.EDGE_COND_ON_SUCCESS,
    "complete": pb.EDGE_COND_ON_COMPLETE,
    "on_complete": pb.EDGE_COND_ON_COMPLETE,
    "failure": pb.EDGE_COND_ON_FAILURE,
    "on_failure": pb.EDGE_COND_ON_FAILURE,
}
_OVERLAPS = {
    "skip": pb.OVERLAP_SKIP,
    "allow": pb.OVERLAP_ALLOW,
    "queue": pb.OVERLAP_QUEUE,
    "queue_on_success": pb.OVERLAP_QUEUE_ON_SUCCESS,
}
_FATAL_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


# ----------------------------------------------------------------------------------------- errors


class ClientError(CronoqError):
    """An RPC failed. ``code`` is the lower-case gRPC status name, ``message`` the server's details."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self) -> tuple[type[ClientError], tuple[str, str]]:
        return (type(self), (self.code, self.message))

    @property
    def retryable(self) -> bool:
        """True when trying again later may succeed (``unavailable``, ``resource_exhausted``)."""
        return self.code in _RETRYABLE_CODES

    @classmethod
    def from_rpc(cls, e: grpc.RpcError) -> ClientError:
        """Build from a failed gRPC call (its status code and details)."""
        code_fn = getattr(e, "code", None)
        code = code_fn() if callable(code_fn) else None
        details_fn = getattr(e, "details", None)
        details = details_fn() if callable(details_fn) else None
        name = getattr(code, "name", None)
        return cls(name.lower() if isinstance(name, str) else "unknown", details or "")


class Reject(CronoqError):
    """Raise from a worker handler to hand the lease back unrun, so another worker can take it."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason

    def __reduce__(self) -> tuple[type[Reject], tuple[str]]:
        return (type(self), (self.reason,))


class CancelTask(CronoqError):
    """Raise from a worker handler to end the task as cancelled (no retry)."""


def _rpc_error(e: grpc.aio.AioRpcError) -> Exception:
    """The exception a failed call surfaces as: ``TimeoutError`` for deadlines, else ``ClientError``."""
    code = e.code()
    details = e.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
        code == grpc.StatusCode.CANCELLED and "timeout expired" in details.lower()
    ):
        return TimeoutError(details or "deadline exceeded")
    return ClientError.from_rpc(e)


# ------------------------------------------------------------------------------- enum conversions


def _enum_text(enum: Any, number: int, prefix: str) -> str:
    try:
        name: str = enum.Name(number)
    except ValueError:
        return str(number)
    return name.removeprefix(prefix).lower()


def _status_text(number: int) -> str:
    return _enum_text(pb.TaskStatus, number, "TASK_STATUS_")


def _priority_text(number: int) -> str | None:
    if number == pb.PRIORITY_UNSPECIFIED:
        return None
    # Every lease carries a priority: look the few names up once.
    text = _PRIORITY_TEXT.get(number)
    if text is None:
        text = _PRIORITY_TEXT[number] = _enum_text(pb.Priority, number, "PRIORITY_")
    return text


_PRIORITY_TEXT: dict[int, str] = {}


def _overlap_text(number: int) -> str:
    if number == pb.OVERLAP_UNSPECIFIED:
        return "skip"
    return _enum_text(pb.Overlap, number, "OVERLAP_")


def _priority_to_wire(value: Any) -> int:
    """``None`` → normal; a name (any case) or a class index 0..3 (int or ``cronoq.Priority``)."""
    if value is None:
        return pb.PRIORITY_NORMAL
    if isinstance(value, str):
        name = value.strip().lower()
        if name in _PRIORITY_NAMES:
            return _PRIORITY_NAMES.index(name) + 1
        raise ValueError(f"unknown priority {value!r}: expected critical, high, normal or low")
    if isinstance(value, bool):
        raise ValueError(f"unknown priority {value!r}")
    if not isinstance(value, numbers.Number) and hasattr(value, "__int__"):
        value = int(value)  # a priority-like object (e.g. a native Priority) that converts to its index
    if isinstance(value, int) and 0 <= value < len(_PRIORITY_NAMES):
        return value + 1
    raise ValueError(f"unknown priority {value!r}: expected a name or a class index 0..3")


def _status_to_wire(name: str) -> int:
    if not isinstance(name, str):
        raise TypeError(f"a status filter is a name, not {type(name).__name__}")
    upper = name.strip().upper()
    if upper == "UNSPECIFIED":
        raise ValueError(f"unknown task status {name!r}")
    try:
        return int(pb.TaskStatus.Value(f"TASK_STATUS_{upper}"))
    except ValueError:
        raise ValueError(f"unknown task status {name!r}") from None


def _from_table(table: Mapping[str, Any], value: str, what: str) -> Any:
    if not isinstance(value, str) or value.strip().lower() not in table:
        choices = ", ".join(sorted({k.removeprefix("on_") for k in table}))
        raise ValueError(f"unknown {what} {value!r}: expected one of {choices}")
    return table[value.strip().lower()]


# ------------------------------------------------------------------------------- value encoding


def _encode_value(value: Any) -> tuple[bytes, str]:
    """Bytes and default content type of a payload or handler output (see the module docs)."""
    if value is None:
        return b"", ""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value), "application/octet-stream"
    if isinstance(value, str):
        return value.encode("utf-8"), "text/plain; charset=utf-8"
    return json.dumps(value).encode("utf-8"), "application/json"


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{what} must be finite")
    return seconds


def _unix_ns(value: Any, what: str) -> int:
    """An aware ``datetime`` or Unix seconds → integer Unix nanoseconds."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"{what} must be a timezone-aware datetime (or Unix seconds)")
        since = value - _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
        return (since // _dt.timedelta(microseconds=1)) * 1000
    return int(_seconds(value, what) * 1e9)


def _task_ref(ref: Any) -> pb.TaskRef:
    if isinstance(ref, bool) or not isinstance(ref, int | str):
        raise TypeError(f"a task reference is an id (int) or a key (str), not {type(ref).__name__}")
    if isinstance(ref, int):
        return pb.TaskRef(id=ref)
    return pb.TaskRef(key=ref)


def _retry_to_wire(retry: Any) -> pb.RetryPolicy:
    if isinstance(retry, Mapping):

        def get(name: str, default: Any) -> Any:
            return retry.get(name, default)
    else:

        def get(name: str, default: Any) -> Any:
            return getattr(retry, name, default)

    return pb.RetryPolicy(
        max_attempts=int(get("max_attempts", 3)),
        initial_backoff_s=float(get("initial_backoff", 0.0)),
        multiplier=float(get("multiplier", 0.0)),
        max_backoff_s=float(get("max_backoff", 0.0)),
        jitter=bool(get("jitter", True)),
    )


def _dep_to_wire(dep: Any) -> pb.Dep:
    if isinstance(dep, Mapping):
        if "ref" not in dep:
            raise ValueError("a dependency mapping needs a 'ref' key")
        ref, cond = dep["ref"], dep.get("cond", "on_success")
    elif isinstance(dep, tuple) and len(dep) == 2:
        ref, cond = dep
    else:
        raise TypeError(f"a dependency is a (ref, cond) tuple or a mapping with 'ref'/'cond', not {dep!r}")
    return pb.Dep(target=_task_ref(ref), cond=_from_table(_EDGE_CONDS, cond, "dependency condition"))


def _str_map(values: Mapping[Any, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (values or {}).items()}


def task(
    payload: Payload = None,
    *,
    pool: str | None = None,
    kind: str | None = None,
    priority: Any = None,
    key: str | None = None,
    deadline_in: float | None = None,
    deadline_at: _dt.datetime | float | None = None,
    start_in: float | None = None,
    start_at: _dt.datetime | float | None = None,
    tolerance: float | None = None,
    on_miss: str | None = None,
    duration_hint: float | None = None,
    timeout: float | None = None,
    retry: Any = None,
    after: TaskRef | Iterable[TaskRef] | None = None,
    deps: Iterable[tuple[TaskRef, str] | Mapping[str, Any]] = (),
    resources: Mapping[str, int] | None = None,
    tags: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    tenant: str | None = None,
    content_type: str | None = None,
) -> pb.TaskSpec:
    """Build the wire ``TaskSpec`` for one task (for ``Client.submit_batch`` or ``add_recurring``).

    ``payload`` is encoded as bytes (as-is), str (UTF-8), None (empty) or JSON, with a matching
    content type unless ``content_type`` is given. Durations are seconds; ``*_at`` times are Unix
    seconds or aware datetimes. ``after`` adds on-success dependencies; ``deps`` takes
    ``(ref, cond)`` pairs or ``{"ref": ..., "cond": ...}`` mappings.
    """
    if deadline_in is not None and deadline_at is not None:
        raise ValueError("give deadline_in or deadline_at, not both")
    if start_in is not None and start_at is not None:
        raise ValueError("give start_in or start_at, not both")
    data, default_type = _encode_value(payload)
    spec = pb.TaskSpec(
        payload=data,
        content_type=default_type if content_type is None else content_type,
        priority=_priority_to_wire(priority),  # type: ignore[arg-type]
    )
    if pool is not None:
        spec.pool = pool
    if kind is not None:
        spec.kind = kind
    if key is not None:
        spec.key = key
    if tenant is not None:
        spec.tenant = tenant
    if deadline_in is not None:
        spec.deadline_in_s = _seconds(deadline_in, "deadline_in")
    if deadline_at is not None:
        spec.deadline_unix_ns = _unix_ns(deadline_at, "deadline_at")
    if start_in is not None:
        spec.start_in_s = _seconds(start_in, "start_in")
    if start_at is not None:
        spec.start_unix_ns = _unix_ns(start_at, "start_at")
    if tolerance is not None:
        spec.tolerance_s = _seconds(tolerance, "tolerance")
    if on_miss is not None:
        spec.on_miss = _from_table(_MISS_POLICIES, on_miss, "on_miss policy")
    if duration_hint is not None:
        spec.duration_hint_s = _seconds(duration_hint, "duration_hint")
    if timeout is not None:
        spec.timeout_s = _seconds(timeout, "timeout")
    if retry is not None:
        spec.retry.CopyFrom(_retry_to_wire(retry))
    if after is not None:
        refs: Iterable[Any] = [after] if isinstance(after, int | str) else after
        for ref in refs:
            spec.deps.append(pb.Dep(target=_task_ref(ref), cond=pb.EDGE_COND_ON_SUCCESS))
    for dep in deps:
        spec.deps.append(_dep_to_wire(dep))
    for name, units in (resources or {}).items():
        spec.resources[str(name)] = int(units)
    spec.tags.update(_str_map(tags))
    spec.labels.update(_str_map(labels))
    return spec


# ------------------------------------------------------------------------------ result dataclasses


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
    def _from_pb(cls, m: pb.TaskResult) -> Result:
        return cls(
            id=m.id,
            status=_status_text(m.status),
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
    def _from_pb(cls, m: pb.SubmitResponse, *, with_result: bool = True) -> Submitted:
        result = Result._from_pb(m.result) if with_result and m.HasField("result") else None
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
    def _from_pb(cls, m: pb.TaskInfo) -> TaskInfo:
        return cls(
            id=m.id,
            status=_status_text(m.status),
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
            priority=_priority_text(m.priority),
        )


@dataclass(frozen=True)
class TaskPage:
    """One page of ``list_tasks``; ``next_after`` is the cursor of the next page, None on the last."""

    tasks: tuple[TaskInfo, ...]
    next_after: int | None
    unavailable_shards: tuple[str, ...] = ()

    @classmethod
    def _from_pb(cls, m: pb.ListTasksResponse) -> TaskPage:
        return cls(
            tasks=tuple(TaskInfo._from_pb(t) for t in m.tasks),
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
    def _from_pb(cls, m: pb.WorkerInfo) -> WorkerInfo:
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
    def _from_pb(cls, m: pb.RecurringInfo) -> RecurringInfo:
        return cls(
            name=m.name,
            cron=m.cron,
            tz=m.tz,
            pool=m.pool,
            kind=m.kind,
            overlap=_overlap_text(m.overlap),
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
    def _from_pb(cls, m: pb.StatusEvent) -> Event:
        return cls(
            id=m.id,
            pool=m.pool,
            key=m.key,
            status=_status_text(m.status),
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
    def _from_pb(cls, m: pb.WorkerGroup) -> WorkerGroup:
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
    def _from_pb(cls, m: pb.PoolSnapshot) -> PoolSnapshot:
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
            groups=tuple(WorkerGroup._from_pb(g) for g in m.groups),
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
    def _from_pb(cls, m: pb.Totals) -> Totals:
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
    def _from_pb(cls, m: pb.SnapshotResponse) -> Snapshot:
        return cls(
            pools=tuple(PoolSnapshot._from_pb(p) for p in m.pools),
            live_tasks=m.live_tasks,
            running=m.running,
            pending=m.pending,
            totals=Totals._from_pb(m.totals),
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
    def _from_pb(cls, m: pb.Lease, default_pool: str) -> Lease:
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
            _priority_text(m.priority),
            m.lease_ttl_s if m.HasField("lease_ttl_s") else None,
        )


Handler = Callable[[Lease], Awaitable[Payload]]


# ---------------------------------------------------------------------------- targets and channels


def _receive_limit(options: Sequence[tuple[str, Any]]) -> int:
    """The largest message a channel with ``options`` accepts (what a Worker announces as its
    ``batch_bytes``): gRPC's default unless the options set ``grpc.max_receive_message_length``."""
    limit = _GRPC_DEFAULT_RECEIVE
    for key, value in options:
        if key == "grpc.max_receive_message_length" and isinstance(value, int):
            limit = value if value > 0 else 2**31 - 1  # -1: no limit
    return limit


def _strip_target(target: str) -> str:
    """The gRPC address of a target: scheme prefix (http/https/grpc) and trailing slashes removed."""
    lowered = target.lower()
    for prefix in ("http://", "https://", "grpc://"):
        if lowered.startswith(prefix):
            target = target[len(prefix) :]
            break
    return target.rstrip("/")


def _wants_tls(target: str, tls: bool, credentials: Any) -> bool:
    """A secure channel is used with ``tls=True``, explicit credentials, or an ``https://`` target."""
    return bool(tls) or credentials is not None or target.lower().startswith("https://")


def _open_channel(target: str, *, secure: bool, credentials: Any, options: Sequence[tuple[str, Any]]) -> Any:
    address = _strip_target(target)
    if secure:
        creds = credentials if credentials is not None else grpc.ssl_channel_credentials()
        return grpc.aio.secure_channel(address, creds, options=list(options))
    return grpc.aio.insecure_channel(address, options=list(options))


def _auth_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token else None


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_redirect(
    endpoint: str,
    *,
    current_target: str,
    tls: bool,
    credentials: Any,
    token: str | None,
    insecure_redirect_http: bool,
    followed: int,
) -> bool:
    """Decide whether a worker may follow a shard redirect to ``endpoint``.

    ``followed`` is how many redirects were followed in a row before this one. Returns True when the
    redirect is allowed but sends the token over plain http to another host (log a warning), False
    when it is simply allowed; raises ``ClientError("failed_precondition", ...)`` when refused.
    """
    lowered = endpoint.lower()
    if not (lowered.startswith("http://") or lowered.startswith("https://")):
        raise ClientError("failed_precondition", f"shard redirect to unsupported endpoint {endpoint!r}")
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
    except ValueError:
        raise ClientError("failed_precondition", f"shard redirect to malformed endpoint {endpoint!r}") from None
    if not parts.netloc or "@" in parts.netloc or not host:
        raise ClientError("failed_precondition", f"shard redirect to malformed endpoint {endpoint!r}")
    if followed >= MAX_REDIRECTS:
        raise ClientError(
            "failed_precondition", f"too many shard redirects in a row ({followed + 1}); last to {endpoint}"
        )
    if lowered.startswith("http://"):
        if _wants_tls(current_target, tls, credentials):
            raise ClientError("failed_precondition", f"refusing shard redirect from TLS to plain {endpoint}")
        if token and not _is_loopback(host):
            if not insecure_redirect_http:
                raise ClientError(
                    "failed_precondition",
                    f"refusing to send the token over plain http to {endpoint} "
                    "(pass insecure_redirect_http=True on trusted networks)",
                )
            return True
    return False


def _metadata_value(metadata: Any, key: str) -> str | None:
    if not metadata:
        return None
    for item in metadata:
        try:
            k, v = item
        except (TypeError, ValueError):
            continue
        if isinstance(k, str) and k.lower() == key and isinstance(v, str):
            return v
    return None


def _redirect_endpoint(e: grpc.aio.AioRpcError) -> str | None:
    """The shard endpoint a ``FAILED_PRECONDITION`` on ``Work`` points at, if any."""
    if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    for getter in (e.trailing_metadata, e.initial_metadata):
        try:
            value = _metadata_value(getter(), _SHARD_ENDPOINT_KEY)
        except Exception:  # metadata may be unavailable on some error paths
            value = None
        if value:
            return value
    return None


def _heartbeat_interval(lease_ttl: float | None, registered_ttl: float | None) -> float | None:
    """Seconds between heartbeats of one lease, or None when no TTL is known (no heartbeats).

    The lease's own TTL wins when present and non-zero, else the TTL from ``Registered``.
    """
    ttl = lease_ttl if lease_ttl else registered_ttl
    if not ttl or ttl <= 0:
        return None
    return max(ttl / 3.0, 0.01)


def _not_a_str(values: Any, what: str) -> None:
    if isinstance(values, str | bytes):
        raise TypeError(f"{what} must be a sequence of names, not a single string")


# --------------------------------------------------------------------------------- OpenTelemetry

#: The tag (and call metadata) carrying a W3C trace context; the attempt span's name.
_TRACEPARENT = "traceparent"
_SPAN_NAME = "cronoq.task"

# ``opentelemetry.trace`` once looked up: a module, or False when the API is not installed. The
# client never imports the SDK; it uses whatever provider and propagator the application set.
_otel_trace: Any = None
_otel_propagate: Any = None


def _trace_api() -> Any | None:
    """``opentelemetry.trace``, or None without the OpenTelemetry API (the import is tried once)."""
    global _otel_trace
    if _otel_trace is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _otel_trace = False
        else:
            _otel_trace = trace
    return _otel_trace or None


def _propagate_api() -> Any:
    """``opentelemetry.propagate`` (imported only once a span or a traced lease needs it)."""
    global _otel_propagate
    if _otel_propagate is None:
        from opentelemetry import propagate

        _otel_propagate = propagate
    return _otel_propagate


def _trace_metadata() -> list[tuple[str, str]]:
    """The current span's context as call metadata (``traceparent``, ...); empty without a span."""
    trace = _trace_api()
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return []
    carrier: dict[str, str] = {}
    _propagate_api().inject(carrier)
    return [(key.lower(), value) for key, value in carrier.items() if isinstance(value, str)]


def _attempt_tracer() -> Any | None:
    """A tracer of the application's tracer provider, or None when it set none (then attempts
    cost no span at all rather than a non-recording one)."""
    trace = _trace_api()
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("cronoq.client")


# ---------------------------------------------------------------------------------------- Client


class Client:
    """Submit tasks to a cronoq server and follow them (``cronoq.v1.Tasks`` and ``Admin``).

    Use as ``async with Client("localhost:7070", token=...) as c: ...`` or call ``close()``.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: bool = False,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] | None = None,
    ) -> None:
        self.target = target
        self._token = token or None
        self._secure = _wants_tls(target, tls, credentials)
        self._credentials = credentials
        self._options = list(options or ())
        self._metadata = _auth_metadata(self._token)
        self._channel: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: Any = None
        self._admin: Any = None

    def __repr__(self) -> str:
        return f"Client({self.target!r})"

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _stubs(self) -> tuple[Any, Any]:
        loop = asyncio.get_running_loop()
        if self._channel is None or self._loop is not loop:
            self._channel = _open_channel(
                self.target, secure=self._secure, credentials=self._credentials, options=self._options
            )
            self._loop = loop
            self._tasks = pb_grpc.TasksStub(self._channel)
            self._admin = pb_grpc.AdminStub(self._channel)
        return self._tasks, self._admin

    async def close(self) -> None:
        """Close the channel (a later call opens a new one)."""
        channel, loop = self._channel, self._loop
        self._channel = self._loop = self._tasks = self._admin = None
        if channel is not None and loop is asyncio.get_running_loop():
            await channel.close()

    def _call_metadata(self) -> tuple[tuple[str, str], ...] | None:
        """Authorization plus, while an OpenTelemetry span is active, its trace context, so the
        server links what the call does (e.g. the tasks it admits) to the caller's trace."""
        traced = _trace_metadata()
        if not traced:
            return self._metadata
        return (*(self._metadata or ()), *traced)

    async def _call(self, service: str, method: str, request: Any, timeout: float | None = None) -> Any:
        tasks, admin = self._stubs()
        stub = tasks if service == "tasks" else admin
        try:
            return await getattr(stub, method)(request, timeout=timeout, metadata=self._call_metadata())
        except grpc.aio.AioRpcError as e:
            raise _rpc_error(e) from e

    async def submit(
        self,
        payload: Payload = None,
        *,
        wait: bool = False,
        wait_timeout: float | None = None,
        call_timeout: float | None = None,
        **opts: Any,
    ) -> Submitted:
        """Submit one task (``opts`` are the ``task()`` keywords); with ``wait=True`` also its result."""
        if wait_timeout is not None and not wait:
            raise ValueError("wait_timeout needs wait=True")
        request = pb.SubmitRequest(task=task(payload, **opts), wait=wait)
        if wait_timeout is not None:
            request.wait_timeout_s = _seconds(wait_timeout, "wait_timeout")
            if call_timeout is None:
                call_timeout = request.wait_timeout_s + 5.0
        response = await self._call("tasks", "Submit", request, call_timeout)
        return Submitted._from_pb(response)

    async def submit_batch(self, tasks: Sequence[pb.TaskSpec]) -> list[Submitted]:
        """Submit several ``task()`` specs atomically; they may depend on each other's keys."""
        response = await self._call("tasks", "SubmitBatch", pb.SubmitBatchRequest(tasks=list(tasks)))
        return [Submitted._from_pb(t, with_result=False) for t in response.tasks]

    async def cancel(self, ref: TaskRef) -> bool:
        """Cancel a task by id or key; False when it had already finished."""
        response = await self._call("tasks", "Cancel", pb.CancelRequest(task=_task_ref(ref)))
        return bool(response.cancelled)

    async def get(self, ref: TaskRef) -> TaskInfo:
        response = await self._call("tasks", "Get", pb.GetRequest(task=_task_ref(ref)))
        return TaskInfo._from_pb(response)

    async def list_tasks(
        self, *, pools: Sequence[str] = (), statuses: Sequence[str] = (), after: int = 0, limit: int = 0
    ) -> TaskPage:
        """One page of tasks in id order, after the exclusive id cursor ``after``."""
        _not_a_str(pools, "pools")
        _not_a_str(statuses, "statuses")
        request = pb.ListTasksRequest(
            pools=list(pools),
            statuses=[_status_to_wire(s) for s in statuses],  # type: ignore[misc]
            after=after,
            limit=limit,
        )
        return TaskPage._from_pb(await self._call("tasks", "ListTasks", request))

    async def iter_tasks(
        self, *, pools: Sequence[str] = (), statuses: Sequence[str] = (), page_size: int = 0
    ) -> AsyncIterator[TaskInfo]:
        """Every matching task, fetching pages as needed."""
        cursor = 0
        while True:
            page = await self.list_tasks(pools=pools, statuses=statuses, after=cursor, limit=page_size)
            for info in page.tasks:
                yield info
            if page.next_after is None:
                return
            cursor = page.next_after

    async def wait(self, ref: TaskRef, timeout: float | None = None) -> Result:
        """Wait for a task to finish; ``TimeoutError`` if it does not within ``timeout`` seconds."""
        request = pb.WaitRequest(task=_task_ref(ref))
        deadline = None
        if timeout is not None:
            request.timeout_s = _seconds(timeout, "timeout")
            deadline = request.timeout_s + 5.0
        return Result._from_pb(await self._call("tasks", "Wait", request, deadline))

    async def watch(
        self,
        pools: Iterable[str] | None = None,
        *,
        ids: Iterable[int] | None = None,
        keys: Iterable[str] | None = None,
        all_transitions: bool = False,
    ) -> AsyncIterator[Event]:
        """Stream status events (terminal ones only unless ``all_transitions``), filtered by the args."""
        _not_a_str(pools, "pools")
        _not_a_str(keys, "keys")
        request = pb.WatchRequest(
            pools=list(pools or ()), ids=list(ids or ()), keys=list(keys or ()), all_transitions=all_transitions
        )
        tasks, _ = self._stubs()
        call = tasks.Watch(request, metadata=self._call_metadata())
        try:
            while True:
                try:
                    message = await call.read()
                except grpc.aio.AioRpcError as e:
                    if e.code() == grpc.StatusCode.CANCELLED:
                        return
                    raise _rpc_error(e) from e
                if message is grpc.aio.EOF:
                    return
                yield Event._from_pb(message)
        finally:
            call.cancel()

    async def snapshot(self) -> Snapshot:
        return Snapshot._from_pb(await self._call("admin", "Snapshot", pb.Empty()))

    async def add_recurring(
        self,
        name: str,
        cron: str,
        payload: Payload | pb.TaskSpec = None,
        *,
        tz: str | None = None,
        overlap: str = "skip",
        **opts: Any,
    ) -> None:
        """Add (or replace) a cron schedule; each occurrence submits the template task."""
        if isinstance(payload, pb.TaskSpec):
            if opts:
                raise TypeError("give task options or a prebuilt TaskSpec, not both")
            template = payload
        else:
            template = task(payload, **opts)
        request = pb.RecurringRequest(
            name=name,
            cron=cron,
            tz=tz or "",
            template=template,
            overlap=_from_table(_OVERLAPS, overlap, "overlap policy"),
        )
        await self._call("admin", "AddRecurring", request)

    async def remove_recurring(self, name: str) -> bool:
        response = await self._call("admin", "RemoveRecurring", pb.RemoveRecurringRequest(name=name))
        return bool(response.removed)

    async def list_workers(self) -> list[WorkerInfo]:
        response = await self._call("admin", "ListWorkers", pb.Empty())
        return [WorkerInfo._from_pb(w) for w in response.workers]

    async def list_recurring(self) -> list[RecurringInfo]:
        response = await self._call("admin", "ListRecurring", pb.Empty())
        return [RecurringInfo._from_pb(r) for r in response.schedules]


# ---------------------------------------------------------------------------------------- Worker


@dataclass(eq=False, slots=True)
class _Running:
    """A lease being served: its handler task and why we cancelled it (None: we did not).

    ``serial`` tells this record apart from any later one for the same lease id."""

    lease: Lease
    serial: int
    task: asyncio.Task[None] | None = None
    stopped_by: str | None = None
    error: BaseException | None = None  # what the handler raised, for the attempt's span


# Leases due for a heartbeat a little early are beaten now rather than re-arming the timer for
# a sliver of time (event loops may fire a timer up to their clock resolution early).
_BEAT_EARLY_S = 0.001


class _Heartbeats:
    """The heartbeats of one stream's leases, driven by a single loop timer.

    A timer task per lease costs a task, a timer and a cancellation for every lease even when the
    handler finishes long before its first beat is due. Here a lease costs one heap entry: the
    timer fires for the earliest due beat, sends the beats of leases still running and schedules
    their next ones; entries of leases that ended are dropped when they come up (or compacted).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, send: Callable[[pb.WorkerMessage], None],
                 still_running: Callable[[int, int], bool]) -> None:  # fmt: skip
        self._loop = loop
        self._send = send
        self._still_running = still_running
        self._due: list[tuple[float, int, int, float]] = []  # (when, serial, lease id, period)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def add(self, lease_id: int, serial: int, period: float, running: int) -> None:
        """Beat ``lease_id`` every ``period`` seconds from one period on, while it still runs."""
        due = self._due
        if len(due) > 4 * running + 1024:
            # Many ended leases wait in the heap for a beat they will not get: drop them now.
            due[:] = [entry for entry in due if self._still_running(entry[2], entry[1])]
            heapq.heapify(due)
        when = self._loop.time() + period
        heapq.heappush(due, (when, serial, lease_id, period))
        if when < self._timer_at:
            self._arm(when)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = math.inf
        self._due.clear()

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._fire)
        self._timer_at = when

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        due = self._due
        now = self._loop.time()
        while due and due[0][0] <= now + _BEAT_EARLY_S:
            _, serial, lease_id, period = heapq.heappop(due)
            if self._still_running(lease_id, serial):
                self._send(pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=lease_id)))
                heapq.heappush(due, (now + period, serial, lease_id, period))
        if due:
            self._arm(due[0][0])


class _SessionEnd(NamedTuple):
    reason: str
    shutdown: bool
    not_leader: bool


class _Session:
    """One ``Work`` stream: the call, an outbox drained by a single writer task, and its state.

    Once the server said ``batching``, ``batch_limit`` is set and the writer sends what the outbox
    holds at each turn (outcomes and heartbeats) as one ``WorkerMessage.batch``, up to that many
    bytes; it never waits for more to come."""

    def __init__(self, call: Any, still_running: Callable[[int, int], bool]) -> None:
        self.call = call
        self.batch_limit = 0
        # A plain deque and one wake-up future: an outcome costs an append, and the writer is woken
        # only when it sleeps on an empty outbox (``None`` in the outbox ends the writes).
        self.outbox: deque[pb.WorkerMessage | None] = deque()
        self._writer_idle: asyncio.Future[None] | None = None
        self.registered = False
        self.writes_open = True
        self.cancelled_locally = False
        self.closed = asyncio.Event()
        self.heartbeats = _Heartbeats(asyncio.get_running_loop(), self.send, still_running)

    def _put(self, item: pb.WorkerMessage | None) -> None:
        self.outbox.append(item)
        idle = self._writer_idle
        if idle is not None:
            self._writer_idle = None
            if not idle.done():
                idle.set_result(None)

    def send(self, message: pb.WorkerMessage) -> None:
        if self.writes_open:
            self._put(message)

    def close_writes(self) -> None:
        if self.writes_open:
            self.writes_open = False
            self._put(None)

    def cancel(self) -> None:
        self.cancelled_locally = True
        self.writes_open = False
        self.call.cancel()

    async def write_loop(self) -> None:
        outbox = self.outbox
        write = self.call.write
        loop = asyncio.get_running_loop()
        try:
            while True:
                # Write what is queued back to back; sleep only on an empty outbox.
                if not outbox:
                    idle = self._writer_idle = loop.create_future()
                    await idle
                    continue
                message = outbox.popleft()
                if message is None:
                    await self.call.done_writing()
                    return
                if self.batch_limit and outbox and message.WhichOneof("msg") in _BATCHED:
                    await write(self._batch(message))
                else:
                    await write(message)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the reader sees the stream's final status
            log.debug("work stream write ended: %r", e)
            self.writes_open = False

    def _batch(self, first: pb.WorkerMessage) -> bytes:
        """``first`` and the reports queued behind it, as one encoded ``WorkerMessage.batch``
        within ``batch_limit``.

        Encoded by hand because copying each report into a WorkerBatch costs several times what
        encoding it does: a WorkerMessage holding one report encodes as ``<its field's tag>
        <length><report>``, and the same report as an entry of WorkerBatch's repeated field as
        ``<that field's tag><length><report>``; only the first byte differs (tags below 16)."""
        outbox = self.outbox
        parts: list[bytes] = []
        message = first
        kind = first.WhichOneof("msg")
        size = 0
        while True:
            data = message.SerializeToString()
            parts.append(_BATCHED[kind])
            parts.append(data[1:])
            size += len(data)
            following = outbox[0] if outbox else None
            if following is None or size >= self.batch_limit:
                break
            kind = following.WhichOneof("msg")
            if kind not in _BATCHED:
                break
            message = outbox.popleft()  # type: ignore[assignment]  # a report: ``None`` is no kind of ours
        body = b"".join(parts)
        return _BATCH_FIELD_TAG + _varint(len(body)) + body


class Worker:
    """Serve a pool of a cronoq server: run ``handler(lease)`` for each lease, up to ``slots`` at once.

    ``await worker.run()`` serves until ``await worker.stop()`` or an error retrying cannot fix
    (raised as ``ClientError``). Lost connections are retried with exponential ``backoff``
    ``(initial, max)`` seconds unless ``reconnect=False``.

    ``link`` is accepted for compatibility with the cronoq version that had worker links, and
    ignored (with a DeprecationWarning): the Work stream batches over gRPC instead.
    """

    def __init__(
        self,
        target: str,
        pool: str,
        handler: Handler,
        *,
        slots: int = 1,
        token: str | None = None,
        name: str = "",
        tls: bool = False,
        credentials: grpc.ChannelCredentials | None = None,
        reconnect: bool = True,
        backoff: tuple[float, float] = (0.1, 5.0),
        grace: float = 10.0,
        options: Sequence[tuple[str, Any]] | None = None,
        labels: Mapping[str, str] | None = None,
        insecure_redirect_http: bool = False,
        link: bool | None = None,
    ) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError("slots must be an int of at least 1")
        if link is not None:
            warnings.warn("Worker(link=...) has no effect: Work streams batch over gRPC; drop the argument",
                          DeprecationWarning, stacklevel=2)  # fmt: skip
        self.target = target
        self.pool = pool
        self.slots = slots
        self.labels: dict[str, str] = _str_map(labels)
        self.name = name
        self.handler = handler
        self.reconnect = reconnect
        self.backoff = (float(backoff[0]), float(backoff[1]))
        self.grace = grace
        self.worker_id: int | None = None
        self.lease_ttl: float | None = None
        self.granted_slots: int | None = None
        self.server_protocol: int | None = None
        self.max_message_bytes: int | None = None
        self.last_shutdown: str | None = None
        self.connections = 0
        self._token = token or None
        self._tls = tls
        self._credentials = credentials
        self._options = list(options or ())
        self._insecure_redirect_http = insecure_redirect_http
        self._running: dict[int, _Running] = {}
        self._serials = itertools.count()
        self._orphans: set[asyncio.Task[None]] = set()
        self._session: _Session | None = None
        self._tracer: Any = None  # an OpenTelemetry tracer while the application set a provider
        self._active = False
        self._stopping = False
        self._stop_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._registered = asyncio.Event()
        self._wake = asyncio.Event()
        self._done = asyncio.Event()

    def __repr__(self) -> str:
        return f"Worker({self.target!r}, pool={self.pool!r}, slots={self.slots})"

    @property
    def running(self) -> int:
        """How many leases are being served right now."""
        return len(self._running)

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._registered = asyncio.Event()
            self._wake = asyncio.Event()
            self._done = asyncio.Event()

    async def wait_registered(self, timeout: float | None = None) -> None:
        """Wait until the server has accepted the worker's registration."""
        self._bind_loop()
        await asyncio.wait_for(self._registered.wait(), timeout)

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking leases, give running ones up to ``grace`` seconds, then end the stream."""
        if not self._active:
            return
        if self._stop_task is None:
            self._stopping = True
            self._stop_task = asyncio.ensure_future(self._shutdown(self.grace if grace is None else grace))
        await asyncio.shield(self._stop_task)

    async def run(self) -> None:
        """Serve until ``stop()`` or a fatal error; may be called again once it has returned."""
        self._bind_loop()
        if self._active:
            raise RuntimeError("this Worker is already running")
        self._active = True
        self._stopping = False
        self._stop_task = None
        self._wake.clear()
        self._done.clear()
        try:
            await self._serve()
        finally:
            self._active = False
            self._done.set()
            if self._orphans:
                await asyncio.wait(set(self._orphans), timeout=1.0)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        initial, maximum = self.backoff
        delay = initial
        followed = 0
        redirect: str | None = None
        while not self._stopping:
            target = redirect or self.target
            started = loop.time()
            not_leader = False
            try:
                end = await self._session_on(target, redirected=redirect is not None)
            except grpc.aio.AioRpcError as e:
                if self._stopping:
                    return
                endpoint = _redirect_endpoint(e)
                if endpoint is not None:
                    warn = _check_redirect(
                        endpoint,
                        current_target=target,
                        tls=self._tls,
                        credentials=self._credentials,
                        token=self._token,
                        insecure_redirect_http=self._insecure_redirect_http,
                        followed=followed,
                    )
                    if warn:
                        log.warning("following shard redirect to %s over plain http with a token", endpoint)
                    else:
                        log.info("pool %r is served by %s; reconnecting there", self.pool, endpoint)
                    followed += 1
                    redirect = endpoint
                    continue
                followed = 0
                error = ClientError.from_rpc(e)
                if e.code() in _FATAL_CODES or not self.reconnect:
                    raise error from e
                if redirect is not None and e.code() == grpc.StatusCode.UNAVAILABLE:
                    redirect = None
                log.warning("work stream to %s failed (%s); reconnecting", target, error)
            else:
                followed = 0
                if self._stopping:
                    return
                if not self.reconnect:
                    raise ClientError("unavailable", f"work stream ended: {end.reason}")
                not_leader = end.not_leader
                log.info("work stream to %s ended (%s); reconnecting", target, end.reason)
            if not_leader or loop.time() - started > _SESSION_RESET_FACTOR * maximum:
                delay = initial
            await self._pause(delay)
            delay = min(delay * 2.0, maximum)

    async def _pause(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    # --- one stream

    async def _session_on(self, target: str, *, redirected: bool) -> _SessionEnd:
        options = self._options
        if redirected:
            options = [(k, v) for k, v in options if k not in _REDIRECT_ONLY_OPTIONS]
        secure = _wants_tls(target, self._tls, self._credentials)
        channel = _open_channel(target, secure=secure, credentials=self._credentials, options=options)
        # Looked up per stream: an application may install its tracer provider after creating us.
        self._tracer = _attempt_tracer()
        try:
            # As the generated stub, except that a batch may be handed over already encoded.
            work = channel.stream_stream(_WORK_METHOD, request_serializer=_serialize_outgoing,
                                         response_deserializer=pb.ServerMessage.FromString)  # fmt: skip
            call = work(metadata=_auth_metadata(self._token))
            return await self._run_session(_Session(call, self._still_running), _receive_limit(options))
        finally:
            await channel.close()

    async def _run_session(self, session: _Session, receive_limit: int) -> _SessionEnd:
        """Register on ``session``'s call and serve it until it ends; ``receive_limit`` is the
        largest message the channel takes (the batches the server may send)."""
        call = session.call
        self._session = session
        self.connections += 1
        session.send(
            pb.WorkerMessage(
                register=pb.Register(
                    pool=self.pool,
                    slots=self.slots,
                    worker_name=self.name,
                    protocol_version=PROTOCOL_VERSION,
                    labels=self.labels,
                    batch_bytes=receive_limit,
                )
            )
        )
        writer = asyncio.create_task(session.write_loop(), name="cronoq-worker-writer")
        try:
            return await self._read_loop(session)
        finally:
            session.closed.set()
            session.heartbeats.close()
            self._session = None
            self._registered.clear()
            self._forget_running("session ended")
            writer.cancel()
            if not call.done():
                call.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    async def _read_loop(self, session: _Session) -> _SessionEnd:
        while True:
            try:
                message = await session.call.read()
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if session.cancelled_locally and not (current is not None and current.cancelling()):
                    return _SessionEnd("stream cancelled by the worker", False, False)
                raise
            if message is grpc.aio.EOF:
                return _SessionEnd(_CLOSED_BY_SERVER, False, False)
            kind = message.WhichOneof("msg")
            if kind == "batch":  # nearly every message of a busy stream
                batch = message.batch
                for lease in batch.leases:
                    self._on_lease(session, lease)
                for abort in batch.aborts:  # after the leases: one may concern them
                    self._on_abort(abort)
            elif kind == "lease":
                self._on_lease(session, message.lease)
            elif kind == "registered":
                self._on_registered(session, message.registered)
            elif kind == "abort":
                self._on_abort(message.abort)
            elif kind == "shutdown":
                reason = message.shutdown.reason or "shutdown"
                self.last_shutdown = reason
                return _SessionEnd(reason, True, message.shutdown.not_leader)
            else:
                log.debug("ignoring unknown server message %r", kind)

    def _on_registered(self, session: _Session, m: pb.Registered) -> None:
        self.worker_id = m.worker_id
        self.lease_ttl = m.lease_ttl_s if m.HasField("lease_ttl_s") else None
        self.granted_slots = m.slots or self.slots
        self.server_protocol = m.protocol_version or 1
        self.max_message_bytes = m.max_message_bytes or None
        if m.batching:
            session.batch_limit = max(1, (self.max_message_bytes or _GRPC_DEFAULT_RECEIVE) - _BATCH_HEADROOM)
        session.registered = True
        self._registered.set()
        log.info(
            "registered as worker %d for pool %r (%d slots, protocol %d)",
            self.worker_id,
            self.pool,
            self.granted_slots,
            self.server_protocol,
        )

    def _on_lease(self, session: _Session, m: pb.Lease) -> None:
        if self._stopping:
            self._give_back(session, m.lease, "worker is stopping")
            return
        limit = self.granted_slots or self.slots
        if len(self._running) >= limit:
            self._give_back(session, m.lease, "worker has no free slot")
            return
        lease = Lease._from_pb(m, self.pool)
        record = _Running(lease, next(self._serials))
        self._running[lease.id] = record
        record.task = asyncio.create_task(self._serve_lease(session, record))
        period = _heartbeat_interval(lease.lease_ttl, self.lease_ttl)
        if period is not None:
            session.heartbeats.add(lease.id, record.serial, period, len(self._running))

    def _still_running(self, lease_id: int, serial: int) -> bool:
        """Whether the record ``serial`` still serves ``lease_id`` (it has not ended or been stopped)."""
        record = self._running.get(lease_id)
        return record is not None and record.serial == serial and record.stopped_by is None

    def _on_abort(self, m: pb.Abort) -> None:
        record = self._running.pop(m.lease, None)
        if record is None:
            return
        log.info("lease %d aborted by the server: %s", m.lease, m.reason)
        self._cancel(record, "aborted")

    def _cancel(self, record: _Running, why: str) -> None:
        record.stopped_by = why
        record.lease.cancelled.set()
        if record.task is not None and not record.task.done():
            record.task.cancel()
            self._orphans.add(record.task)
            record.task.add_done_callback(self._orphans.discard)

    def _forget_running(self, why: str) -> None:
        records = list(self._running.values())
        self._running.clear()
        for record in records:
            self._cancel(record, why)

    def _give_back(self, session: _Session, lease: int, reason: str) -> None:
        if (self.server_protocol or 1) >= 2:
            session.send(pb.WorkerMessage(nack=pb.Nack(lease=lease, reason=reason)))
        else:
            session.send(pb.WorkerMessage(fail=pb.Fail(lease=lease, message=reason, permanent=False)))

    async def _serve_lease(self, session: _Session, record: _Running) -> None:
        lease = record.lease
        try:
            tracer = self._tracer
            if tracer is None:
                reply = await self._outcome(record)
            else:
                reply = await self._traced_outcome(tracer, record)
        finally:
            # Leaving ``_running`` also ends the lease's heartbeats (see ``_Heartbeats``).
            if self._running.get(lease.id) is record:
                del self._running[lease.id]
        if reply is not None and record.stopped_by is None:
            session.send(reply)

    async def _outcome(self, record: _Running) -> pb.WorkerMessage | None:
        """Run the handler and turn what it did into the message to send (None: send nothing)."""
        lease = record.lease
        try:
            value: Any = self.handler(lease)
            if inspect.isawaitable(value):
                value = await value
        except asyncio.CancelledError:
            if record.stopped_by is not None:
                return None
            return self._fail(lease.id, "handler was cancelled", permanent=False)
        except Reject as e:
            record.error = e
            if (self.server_protocol or 1) >= 2:
                return pb.WorkerMessage(nack=pb.Nack(lease=lease.id, reason=e.reason))
            return self._fail(lease.id, e.reason, permanent=False)
        except CancelTask as e:
            record.error = e
            if (self.server_protocol or 1) >= 2:
                return pb.WorkerMessage(cancelled=pb.Cancelled(lease=lease.id))
            return self._fail(lease.id, str(e) or "cancelled by the handler", permanent=True)
        except Retryable as e:
            record.error = e
            return self._fail(lease.id, str(e), permanent=False, retry_after=e.retry_after)
        except Permanent as e:
            record.error = e
            return self._fail(lease.id, str(e), permanent=True)
        except Exception as e:  # any handler failure is reported, not raised
            record.error = e
            log.debug("handler failed on lease %d", lease.id, exc_info=True)
            return self._fail(lease.id, f"{type(e).__name__}: {e}", permanent=False)
        try:
            output, content_type = _encode_value(value)
        except (TypeError, ValueError) as e:
            return self._fail(lease.id, f"output is not encodable: {type(e).__name__}: {e}", permanent=True)
        limit = self.max_message_bytes
        if limit and len(output) + _OUTPUT_HEADROOM > limit:
            return self._fail(
                lease.id, f"output of {len(output)} bytes exceeds the server's {limit}-byte message limit", True
            )
        # Filled in place: a Complete passed to the WorkerMessage constructor would be copied.
        reply = pb.WorkerMessage()
        complete = reply.complete
        complete.SetInParent()
        complete.lease = lease.id
        if output:
            complete.output = output
        if content_type:
            complete.content_type = content_type
        return reply

    async def _traced_outcome(self, tracer: Any, record: _Running) -> pb.WorkerMessage | None:
        """``_outcome`` inside a ``cronoq.task`` span continuing the submitter's trace.

        The span is the handler's current span (its own spans and outgoing calls join the trace).
        Its parent is the lease's ``traceparent`` tag; without one it is a root span rather than a
        child of whatever span was current where the worker was started.
        """
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, Status, StatusCode

        lease = record.lease
        traceparent = lease.tags.get(_TRACEPARENT)
        parent = _propagate_api().extract({_TRACEPARENT: traceparent}) if traceparent else Context()
        attributes: dict[str, str | int] = {
            "task.id": lease.task_id,
            "task.pool": lease.pool,
            "task.kind": lease.kind,
            "task.attempt": lease.attempt,
        }
        with tracer.start_as_current_span(_SPAN_NAME, context=parent, kind=SpanKind.CONSUMER, attributes=attributes,
                                          record_exception=False, set_status_on_exception=False) as span:  # fmt: skip
            reply = await self._outcome(record)
            if record.error is not None:
                span.record_exception(record.error)
            if reply is None:
                span.set_status(Status(StatusCode.ERROR, f"attempt ended: {record.stopped_by or 'no outcome'}"))
            else:
                kind = reply.WhichOneof("msg")
                if kind == "complete":
                    span.set_status(Status(StatusCode.OK))
                elif kind == "fail":
                    span.set_status(Status(StatusCode.ERROR, reply.fail.message))
                elif kind == "cancelled":
                    span.set_status(Status(StatusCode.ERROR, "cancelled by the handler"))
                elif kind == "nack":
                    # Handed back unrun: not a failure of the task, which runs elsewhere.
                    span.set_attribute("cronoq.rejected", True)
        return reply

    @staticmethod
    def _fail(lease: int, message: str, permanent: bool, retry_after: float | None = None) -> pb.WorkerMessage:
        fail = pb.Fail(lease=lease, message=message, permanent=permanent)
        if retry_after is not None:
            fail.retry_after_s = float(retry_after)
        return pb.WorkerMessage(fail=fail)

    # --- graceful stop

    async def _shutdown(self, grace: float) -> None:
        self._wake.set()
        session = self._session
        if session is not None:
            if not session.registered:
                session.cancel()
            else:
                session.send(pb.WorkerMessage(set_slots=pb.SetSlots(slots=0)))
                busy = [r.task for r in self._running.values() if r.task is not None]
                if busy:
                    await asyncio.wait(busy, timeout=max(grace, 0.0))
                self._forget_running("worker stopped")
                session.close_writes()
                try:
                    await asyncio.wait_for(session.closed.wait(), _CLOSE_WAIT_S)
                except TimeoutError:
                    session.cancel()
        await self._done.wait()
