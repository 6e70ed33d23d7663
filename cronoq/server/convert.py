"""The edge between ``cronoq.v1`` protobuf messages and engine / shard domain types.

Everything a request carries is checked here once (limits, NUL characters, durations, enum
values) and turned into engine types; everything an answer carries is built here from domain
views. Nothing else in the server touches protobuf fields one by one. Errors are ``ApiError``
with INVALID_ARGUMENT unless noted.

This module also builds the engine's ``CoreConfig`` from the server's ``cronoq.config.Config``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence

from cronoq.config import Config, LimitsConfig, Overflow, PoolSection, SemaphoreResource
from cronoq.engine import (
    AutoscaleConfig,
    Bounds,
    CoreConfig,
    Dep,
    Dispatch,
    EdgeCond,
    Fairness,
    FixedStart,
    MissPolicy,
    OverflowPolicy,
    OverlapPolicy,
    PoolConfig,
    Priority,
    RecurringInfo,
    RecurringSpec,
    ResourceConfig,
    RetryPolicy,
    Snapshot,
    StatusEvent,
    TaskInfo,
    TaskRef,
    TaskSpec,
    TaskStatus,
    UnknownDependencyPolicy,
)
from cronoq.engine.limits import MAX_INSTANT
from cronoq.engine.types import NS_PER_S
from cronoq.proto import cronoq_pb2 as pb
from cronoq.shard.blob import Blob
from cronoq.shard.service import Result
from cronoq.shard.workers import WorkerSession

from .errors import ApiError

__all__ = [
    "MAX_CONTENT_TYPE_LEN",
    "MAX_DURATION_S",
    "MAX_WORKER_MESSAGE_BYTES",
    "core_config",
    "duration_ns",
    "fill_lease",
    "lease_message",
    "lease_server_message",
    "list_statuses",
    "recurring_info",
    "recurring_spec",
    "sanitize_message",
    "snapshot_response",
    "status_event",
    "task_info",
    "task_ref",
    "task_result",
    "task_spec",
    "text",
    "worker_info",
]

MAX_DURATION_S = 100 * 365.25 * 86400.0
"""Client-supplied durations above a century are refused as "invalid duration"."""

MAX_CONTENT_TYPE_LEN = 128
MAX_WORKER_MESSAGE_BYTES = 8192
"""Worker failure messages are cut to this many bytes (after NUL characters are replaced)."""

_DEFAULT_TOLERANCE = NS_PER_S
_DEFAULT_RETRY = RetryPolicy()

# ------------------------------------------------------------------------------------- enums

_PRIORITY_IN: dict[int, Priority] = {
    pb.PRIORITY_UNSPECIFIED: Priority.NORMAL,
    pb.PRIORITY_CRITICAL: Priority.CRITICAL,
    pb.PRIORITY_HIGH: Priority.HIGH,
    pb.PRIORITY_NORMAL: Priority.NORMAL,
    pb.PRIORITY_LOW: Priority.LOW,
}
_PRIORITY_OUT: dict[Priority, int] = {
    Priority.CRITICAL: pb.PRIORITY_CRITICAL,
    Priority.HIGH: pb.PRIORITY_HIGH,
    Priority.NORMAL: pb.PRIORITY_NORMAL,
    Priority.LOW: pb.PRIORITY_LOW,
}
_MISS_IN: dict[int, MissPolicy] = {
    pb.MISS_POLICY_UNSPECIFIED: MissPolicy.RUN_LATE,
    pb.MISS_POLICY_RUN_LATE: MissPolicy.RUN_LATE,
    pb.MISS_POLICY_SKIP: MissPolicy.SKIP,
    pb.MISS_POLICY_FAIL: MissPolicy.FAIL,
}
_COND_IN: dict[int, EdgeCond] = {
    pb.EDGE_COND_UNSPECIFIED: EdgeCond.ON_SUCCESS,
    pb.EDGE_COND_ON_SUCCESS: EdgeCond.ON_SUCCESS,
    pb.EDGE_COND_ON_COMPLETE: EdgeCond.ON_COMPLETE,
    pb.EDGE_COND_ON_FAILURE: EdgeCond.ON_FAILURE,
}
_OVERLAP_IN: dict[int, OverlapPolicy] = {
    pb.OVERLAP_UNSPECIFIED: OverlapPolicy.SKIP,
    pb.OVERLAP_SKIP: OverlapPolicy.SKIP,
    pb.OVERLAP_ALLOW: OverlapPolicy.ALLOW,
    pb.OVERLAP_QUEUE: OverlapPolicy.QUEUE,
    pb.OVERLAP_QUEUE_ON_SUCCESS: OverlapPolicy.QUEUE_ON_SUCCESS,
}
_OVERLAP_OUT: dict[OverlapPolicy, int] = {policy: number for number, policy in _OVERLAP_IN.items() if number}
_STATUS_OUT: dict[TaskStatus, int] = {
    status: pb.TaskStatus.Value(f"TASK_STATUS_{status.name}") for status in TaskStatus
}
_STATUS_IN: dict[int, TaskStatus] = {number: status for status, number in _STATUS_OUT.items()}
_OVERFLOW: dict[Overflow, OverflowPolicy] = {
    Overflow.WAIT: OverflowPolicy.WAIT,
    Overflow.REJECT: OverflowPolicy.REJECT,
    Overflow.SHED_LOWEST: OverflowPolicy.SHED_LOWEST,
    Overflow.SHED_OLDEST: OverflowPolicy.SHED_OLDEST,
}


def _enum(table: Mapping[int, object], value: int, what: str) -> object:
    try:
        return table[value]
    except KeyError:
        raise ApiError.invalid(f"{what}: unknown value {value}") from None


def status_number(status: TaskStatus) -> int:
    return _STATUS_OUT[status]


def priority_number(priority: Priority) -> int:
    return _PRIORITY_OUT[priority]


# ------------------------------------------------------------------------------------- scalars


def duration_ns(value: float, what: str) -> int:
    """Seconds from a request to nanoseconds: finite, not negative, at most a century."""
    if not math.isfinite(value) or value < 0 or value > MAX_DURATION_S:
        raise ApiError.invalid(f"invalid duration: {what} must be a finite number of seconds between 0 and 100 years")
    return round(value * NS_PER_S)


def duration_s(value: float, what: str) -> float:
    duration_ns(value, what)
    return float(value)


def text(value: str, what: str, max_len: int | None = None) -> str:
    if "\0" in value:
        raise ApiError.invalid(f"{what} must not contain NUL characters")
    if max_len is not None and len(value) > max_len:
        raise ApiError.invalid(f"{what} is longer than {max_len} characters")
    return value


def _string_map(values: Mapping[str, str], what: str, limits: LimitsConfig) -> dict[str, str]:
    if not values:  # most tasks: no tags, no labels
        return {}
    if len(values) > limits.max_tags:
        raise ApiError.invalid(f"{what}: more than {limits.max_tags} entries")
    out: dict[str, str] = {}
    for name, value in values.items():
        text(name, f"{what} name", limits.max_tag_len)
        text(value, f"{what} value", limits.max_tag_len)
        out[name] = value
    return out


def sanitize_message(text: str) -> str:
    """A worker's failure message as stored: NUL replaced, cut at 8 KiB of UTF-8."""
    text = text.replace("\0", "\ufffd")
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_WORKER_MESSAGE_BYTES:
        return text
    return data[:MAX_WORKER_MESSAGE_BYTES].decode("utf-8", "ignore")


