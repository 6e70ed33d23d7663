"""Task history on the wire: ``cronoq.console.v1`` search filters and task details.

``task_query`` checks a ``SearchTasksRequest`` (every value bounded, texts without NUL, names at
most as long as the engine accepts) and turns it into the engine's ``TaskQuery``, the filter the
engine and the store's history share. ``task_detail`` builds a ``TaskDetail`` from what the shard
knows of a task: its info, its stored spec and its recorded transitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from cronoq.config.schema import LimitsConfig
from cronoq.engine import Priority, TaskInfo, TaskSpec, TaskStatus
from cronoq.engine.actions import RecoveredTask
from cronoq.engine.types import NS_PER_S, EdgeCond, MissPolicy
from cronoq.engine.views import TaskQuery
from cronoq.proto import console_pb2 as cpb
from cronoq.proto import cronoq_pb2 as pb
from cronoq.stores.history import Transition

from . import convert
from .errors import ApiError

__all__ = ["MAX_FILTER_VALUES", "PAYLOAD_PREVIEW_BYTES", "task_detail", "task_query"]

MAX_FILTER_VALUES = 64
"""Most values one filter of a search may list."""
PAYLOAD_PREVIEW_BYTES = 4096

_MISS_OUT = {
    MissPolicy.RUN_LATE: pb.MISS_POLICY_RUN_LATE,
    MissPolicy.SKIP: pb.MISS_POLICY_SKIP,
    MissPolicy.FAIL: pb.MISS_POLICY_FAIL,
}
_COND_OUT = {
    EdgeCond.ON_SUCCESS: pb.EDGE_COND_ON_SUCCESS,
    EdgeCond.ON_COMPLETE: pb.EDGE_COND_ON_COMPLETE,
    EdgeCond.ON_FAILURE: pb.EDGE_COND_ON_FAILURE,
}


def _names(values: Iterable[str], what: str, max_len: int) -> frozenset[str] | None:
    names = list(values)
    if len(names) > MAX_FILTER_VALUES:
        raise ApiError.invalid(f"{what}: at most {MAX_FILTER_VALUES} values, not {len(names)}")
    return frozenset(convert.text(name, what, max_len) for name in names) or None


def task_query(request: cpb.SearchTasksRequest, pools: Sequence[str] | None, limits: LimitsConfig) -> TaskQuery:
    """The filter of a search; ``pools`` are the pools the caller's listing covers (None: all)."""
    listing = request.list
    statuses = convert.list_statuses(listing.statuses)
    created_from = request.created_from_unix_ns if request.HasField("created_from_unix_ns") else None
    created_to = request.created_to_unix_ns if request.HasField("created_to_unix_ns") else None
    # An inverted range is not an error: like any range, it holds what lies in it (nothing).
    return TaskQuery(
        pools=frozenset(pools) if pools else None,
        statuses=frozenset(statuses) or None,
        kinds=_names(request.kinds, "kinds", limits.max_kind_len),
        tenants=_names(request.tenants, "tenants", limits.max_key_len),
        key_prefix=convert.text(request.key_prefix, "key_prefix", limits.max_key_len) or None,
        created_from=created_from,
        created_to=created_to,
    )


def _transition(change: Transition) -> cpb.Transition:
    m = cpb.Transition(
        status=convert.status_number(change.status),  # type: ignore[arg-type]
        attempt=change.attempt,
        message=change.message or "",
    )
    if change.at is not None:
        m.at_unix_ns = change.at
    if change.retry_at is not None:
        m.retry_unix_ns = change.retry_at
    return m


def _seconds(ns: int) -> float:
    return ns / NS_PER_S


def _spec(spec: TaskSpec, pool: str) -> pb.TaskSpec:
    """The stored spec without its payload (``TaskDetail`` carries a preview of it)."""
    m = pb.TaskSpec(
        kind=spec.kind,
        pool=spec.pool or pool,
        priority=convert.priority_number(spec.priority),  # type: ignore[arg-type]
        key=spec.key or "",
        tenant=spec.tenant or "",
    )
    if spec.deadline is not None:
        m.deadline_unix_ns = spec.deadline
    if spec.fixed_start is not None:
        m.start_unix_ns = spec.fixed_start.start
        m.tolerance_s = _seconds(spec.fixed_start.tolerance)
        m.on_miss = _MISS_OUT[spec.fixed_start.on_miss]
    if spec.duration_hint is not None:
        m.duration_hint_s = _seconds(spec.duration_hint)
    if spec.timeout is not None:
        m.timeout_s = _seconds(spec.timeout)
    if spec.retry is not None:
        retry = spec.retry
        m.retry.CopyFrom(
            pb.RetryPolicy(
                max_attempts=retry.max_attempts,
                initial_backoff_s=_seconds(retry.initial_backoff),
                multiplier=retry.multiplier,
                max_backoff_s=_seconds(retry.max_backoff),
                jitter=retry.jitter,
            )
        )
    for dep in spec.deps:
        target = pb.TaskRef(id=dep.target) if isinstance(dep.target, int) else pb.TaskRef(key=dep.target)
        m.deps.append(pb.Dep(target=target, cond=_COND_OUT[dep.cond]))
    m.resources.update(spec.resources)
    m.tags.update(spec.tags)
    m.labels.update(spec.labels)
    return m


def task_detail(
    info: TaskInfo, output_available: bool, stored: RecoveredTask | None, transitions: Sequence[Transition]
) -> cpb.TaskDetail:
    detail = cpb.TaskDetail(
        info=convert.task_info(info, output_available), transitions=[_transition(change) for change in transitions]
    )
    if stored is not None:
        spec = stored.record.spec
        detail.spec.CopyFrom(_spec(spec, stored.record.pool))
        payload = convert.blob_of(spec.payload)
        detail.spec.content_type = payload.content_type
        detail.payload_preview = payload.data[:PAYLOAD_PREVIEW_BYTES]
        detail.payload_bytes = len(payload.data)
    return detail


# The engine names every status and priority the wire has (checked once, at import).
assert all(convert.status_number(status) for status in TaskStatus)
assert all(convert.priority_number(priority) for priority in Priority)
