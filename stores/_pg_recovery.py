"""Postgres recovery's read of the task rows: streamed in id order, decoded while being read.

The rows of live tasks (and of tasks finished within the retention window) are read through a
cursor over the primary key, chunk by chunk. Each chunk is decoded in a thread while the next
one is already on its way: the server produces rows while this process decodes them, and only
two chunks of records are alive at a time, where reading the whole table first held every
record (about a kilobyte each) beside the decoded tasks. The status event log is laid over
the rows as they come (see ``_pg_events``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from . import _pg_events as E
from . import _row_decode as D
from . import _rows as R

# Rows per chunk of the recovery read: large enough that round trips do not count, small
# enough that a chunk's records (about a kilobyte each) never weigh much.
RECOVERY_CHUNK = 20_000


def _finished_before(row: Sequence[Any], cutoff: int) -> bool:
    """Whether the log says the row's task finished before the retention window."""
    finished = row[R.T_FINISHED]
    return type(finished) is int and finished < cutoff


async def _stream(cursor: Any, decode: Callable[[list[Any]], None]) -> None:
    """Feed the rows of ``cursor`` to ``decode`` chunk by chunk, in order.

    Each chunk is decoded in a thread (decoding a large backlog takes seconds, during which the
    event loop must go on renewing the lease) while the next one is already being read, so the
    server produces rows while this process decodes them, and only two chunks of records are
    alive at a time instead of the whole table.
    """
    chunk = await cursor.fetch(RECOVERY_CHUNK)
    while chunk:
        following = asyncio.ensure_future(cursor.fetch(RECOVERY_CHUNK))
        try:
            await asyncio.to_thread(decode, chunk)
        except BaseException:
            following.cancel()
            following.add_done_callback(_consume)
            raise
        del chunk
        chunk = await following


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned read's error, so that it is not reported as never retrieved."""
    if not future.cancelled():
        future.exception()


async def read_tasks(conn: Any, s: str, rec: D.Recovery, cutoff: int) -> None:
    """Add to ``rec`` every task row of schema ``s`` that recovery restores, with its latest
    status, then the terminal parents that live tasks still name. Runs in the caller's
    (repeatable read) transaction on ``conn``."""
    cols = ", ".join(R.READ_COLUMNS)
    with D.gc_paused():
        # The log holds the latest status of tasks whose rows it has not been folded into yet
        # (a row that finished before the cutoff gets no more events).
        events = E.EventFold([r[0] for r in await conn.fetch(E.read_events_sql(s))])

        def decode(rows: list[Any]) -> None:
            if events.latest:
                rows = [row for row in map(events.apply, rows) if not _finished_before(row, cutoff)]
            rec.add_rows(rows)

        cursor = await conn.cursor(
            f"SELECT {cols} FROM {s}.cronoq_tasks WHERE finished_at IS NULL OR finished_at >= $1 ORDER BY id",
            cutoff,
        )
        await _stream(cursor, decode)
    ids, keys = rec.missing_parents()
    if ids or keys:
        parents = await conn.fetch(
            f"SELECT {cols} FROM {s}.cronoq_tasks WHERE id = ANY($1::bigint[]) OR key = ANY($2::text[])",
            ids,
            keys,
        )
        rec.add_parents([events.apply(p) for p in parents], ids, keys)