# ------------------------------------------------------------------------------------- requests


def task_ref(ref: pb.TaskRef, what: str = "task") -> TaskRef:
    """A ``TaskRef`` oneof as an id (int) or key (str)."""
    which = ref.WhichOneof("target")
    if which == "id":
        return int(ref.id)
    if which == "key":
        if not ref.key:
            raise ApiError.invalid(f"{what}: the key must not be empty")
        return text(ref.key, f"{what} key")
    raise ApiError.invalid(f"{what}: give an id or a key")


def pool_of(spec: pb.TaskSpec, default_pool: str) -> str:
    """The pool a spec names (its own, or the server's default pool)."""
    return spec.pool or default_pool


def _retry(policy: pb.RetryPolicy) -> RetryPolicy:
    """A wire retry policy; zero fields where zero cannot be meant take the engine defaults."""
    if not math.isfinite(policy.multiplier) or policy.multiplier < 0:
        raise ApiError.invalid("retry.multiplier must be a finite number of at least 1")
    if 0 < policy.multiplier < 1:
        raise ApiError.invalid("retry.multiplier must be at least 1")
    initial = duration_ns(policy.initial_backoff_s, "retry.initial_backoff_s")
    ceiling = duration_ns(policy.max_backoff_s, "retry.max_backoff_s")
    if ceiling == 0:
        # A client that gives no ceiling sends 0: keep the default one (never below the first delay).
        ceiling = max(_DEFAULT_RETRY.max_backoff, initial)
    return RetryPolicy(
        max_attempts=policy.max_attempts or _DEFAULT_RETRY.max_attempts,
        initial_backoff=initial,
        multiplier=policy.multiplier or _DEFAULT_RETRY.multiplier,
        max_backoff=ceiling,
        jitter=policy.jitter,
    )


