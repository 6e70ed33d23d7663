"""Task history: finished tasks read back from a durable store, after the engine forgot them.

The engine keeps finished tasks for the key retention window (1 hour by default); the store keeps
their rows for ``keep_finished_s`` (7 days). The SQL stores answer three reads here:

* ``history(query, after, limit, descending)``: finished tasks that match a ``TaskQuery``, in id
  order from a cursor. Only finished rows are listed (the engine lists live tasks itself), and the
  indexes of schema version 4 cover finished rows only, so inserting a task costs no extra index
  entry. A page costs O(page) index entries: a filter with one value is an equality on the leading
  column of an ``(column, id)`` index, whose entries come in id order; a filter with several
  values (two pools, say) is asked once per value (``fan_out``) and the answers merged.
* ``history_task(id)``: one task's row, whatever its status, with its spec.
* ``transitions(id)``: the status changes a task went through, as the store recorded them: one per
  task and commit (a task whose status changed twice within one engine step shows the second).

``HistoryRead`` is that protocol; ``SqlHistory`` builds the statements of both SQL dialects.
Stored ids are signed 64-bit integers (``_rows.to_db_id``); every id of one store carries its
shard's number, so the cursor is clamped to the shard's id range (``shard_bounds``) before it is
compared with them.
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Protocol, runtime_checkable

from cronoq.engine.actions import RecoveredTask
from cronoq.engine.types import TaskStatus
from cronoq.engine.views import TaskInfo, TaskQuery

from . import _row_decode as D
from . import _rows as R
from .base import Codec, Corrupt

__all__ = [
    "MAX_FAN_OUT",
    "HistoryRead",
    "SqlHistory",
    "Transition",
    "clamp_cursor",
    "decode_row",
    "fan_out",
    "info_of",
    "merge_pages",
    "read_page",
    "row_info",
    "shard_bounds",
    "transition_of",
]

MAX_FAN_OUT: Final = 16
"""A multi-valued filter with more values than this is one statement (``IN``) instead of one per
value: past a few values the planner's own choice costs less than many round trips."""

SHARD_SHIFT: Final = 56


@dataclass(frozen=True, slots=True)
class Transition:
    """One recorded status change: ``at`` is when it happened as far as the row tells (the start
    of a running attempt, the end of a finished task); ``retry_at`` when a retry is due."""

    status: TaskStatus
    attempt: int
    message: str | None
    at: int | None
    retry_at: int | None


@runtime_checkable
class HistoryRead(Protocol):
    """What a store offers for reading history (the SQL stores and the memory store)."""

    async def history(self, query: TaskQuery, after: int, limit: int, descending: bool = False) -> list[TaskInfo]: ...

    async def history_task(self, task_id: int) -> RecoveredTask | None: ...

    async def transitions(self, task_id: int) -> list[Transition]: ...


def shard_bounds(shard: int) -> tuple[int, int]:
    """The first and last task id of shard number ``shard`` (0: unsharded)."""
    return shard << SHARD_SHIFT, ((shard + 1) << SHARD_SHIFT) - 1


def clamp_cursor(after: int, descending: bool, shard: int) -> int | None:
    """``after`` moved into the shard's id range, so that the signed stored ids compare with it as
    the unsigned ids do; None when no id of the shard is past the cursor."""
    low, high = shard_bounds(shard)
    if descending:
        if after == 0 or after > high:
            return 0
        return None if after <= low else after
    if after >= high:
        return None
    return max(after, low - 1) if low else after


def decode_row(row: Sequence[Any], codec: Codec, now: int) -> RecoveredTask:
    """A read row (``_rows.READ_COLUMNS`` order) decoded; a row that cannot be decoded shows as the
    Failed task recovery would quarantine it as."""
    try:
        return D.decode_task(row, codec)
    except Corrupt as exc:
        return D.quarantined_task(row, str(exc), now)


def info_of(task: RecoveredTask) -> TaskInfo:
    """A stored task as the engine's ``TaskInfo``."""
    record = task.record
    spec = record.spec
    fixed = spec.fixed_start
    return TaskInfo(
        id=record.id,
        pool=record.pool,
        key=spec.key,
        kind=spec.kind,
        status=task.status,
        attempt=task.attempt,
        max_attempts=record.max_attempts,
        priority=spec.priority,
        tenant=spec.tenant,
        created_at=record.submitted_at,
        started_at=task.started_at,
        finished_at=task.finished_at,
        message=task.message,
        has_output=task.has_output,
        tags=dict(spec.tags),
        deadline=spec.deadline,
        fixed_start=fixed.start if fixed is not None else None,
    )


def row_info(row: Sequence[Any], codec: Codec, now: int) -> TaskInfo:
    return info_of(decode_row(row, codec, now))


def transition_of(status: object, attempt: object, message: object, started: object, finished: object,
                  retry_at: object) -> Transition | None:  # fmt: skip
    """A recorded status row as a ``Transition`` (None when it cannot be read)."""
    try:
        value = TaskStatus(status)
    except ValueError:
        return None
    if type(attempt) is not int:
        return None
    at = finished if value.terminal else started if value is TaskStatus.RUNNING else None
    return Transition(
        status=value,
        attempt=attempt,
        message=message if isinstance(message, str) else None,
        at=at if type(at) is int else None,
        retry_at=retry_at if type(retry_at) is int else None,
    )


