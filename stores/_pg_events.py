"""The Postgres status event log (schema version 3): statements and the fold recovery applies.

Why: a status change of a task stored by an earlier step used to be an UPDATE of its task row.
Postgres writes a new version of the whole row (spec, payload and all) plus an entry in every
index of the table for each update, and a task goes through at least two (running, then its
outcome). The commit of a step is on the critical path of everything the step released, so it now
appends ONE row holding all its status rows as a JSON text: nothing to parse, index or rewrite
while the step waits. The log is folded into the task rows later, in bulk and off that path
(``compact_sql``), and recovery folds whatever is still in it (``EventFold``).

A status row (``EVENT_COLUMNS``, the layout of ``_rows.STATUS_COLUMNS``) is a JSON array with the
output in hex. Order: every commit passes its ``seq``: the epoch above bit 40 and the number of
the commit within that epoch below, so a later commit, or a later leader, always has the larger
``seq``. (2**40 commits are 35 years at 1,000 commits/s; 2**23 epochs fit in the remaining bits of
a bigint.) A step folds its mutations before committing, so one commit holds at most one status
row per task.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any, Final

from . import _rows as R

log = logging.getLogger("cronoq.stores.postgres")

EVENT_COLUMNS: Final = (
    "id",
    "status",
    "attempt",
    "message",
    "started_at",  # NULL: keep the started_at known before
    "finished_at",
    "retry_at",
    "output",
    "has_output",
)
EVENT_TYPES: Final = ("bigint", "text", "bigint", "text", "bigint", "bigint", "bigint", "bytea", "boolean")
assert EVENT_COLUMNS == R.STATUS_COLUMNS  # an event is a status row, appended

EPOCH_SHIFT: Final = 40


def commit_seq(epoch: int, commit_number: int) -> int:
    """The ``seq`` of the ``commit_number``-th commit (from 1) under ``epoch``."""
    if not 0 < commit_number < 1 << EPOCH_SHIFT or not 0 < epoch < 1 << (63 - EPOCH_SHIFT):
        raise ValueError(f"commit {commit_number} of epoch {epoch} has no event sequence number")
    return (epoch << EPOCH_SHIFT) | commit_number


def _expanded(source: str) -> str:
    """The status rows of the log rows in ``source`` (columns ``seq, statuses``), one per row."""
    cols = ", ".join(
        f"decode(e->>{i}, 'hex') AS {c}" if c == "output" else f"(e->>{i})::{t} AS {c}"
        for i, (c, t) in enumerate(zip(EVENT_COLUMNS, EVENT_TYPES, strict=True))
    )
    return f"SELECT m.seq, {cols} FROM {source} m, jsonb_array_elements(m.statuses::jsonb) AS e"


def compact_sql(s: str) -> str:
    """Fold the log rows with ``seq <= $2`` into their task rows and delete them, guarded by epoch
    ``$1``; returns (whether the epoch still held, how many status rows were folded).

    One statement, so the deletion and the updates commit together: a reader sees a status either
    in the log or in its task row, never in neither. Run it with hash and merge joins switched off
    (see ``PostgresStore._compact``): each folded task is then found through the primary key, and
    the statement has no other join (a second one, nested the same way, would be quadratic).
    """
    return (
        f"WITH fence AS (SELECT epoch FROM {s}.cronoq_leader WHERE id = 1 AND epoch = $1 FOR SHARE),"
        f" moved AS (DELETE FROM {s}.cronoq_task_events WHERE seq <= $2 AND EXISTS (SELECT 1 FROM fence)"
        " RETURNING seq, statuses),"
        f" ev AS ({_expanded('moved')}),"
        # Every folded status row stays readable as one of its task's transitions (history.py).
        f" kept AS (INSERT INTO {s}.cronoq_task_transitions (task_id, {_TRANSITION_COLS})"
        f" SELECT id, {_TRANSITION_COLS} FROM ev),"
        # The latest status of each task, with the latest started_at any of its rows carries.
        " latest AS (SELECT DISTINCT ON (id) *, first_value(started_at) OVER"
        " (PARTITION BY id ORDER BY started_at IS NULL, seq DESC) AS started FROM ev ORDER BY id, seq DESC),"
        f" upd AS (UPDATE {s}.cronoq_tasks t SET status = l.status, attempt = l.attempt, message = l.message,"
        " started_at = COALESCE(l.started, t.started_at), finished_at = l.finished_at,"
        " retry_at = l.retry_at, output = l.output, has_output = l.has_output"
        " FROM latest l WHERE t.id = l.id)"
        " SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM ev)"
    )


def read_events_sql(s: str) -> str:
    """Every log row, in commit order."""
    return f"SELECT statuses FROM {s}.cronoq_task_events ORDER BY seq"


def output_sql(s: str) -> str:
    """The output of task ``$1``: from its latest status row in the log if it has one, else from
    its task row. (The log is short: it is folded every ``compact_after`` status rows.)"""
    return (
        f"SELECT has_output, output FROM ({_expanded(f'{s}.cronoq_task_events')}"
        " UNION ALL SELECT -1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, output, has_output"
        f" FROM {s}.cronoq_tasks WHERE id = $1) AS x WHERE id = $1 OR seq = -1"
        " ORDER BY seq DESC LIMIT 1"
    )


_TRANSITION_COLS: Final = "seq, status, attempt, message, started_at, finished_at, retry_at"


def transitions_sql(s: str) -> str:
    """The recorded status rows of task ``$1`` in commit order: the folded ones, then those still
    in the log."""
    return (
        f"SELECT {_TRANSITION_COLS} FROM {s}.cronoq_task_transitions WHERE task_id = $1"
        f" UNION ALL SELECT {_TRANSITION_COLS} FROM ({_expanded(f'{s}.cronoq_task_events')}) AS x WHERE id = $1"
        " ORDER BY seq"
    )


def scrub_sql(s: str) -> str:
    """Remove the status rows of tasks ``$1`` (bigint[]) from the log (quarantine: folded later,
    they would overwrite it)."""
    return (
        f"UPDATE {s}.cronoq_task_events SET statuses = COALESCE((SELECT jsonb_agg(e ORDER BY n)"
        " FROM jsonb_array_elements(statuses::jsonb) WITH ORDINALITY AS x(e, n)"
        " WHERE (e->>0)::bigint <> ALL($1::bigint[])), '[]'::jsonb)::text"
        " WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(statuses::jsonb) AS e"
        " WHERE (e->>0)::bigint = ANY($1::bigint[]))"
    )


# Positions in a status row.
_E_ID, _E_STATUS, _E_ATTEMPT, _E_MESSAGE, _E_STARTED, _E_FINISHED, _E_RETRY_AT, _E_OUTPUT, _E_HAS_OUTPUT = range(9)


def _statuses(text: object) -> list[list[Any]]:
    """The status rows of one log row. What cannot be read is logged and left out, so that a
    damaged log row never keeps a leader from starting (the values of the rows that are read are
    checked with the task rows they land on, which are quarantined when they do not fit)."""
    try:
        rows = json.loads(text)  # type: ignore[arg-type]
    except (TypeError, ValueError, RecursionError) as exc:
        log.error("a status log row cannot be decoded and is skipped: %s", type(exc).__name__)
        return []
    if not isinstance(rows, list):
        log.error("a status log row is not a JSON array and is skipped")
        return []
    good = [r for r in rows if type(r) is list and len(r) == len(EVENT_COLUMNS) and type(r[_E_ID]) is int]
    if len(good) != len(rows):
        log.error("%d status rows of the log cannot be read and are skipped", len(rows) - len(good))
    return good


class EventFold:
    """The log folded per task, to be laid over task rows read for recovery."""

    __slots__ = ("latest",)

    def __init__(self, texts: Sequence[str]) -> None:
        latest: dict[Any, list[Any]] = {}
        for text in texts:  # in commit order: a later status replaces an earlier one
            for status in _statuses(text):
                earlier = latest.get(status[_E_ID])
                if status[_E_STARTED] is None and earlier is not None:
                    status[_E_STARTED] = earlier[_E_STARTED]
                latest[status[_E_ID]] = status
        self.latest = latest

    def __len__(self) -> int:
        return len(self.latest)

    def apply(self, row: Sequence[Any]) -> Sequence[Any]:
        """``row`` (READ_COLUMNS order) with its task's latest status, if the log has one."""
        event = self.latest.get(row[R.T_ID])
        if event is None:
            return row
        out = list(row)
        out[R.T_STATUS] = event[_E_STATUS]
        out[R.T_ATTEMPT] = event[_E_ATTEMPT]
        out[R.T_MESSAGE] = event[_E_MESSAGE]
        if event[_E_STARTED] is not None:
            out[R.T_STARTED] = event[_E_STARTED]
        out[R.T_FINISHED] = event[_E_FINISHED]
        out[R.T_RETRY_AT] = event[_E_RETRY_AT]
        out[R.T_HAS_OUTPUT_READ] = bool(event[_E_HAS_OUTPUT])
        return out