def _common(m: pb.TaskSpec, limits: LimitsConfig) -> TaskSpec:
    """Every field but the times, deadlines and dependencies."""
    content_type = text(m.content_type, "content_type")
    if len(content_type) > MAX_CONTENT_TYPE_LEN:
        raise ApiError.invalid(f"content_type is longer than {MAX_CONTENT_TYPE_LEN} characters")
    if len(m.resources) > limits.max_resources:
        raise ApiError.invalid(f"resources: more than {limits.max_resources} entries")
    resources: dict[str, int] = {}
    for name, amount in m.resources.items():
        text(name, "resource name", limits.max_key_len)
        resources[name] = int(amount)
    spec = TaskSpec(
        payload=Blob(bytes(m.payload), content_type),
        pool=text(m.pool, "pool", limits.max_key_len) or None,
        kind=text(m.kind, "kind", limits.max_kind_len) or "default",
        priority=_enum(_PRIORITY_IN, m.priority, "priority"),  # type: ignore[arg-type]
        key=text(m.key, "key", limits.max_key_len) or None,
        duration_hint=duration_ns(m.duration_hint_s, "duration_hint_s") if m.HasField("duration_hint_s") else None,
        timeout=duration_ns(m.timeout_s, "timeout_s") if m.HasField("timeout_s") else None,
        retry=_retry(m.retry) if m.HasField("retry") else None,
        resources=resources,
        tags=_string_map(m.tags, "tags", limits),
        labels=_string_map(m.labels, "labels", limits),
        tenant=text(m.tenant, "tenant", limits.max_key_len) or None,
    )
    return spec


def _either(m: pb.TaskSpec, relative: str, absolute: str, now: int) -> int | None:
    has_rel, has_abs = m.HasField(relative), m.HasField(absolute)
    if has_rel and has_abs:
        raise ApiError.invalid(f"set {relative} or {absolute}, not both")
    if has_rel:
        return now + duration_ns(getattr(m, relative), relative)
    if has_abs:
        value = int(getattr(m, absolute))
        if not 0 <= value <= MAX_INSTANT:
            raise ApiError.invalid(f"{absolute} must lie between the Unix epoch and {MAX_INSTANT} (year 2262)")
        return value
    return None


def task_spec(m: pb.TaskSpec, now: int, limits: LimitsConfig) -> TaskSpec:
    """A submitted task. Relative times count from ``now`` (the server's clock, Unix ns)."""
    spec = _common(m, limits)
    spec.deadline = _either(m, "deadline_in_s", "deadline_unix_ns", now)
    start = _either(m, "start_in_s", "start_unix_ns", now)
    tolerance = duration_ns(m.tolerance_s, "tolerance_s") if m.HasField("tolerance_s") else _DEFAULT_TOLERANCE
    on_miss: MissPolicy = _enum(_MISS_IN, m.on_miss, "on_miss")  # type: ignore[assignment]
    if start is not None:
        spec.fixed_start = FixedStart(start, tolerance, on_miss)
    if len(m.deps) > limits.max_deps:
        raise ApiError.invalid(f"deps: more than {limits.max_deps} dependencies")
    deps = []
    for index, dep in enumerate(m.deps):
        if not dep.HasField("target"):
            raise ApiError.invalid(f"deps[{index}]: give the id or key of the task it depends on")
        target = task_ref(dep.target, f"deps[{index}]")
        if isinstance(target, str):
            text(target, f"deps[{index}] key", limits.max_key_len)
        deps.append(Dep(target, _enum(_COND_IN, dep.cond, f"deps[{index}].cond")))  # type: ignore[arg-type]
    spec.deps = tuple(deps)
    return spec


