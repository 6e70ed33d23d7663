"""Row decoding for recovery and history: stored rows back into recovered tasks and schedules.

The inverse of the encoding in ``_rows``: every column is checked, and whatever a damaged row
holds raises ``Corrupt`` with a short reason, which recovery turns into a quarantined task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import json
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final, NoReturn

from cronoq.engine.actions import Recovered, RecoveredRecurring, RecoveredTask, TaskRecord
from cronoq.engine.types import (
    Dep,
    EdgeCond,
    FixedStart,
    MissPolicy,
    OverlapPolicy,
    Priority,
    RecurringSpec,
    RetryPolicy,
    TaskSpec,
    TaskStatus,
)

from ._rows import (
    DEFAULT_POOL_SPEC,
    PLAIN_SPEC,
    READ_COLUMNS,
    T_ATTEMPT,
    T_FINISHED,
    T_HAS_OUTPUT_READ,
    T_ID,
    T_KEY,
    T_KIND,
    T_MAX_ATTEMPTS,
    T_MESSAGE,
    T_PAYLOAD,
    T_POOL,
    T_PRIORITY,
    T_RETRY_AT,
    T_SPEC,
    T_STARTED,
    T_STATUS,
    T_SUBMITTED,
    T_TENANT,
    TERMINAL_VALUES,
    U64,
    clean_message,
    from_db_id,
    log,
    to_db_id,
)
from .base import Codec, Corrupt

# ---------------------------------------------------------------------------------------------
# Decoding helpers raise Corrupt with a short reason.


def _want_int(value: object, what: str) -> int:
    if type(value) is not int:
        raise Corrupt(f"{what} is not an integer")
    return value


def _want_opt_int(value: object, what: str) -> int | None:
    return None if value is None else _want_int(value, what)


def _want_str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise Corrupt(f"{what} is not text")
    return value


def _want_opt_str(value: object, what: str) -> str | None:
    return None if value is None else _want_str(value, what)


def _want_str_map(value: object, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise Corrupt(f"{what} are not a map of text")
    return value


def _want_int_map(value: object, what: str) -> dict[str, int]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and type(v) is int for k, v in value.items()):
        raise Corrupt(f"{what} are not a map of integers")
    return value


def _enum(cls: Any, value: object, what: str) -> Any:
    try:
        return cls(value)
    except (ValueError, TypeError):
        raise Corrupt(f"unknown {what} {value!r}") from None


def _load_json(text: object, what: str) -> dict[str, Any]:
    if isinstance(text, bytes | bytearray | memoryview):
        text = bytes(text).decode("utf-8", "replace")
    if not isinstance(text, str):
        raise Corrupt(f"{what} is not text")
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise Corrupt(f"{what} is not valid JSON ({reason})") from None
    if not isinstance(d, dict):
        raise Corrupt(f"{what} is not a JSON object")
    return d


def _spec_from_fields(d: dict[str, Any], spec: TaskSpec) -> TaskSpec:
    """Fill ``spec`` (which already holds the column fields) from a ``_spec_fields`` dict."""
    if "pool" in d:
        spec.pool = _want_opt_str(d["pool"], "spec pool")
    spec.deadline = _want_opt_int(d.get("deadline"), "deadline")
    fs = d.get("fixed_start")
    if fs is not None:
        if not isinstance(fs, dict):
            raise Corrupt("fixed start is not an object")
        spec.fixed_start = FixedStart(
            start=_want_int(fs.get("start"), "fixed start"),
            tolerance=_want_int(fs.get("tolerance"), "fixed start tolerance"),
            on_miss=_enum(MissPolicy, fs.get("on_miss"), "miss policy"),
        )
    spec.duration_hint = _want_opt_int(d.get("duration_hint"), "duration hint")
    spec.timeout = _want_opt_int(d.get("timeout"), "timeout")
    r = d.get("retry")
    if r is not None:
        if not isinstance(r, dict):
            raise Corrupt("retry policy is not an object")
        multiplier = r.get("multiplier")
        if type(multiplier) not in (int, float):
            raise Corrupt("retry multiplier is not a number")
        jitter = r.get("jitter")
        if not isinstance(jitter, bool):
            raise Corrupt("retry jitter is not a boolean")
        spec.retry = RetryPolicy(
            max_attempts=_want_int(r.get("max_attempts"), "retry max_attempts"),
            initial_backoff=_want_int(r.get("initial_backoff"), "retry initial_backoff"),
            multiplier=float(multiplier),  # type: ignore[arg-type]
            max_backoff=_want_int(r.get("max_backoff"), "retry max_backoff"),
            jitter=jitter,
        )
    deps_raw = d.get("deps", ())
    if not isinstance(deps_raw, list | tuple):
        raise Corrupt("dependencies are not a list")
    deps: list[Dep] = []
    for item in deps_raw:
        if not isinstance(item, dict):
            raise Corrupt("a dependency is not an object")
        cond = _enum(EdgeCond, item.get("on"), "dependency condition")
        if "id" in item:
            deps.append(Dep(_want_int(item["id"], "dependency id"), cond))
        else:
            deps.append(Dep(_want_str(item.get("key"), "dependency key"), cond))
    spec.deps = tuple(deps)
    spec.resources = _want_int_map(d.get("resources", {}), "resources")
    spec.tags = _want_str_map(d.get("tags", {}), "tags")
    spec.labels = _want_str_map(d.get("labels", {}), "labels")
    return spec


def _template_from_dict(d: dict[str, Any], payload: object) -> TaskSpec:
    spec = TaskSpec(
        payload=payload,
        pool=_want_opt_str(d.get("pool"), "template pool"),
        kind=_want_str(d.get("kind"), "template kind"),
        priority=_enum(Priority, d.get("priority"), "priority"),
        key=_want_opt_str(d.get("key"), "template key"),
        tenant=_want_opt_str(d.get("tenant"), "template tenant"),
    )
    rest = {k: v for k, v in d.items() if k != "pool"}
    return _spec_from_fields(rest, spec)


def _decode_payload(codec: Codec, data: object, what: str) -> object:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise Corrupt(f"{what} is not bytes")
    try:
        return codec.decode(bytes(data))
    except Exception as exc:
        raise Corrupt(f"{what} cannot be decoded ({type(exc).__name__}: {exc})") from None


def decode_output(codec: Codec, data: object) -> object:
    return _decode_payload(codec, data, "output")


# ---------------------------------------------------------------------------------------------
# Decoding for recovery


# Lookups that stand in for calling the enum classes (which run Python code) on the hot path.
_STATUS_OF: Final = {s.value: s for s in TaskStatus}
_PRIORITY_OF: Final = {int(p): p for p in Priority}


class FrozenMap(dict[str, Any]):
    """A dict that refuses changes. Recovered specs share their resources, tags and labels
    (three empty dicts per task were a third of a pending task's memory, and a backlog's tasks
    often carry the same maps), so none of them may be changed in place: that would change every
    task at once. Reading, copying and JSON work as with any dict."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("the maps of a recovered task's spec are shared: copy them to change them")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type[FrozenMap], tuple[dict[str, Any]]]:
        return FrozenMap, (dict(self),)


