"""The JSON shapes of the console's HTTP answers (task details, shards, schedules, events), in the
conventions of ``cronoq.server.json_shapes``: ids and ``*_unix_ns`` times are strings, enum values
their lower-case names, ``unavailable_shards`` names the shards a merged answer left out.

Previews of payloads and outputs carry their first bytes twice: as base64 (exact) and as text
decoded from UTF-8 with replacement characters (for reading). The page only ever puts that text
into text nodes.
"""

from __future__ import annotations

import base64
from typing import Any

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import cronoq_pb2 as pb

from ..json_shapes import (
    EDGE_CONDS,
    MISS_POLICIES,
    PRIORITIES,
    STATUSES,
    ns_text,
    recurring_json,
    task_info_json,
    with_unavailable_shards,
)

__all__ = ["detail_json", "event_json", "schedules_json", "shards_json", "whoami_json"]

_STATUS_OUT = {number: name for name, number in STATUSES.items()}
_PRIORITY_OUT = {number: name for name, number in PRIORITIES.items()} | {pb.PRIORITY_UNSPECIFIED: "normal"}
_MISS_OUT = {number: name for name, number in MISS_POLICIES.items()} | {pb.MISS_POLICY_UNSPECIFIED: "run_late"}
_COND_OUT = {number: name for name, number in EDGE_CONDS.items()} | {pb.EDGE_COND_UNSPECIFIED: "on_success"}


def _preview(data: bytes, size: int, content_type: str) -> dict[str, Any]:
    return {
        "bytes": size,
        "content_type": content_type,
        "truncated": len(data) < size,
        "preview_b64": base64.b64encode(data).decode("ascii"),
        "preview_text": data.decode("utf-8", errors="replace"),
    }


def spec_json(m: pb.TaskSpec) -> dict[str, Any]:
    """A stored spec in the shape of the task object of ``POST /v1/tasks`` (without its payload)."""
    out: dict[str, Any] = {"pool": m.pool, "kind": m.kind, "priority": _PRIORITY_OUT.get(m.priority, "normal")}
    for name in ("key", "tenant", "content_type"):
        if value := getattr(m, name):
            out[name] = value
    for name in ("deadline_unix_ns", "start_unix_ns"):
        if m.HasField(name):
            out[name] = ns_text(getattr(m, name))
    for name in ("tolerance_s", "duration_hint_s", "timeout_s"):
        if m.HasField(name):
            out[name] = getattr(m, name)
    if m.HasField("start_unix_ns"):
        out["on_miss"] = _MISS_OUT.get(m.on_miss, "run_late")
    if m.HasField("retry"):
        retry = m.retry
        out["retry"] = {
            "max_attempts": retry.max_attempts,
            "initial_backoff_s": retry.initial_backoff_s,
            "multiplier": retry.multiplier,
            "max_backoff_s": retry.max_backoff_s,
            "jitter": retry.jitter,
        }
    if m.deps:
        deps = []
        for dep in m.deps:
            target = {"id": str(dep.target.id)} if dep.target.WhichOneof("target") == "id" else {"key": dep.target.key}
            deps.append({**target, "cond": _COND_OUT.get(dep.cond, "on_success")})
        out["deps"] = deps
    for name in ("resources", "tags", "labels"):
        if mapping := dict(getattr(m, name)):
            out[name] = mapping
    return out


def detail_json(m: cpb.TaskDetail) -> dict[str, Any]:
    """``GET /v1/tasks/{id}/detail``: the task, its spec, its transitions and previews."""
    out: dict[str, Any] = {"task": task_info_json(m.info), "transitions": []}
    for change in m.transitions:
        item: dict[str, Any] = {"status": _STATUS_OUT.get(change.status, "unspecified"), "attempt": change.attempt}
        if change.HasField("at_unix_ns"):
            item["at_unix_ns"] = ns_text(change.at_unix_ns)
        if change.HasField("retry_unix_ns"):
            item["retry_unix_ns"] = ns_text(change.retry_unix_ns)
        if change.message:
            item["message"] = change.message
        out["transitions"].append(item)
    if m.HasField("spec"):
        out["spec"] = spec_json(m.spec)
        out["payload"] = _preview(m.payload_preview, m.payload_bytes, m.spec.content_type)
    if m.output_bytes or m.output_content_type:
        out["output"] = _preview(m.output_preview, m.output_bytes, m.output_content_type)
    return out


def shards_json(m: cpb.ListShardsResponse) -> dict[str, Any]:
    """``GET /v1/shards``: every shard's leader and listed replicas; ``unavailable_shards`` is
    always present."""
    shards = [
        {
            "name": shard.name,
            "number": shard.number,
            "pools": list(shard.pools),
            "endpoint": shard.endpoint,
            "leader": shard.leader,
            "host": shard.host,
            "pid": shard.pid,
            "epoch": str(shard.epoch),
            "leading_since_unix_ns": ns_text(shard.leading_since_unix_ns),
            "version": shard.version,
            "store": shard.store,
            "replicas": [
                {
                    "endpoint": r.endpoint,
                    "state": r.state,
                    "host": r.host,
                    "pid": r.pid,
                    "version": r.version,
                    "error": r.error,
                }
                for r in shard.replicas
            ],
            "topology_version": str(shard.topology_version),
            "placements": [
                {"pool": placed.pool, "shard": placed.shard, "version": str(placed.version)}
                for placed in shard.placements
            ],
            "topology_differences": list(shard.topology_differences),
        }
        for shard in m.shards
    ]
    return with_unavailable_shards({"shards": shards}, m.unavailable_shards, always=True)


def schedules_json(m: cpb.ListSchedulesResponse) -> dict[str, Any]:
    """``GET /v1/schedules``: the entries of ``/v1/recurring``, plus ``paused``, ``key`` and
    ``next_runs_unix_ns``."""
    out = recurring_json(
        pb.ListRecurringResponse(
            schedules=[schedule.info for schedule in m.schedules], unavailable_shards=m.unavailable_shards
        )
    )
    for item, schedule in zip(out["schedules"], m.schedules, strict=True):
        item["paused"] = schedule.paused
        if schedule.key:
            item["key"] = schedule.key
        item["next_runs_unix_ns"] = [ns_text(start) for start in schedule.next_runs_unix_ns]
    return out


def event_json(m: pb.StatusEvent) -> dict[str, Any]:
    """One status change of the event stream (``GET /v1/events``)."""
    out: dict[str, Any] = {
        "id": str(m.id),
        "pool": m.pool,
        "status": _STATUS_OUT.get(m.status, "unspecified"),
        "attempt": m.attempt,
        "at_unix_ns": ns_text(m.at_unix_ns),
    }
    if m.key:
        out["key"] = m.key
    if m.message:
        out["message"] = m.message
    return out


def whoami_json(role: str, pools: frozenset[str] | None, tenant: str | None, authentication: bool) -> dict[str, Any]:
    """``GET /v1/whoami``: what the caller's own credential may do."""
    return {
        "role": role,
        "pools": None if pools is None else sorted(pools),
        "tenant": tenant,
        "authentication": authentication,
    }
