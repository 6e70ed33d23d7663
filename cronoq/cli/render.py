"""How each answer of the server is shown: tables for people, and ``-o json`` shaped like the HTTP API.

The JSON shapes are the HTTP gateway's own encoders (``cronoq.server.json_shapes``, which needs
neither aiohttp nor the engine), so the CLI prints exactly what ``curl`` would get. Watch has no
HTTP route; its events use the same conventions (ids and ``*_unix_ns`` as strings).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from cronoq.proto import cronoq_pb2 as pb
from cronoq.server import json_shapes as shapes

from . import tables
from .tables import NS_PER_S

Safe = Callable[[str], str]
"""Makes a server-controlled string safe to show (escapes control characters on a terminal)."""

TERMINAL_STATUSES = frozenset(
    {
        pb.TASK_STATUS_SUCCEEDED,
        pb.TASK_STATUS_FAILED,
        pb.TASK_STATUS_DEAD_LETTERED,
        pb.TASK_STATUS_CANCELLED,
        pb.TASK_STATUS_SKIPPED,
        pb.TASK_STATUS_MISSED,
        pb.TASK_STATUS_SHED,
    }
)
STATUS_NAMES = tuple(
    pb.TaskStatus.Name(number).removeprefix("TASK_STATUS_").lower()
    for number in pb.TaskStatus.values()
    if number != pb.TASK_STATUS_UNSPECIFIED
)


def _enum_name(enum: Any, number: int, prefix: str, unset: str) -> str:
    if number == 0:
        return unset
    try:
        name: str = enum.Name(number)
    except ValueError:
        return str(number)
    return name.removeprefix(prefix).lower()


def status_name(number: int) -> str:
    return _enum_name(pb.TaskStatus, number, "TASK_STATUS_", "unspecified")


def priority_name(number: int) -> str:
    return _enum_name(pb.Priority, number, "PRIORITY_", "normal")


def overlap_name(number: int) -> str:
    return _enum_name(pb.Overlap, number, "OVERLAP_", "skip")


def status_number(name: str) -> int:
    """The wire value of a status name; ValueError names the valid ones."""
    if name not in STATUS_NAMES:
        raise ValueError(f"unknown status {name!r}: expected one of {', '.join(STATUS_NAMES)}")
    return int(pb.TaskStatus.Value(f"TASK_STATUS_{name.upper()}"))


def _optional_time(message: Any, field: str) -> str:
    return tables.local_time(getattr(message, field)) if message.HasField(field) else "-"


# ========================================================================================== JSON


def task_info_json(m: pb.TaskInfo, unavailable: Sequence[str] = ()) -> dict[str, Any]:
    return shapes.with_unavailable_shards(shapes.task_info_json(m), unavailable)


def result_json(m: pb.TaskResult, unavailable: Sequence[str] = ()) -> dict[str, Any]:
    return shapes.with_unavailable_shards(shapes.result_json(m), unavailable)


submit_json = shapes.submit_json
list_json = shapes.list_json
snapshot_json = shapes.snapshot_json
workers_json = shapes.workers_json
recurring_json = shapes.recurring_json


def event_json(m: pb.StatusEvent) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": str(m.id),
        "pool": m.pool,
        "status": status_name(m.status),
        "attempt": m.attempt,
        "at_unix_ns": shapes.ns_text(m.at_unix_ns),
    }
    if m.key:
        out["key"] = m.key
    if m.message:
        out["message"] = m.message
    return out


# ======================================================================================== tables


def task_details(m: pb.TaskInfo, safe: Safe) -> list[str]:
    pairs = [
        ("id", str(m.id)),
        ("status", status_name(m.status)),
        ("pool", safe(m.pool)),
        ("key", safe(m.key) or "-"),
        ("kind", safe(m.kind)),
        ("priority", priority_name(m.priority)),
        ("tenant", safe(m.tenant) or "-"),
        ("attempt", f"{m.attempt} of {m.max_attempts}" if m.max_attempts else str(m.attempt)),
        ("created", _optional_time(m, "created_unix_ns")),
        ("started", _optional_time(m, "started_unix_ns")),
        ("finished", _optional_time(m, "finished_unix_ns")),
        ("output", "available" if m.output_available else "-"),
        ("message", safe(m.message) or "-"),
    ]
    return tables.key_values(pairs)


def task_rows(tasks: Sequence[pb.TaskInfo], safe: Safe) -> list[str]:
    rows = [
        [
            str(t.id),
            status_name(t.status),
            safe(t.pool),
            priority_name(t.priority),
            safe(t.kind),
            str(t.attempt),
            _optional_time(t, "created_unix_ns"),
            safe(t.key) or "-",
            safe(t.message),
        ]
        for t in tasks
    ]
    return tables.table(["ID", "STATUS", "POOL", "PRIORITY", "KIND", "ATTEMPT", "CREATED", "KEY", "MESSAGE"], rows)


def worker_rows(m: pb.ListWorkersResponse, safe: Safe) -> list[str]:
    rows = [
        [
            str(w.id),
            safe(w.name) or "-",
            safe(w.pool),
            f"{w.busy}/{w.slots}",
            safe(tables.labels(dict(w.labels))),
            tables.local_time(w.connected_unix_ns),
        ]
        for w in m.workers
    ]
    return tables.table(["ID", "NAME", "POOL", "BUSY/SLOTS", "LABELS", "CONNECTED"], rows)


def schedule_rows(m: pb.ListRecurringResponse, safe: Safe) -> list[str]:
    now = time.time_ns()
    rows = []
    for s in m.schedules:
        if s.HasField("next_unix_ns"):
            upcoming = f"{tables.local_time(s.next_unix_ns)} (in {tables.duration((s.next_unix_ns - now) / NS_PER_S)})"
        else:
            upcoming = "-"
        rows.append(
            [
                safe(s.name),
                safe(s.cron),
                safe(s.tz) or "UTC",
                safe(s.pool),
                safe(s.kind),
                overlap_name(s.overlap),
                upcoming,
                str(s.last_task_id) if s.HasField("last_task_id") else "-",
            ]
        )
    return tables.table(["NAME", "CRON", "TZ", "POOL", "KIND", "OVERLAP", "NEXT", "LAST TASK"], rows)


def snapshot_lines(m: pb.SnapshotResponse, safe: Safe) -> list[str]:
    lines = [
        f"live tasks {m.live_tasks}   running {m.running}   pending {m.pending}   "
        f"workers connected {m.workers_connected}",
        "",
    ]
    rows = [
        [
            safe(p.name),
            str(p.capacity),
            str(p.busy),
            str(p.held),
            str(p.desired),
            str(sum(p.pending_by_class)),
            "/".join(str(n) for n in p.pending_by_class) or "-",
            tables.duration(p.wait_p50_s),
            tables.duration(p.wait_p90_s),
            tables.duration(p.wait_p99_s),
            tables.percent(p.utilization),
            str(p.succeeded),
            str(p.failed),
            str(p.workers_connected),
        ]
        for p in m.pools
    ]
    headers = "POOL CAPACITY BUSY HELD DESIRED PENDING BY_CLASS WAIT_P50 P90 P99 UTIL SUCCEEDED FAILED WORKERS"
    lines += tables.table([h.replace("_", " ") for h in headers.split()], rows)
    totals = [(field.name, str(getattr(m.totals, field.name))) for field in m.totals.DESCRIPTOR.fields]
    lines += ["", "totals:", *("  " + line for line in tables.key_values(totals))]
    return lines


def event_line(m: pb.StatusEvent, safe: Safe) -> str:
    parts = [
        tables.local_time(m.at_unix_ns, millis=True),
        str(m.id),
        safe(m.pool),
        status_name(m.status),
        f"attempt {m.attempt}",
    ]
    if m.key:
        parts.append(f"key={safe(m.key)}")
    if m.message:
        parts.append(safe(m.message))
    return "  ".join(parts)
