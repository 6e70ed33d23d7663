"""Client-side values to wire messages: enum names, payloads, times, dependencies and ``task()``."""

from __future__ import annotations

import datetime as _dt
import json
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict

from cronoq._client.common import Payload, TaskRef
from cronoq._keywords import keyword_signature, option_names, refuse_unknown
from cronoq.proto import cronoq_pb2 as pb

if TYPE_CHECKING:
    from typing_extensions import Unpack

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
OVERLAPS = {
    "skip": pb.OVERLAP_SKIP,
    "allow": pb.OVERLAP_ALLOW,
    "queue": pb.OVERLAP_QUEUE,
    "queue_on_success": pb.OVERLAP_QUEUE_ON_SUCCESS,
}


def _enum_text(enum: Any, number: int, prefix: str) -> str:
    try:
        name: str = enum.Name(number)
    except ValueError:
        return str(number)
    return name.removeprefix(prefix).lower()


def status_text(number: int) -> str:
    return _enum_text(pb.TaskStatus, number, "TASK_STATUS_")


def priority_text(number: int) -> str | None:
    if number == pb.PRIORITY_UNSPECIFIED:
        return None
    # Every lease carries a priority: look the few names up once.
    text = _PRIORITY_TEXT.get(number)
    if text is None:
        text = _PRIORITY_TEXT[number] = _enum_text(pb.Priority, number, "PRIORITY_")
    return text


_PRIORITY_TEXT: dict[int, str] = {}


def overlap_text(number: int) -> str:
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


def status_to_wire(name: str) -> int:
    if not isinstance(name, str):
        raise TypeError(f"a status filter is a name, not {type(name).__name__}")
    upper = name.strip().upper()
    if upper == "UNSPECIFIED":
        raise ValueError(f"unknown task status {name!r}")
    try:
        return int(pb.TaskStatus.Value(f"TASK_STATUS_{upper}"))
    except ValueError:
        raise ValueError(f"unknown task status {name!r}") from None


def from_table(table: Mapping[str, Any], value: str, what: str) -> Any:
    if not isinstance(value, str) or value.strip().lower() not in table:
        choices = ", ".join(sorted({k.removeprefix("on_") for k in table}))
        raise ValueError(f"unknown {what} {value!r}: expected one of {choices}")
    return table[value.strip().lower()]


def encode_value(value: Any) -> tuple[bytes, str]:
    """Bytes and default content type of a payload or handler output (see the module docs)."""
    if value is None:
        return b"", ""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value), "application/octet-stream"
    if isinstance(value, str):
        return value.encode("utf-8"), "text/plain; charset=utf-8"
    return json.dumps(value).encode("utf-8"), "application/json"


def to_seconds(value: Any, what: str) -> float:
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
    return int(to_seconds(value, what) * 1e9)


def task_ref_to_wire(ref: Any) -> pb.TaskRef:
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
    return pb.Dep(target=task_ref_to_wire(ref), cond=from_table(_EDGE_CONDS, cond, "dependency condition"))


def str_map(values: Mapping[Any, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (values or {}).items()}


class TaskSpecOptions(TypedDict, total=False):
    """The options of one task as ``task()``, ``Client.submit`` and ``Client.add_recurring`` take
    them (each keyword-only; ``deps`` defaults to ``()``, the rest to ``None``: not set)."""

    pool: str | None
    kind: str | None
    priority: Any
    key: str | None
    deadline_in: float | None
    deadline_at: _dt.datetime | float | None
    start_in: float | None
    start_at: _dt.datetime | float | None
    tolerance: float | None
    on_miss: str | None
    duration_hint: float | None
    timeout: float | None
    retry: Any
    after: TaskRef | Iterable[TaskRef] | None
    deps: Iterable[tuple[TaskRef, str] | Mapping[str, Any]]
    resources: Mapping[str, int] | None
    tags: Mapping[str, str] | None
    labels: Mapping[str, str] | None
    tenant: str | None
    content_type: str | None


TASK_SPEC_OPTIONS = frozenset(option_names(TaskSpecOptions))


@keyword_signature(TaskSpecOptions, {"deps": ()})
def task(payload: Payload = None, **options: Unpack[TaskSpecOptions]) -> pb.TaskSpec:
    """Build the wire ``TaskSpec`` for one task (for ``Client.submit_batch`` or ``add_recurring``).

    ``payload`` is encoded as bytes (as-is), str (UTF-8), None (empty) or JSON, with a matching
    content type unless ``content_type`` is given. Durations are seconds; ``*_at`` times are Unix
    seconds or aware datetimes. ``after`` adds on-success dependencies; ``deps`` takes
    ``(ref, cond)`` pairs or ``{"ref": ..., "cond": ...}`` mappings.
    """
    if options:
        refuse_unknown(options, TASK_SPEC_OPTIONS, "task")
    deadline_in, deadline_at = options.get("deadline_in"), options.get("deadline_at")
    start_in, start_at = options.get("start_in"), options.get("start_at")
    if deadline_in is not None and deadline_at is not None:
        raise ValueError("give deadline_in or deadline_at, not both")
    if start_in is not None and start_at is not None:
        raise ValueError("give start_in or start_at, not both")
    data, default_type = encode_value(payload)
    content_type = options.get("content_type")
    spec = pb.TaskSpec(
        payload=data,
        content_type=default_type if content_type is None else content_type,
        priority=_priority_to_wire(options.get("priority")),  # type: ignore[arg-type]
    )
    if (pool := options.get("pool")) is not None:
        spec.pool = pool
    if (kind := options.get("kind")) is not None:
        spec.kind = kind
    if (key := options.get("key")) is not None:
        spec.key = key
    if (tenant := options.get("tenant")) is not None:
        spec.tenant = tenant
    if deadline_in is not None:
        spec.deadline_in_s = to_seconds(deadline_in, "deadline_in")
    if deadline_at is not None:
        spec.deadline_unix_ns = _unix_ns(deadline_at, "deadline_at")
    if start_in is not None:
        spec.start_in_s = to_seconds(start_in, "start_in")
    if start_at is not None:
        spec.start_unix_ns = _unix_ns(start_at, "start_at")
    if (tolerance := options.get("tolerance")) is not None:
        spec.tolerance_s = to_seconds(tolerance, "tolerance")
    if (on_miss := options.get("on_miss")) is not None:
        spec.on_miss = from_table(_MISS_POLICIES, on_miss, "on_miss policy")
    if (duration_hint := options.get("duration_hint")) is not None:
        spec.duration_hint_s = to_seconds(duration_hint, "duration_hint")
    if (timeout := options.get("timeout")) is not None:
        spec.timeout_s = to_seconds(timeout, "timeout")
    if (retry := options.get("retry")) is not None:
        spec.retry.CopyFrom(_retry_to_wire(retry))
    if (after := options.get("after")) is not None:
        refs: Iterable[Any] = [after] if isinstance(after, int | str) else after
        for ref in refs:
            spec.deps.append(pb.Dep(target=task_ref_to_wire(ref), cond=pb.EDGE_COND_ON_SUCCESS))
    for dep in options.get("deps", ()):
        spec.deps.append(_dep_to_wire(dep))
    for name, units in (options.get("resources") or {}).items():
        spec.resources[str(name)] = int(units)
    spec.tags.update(str_map(options.get("tags")))
    spec.labels.update(str_map(options.get("labels")))
    return spec


def refuse_single_string(values: Any, what: str) -> None:
    if isinstance(values, str | bytes):
        raise TypeError(f"{what} must be a sequence of names, not a single string")