def recurring_spec(m: pb.RecurringRequest, limits: LimitsConfig) -> RecurringSpec:
    """An AddRecurring request. The template may not carry an absolute deadline, a start or
    dependencies; its ``deadline_in_s`` counts from each occurrence's start."""
    template = m.template
    for field_name in ("deadline_unix_ns", "start_in_s", "start_unix_ns"):
        if template.HasField(field_name):
            raise ApiError.invalid(f"a recurring template may not set {field_name}")
    if template.deps:
        raise ApiError.invalid("a recurring template may not set dependencies (use overlap = OVERLAP_QUEUE)")
    if not m.name:
        raise ApiError.invalid("a schedule needs a name")
    text(m.name, "name", limits.max_key_len)
    text(m.cron, "cron")
    text(m.tz, "tz")
    spec = _common(template, limits)
    tolerance = (
        duration_ns(template.tolerance_s, "tolerance_s") if template.HasField("tolerance_s") else _DEFAULT_TOLERANCE
    )
    deadline_after = (
        duration_ns(template.deadline_in_s, "deadline_in_s") if template.HasField("deadline_in_s") else None
    )
    return RecurringSpec(
        name=m.name,
        cron=m.cron,
        template=spec,
        tz=m.tz or None,
        overlap=_enum(_OVERLAP_IN, m.overlap, "overlap"),  # type: ignore[arg-type]
        tolerance=tolerance,
        on_miss=_enum(_MISS_IN, template.on_miss, "on_miss"),  # type: ignore[arg-type]
        deadline_after=deadline_after,
    )


def list_statuses(numbers: Iterable[int]) -> list[TaskStatus]:
    out = []
    for number in numbers:
        if number == pb.TASK_STATUS_UNSPECIFIED:
            raise ApiError.invalid("statuses: TASK_STATUS_UNSPECIFIED is not a status")
        out.append(_enum(_STATUS_IN, number, "statuses"))
    return out  # type: ignore[return-value]


# ------------------------------------------------------------------------------------- answers


def blob_of(value: object) -> Blob:
    """A payload or output as bytes plus content type, whatever the store handed back."""
    if isinstance(value, Blob):
        return value
    if value is None:
        return Blob(b"", "")
    if isinstance(value, bytes | bytearray | memoryview):
        return Blob(bytes(value), "application/octet-stream")
    if isinstance(value, str):
        return Blob(value.encode("utf-8"), "text/plain; charset=utf-8")
    return Blob(json.dumps(value).encode("utf-8"), "application/json")


def task_info(info: TaskInfo, output_available: bool) -> pb.TaskInfo:
    m = pb.TaskInfo(
        id=info.id,
        status=_STATUS_OUT[info.status],  # type: ignore[arg-type]
        pool=info.pool,
        key=info.key or "",
        kind=info.kind,
        attempt=info.attempt,
        max_attempts=info.max_attempts,
        created_unix_ns=info.created_at,
        message=info.message or "",
        output_available=output_available,
        tenant=info.tenant or "",
        priority=_PRIORITY_OUT[info.priority],  # type: ignore[arg-type]
    )
    if info.started_at is not None:
        m.started_unix_ns = info.started_at
    if info.finished_at is not None:
        m.finished_unix_ns = info.finished_at
    return m


def task_result(result: Result) -> pb.TaskResult:
    m = pb.TaskResult(
        id=result.id,
        status=_STATUS_OUT[result.status],  # type: ignore[arg-type]
        message=result.message,
        output_available=result.output_available,
    )
    if result.output is not None:
        m.output = result.output.data
    return m


def status_event(event: StatusEvent) -> pb.StatusEvent:
    return pb.StatusEvent(
        id=event.id,
        pool=event.pool,
        key=event.key or "",
        status=_STATUS_OUT[event.status],  # type: ignore[arg-type]
        attempt=event.attempt,
        at_unix_ns=event.at,
        message=event.message or "",
    )