def fan_out(query: TaskQuery) -> list[TaskQuery]:
    """The queries whose merged pages make the page of ``query``: one per value of its smallest
    multi-valued filter (unless a filter has one value already, or too many)."""
    fields: list[tuple[str, frozenset[Any]]] = [
        (name, values) for name in ("kinds", "tenants", "pools", "statuses") if (values := getattr(query, name))
    ]
    if not fields or any(len(values) == 1 for _, values in fields):
        return [query]
    name, values = min(fields, key=lambda item: len(item[1]))
    if len(values) > MAX_FAN_OUT:
        return [query]
    fields_of: dict[str, Any] = {}
    out = []
    for value in sorted(values, key=str):
        fields_of[name] = frozenset((value,))
        out.append(replace(query, **fields_of))
    return out


def merge_pages(pages: Iterable[list[TaskInfo]], limit: int, descending: bool) -> list[TaskInfo]:
    """The first ``limit`` tasks of pages that are each in id order (no id in two pages)."""
    merged = heapq.merge(*pages, key=lambda info: info.id, reverse=descending)
    out: list[TaskInfo] = []
    for info in merged:
        out.append(info)
        if len(out) >= limit:
            break
    return out


def _key_upper(prefix: str) -> str | None:
    """The least string above every string starting with ``prefix`` (binary order), if any."""
    for index in range(len(prefix) - 1, -1, -1):
        code = ord(prefix[index])
        if code < 0x10FFFF and not 0xD7FF <= code < 0xDFFF:
            return prefix[:index] + chr(code + 1)
    return None


class SqlHistory:
    """The history statements of one dialect: ``placeholder(n)`` spells parameter ``n`` (from 1),
    ``table`` is the (qualified) task table, ``binary`` the collation clause that makes text
    compare byte by byte (for key prefixes), ``starts_with`` the exact prefix test."""

    def __init__(
        self,
        table: str,
        placeholder: Callable[[int], str],
        *,
        binary: str,
        starts_with: Callable[[str, str], str],
        array: Callable[[str, str], str] | None = None,
    ) -> None:
        self.table = table
        self.placeholder = placeholder
        self.binary = binary
        self.starts_with = starts_with
        self.array = array
        self.columns = ", ".join(R.READ_COLUMNS)

    def page(self, query: TaskQuery, after: int, limit: int, descending: bool) -> tuple[str, list[Any]]:
        """``SELECT`` of one page of finished tasks (``after`` already clamped, see
        ``clamp_cursor``)."""
        args: list[Any] = []

        def arg(value: Any) -> str:
            args.append(value)
            return self.placeholder(len(args))

        where = ["finished_at IS NOT NULL"]
        for column, values in (("pool", query.pools), ("kind", query.kinds), ("tenant", query.tenants),
                               ("status", query.statuses)):  # fmt: skip
            if not values:
                continue
            texts = sorted(value.value if isinstance(value, TaskStatus) else value for value in values)
            if len(texts) == 1:
                where.append(f"{column} = {arg(texts[0])}")
            elif self.array is not None:
                where.append(f"{column} = ANY({self.array(arg(texts), 'text')})")
            else:
                where.append(f"{column} IN ({', '.join(arg(text) for text in texts)})")
        if query.key_prefix:
            prefix = query.key_prefix
            where.append(f"key{self.binary} >= {arg(prefix)}")
            upper = _key_upper(prefix)
            if upper is not None:
                where.append(f"key{self.binary} < {arg(upper)}")
            where.append(self.starts_with("key", arg(prefix)))
        if query.created_from is not None:
            where.append(f"submitted_at >= {arg(query.created_from)}")
        if query.created_to is not None:
            where.append(f"submitted_at < {arg(query.created_to)}")
        if after:
            where.append(f"id {'<' if descending else '>'} {arg(R.to_db_id(after))}")
        order = "DESC" if descending else "ASC"
        sql = (f"SELECT {self.columns} FROM {self.table} WHERE {' AND '.join(where)}"
               f" ORDER BY id {order} LIMIT {arg(limit)}")  # fmt: skip
        return sql, args

    def one(self) -> str:
        return f"SELECT {self.columns} FROM {self.table} WHERE id = {self.placeholder(1)}"


async def read_page(run: Callable[[str, list[Any]], Awaitable[Sequence[Sequence[Any]]]], sql: SqlHistory,
                    codec: Codec, query: TaskQuery, after: int, limit: int, descending: bool,
                    now: int) -> list[TaskInfo]:  # fmt: skip
    """One page of history through ``run(statement, args) -> rows``: one statement per query of
    ``fan_out``, their pages merged."""
    pages = []
    for sub in fan_out(query):
        statement, args = sql.page(sub, after, limit, descending)
        pages.append([row_info(row, codec, now) for row in await run(statement, args)])
    return pages[0] if len(pages) == 1 else merge_pages(pages, limit, descending)