EMPTY_MAP: Final[Mapping[str, Any]] = FrozenMap()


def _shared(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return FrozenMap(values) if values else EMPTY_MAP


# What a spec text holds besides the columns, as ``add_rows`` shares it between the tasks with the
# same text: submitted status, whether the text names the spec's pool, that pool, deadline, fixed
# start, duration hint, timeout, retry, dependencies, resources, tags, labels.
_Shape = tuple[
    TaskStatus,
    bool,
    str | None,
    int | None,
    FixedStart | None,
    int | None,
    int | None,
    RetryPolicy | None,
    tuple[Dep, ...],
    Mapping[str, int],
    Mapping[str, str],
    Mapping[str, str],
]
# The texts ``_spec_text`` writes for plain specs (nothing beyond the columns), known in advance;
# a plain spec's pool is the resolved one (PLAIN_SPEC) or left to the default (DEFAULT_POOL_SPEC).
_PLAIN_SHAPES: Final[dict[str, _Shape]] = {
    **{text: (_STATUS_OF[value], False, None, None, None, None, None, None, (), EMPTY_MAP, EMPTY_MAP, EMPTY_MAP)
       for value, text in PLAIN_SPEC.items()},
    **{text: (_STATUS_OF[value], True, None, None, None, None, None, None, (), EMPTY_MAP, EMPTY_MAP, EMPTY_MAP)
       for value, text in DEFAULT_POOL_SPEC.items()},
}  # fmt: skip
_PLAIN_SPEC_OF: Final = {text: (shape[0], shape[1]) for text, shape in _PLAIN_SHAPES.items()}
# Parsed texts a Recovery remembers at most (texts that differ per task, by their deadline for
# instance, must not fill the memory).
_SHAPES_MAX: Final = 4096


def _spec_shape(text: str) -> _Shape | None:
    """The shape of a spec text that is not plain, or None if the text is damaged (its row goes
    through ``Recovery.add``, which says why)."""
    try:
        d = _load_json(text, "spec")
        status = _enum(TaskStatus, d.pop("status", None), "submitted status")
        own_pool = "pool" in d
        spec = _spec_from_fields(d, TaskSpec())
    except Exception:
        return None
    return (status, own_pool, spec.pool, spec.deadline, spec.fixed_start, spec.duration_hint, spec.timeout,
            spec.retry, spec.deps, _shared(spec.resources), _shared(spec.tags), _shared(spec.labels))  # fmt: skip


# ``add_rows`` builds specs positionally (keywords cost a third of the construction).
_SPEC_ORDER: Final = ("payload", "pool", "kind", "priority", "key", "deadline", "fixed_start", "duration_hint",
                      "timeout", "retry", "deps", "resources", "tags", "labels", "tenant")  # fmt: skip
assert tuple(f.name for f in dataclasses.fields(TaskSpec)) == _SPEC_ORDER
assert len(READ_COLUMNS) == 17  # the unpacking in ``add_rows``


def _status(value: object, what: str) -> TaskStatus:
    found = _STATUS_OF.get(value) if type(value) is str else None
    return found if found is not None else _enum(TaskStatus, value, what)


def decode_task(row: Sequence[Any], codec: Codec) -> RecoveredTask:
    """A read row (READ_COLUMNS order) as a RecoveredTask; raises Corrupt.

    Checks every column like the general path; a spec text that a plain spec produces (nothing
    beyond its columns) skips the JSON parser, since that is the spec of most tasks.
    """
    task_id = from_db_id(_want_int(row[T_ID], "id"))
    pool = row[T_POOL]
    if type(pool) is not str:
        pool = _want_str(pool, "pool")
    spec_text = row[T_SPEC]
    plain = _PLAIN_SPEC_OF.get(spec_text) if type(spec_text) is str else None
    d: dict[str, Any] | None = None
    if plain is None:
        d = _load_json(spec_text, "spec")
        submitted_status = _enum(TaskStatus, d.pop("status", None), "submitted status")
    else:
        submitted_status = plain[0]
    priority = _PRIORITY_OF.get(row[T_PRIORITY]) if type(row[T_PRIORITY]) is int else None
    if priority is None:
        priority = _enum(Priority, row[T_PRIORITY], "priority")
    kind = row[T_KIND]
    key = row[T_KEY]
    tenant = row[T_TENANT]
    spec = TaskSpec(
        payload=_decode_payload(codec, row[T_PAYLOAD], "payload"),
        pool=None if plain is not None and plain[1] else pool,
        kind=kind if type(kind) is str else _want_str(kind, "kind"),
        priority=priority,
        key=key if key is None or type(key) is str else _want_str(key, "key"),
        tenant=tenant if tenant is None or type(tenant) is str else _want_str(tenant, "tenant"),
    )
    if d is not None:
        _spec_from_fields(d, spec)
    else:
        spec.resources = spec.tags = spec.labels = EMPTY_MAP
    submitted = row[T_SUBMITTED]
    max_attempts = row[T_MAX_ATTEMPTS]
    record = TaskRecord(
        id=task_id,
        pool=pool,
        spec=spec,
        submitted_at=submitted if type(submitted) is int else _want_int(submitted, "submitted_at"),
        status=submitted_status,
        max_attempts=max_attempts if type(max_attempts) is int else _want_int(max_attempts, "max_attempts"),
    )
    attempt = row[T_ATTEMPT]
    message = row[T_MESSAGE]
    started = row[T_STARTED]
    finished = row[T_FINISHED]
    retry_at = row[T_RETRY_AT]
    return RecoveredTask(
        record=record,
        status=_status(row[T_STATUS], "status"),
        attempt=attempt if type(attempt) is int else _want_int(attempt, "attempt"),
        message=message if message is None or type(message) is str else _want_str(message, "message"),
        started_at=started if started is None or type(started) is int else _want_int(started, "started_at"),
        finished_at=finished if finished is None or type(finished) is int else _want_int(finished, "finished_at"),
        retry_at=retry_at if retry_at is None or type(retry_at) is int else _want_int(retry_at, "retry_at"),
        has_output=bool(row[T_HAS_OUTPUT_READ]),
    )


def quarantine_message(reason: str) -> str:
    return clean_message(f"quarantined: {reason}") or ""


def quarantined_task(row: Sequence[Any], reason: str, now: int) -> RecoveredTask:
    """What recovery reports for a row it could not decode: a dead-lettered task with what was legible."""

    def pick(index: int, kind: type, default: Any) -> Any:
        value = row[index]
        return value if type(value) is kind else default

    pool = pick(T_POOL, str, "default")
    priority = row[T_PRIORITY]
    spec = TaskSpec(
        pool=pool,
        kind=pick(T_KIND, str, "default"),
        priority=Priority(priority) if priority in (0, 1, 2, 3) else Priority.NORMAL,
        key=pick(T_KEY, str, None),
        tenant=pick(T_TENANT, str, None),
    )
    submitted = pick(T_SUBMITTED, int, now)
    record = TaskRecord(
        id=from_db_id(row[T_ID]),
        pool=pool,
        spec=spec,
        submitted_at=submitted,
        status=TaskStatus.DEAD_LETTERED,
        max_attempts=pick(T_MAX_ATTEMPTS, int, 1),
    )
    return RecoveredTask(
        record=record,
        status=TaskStatus.DEAD_LETTERED,
        attempt=pick(T_ATTEMPT, int, 0),
        message=quarantine_message(reason),
        started_at=pick(T_STARTED, int, None),
        finished_at=pick(T_FINISHED, int, now),
        retry_at=None,
        has_output=False,
    )


def log_bad_recurring(name: object, exc: Exception) -> None:
    log.error("recurring schedule %r cannot be decoded and is skipped: %s", name, exc)


def add_recurring(recovered: Recovered, rows: Iterable[Sequence[Any]], codec: Codec) -> None:
    """Decode recurring rows into ``recovered``; one that cannot be decoded is logged, skipped and
    counted as quarantined."""
    for row in rows:
        try:
            recovered.recurring.append(decode_recurring(row, codec))
        except Corrupt as exc:
            log_bad_recurring(row[0], exc)
            recovered.quarantined += 1


def decode_recurring(row: Sequence[Any], codec: Codec) -> RecoveredRecurring:
    """A recurring row (RECURRING_COLUMNS order) as a RecoveredRecurring; raises Corrupt."""
    try:
        return _decode_recurring(row, codec)
    except Corrupt:
        raise
    except Exception as exc:
        raise Corrupt(f"{type(exc).__name__}: {exc}") from None


def _decode_recurring(row: Sequence[Any], codec: Codec) -> RecoveredRecurring:
    name = _want_str(row[0], "recurring name")
    cron = _want_str(row[1], "cron")
    d = _load_json(row[2], "recurring spec")
    template = d.get("template")
    if not isinstance(template, dict):
        raise Corrupt("recurring template is not an object")
    spec = RecurringSpec(
        name=name,
        cron=cron,
        template=_template_from_dict(template, _decode_payload(codec, row[3], "template payload")),
        tz=_want_opt_str(d.get("tz"), "time zone"),
        overlap=_enum(OverlapPolicy, d.get("overlap"), "overlap policy"),
        tolerance=_want_int(d.get("tolerance"), "tolerance"),
        on_miss=_enum(MissPolicy, d.get("on_miss"), "miss policy"),
        deadline_after=_want_opt_int(d.get("deadline_after"), "deadline_after"),
    )
    last = _want_opt_int(row[5], "last_task_id")
    return RecoveredRecurring(
        spec=spec,
        next_at=_want_opt_int(row[4], "next_at"),
        last_task_id=None if last is None else from_db_id(last),
        paused=bool(row[6]),
    )


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while recovery builds its objects.

    Recovery allocates several objects per task and keeps all of them, so every collection that
    the allocations trigger finds nothing to free yet walks a heap that keeps growing: with
    100,000 tasks that is about a third of the decoding time. Nothing is lost by pausing:
    reference counting still frees what becomes garbage, and the collector catches up when it is
    switched back on (only if it was on before).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Recovery:
    """Collects decoded rows during ``recover`` and works out which parents are still missing."""

    __slots__ = ("codec", "dependents", "keys", "now", "quarantined", "shapes", "tasks")

    def __init__(self, codec: Codec, now: int) -> None:
        self.codec = codec
        self.now = now
        self.tasks: dict[int, RecoveredTask] = {}
        self.keys: dict[str, int] = {}
        self.quarantined: list[tuple[int, str]] = []  # (stored id, message)
        self.dependents: list[RecoveredTask] = []  # tasks with dependencies, for missing_parents
        self.shapes: dict[str, _Shape] = dict(_PLAIN_SHAPES)  # spec texts seen, for add_rows

    def add(self, row: Sequence[Any]) -> None:
        try:
            task = decode_task(row, self.codec)
        except Exception as exc:  # whatever a damaged row throws, recovery goes on
            reason = str(exc) if isinstance(exc, Corrupt) else f"{type(exc).__name__}: {exc}"
            task = quarantined_task(row, reason, self.now)
            self.quarantined.append((row[T_ID], task.message or ""))
        self.tasks[task.record.id] = task
        key = task.record.spec.key
        if key is not None and self.keys.get(key, -1) < task.record.id:
            self.keys[key] = task.record.id
        if task.record.spec.deps:
            self.dependents.append(task)

    def add_rows(self, rows: Iterable[Sequence[Any]]) -> None:
        """``add`` for each of ``rows``, with the same result, at a fraction of the cost.

        Takeover time is mostly this loop (10^6 rows for a large backlog), so rows are checked
        and built inline here: one unpacking instead of a lookup per column, positional
        construction, no call per row, and each distinct spec text parsed once, its fields
        shared by the tasks that have it (plain specs, most of them, need no parsing at all).
        A row with a column of an unexpected type or a damaged text or payload goes through
        ``add`` and its full checks.
        """
        add = self.add
        decode = self.codec.decode
        tasks = self.tasks
        keys = self.keys
        dependents = self.dependents
        shapes = self.shapes
        priority_of, status_of = _PRIORITY_OF, _STATUS_OF
        for row in rows:
            (db_id, pool, kind, priority, key, tenant, status, attempt, max_attempts, message,
             submitted, started, finished, retry_at, spec_text, payload, has_output) = row  # fmt: skip
            shape = shapes.get(spec_text) if type(spec_text) is str else None
            if shape is None and type(spec_text) is str:
                shape = _spec_shape(spec_text)
                if shape is not None:
                    if len(shapes) >= len(_PLAIN_SHAPES) + _SHAPES_MAX:
                        shapes.clear()
                        shapes.update(_PLAIN_SHAPES)
                    shapes[spec_text] = shape
            spec_priority = priority_of.get(priority) if type(priority) is int else None
            task_status = status_of.get(status) if type(status) is str else None
            if (
                shape is None
                or spec_priority is None
                or task_status is None
                or type(payload) is not bytes
                or type(db_id) is not int
                or type(pool) is not str
                or type(kind) is not str
                or type(attempt) is not int
                or type(max_attempts) is not int
                or type(submitted) is not int
                or (key is not None and type(key) is not str)
                or (tenant is not None and type(tenant) is not str)
                or (message is not None and type(message) is not str)
                or (started is not None and type(started) is not int)
                or (finished is not None and type(finished) is not int)
                or (retry_at is not None and type(retry_at) is not int)
            ):
                add(row)
                continue
            try:
                value = decode(payload)
            except Exception:
                add(row)  # quarantined there, with the reason
                continue
            task_id = db_id + U64 if db_id < 0 else db_id
            (submitted_status, own_pool, spec_pool, deadline, fixed, hint, timeout, retry, deps, resources, tags,
             labels) = shape  # fmt: skip
            spec = TaskSpec(value, spec_pool if own_pool else pool, kind, spec_priority, key, deadline, fixed, hint,
                            timeout, retry, deps, resources, tags, labels, tenant)  # fmt: skip
            record = TaskRecord(task_id, pool, spec, submitted, submitted_status, max_attempts)
            task = tasks[task_id] = RecoveredTask(record, task_status, attempt, message, started, finished, retry_at,
                                                  bool(has_output))  # fmt: skip
            if key is not None and keys.get(key, -1) < task_id:
                keys[key] = task_id
            if deps:
                dependents.append(task)

    def missing_parents(self) -> tuple[list[int], list[str]]:
        """Ids (as stored) and keys that live tasks depend on but that were not loaded."""
        ids: set[int] = set()
        keys: set[str] = set()
        tasks = self.tasks
        seen: set[int] = set()  # dependency tuples looked at (the tasks of one spec text share one)
        for task in self.dependents:
            if task.status._value_ in TERMINAL_VALUES or tasks.get(task.record.id) is not task:
                continue  # ended, or replaced by a later row of the same id
            deps = task.record.spec.deps
            if id(deps) in seen:
                continue
            seen.add(id(deps))
            for dep in deps:
                target = dep.target
                if isinstance(target, str):
                    if target not in self.keys:
                        keys.add(target)
                elif target not in self.tasks and 0 <= target < U64:
                    ids.add(to_db_id(target))
        return sorted(ids), sorted(keys)

    def add_parents(self, rows: Sequence[Sequence[Any]], ids: Sequence[int], keys: Sequence[str]) -> None:
        """Add the terminal parents fetched for ``missing_parents``.

        A parent named by id is added as is; for a key only the newest task with it counts.
        """
        wanted_ids = set(ids)
        wanted_keys = set(keys)
        newest: dict[str, Sequence[Any]] = {}
        for row in rows:
            if row[T_STATUS] not in TERMINAL_VALUES:
                continue  # a live row was loaded already
            if row[T_ID] in wanted_ids and from_db_id(row[T_ID]) not in self.tasks:
                self.add(row)
            key = row[T_KEY]
            if key in wanted_keys:
                prev = newest.get(key)
                if prev is None or from_db_id(prev[T_ID]) < from_db_id(row[T_ID]):
                    newest[key] = row
        for row in newest.values():
            if from_db_id(row[T_ID]) not in self.tasks:
                self.add(row)

    def ordered(self) -> list[RecoveredTask]:
        """The tasks by id. Rows are read in id order, so the sort is usually skipped."""
        ids = list(self.tasks)
        if all(map(operator.lt, ids, itertools.islice(ids, 1, None))):
            return list(self.tasks.values())
        return [self.tasks[i] for i in sorted(self.tasks)]
