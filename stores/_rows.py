"""Row layouts and encoding shared by every store: mutations become rows.

All three stores keep the same row shapes (the memory store keeps them in dicts), so they encode,
validate and fold alike, and the conformance suite can hold them to one behaviour. Rows become
recovered tasks again in ``_row_decode``.

Task rows (column order of ``TASK_COLUMNS``):

====================  =====================================================================
``id``                task id; stored as a signed 64-bit integer (see ``to_db_id``)
``pool``              the pool the engine resolved (``TaskRecord.pool``)
``kind``              ``TaskSpec.kind``
``priority``          ``Priority`` value 0..3
``key``               ``TaskSpec.key`` or NULL
``tenant``            ``TaskSpec.tenant`` or NULL
``status``            latest ``TaskStatus`` value (text)
``attempt``           attempts started so far
``max_attempts``      ``TaskRecord.max_attempts``
``message``           latest status message (NUL and lone surrogates replaced by U+FFFD)
``submitted_at``      ``TaskRecord.submitted_at``
``started_at``        ``at`` of the latest Running status, else NULL
``finished_at``       ``at`` of the terminal status, NULL while the task is live
``retry_at``          retry time of the latest status, else NULL
``spec``              JSON text with the rest of the spec (see ``spec_to_json``)
``payload``           ``codec.encode(spec.payload)``
``output``            ``codec.encode(output)`` of a Succeeded task, else NULL
``has_output``        whether ``output`` holds an output
====================  =====================================================================

Recurring rows: ``name``, ``cron``, ``spec`` (JSON: tz, policies and the template without its
payload), ``payload`` (the template's payload through the codec), ``next_at``, ``last_task_id``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from cronoq.engine.actions import (
    DeleteRecurring,
    Mutation,
    PutRecurring,
    PutTask,
    SetStatus,
    TaskRecord,
)
from cronoq.engine.types import (
    Priority,
    TaskSpec,
    TaskStatus,
)

from .base import Codec, Unstorable

# ---------------------------------------------------------------------------------------------
# Column layouts

TASK_COLUMNS: Final = (
    "id",
    "pool",
    "kind",
    "priority",
    "key",
    "tenant",
    "status",
    "attempt",
    "max_attempts",
    "message",
    "submitted_at",
    "started_at",
    "finished_at",
    "retry_at",
    "spec",
    "payload",
    "output",
    "has_output",
)
# Recovery reads every column but the output, which ``load_output`` fetches on demand.
READ_COLUMNS: Final = tuple(c for c in TASK_COLUMNS if c != "output")

(
    T_ID,
    T_POOL,
    T_KIND,
    T_PRIORITY,
    T_KEY,
    T_TENANT,
    T_STATUS,
    T_ATTEMPT,
    T_MAX_ATTEMPTS,
    T_MESSAGE,
    T_SUBMITTED,
    T_STARTED,
    T_FINISHED,
    T_RETRY_AT,
    T_SPEC,
    T_PAYLOAD,
) = range(16)
# Indexes that differ between a full row (TASK_COLUMNS) and a read row (READ_COLUMNS).
T_OUTPUT_FULL: Final = 16
T_HAS_OUTPUT_FULL: Final = 17
T_HAS_OUTPUT_READ: Final = 16

# A status update: what one task's SetStatus mutations of a step leave behind.
STATUS_COLUMNS: Final = (
    "id",
    "status",
    "attempt",
    "message",
    "started_at",  # NULL means: keep the stored value
    "finished_at",
    "retry_at",
    "output",
    "has_output",
)

RECURRING_COLUMNS: Final = ("name", "cron", "spec", "payload", "next_at", "last_task_id", "paused")

TERMINAL_VALUES: Final = frozenset(s.value for s in TaskStatus if s.terminal)
_RUNNING: Final = TaskStatus.RUNNING


def _status_value(status: object, task_id: object) -> str:
    """The stored text of a status. (``.value`` and hashing an enum member run Python code; the
    hot path reads the member's ``_value_`` and works with the text.)"""
    if type(status) is not TaskStatus:
        raise ValueError(f"task {task_id}: status must be a TaskStatus")
    value: str = status._value_
    return value


log = logging.getLogger("cronoq.stores")

# ---------------------------------------------------------------------------------------------
# Ids and integers

U64: Final = 1 << 64
_I63: Final = 1 << 63


def to_db_id(task_id: int) -> int:
    """A uint64 task id as the signed 64-bit integer SQL databases store.

    Ids of one store share their shard bits, so the mapping keeps their order.
    """
    if type(task_id) is not int or not 0 <= task_id < U64:
        raise ValueError(f"task id {task_id!r} is not an unsigned 64-bit integer")
    return task_id - U64 if task_id >= _I63 else task_id


def from_db_id(value: int) -> int:
    return value + U64 if value < 0 else value


def _i64(value: object, what: str) -> int:
    if type(value) is not int or not -_I63 <= value < _I63:
        raise ValueError(f"{what} must be an int that fits in 64 bits, got {value!r}")
    return value


def _opt_i64(value: object, what: str) -> int | None:
    return None if value is None else _i64(value, what)


# ---------------------------------------------------------------------------------------------
# Text rules


# Names (pools, kinds, tags...) repeat from task to task: remember the ones already checked.
_CHECKED: dict[str, None] = {}
_CHECKED_MAX: Final = 4096


def check_text(value: object, what: str) -> str:
    """Refuse text a store cannot keep as it is: NUL, unpaired surrogates, non-strings."""
    if type(value) is str and value in _CHECKED:
        return value
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{what} must not contain NUL characters: {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid Unicode text: {value!r}") from None
    if type(value) is str and len(value) <= 256:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[value] = None
    return value


def _opt_text(value: object, what: str) -> str | None:
    return None if value is None else check_text(value, what)


def clean_message(message: object) -> str | None:
    """Messages come from executors and workers: store them, replacing what text cannot hold."""
    if message is None:
        return None
    text = message if isinstance(message, str) else str(message)
    if "\0" in text:
        text = text.replace("\0", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in text)
    return text


def _str_map(value: Mapping[str, str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in value.items():
        out[check_text(k, f"{what} name")] = check_text(v, f"{what} {k!r} value")
    return out


def _int_map(value: Mapping[str, int], what: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in value.items():
        out[check_text(k, f"{what} name")] = _i64(v, f"{what} {k!r}")
    return out


# ---------------------------------------------------------------------------------------------
# Specs as JSON


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
"""Compact JSON text of a spec dict (one encoder for every call)."""

# Spec texts of the common cases, made once: a spec with nothing beyond its columns, whose pool
# is the resolved one or left to the default (``pool=None``).
PLAIN_SPEC: Final = {s.value: _dumps({"status": s.value}) for s in TaskStatus}
DEFAULT_POOL_SPEC: Final = {s.value: _dumps({"status": s.value, "pool": None}) for s in TaskStatus}


def _spec_text(value: str, fields: dict[str, Any]) -> str:
    if not fields:
        return PLAIN_SPEC[value]
    if len(fields) == 1 and "pool" in fields and fields["pool"] is None:
        return DEFAULT_POOL_SPEC[value]
    return _dumps({"status": value, **fields})


def _spec_fields(spec: TaskSpec, pool: str | None) -> dict[str, Any]:
    """The spec fields that have no column of their own; defaults are left out.

    ``pool`` is the pool already stored elsewhere: ``spec.pool`` is written only when it differs.
    """
    d: dict[str, Any] = {}
    if spec.pool != pool:
        d["pool"] = _opt_text(spec.pool, "pool name")
    if spec.deadline is not None:
        d["deadline"] = _i64(spec.deadline, "deadline")
    fs = spec.fixed_start
    if fs is not None:
        d["fixed_start"] = {
            "start": _i64(fs.start, "fixed start"),
            "tolerance": _i64(fs.tolerance, "fixed start tolerance"),
            "on_miss": fs.on_miss.value,
        }
    if spec.duration_hint is not None:
        d["duration_hint"] = _i64(spec.duration_hint, "duration hint")
    if spec.timeout is not None:
        d["timeout"] = _i64(spec.timeout, "timeout")
    if spec.retry is not None:
        r = spec.retry
        d["retry"] = {
            "max_attempts": _i64(r.max_attempts, "retry.max_attempts"),
            "initial_backoff": _i64(r.initial_backoff, "retry.initial_backoff"),
            "multiplier": float(r.multiplier),
            "max_backoff": _i64(r.max_backoff, "retry.max_backoff"),
            "jitter": bool(r.jitter),
        }
    if spec.deps:
        deps: list[dict[str, Any]] = []
        for dep in spec.deps:
            target = dep.target
            if isinstance(target, str):
                deps.append({"key": check_text(target, "dependency key"), "on": dep.cond.value})
            else:
                to_db_id(target)  # validates the range
                deps.append({"id": target, "on": dep.cond.value})
        d["deps"] = deps
    if spec.resources:
        d["resources"] = _int_map(spec.resources, "resource")
    if spec.tags:
        d["tags"] = _str_map(spec.tags, "tag")
    if spec.labels:
        d["labels"] = _str_map(spec.labels, "label")
    return d


def _template_to_dict(spec: TaskSpec) -> dict[str, Any]:
    d: dict[str, Any] = {
        "pool": _opt_text(spec.pool, "pool name"),
        "kind": check_text(spec.kind, "kind"),
        "priority": int(Priority.parse(spec.priority)),
    }
    if spec.key is not None:
        d["key"] = check_text(spec.key, "key")
    if spec.tenant is not None:
        d["tenant"] = check_text(spec.tenant, "tenant")
    d.update(_spec_fields(spec, spec.pool))
    return d


# ---------------------------------------------------------------------------------------------
# Encoding a step


@dataclass(slots=True)
class Batch:
    """One step's mutations folded into rows: at most one row per task and per schedule.

    ``tasks`` are full task rows to upsert; ``statuses`` update tasks written by earlier steps;
    ``recurring`` rows are upserted and ``deleted`` schedules removed; ``max_id`` is the largest
    task id submitted in the step (as stored), for the high-water mark. Folding first lets each
    kind travel as one statement whatever the order of the mutations.
    """

    tasks: list[list[Any]] = field(default_factory=list)
    statuses: list[list[Any]] = field(default_factory=list)
    recurring: list[tuple[Any, ...]] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    max_id: int | None = None

    @property
    def empty(self) -> bool:
        return not (self.tasks or self.statuses or self.recurring or self.deleted)


def _task_row(record: TaskRecord, codec: Codec) -> list[Any]:
    spec = record.spec
    pool = record.pool
    if type(pool) is not str or pool not in _CHECKED:
        check_text(pool, "pool name")
    kind = spec.kind
    if type(kind) is not str or kind not in _CHECKED:
        check_text(kind, "kind")
    status = record.status
    if type(status) is not TaskStatus:
        _status_value(status, record.id)
    value: str = status._value_
    submitted = record.submitted_at
    if type(submitted) is not int or not -_I63 <= submitted < _I63:
        _i64(submitted, "submitted_at")
    max_attempts = record.max_attempts
    if type(max_attempts) is not int or not -_I63 <= max_attempts < _I63:
        _i64(max_attempts, "max_attempts")
    task_id = record.id
    priority = spec.priority
    fields = _spec_fields(spec, pool)
    return [
        task_id if type(task_id) is int and 0 <= task_id < _I63 else to_db_id(task_id),
        pool,
        kind,
        priority._value_ if type(priority) is Priority else int(Priority.parse(priority)),
        None if spec.key is None else check_text(spec.key, "key"),
        None if spec.tenant is None else check_text(spec.tenant, "tenant"),
        value,
        0,
        max_attempts,
        None,
        submitted,
        None,
        submitted if value in TERMINAL_VALUES else None,
        None,
        _spec_text(value, fields),
        codec.encode(spec.payload),
        None,
        False,
    ]


def _apply_status(row: list[Any], m: SetStatus, codec: Codec, full_row: bool) -> None:
    """Apply one SetStatus to a task row (``full_row``) or a status row.

    Runs once or twice per task, so the checks of ``_status_value`` and ``_i64`` are written out
    for the valid case; anything else goes through them to raise their errors.
    """
    status = m.status
    if type(status) is not TaskStatus:
        _status_value(status, m.id)
    value: str = status._value_
    at = m.at
    if type(at) is not int or not -_I63 <= at < _I63:
        _i64(at, "status time")
    attempt = m.attempt
    if type(attempt) is not int or not -_I63 <= attempt < _I63:
        _i64(attempt, "attempt")
    has_output = m.has_output
    output = codec.encode(m.output) if has_output else None
    message = m.message
    if message is not None:
        message = clean_message(message)
    retry_at = m.retry_at
    if retry_at is not None and (type(retry_at) is not int or not -_I63 <= retry_at < _I63):
        _i64(retry_at, "retry_at")
    finished = at if value in TERMINAL_VALUES else None
    if full_row:
        row[T_STATUS] = value
        row[T_ATTEMPT] = attempt
        row[T_MESSAGE] = message
        if status is _RUNNING:
            row[T_STARTED] = at
        row[T_FINISHED] = finished
        row[T_RETRY_AT] = retry_at
        row[T_OUTPUT_FULL] = output
        row[T_HAS_OUTPUT_FULL] = has_output is True or bool(has_output)
    else:
        row[1] = value
        row[2] = attempt
        row[3] = message
        if status is _RUNNING:
            row[4] = at
        row[5] = finished
        row[6] = retry_at
        row[7] = output
        row[8] = has_output is True or bool(has_output)


def _status_row(db_id: int, m: SetStatus, codec: Codec) -> list[Any]:
    """The status row (``STATUS_COLUMNS``) of a task's first SetStatus in a step: the common case
    of ``_apply_status`` on a fresh row, built in one go. Same checks, same errors."""
    status = m.status
    if type(status) is not TaskStatus:
        _status_value(status, m.id)
    value: str = status._value_
    at = m.at
    if type(at) is not int or not -_I63 <= at < _I63:
        _i64(at, "status time")
    attempt = m.attempt
    if type(attempt) is not int or not -_I63 <= attempt < _I63:
        _i64(attempt, "attempt")
    message = m.message
    if message is not None:
        message = clean_message(message)
    retry_at = m.retry_at
    if retry_at is not None and (type(retry_at) is not int or not -_I63 <= retry_at < _I63):
        _i64(retry_at, "retry_at")
    has_output = m.has_output
    if has_output:
        return [db_id, value, attempt, message, at if status is _RUNNING else None,
                at if value in TERMINAL_VALUES else None, retry_at, codec.encode(m.output), True]  # fmt: skip
    return [db_id, value, attempt, message, at if status is _RUNNING else None,
            at if value in TERMINAL_VALUES else None, retry_at, None, False]  # fmt: skip


def _recurring_row(m: PutRecurring, codec: Codec) -> tuple[Any, ...]:
    spec = m.spec
    d: dict[str, Any] = {
        "overlap": spec.overlap.value,
        "tolerance": _i64(spec.tolerance, "recurring tolerance"),
        "on_miss": spec.on_miss.value,
        "template": _template_to_dict(spec.template),
    }
    if spec.tz is not None:
        d["tz"] = check_text(spec.tz, "time zone")
    if spec.deadline_after is not None:
        d["deadline_after"] = _i64(spec.deadline_after, "deadline_after")
    return (
        check_text(spec.name, "recurring name"),
        check_text(spec.cron, "cron expression"),
        _dumps(d),
        codec.encode(spec.template.payload),
        _opt_i64(m.next_at, "next_at"),
        None if m.last_task_id is None else to_db_id(m.last_task_id),
        m.paused,
    )


def fold(mutations: Sequence[Mutation], codec: Codec) -> Batch:
    """Validate and encode a step. Raises ``Unstorable`` (a ValueError and a TypeError) naming
    the task of the first mutation that cannot be stored, before anything is written."""
    try:
        return _fold(mutations, codec)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, Unstorable):
            raise
        raise Unstorable(str(exc), _failed_task(mutations, codec)) from exc


def _failed_task(mutations: Sequence[Mutation], codec: Codec) -> int | None:
    """The task of the first mutation that does not fold on its own (None: a schedule, or none)."""
    for m in mutations:
        try:
            _fold([m], codec)
        except (ValueError, TypeError):
            task_id = m.task.id if isinstance(m, PutTask) else m.id if isinstance(m, SetStatus) else None
            return task_id if type(task_id) is int else None
    return None


def _fold(mutations: Sequence[Mutation], codec: Codec) -> Batch:
    tasks: dict[int, list[Any]] = {}
    statuses: dict[int, list[Any]] = {}
    recurring: dict[str, tuple[Any, ...] | None] = {}
    max_id: int | None = None
    for m in mutations:
        if type(m) is SetStatus or isinstance(m, SetStatus):
            task_id = m.id
            db_id = task_id if type(task_id) is int and 0 <= task_id < _I63 else to_db_id(task_id)
            row = tasks.get(db_id)
            if row is not None:
                _apply_status(row, m, codec, full_row=True)
            else:
                upd = statuses.get(db_id)
                if upd is None:
                    statuses[db_id] = _status_row(db_id, m, codec)
                else:
                    _apply_status(upd, m, codec, full_row=False)
        elif isinstance(m, PutTask):
            row = _task_row(m.task, codec)
            db_id = row[T_ID]
            tasks[db_id] = row
            statuses.pop(db_id, None)
            if max_id is None or m.task.id > max_id:
                max_id = m.task.id
        elif isinstance(m, PutRecurring):
            put = _recurring_row(m, codec)
            recurring.pop(put[0], None)  # keep the order of the last write
            recurring[put[0]] = put
        elif isinstance(m, DeleteRecurring):
            name = check_text(m.name, "recurring name")
            recurring.pop(name, None)
            recurring[name] = None
        else:
            raise TypeError(f"not a mutation: {m!r}")
    batch = Batch(
        tasks=list(tasks.values()),
        statuses=list(statuses.values()),
        max_id=None if max_id is None else to_db_id(max_id),
    )
    for name, rec in recurring.items():
        if rec is None:
            batch.deleted.append(name)
        else:
            batch.recurring.append(rec)
    return batch