def lease_message(lease: Dispatch) -> pb.Lease:
    m = pb.Lease()
    fill_lease(m, lease)
    return m


def lease_server_message(lease: Dispatch) -> pb.ServerMessage:
    """The ``ServerMessage`` that hands ``lease`` to a worker, built in place (no nested copy)."""
    m = pb.ServerMessage()
    fill_lease(m.lease, lease)
    return m


_LEASE_FIXED_BYTES = 100
"""An upper bound on a ``Lease``'s encoding besides its strings, payload and tags: each field's
tag, the longest varints of its numbers and the length prefixes of its five string fields."""
_TAG_ENTRY_BYTES = 18
"""An upper bound on one ``tags`` entry besides its key and value: the entry's tag and length
prefix, and the tags and length prefixes of its key and value."""


def _utf8_bound(text: str) -> int:
    # isascii() reads a flag CPython keeps on the string, so this is cheaper than encoding it;
    # no code point takes more than four bytes of UTF-8.
    return len(text) if text.isascii() else 4 * len(text)


def fill_lease(m: pb.Lease, lease: Dispatch) -> int:
    """Write ``lease`` into an empty ``Lease`` message; fields at their default are left unset,
    which encodes the same and costs less for every lease of a busy pool. Returns an upper bound
    on the bytes ``m`` encodes to, cheaper than ``m.ByteSize()`` (a batch writer sums it per lease)."""
    m.SetInParent()
    m.lease = lease.id
    m.task_id = lease.task_id
    m.attempt = lease.attempt
    size = _LEASE_FIXED_BYTES
    payload = blob_of(lease.payload)
    if payload.data:
        m.payload = payload.data
        size += len(payload.data)
    if payload.content_type:
        m.content_type = payload.content_type
        size += _utf8_bound(payload.content_type)
    if lease.kind:
        m.kind = lease.kind
        size += _utf8_bound(lease.kind)
    if lease.key:
        m.key = lease.key
        size += _utf8_bound(lease.key)
    if lease.tags:
        m.tags.update(lease.tags)
        for name, value in lease.tags.items():
            size += _TAG_ENTRY_BYTES + _utf8_bound(name) + _utf8_bound(value)
    m.pool = lease.pool
    size += _utf8_bound(lease.pool)
    m.priority = _PRIORITY_OUT[lease.priority]  # type: ignore[assignment]
    if lease.timeout is not None:
        m.timeout_s = lease.timeout / NS_PER_S
    if lease.deadline is not None:
        m.deadline_unix_ns = lease.deadline
    if lease.lease_ttl is not None:
        m.lease_ttl_s = lease.lease_ttl / NS_PER_S
    return size


def snapshot_response(snap: Snapshot, workers: Mapping[str, int]) -> pb.SnapshotResponse:
    """The Admin snapshot. ``workers`` counts connected workers per pool. A pool-scoped caller's
    ``snap`` and ``workers`` hold its own pools only (``Api`` narrows them first)."""
    out = pb.SnapshotResponse(
        live_tasks=snap.live_tasks,
        running=snap.running,
        pending=snap.pending,
        workers_connected=sum(workers.values()),
    )
    totals = snap.totals
    for name in out.totals.DESCRIPTOR.fields_by_name:
        setattr(out.totals, name, int(totals.get(name, 0)))
    for pool in snap.pools:
        entry = out.pools.add(
            name=pool.name,
            capacity=pool.capacity,
            busy=pool.busy,
            held=pool.held,
            desired=pool.desired,
            pending_by_class=list(pool.pending_by_class),
            reservations=pool.reservations,
            dispatched=pool.dispatched,
            succeeded=pool.succeeded,
            failed=pool.failed,
            priority_adherence=pool.priority_adherence,
            fixed_start_hit_rate=pool.fixed_start_hit_rate,
            utilization=pool.utilization,
            schedule_efficiency=pool.schedule_efficiency,
            wait_p50_s=pool.wait_p50,
            wait_p90_s=pool.wait_p90,
            wait_p99_s=pool.wait_p99,
            cost=pool.cost,
            workers_connected=workers.get(pool.name, 0),
        )
        groups = sorted(pool.groups, key=lambda g: (bool(g.labels), sorted(g.labels.items())))
        for group in groups:
            entry.groups.add(labels=dict(group.labels), capacity=group.capacity, busy=group.busy)
    return out


