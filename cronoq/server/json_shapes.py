"""The JSON shapes of the HTTP API's answers, built from ``cronoq.v1`` protobuf messages.

The HTTP gateway (``cronoq.server.http``) answers with these, and the command line prints them
for ``-o json``, so ``cronoq get -o json`` and ``curl /v1/tasks/{id}`` give the same document.
This module imports only the standard library and the generated protobuf code: no aiohttp, no
engine, so the command line stays light and works without the server's dependencies.

Conventions: ids and ``*_unix_ns`` times are JSON strings (tools that read numbers as doubles
would round them); enum values are their lower-case names without the prefix; ``unavailable_shards``
names the shards a merged answer could not include.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any, NoReturn

from cronoq.proto import cronoq_pb2 as pb

__all__ = [
    "EDGE_CONDS",
    "MISS_POLICIES",
    "OVERLAPS",
    "PRIORITIES",
    "STATUSES",
    "list_json",
    "ns_text",
    "output_json",
    "recurring_json",
    "refuse_constants",
    "result_json",
    "snapshot_json",
    "submit_json",
    "task_info_json",
    "with_unavailable_shards",
    "workers_json",
]


def _names(enum: Any, prefix: str) -> dict[str, int]:
    """Lower-case JSON names of a protobuf enum (without its UNSPECIFIED value)."""
    return {name[len(prefix) :].lower(): number for name, number in enum.items() if number}


PRIORITIES = _names(pb.Priority, "PRIORITY_")
STATUSES = _names(pb.TaskStatus, "TASK_STATUS_")
MISS_POLICIES = _names(pb.MissPolicy, "MISS_POLICY_")
EDGE_CONDS = _names(pb.EdgeCond, "EDGE_COND_")
OVERLAPS = _names(pb.Overlap, "OVERLAP_")

# An unset priority or overlap means the default one; an unset status has no name of its own.
_PRIORITY_OUT = {number: name for name, number in PRIORITIES.items()} | {pb.PRIORITY_UNSPECIFIED: "normal"}
_STATUS_OUT = {number: name for name, number in STATUSES.items()}
_OVERLAP_OUT = {number: name for name, number in OVERLAPS.items()} | {pb.OVERLAP_UNSPECIFIED: "skip"}


def refuse_constants(name: str) -> NoReturn:
    """``parse_constant`` for ``json.loads``: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


def ns_text(value: int) -> str:
    """Unix nanoseconds as a JSON string."""
    return str(value)


def with_unavailable_shards(out: dict[str, Any], shards: Iterable[str], *, always: bool = False) -> dict[str, Any]:
    """``out`` with ``unavailable_shards`` set when some shard is missing (or ``always``)."""
    names = list(shards)
    if names or always:
        out["unavailable_shards"] = names
    return out


def output_json(data: bytes) -> tuple[bool, Any]:
    """``(True, value)`` when a task's output bytes are a JSON document."""
    if not data:
        return False, None
    try:
        return True, json.loads(data.decode("utf-8"), parse_constant=refuse_constants)
    except (ValueError, RecursionError):
        return False, None


def task_info_json(m: pb.TaskInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(m.id),
        "status": _STATUS_OUT.get(m.status, "unspecified"),
        "pool": m.pool,
        "kind": m.kind,
        "priority": _PRIORITY_OUT.get(m.priority, "normal"),
        "attempt": m.attempt,
        "max_attempts": m.max_attempts,
        "output_available": m.output_available,
    }
    if m.key:
        out["key"] = m.key
    if m.tenant:
        out["tenant"] = m.tenant
    if m.message:
        out["message"] = m.message
    for name in ("created_unix_ns", "started_unix_ns", "finished_unix_ns"):
        if m.HasField(name):
            out[name] = ns_text(getattr(m, name))
    return out


def result_json(m: pb.TaskResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(m.id),
        "status": _STATUS_OUT.get(m.status, "unspecified"),
        "output_available": m.output_available,
    }
    if m.HasField("output"):
        is_json, value = output_json(m.output)
        if is_json:
            out["output"] = value
        out["output_b64"] = base64.b64encode(m.output).decode("ascii")
    if m.message:
        out["message"] = m.message
    return out


def submit_json(m: pb.SubmitResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"id": str(m.id), "duplicate": m.duplicate}
    if m.HasField("result"):
        out["result"] = result_json(m.result)
    return out


def list_json(m: pb.ListTasksResponse) -> dict[str, Any]:
    out: dict[str, Any] = {"tasks": [task_info_json(info) for info in m.tasks]}
    if m.next_after:
        out["next_after"] = str(m.next_after)
    return with_unavailable_shards(out, m.unavailable_shards)


def snapshot_json(m: pb.SnapshotResponse) -> dict[str, Any]:
    pools = []
    for pool in m.pools:
        pools.append(
            {
                "name": pool.name,
                "capacity": pool.capacity,
                "busy": pool.busy,
                "held": pool.held,
                "desired": pool.desired,
                "pending": sum(pool.pending_by_class),
                "pending_by_class": list(pool.pending_by_class),
                "reservations": pool.reservations,
                "dispatched": pool.dispatched,
                "succeeded": pool.succeeded,
                "failed": pool.failed,
                "priority_adherence": pool.priority_adherence,
                "fixed_start_hit_rate": pool.fixed_start_hit_rate,
                "utilization": pool.utilization,
                "schedule_efficiency": pool.schedule_efficiency,
                "wait_p50_s": pool.wait_p50_s,
                "wait_p90_s": pool.wait_p90_s,
                "wait_p99_s": pool.wait_p99_s,
                "cost": pool.cost,
                "workers_connected": pool.workers_connected,
                "groups": [
                    {"labels": dict(group.labels), "capacity": group.capacity, "busy": group.busy}
                    for group in pool.groups
                ],
            }
        )
    totals = {field.name: getattr(m.totals, field.name) for field in m.totals.DESCRIPTOR.fields}
    out: dict[str, Any] = {
        "live_tasks": m.live_tasks,
        "running": m.running,
        "pending": m.pending,
        "workers_connected": m.workers_connected,
        "pools": pools,
        "totals": totals,
    }
    # The snapshot always names missing shards (an empty list says every shard answered).
    return with_unavailable_shards(out, m.unavailable_shards, always=True)


def workers_json(m: pb.ListWorkersResponse) -> dict[str, Any]:
    workers = [
        {
            "id": str(worker.id),
            "name": worker.name,
            "pool": worker.pool,
            "labels": dict(worker.labels),
            "slots": worker.slots,
            "busy": worker.busy,
            "connected_unix_ns": ns_text(worker.connected_unix_ns),
        }
        for worker in m.workers
    ]
    return with_unavailable_shards({"workers": workers}, m.unavailable_shards)


def recurring_json(m: pb.ListRecurringResponse) -> dict[str, Any]:
    schedules = []
    for info in m.schedules:
        item: dict[str, Any] = {
            "name": info.name,
            "cron": info.cron,
            "pool": info.pool,
            "kind": info.kind,
            "overlap": _OVERLAP_OUT.get(info.overlap, "skip"),
        }
        if info.tz:
            item["tz"] = info.tz
        if info.HasField("next_unix_ns"):
            item["next_unix_ns"] = ns_text(info.next_unix_ns)
        if info.HasField("last_task_id"):
            item["last_task_id"] = str(info.last_task_id)
        schedules.append(item)
    return with_unavailable_shards({"schedules": schedules}, m.unavailable_shards)