def worker_info(session: WorkerSession) -> pb.WorkerInfo:
    return pb.WorkerInfo(
        id=session.id,
        name=session.name,
        pool=session.pool,
        labels=dict(session.labels),
        slots=session.slots,
        busy=len(session.running),
        connected_unix_ns=session.connected_at,
    )


def recurring_info(info: RecurringInfo) -> pb.RecurringInfo:
    m = pb.RecurringInfo(
        name=info.name,
        cron=info.cron,
        tz=info.tz or "",
        pool=info.pool,
        kind=info.kind,
        overlap=_OVERLAP_OUT[info.overlap],  # type: ignore[arg-type]
    )
    if info.next_at is not None:
        m.next_unix_ns = info.next_at
    if info.last_task_id is not None:
        m.last_task_id = info.last_task_id
    return m


# ------------------------------------------------------------------------------------- config


def _pool_config(pool: PoolSection, limits: LimitsConfig) -> PoolConfig:
    defaults = PoolConfig(pool.name)
    retry = defaults.retry
    if pool.retry is not None:
        retry = RetryPolicy(
            max_attempts=pool.retry.max_attempts,
            initial_backoff=round(pool.retry.initial_backoff_s * NS_PER_S),
            multiplier=pool.retry.multiplier,
            max_backoff=round(pool.retry.max_backoff_s * NS_PER_S),
            jitter=pool.retry.jitter,
        )
    autoscale = None
    if pool.autoscale:
        base = AutoscaleConfig()
        autoscale = AutoscaleConfig(
            target_utilization=(
                pool.target_utilization if pool.target_utilization is not None else base.target_utilization
            ),
            drain_time=_ns(pool.drain_time_s, base.drain_time),
            cooldown=_ns(pool.cooldown_s, base.cooldown),
            cost_per_worker_second=pool.cost_per_worker_second or 0.0,
        )
    fairness = Fairness(dict(pool.tenant_weights)) if pool.fair else None
    awaiting = pool.await_unknown_dependencies_s is not None
    return PoolConfig(
        name=pool.name,
        min_workers=pool.min,
        max_workers=pool.max,
        initial_workers=0,
        autoscale=autoscale,
        retry=retry,
        bounds=Bounds(max_pending=pool.pending_bound(limits)),
        overflow=_OVERFLOW[pool.overflow],
        reservable_fraction=(
            pool.reservable_fraction if pool.reservable_fraction is not None else defaults.reservable_fraction
        ),
        default_duration=_ns(pool.default_duration_s, defaults.default_duration),
        lease_ttl=round(pool.lease_ttl_s * NS_PER_S),
        unknown_dependency=UnknownDependencyPolicy.AWAIT if awaiting else UnknownDependencyPolicy.REJECT,
        await_timeout=_ns(pool.await_unknown_dependencies_s, None) if awaiting else None,
        fairness=fairness,
    )


def _ns(seconds: float | None, default: int | None) -> int:
    if seconds is None:
        assert default is not None
        return default
    return round(seconds * NS_PER_S)


def core_config(config: Config) -> CoreConfig:
    """The engine configuration of this server's shard."""
    limits = config.limits
    pools: Sequence[PoolSection] = config.local_pools()
    resources = []
    for res in config.local_resources():
        if isinstance(res, SemaphoreResource):
            resources.append(ResourceConfig.semaphore(res.name, res.permits))
        else:
            resources.append(ResourceConfig.token_bucket(res.name, res.rate, res.burst))
    return CoreConfig(
        pools=tuple(_pool_config(pool, limits) for pool in pools),
        resources=tuple(resources),
        global_bounds=Bounds(max_pending=limits.max_pending_total),
        retention=round(limits.key_retention_s * NS_PER_S),
        retention_max=limits.key_retention_max,
        # Intermediate transitions are switched on by the shard service while a Watch with
        # all_transitions is open.
        emit_transitions=False,
        id_shard=config.shard_number() if config.sharded else None,
    )
