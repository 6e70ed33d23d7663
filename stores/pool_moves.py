"""Handing a pool's rows from one shard's store to another's (``docs/pool-moves.md``).

The source shard keeps ``cronoq_moves`` (the latest move of each pool: its id, target, version,
phase) and ``cronoq_forwarded`` (ids handed over, and where to). A move is recorded by the
source's leader (``request_move``, fenced by its epoch; phase ``draining`` while the pool's running
attempts end, then ``requested``). It is carried out (``transfer``) by that leader once its engine
let go of the pool (Postgres), or else by the next leader of the source before it recovers the
store; either way no engine of the source holds the pool while its rows change hands:

* Postgres (both schemas in one database): one transaction, fenced by the source's epoch, copies
  the pool's task rows (with their status transitions) and schedules into the target's schema,
  deletes them from the source, records where the ids went, writes the new placement into both
  records and marks the move done. It commits whole or not at all.
* SQLite (two files, no atomic commit across them in WAL mode): the source marks the move
  ``transferring`` (fenced), then the target's file is written (rows inserted if absent, the new
  placement), then the source's (fenced: rows deleted, forwarding records, placement, move done).
  A crash in between leaves the move ``transferring``: the next leader of the source repeats it,
  the target's half being a no-op the second time, and it can no longer be aborted (the target
  may own the pool already). The source never leads with a move pending past ``draining``, so
  only the target can serve the pool.

``recover_pool`` reads one pool's rows back the way recovery would: what a target's running
engine adds when the pool arrives, or a source's when a handover was refused.

Before anything is written the move is checked against both stores: live dependency edges between
the pool and other pools of the source, keys of the pool already used in the target, schedule
names taken in the target. A move that fails a check is marked ``refused`` with the reason and
nothing else changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cronoq.engine.actions import Recovered

from ._schema import POOL_MOVES_VERSION
from .base import Corrupt, Fenced, StoreError, Unavailable
from .placements import MAX_NAME, notify_sql, pg_connection

__all__ = [
    "ACTIVE",
    "MoveRefused",
    "MoveRow",
    "forwarded_to",
    "read_moves",
    "recover_pool",
    "request_move",
    "set_move_phase",
    "transfer",
]

PHASES = ("draining", "requested", "transferring", "done", "refused", "aborted")
ACTIVE = ("draining", "requested", "transferring")
"""The phases of a move not carried out yet (a pool has at most one such move)."""
_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class MoveRow:
    pool: str
    move_id: str
    target: str
    version: int
    phase: str
    message: str
    updated_at: int


class MoveRefused(StoreError):
    """A move that a check refused; the message says why (names pools, keys or schedules)."""


def _move(row: Sequence[Any]) -> MoveRow:
    pool, move_id, target, version, phase, message, updated_at = row
    if (
        not isinstance(pool, str)
        or not isinstance(target, str)
        or not 0 < len(pool) <= MAX_NAME
        or not 0 < len(target) <= MAX_NAME
        or phase not in PHASES
        or type(version) is not int
        or version < 1
    ):
        raise Corrupt(f"cronoq_moves holds an unusable row for pool {pool!r}")
    return MoveRow(pool, str(move_id), target, version, phase, str(message), int(updated_at))


def _not_ready(target: str, version: int) -> Unavailable:
    return Unavailable(
        f"the store of shard {target!r} is at schema version {version}, a pool move needs {POOL_MOVES_VERSION}:"
        " start a server of that shard (it migrates its store), then the move goes on"
    )


def _kind(store: Any) -> str:
    from .postgres import PostgresStore
    from .sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        return "sqlite"
    if isinstance(store, PostgresStore):
        return "postgres"
    raise TypeError(f"{type(store).__name__} cannot move pools")


# ------------------------------------------------------------------------------------------ moves


async def read_moves(store: Any) -> dict[str, MoveRow]:
    """The latest move of every pool the store's shard has moved or been asked to move."""
    if _kind(store) == "sqlite":
        return await asyncio.to_thread(_sqlite_read_moves, str(store.path))
    from .postgres import quote_schema

    s = quote_schema(store.schema)
    async with pg_connection(store) as conn:
        rows = await conn.fetch(
            f"SELECT pool, move_id, target, version, phase, message, updated_at FROM {s}.cronoq_moves"
        )
    return {row["pool"]: _move(tuple(row)) for row in rows}


async def request_move(store: Any, epoch: int, row: MoveRow) -> MoveRow:
    """Record ``row`` unless a move of that pool is already under way (a phase of ``ACTIVE``),
    which is returned instead. Fenced: ``Fenced`` if ``epoch`` no longer leads the store."""
    if _kind(store) == "sqlite":
        return await asyncio.to_thread(_sqlite_request, str(store.path), store.holder, epoch, row)
    from .postgres import fence_sql, quote_schema

    s = quote_schema(store.schema)
    async with pg_connection(store) as conn, conn.transaction():
        if await conn.fetchval(fence_sql(s), epoch, store.holder) is None:
            raise Fenced(f"epoch {epoch} no longer leads schema {store.schema}")
        found = await conn.fetchrow(
            f"SELECT pool, move_id, target, version, phase, message, updated_at FROM {s}.cronoq_moves"
            " WHERE pool = $1 FOR UPDATE",
            row.pool,
        )
        if found is not None and found["phase"] in ACTIVE:
            return _move(tuple(found))
        await conn.execute(
            f"INSERT INTO {s}.cronoq_moves (pool, move_id, target, version, phase, message, updated_at)"
            " VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (pool) DO UPDATE SET move_id = excluded.move_id,"
            " target = excluded.target, version = excluded.version, phase = excluded.phase,"
            " message = excluded.message, updated_at = excluded.updated_at",
            row.pool,
            row.move_id,
            row.target,
            row.version,
            row.phase,
            row.message,
            row.updated_at,
        )
    return row


async def set_move_phase(store: Any, epoch: int, pool: str, move_id: str, phase: str, message: str, now: int,
                         expected: Sequence[str] = ACTIVE) -> bool:  # fmt: skip
    """Move ``pool``'s move ``move_id`` from one of the ``expected`` phases to ``phase`` (fenced);
    whether it was in one of them."""
    if _kind(store) == "sqlite":
        return await asyncio.to_thread(
            _sqlite_set_phase, str(store.path), store.holder, epoch, pool, move_id, phase, message, now, list(expected)
        )
    from .postgres import fence_sql, quote_schema

    s = quote_schema(store.schema)
    async with pg_connection(store) as conn, conn.transaction():
        if await conn.fetchval(fence_sql(s), epoch, store.holder) is None:
            raise Fenced(f"epoch {epoch} no longer leads schema {store.schema}")
        status = await conn.execute(
            f"UPDATE {s}.cronoq_moves SET phase = $3, message = $4, updated_at = $5"
            " WHERE pool = $1 AND move_id = $2 AND phase = ANY($6::text[])",
            pool,
            move_id,
            phase,
            message,
            now,
            list(expected),
        )
    return bool(status.endswith(" 1"))


async def forwarded_to(store: Any, task_id: int) -> tuple[str, str, int] | None:
    """Where task ``task_id`` was handed over to with its pool: (pool, shard, placement version)."""
    if _kind(store) == "sqlite":
        return await asyncio.to_thread(_sqlite_forwarded, str(store.path), task_id)
    from .postgres import quote_schema

    s = quote_schema(store.schema)
    async with pg_connection(store) as conn:
        row = await conn.fetchrow(
            f"SELECT pool, shard, version FROM {s}.cronoq_forwarded WHERE id = $1", _db_id(task_id)
        )
    return None if row is None else (str(row["pool"]), str(row["shard"]), int(row["version"]))


async def recover_pool(store: Any, pool: str, now: int, retention: int,
                       template_pool: Callable[[str], str | None]) -> Recovered:  # fmt: skip
    """The rows of ``pool`` in a running leader's Postgres store, as recovery would read them (its
    live tasks, those finished within the retention window, the terminal parents they name, and
    the schedules whose template names it): what a target adds to its running engine once a move
    handed the pool over, and what a source takes back when the handover was refused."""
    from . import _pg_events as E
    from . import _row_decode as D
    from . import _rows as R
    from .postgres import quote_schema

    s = quote_schema(store.schema)
    cols = ", ".join(R.READ_COLUMNS)
    rec = D.Recovery(store.codec, now)
    cutoff = now - retention
    async with pg_connection(store) as conn, conn.transaction(isolation="repeatable_read"):
        events = E.EventFold([r[0] for r in await conn.fetch(E.read_events_sql(s))])
        rows = await conn.fetch(
            f"SELECT {cols} FROM {s}.cronoq_tasks WHERE pool = $1 AND (finished_at IS NULL OR finished_at >= $2)"
            " ORDER BY id",
            pool,
            cutoff,
        )
        rec.add_rows([events.apply(row) for row in rows])
        ids, keys = rec.missing_parents()
        if ids or keys:
            parents = await conn.fetch(
                f"SELECT {cols} FROM {s}.cronoq_tasks"
                " WHERE pool = $1 AND (id = ANY($2::bigint[]) OR key = ANY($3::text[]))",
                pool,
                ids,
                keys,
            )
            rec.add_parents([events.apply(p) for p in parents], ids, keys)
        schedules = [
            row
            for row in await conn.fetch(
                f"SELECT {', '.join(R.RECURRING_COLUMNS)} FROM {s}.cronoq_recurring ORDER BY name"
            )
            if template_pool(row["spec"]) == pool
        ]
    recovered = Recovered(tasks=rec.ordered(), quarantined=len(rec.quarantined))
    D.add_recurring(recovered, schedules, store.codec)
    return recovered


def _db_id(task_id: int) -> int:
    """Ids are unsigned 64-bit; the databases store them as signed 64-bit integers."""
    return task_id - (1 << 64) if task_id >= 1 << 63 else task_id


# --------------------------------------------------------------------------------------- transfer


@dataclass(frozen=True, slots=True)
class Transferred:
    tasks: int
    schedules: int


async def transfer(
    store: Any,
    epoch: int,
    move: MoveRow,
    source_shard: str,
    target_namespace: str,
    template_pool: Callable[[str], str | None],
) -> Transferred:
    """Carry out ``move`` (see the module docstring). ``target_namespace`` is the target's SQLite
    path or Postgres schema; ``template_pool`` reads a schedule's pool from its stored template.
    ``MoveRefused`` when a check fails (nothing written)."""
    if _kind(store) == "sqlite":
        return await asyncio.to_thread(
            _sqlite_transfer, str(store.path), store.holder, epoch, move, source_shard, target_namespace, template_pool
        )
    await store.compact()  # every status change in the task rows, none left in the event log
    return await _pg_transfer(store, epoch, move, source_shard, target_namespace, template_pool)


def _dependency_edges(pool: str, rows: Iterable[tuple[int, str, str | None, str]]) -> list[str]:
    """Pools of the source whose live tasks depend on the pool's, or that the pool's depend on.
    ``rows`` are the source's live tasks: (id, pool, key, spec text)."""
    rows = list(rows)
    pool_of_id = {task_id & _U64: task_pool for task_id, task_pool, _, _ in rows}
    pool_of_key = {key: task_pool for _, task_pool, key, _ in rows if key is not None}
    others: set[str] = set()
    for _, task_pool, _, spec_text in rows:
        try:
            deps = json.loads(spec_text).get("deps", ())
        except (ValueError, AttributeError):
            raise Corrupt("a task's stored spec is not a JSON object") from None
        for dep in deps if isinstance(deps, list) else ():
            if not isinstance(dep, dict):
                continue
            if "id" in dep:
                target = pool_of_id.get(dep["id"] & _U64) if type(dep["id"]) is int else None
            else:
                target = pool_of_key.get(str(dep.get("key")))
            if target is None or target == task_pool:
                continue
            if task_pool == pool:
                others.add(target)
            elif target == pool:
                others.add(task_pool)
    return sorted(others)


def _check(move: MoveRow, source_shard: str, live: list[Any], keys: set[str], taken_keys: Iterable[str],
           schedules: list[str], taken_names: Iterable[str]) -> None:  # fmt: skip
    edges = _dependency_edges(move.pool, live)
    if edges:
        names = ", ".join(repr(name) for name in edges)
        raise MoveRefused(f"pool {move.pool!r} has live dependency edges with pools {names} of shard {source_shard!r}")
    clash = sorted(set(taken_keys) & keys)
    if clash:
        shown = ", ".join(repr(key) for key in clash[:5])
        raise MoveRefused(f"keys of pool {move.pool!r} are in use in shard {move.target!r}: {shown}")
    taken = sorted(set(taken_names) & set(schedules))
    if taken:
        shown = ", ".join(repr(name) for name in taken[:5])
        raise MoveRefused(f"schedule names of pool {move.pool!r} are taken in shard {move.target!r}: {shown}")


# ---------------------------------------------------------------------------------------- SQLite


def _sqlite(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _sqlite_fence(conn: sqlite3.Connection, holder: str, epoch: int) -> None:
    current, held_by = conn.execute("SELECT epoch, holder FROM cronoq_leader WHERE id = 1").fetchone()
    if current != epoch or held_by != holder:
        raise Fenced(f"epoch {epoch} is stale: the lease is at epoch {current}")


@contextlib.contextmanager
def _sqlite_fenced(conn: sqlite3.Connection, holder: str, epoch: int) -> Iterator[None]:
    """One write transaction of the source's file, fenced by ``epoch``: committed whole or not at all."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        _sqlite_fence(conn, holder, epoch)
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _sqlite_guarded(work: Callable[[], Any]) -> Any:
    try:
        return work()
    except sqlite3.Error as exc:
        raise Unavailable(f"moving a pool: {exc}") from exc


def _sqlite_read_moves(path: str) -> dict[str, MoveRow]:
    def work() -> dict[str, MoveRow]:
        conn = _sqlite(path)
        try:
            rows = conn.execute(
                "SELECT pool, move_id, target, version, phase, message, updated_at FROM cronoq_moves"
            ).fetchall()
        finally:
            conn.close()
        return {row[0]: _move(row) for row in rows}

    result: dict[str, MoveRow] = _sqlite_guarded(work)
    return result


def _sqlite_request(path: str, holder: str, epoch: int, row: MoveRow) -> MoveRow:
    def work() -> MoveRow:
        conn = _sqlite(path)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                _sqlite_fence(conn, holder, epoch)
                found = conn.execute(
                    "SELECT pool, move_id, target, version, phase, message, updated_at FROM cronoq_moves"
                    " WHERE pool = ?",
                    (row.pool,),
                ).fetchone()
                if found is not None and found[4] in ACTIVE:
                    conn.execute("ROLLBACK")
                    return _move(found)
                conn.execute(
                    "INSERT OR REPLACE INTO cronoq_moves (pool, move_id, target, version, phase, message, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (row.pool, row.move_id, row.target, row.version, row.phase, row.message, row.updated_at),
                )
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()
        return row

    result: MoveRow = _sqlite_guarded(work)
    return result


def _sqlite_set_phase(path: str, holder: str, epoch: int, pool: str, move_id: str, phase: str, message: str,
                      now: int, expected: list[str]) -> bool:  # fmt: skip
    def work() -> bool:
        conn = _sqlite(path)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                _sqlite_fence(conn, holder, epoch)
                changed = conn.execute(
                    "UPDATE cronoq_moves SET phase = ?, message = ?, updated_at = ?"
                    f" WHERE pool = ? AND move_id = ? AND phase IN ({', '.join('?' for _ in expected)})",
                    (phase, message, now, pool, move_id, *expected),
                ).rowcount
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            conn.close()
        return bool(changed)

    result: bool = _sqlite_guarded(work)
    return result


def _sqlite_forwarded(path: str, task_id: int) -> tuple[str, str, int] | None:
    def work() -> tuple[str, str, int] | None:
        conn = _sqlite(path)
        try:
            row = conn.execute(
                "SELECT pool, shard, version FROM cronoq_forwarded WHERE id = ?", (_db_id(task_id),)
            ).fetchone()
        finally:
            conn.close()
        return None if row is None else (str(row[0]), str(row[1]), int(row[2]))

    result: tuple[str, str, int] | None = _sqlite_guarded(work)
    return result


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def _sqlite_transfer(path: str, holder: str, epoch: int, move: MoveRow, source_shard: str, target_path: str,
                     template_pool: Callable[[str], str | None]) -> Transferred:  # fmt: skip
    def work() -> Transferred:
        source, target = _sqlite(path), _sqlite(target_path)
        try:
            # Read the pool's rows (the source leads: nothing else writes them now).
            task_cols = _columns(source, "cronoq_tasks")
            rows = source.execute(
                f"SELECT {', '.join(task_cols)} FROM cronoq_tasks WHERE pool = ?", (move.pool,)
            ).fetchall()
            ids = [row[0] for row in rows]
            live = source.execute("SELECT id, pool, key, spec FROM cronoq_tasks WHERE finished_at IS NULL").fetchall()
            key_at = task_cols.index("key")
            keys = {row[key_at] for row in rows if row[key_at] is not None}
            rec_cols = _columns(source, "cronoq_recurring")
            schedules = [
                row
                for row in source.execute(f"SELECT {', '.join(rec_cols)} FROM cronoq_recurring").fetchall()
                if template_pool(row[rec_cols.index("spec")]) == move.pool
            ]
            names = [row[0] for row in schedules]
            tran_cols = [c for c in _columns(source, "cronoq_task_transitions") if c != "seq"]

            # From here on the target may hold the pool: the move can no longer be aborted.
            with _sqlite_fenced(source, holder, epoch):
                source.execute(
                    "UPDATE cronoq_moves SET phase = 'transferring' WHERE pool = ? AND move_id = ?",
                    (move.pool, move.move_id),
                )

            # The target's half: rows it does not have yet, and the new placement.
            target.execute("BEGIN IMMEDIATE")
            try:
                _sqlite_check_target(target, move.target)
                present = {
                    row[0]
                    for row in target.execute("SELECT id FROM cronoq_tasks WHERE pool = ?", (move.pool,)).fetchall()
                }
                taken_keys = [
                    row[0]
                    for row in target.execute(
                        "SELECT key FROM cronoq_tasks WHERE key IS NOT NULL AND pool <> ?", (move.pool,)
                    ).fetchall()
                ]
                taken_names = [
                    row[0]
                    for row in target.execute("SELECT name, spec FROM cronoq_recurring").fetchall()
                    if template_pool(row[1]) != move.pool
                ]
                _check(move, source_shard, live, keys, taken_keys, names, taken_names)
                fresh = [row for row in rows if row[0] not in present]
                marks = ", ".join("?" for _ in task_cols)
                target.executemany(
                    f"INSERT OR IGNORE INTO cronoq_tasks ({', '.join(task_cols)}) VALUES ({marks})", fresh
                )
                fresh_ids = [row[0] for row in fresh]
                for start in range(0, len(fresh_ids), 500):
                    chunk = fresh_ids[start : start + 500]
                    transitions = source.execute(
                        f"SELECT {', '.join(tran_cols)} FROM cronoq_task_transitions WHERE task_id IN"
                        f" ({', '.join('?' for _ in chunk)}) ORDER BY seq",
                        chunk,
                    ).fetchall()
                    target.executemany(
                        f"INSERT INTO cronoq_task_transitions ({', '.join(tran_cols)})"
                        f" VALUES ({', '.join('?' for _ in tran_cols)})",
                        transitions,
                    )
                target.executemany(
                    f"INSERT OR IGNORE INTO cronoq_recurring ({', '.join(rec_cols)})"
                    f" VALUES ({', '.join('?' for _ in rec_cols)})",
                    schedules,
                )
                _sqlite_place(target, move)
                target.execute("COMMIT")
            except BaseException:
                if target.in_transaction:
                    target.execute("ROLLBACK")
                raise

            # The source's half, fenced by the epoch that carries the move out.
            with _sqlite_fenced(source, holder, epoch):
                source.executemany(
                    "INSERT OR IGNORE INTO cronoq_forwarded (id, pool, shard, version) VALUES (?, ?, ?, ?)",
                    [(task_id, move.pool, move.target, move.version) for task_id in ids],
                )
                source.execute("DELETE FROM cronoq_tasks WHERE pool = ?", (move.pool,))
                source.executemany("DELETE FROM cronoq_recurring WHERE name = ?", [(name,) for name in names])
                _sqlite_place(source, move)
                source.execute(
                    "UPDATE cronoq_moves SET phase = 'done', message = '' WHERE pool = ? AND move_id = ?",
                    (move.pool, move.move_id),
                )
        finally:
            source.close()
            target.close()
        return Transferred(len(ids), len(names))

    result: Transferred = _sqlite_guarded(work)
    return result


def _sqlite_check_target(conn: sqlite3.Connection, target: str) -> None:
    """The target's file must have been opened by this build (it has the move tables then)."""
    try:
        version = conn.execute("SELECT coalesce(max(version), 0) FROM cronoq_schema_version").fetchone()[0]
    except sqlite3.OperationalError:  # no such table: the file was never opened as a store
        version = 0
    if version < POOL_MOVES_VERSION:
        raise _not_ready(target, version)


def _sqlite_place(conn: sqlite3.Connection, move: MoveRow) -> None:
    conn.execute(
        "INSERT INTO cronoq_topology (pool, shard, version) VALUES (?, ?, ?)"
        " ON CONFLICT (pool) DO UPDATE SET shard = excluded.shard, version = excluded.version"
        " WHERE cronoq_topology.version < excluded.version",
        (move.pool, move.target, move.version),
    )


# -------------------------------------------------------------------------------------- Postgres


async def _pg_columns(conn: Any, schema: str, table: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2"
        " ORDER BY ordinal_position",
        schema,
        table,
    )
    return [str(row["column_name"]) for row in rows]


async def _pg_check_target(conn: Any, schema: str, target: str) -> None:
    from .postgres import quote_schema

    table = f"{quote_schema(schema)}.cronoq_schema_version"
    version = 0
    if await conn.fetchval("SELECT to_regclass($1)", table) is not None:
        version = await conn.fetchval(f"SELECT coalesce(max(version), 0) FROM {table}")
    if version < POOL_MOVES_VERSION:
        raise _not_ready(target, version)


async def _pg_transfer(store: Any, epoch: int, move: MoveRow, source_shard: str, target_schema: str,
                       template_pool: Callable[[str], str | None]) -> Transferred:  # fmt: skip
    from .postgres import fence_sql, quote_schema

    s, t = quote_schema(store.schema), quote_schema(target_schema)
    async with pg_connection(store) as conn, conn.transaction():
        if await conn.fetchval(fence_sql(s), epoch, store.holder) is None:
            raise Fenced(f"epoch {epoch} no longer leads schema {store.schema}")
        # The leader serves while it hands a pool over: an abort may have come first. Locking the
        # move's row orders the two.
        phase = await conn.fetchval(
            f"SELECT phase FROM {s}.cronoq_moves WHERE pool = $1 AND move_id = $2 FOR UPDATE", move.pool, move.move_id
        )
        if phase == "done":
            return Transferred(0, 0)  # carried out already: repeating it changes nothing
        if phase in ("aborted", "refused"):
            raise MoveRefused(f"the move of pool {move.pool!r} is {phase!r}")
        await _pg_check_target(conn, target_schema, move.target)
        task_cols = ", ".join(f'"{c}"' for c in await _pg_columns(conn, store.schema, "cronoq_tasks"))
        rec_cols = ", ".join(f'"{c}"' for c in await _pg_columns(conn, store.schema, "cronoq_recurring"))
        # Postgres numbers transitions by the commit that logged them (no table-wide key): kept as is.
        tran_cols = ", ".join(f'"{c}"' for c in await _pg_columns(conn, store.schema, "cronoq_task_transitions"))
        live = [
            (row["id"], row["pool"], row["key"], row["spec"])
            for row in await conn.fetch(f"SELECT id, pool, key, spec FROM {s}.cronoq_tasks WHERE finished_at IS NULL")
        ]
        keys = {
            str(row["key"])
            for row in await conn.fetch(
                f"SELECT key FROM {s}.cronoq_tasks WHERE pool = $1 AND key IS NOT NULL", move.pool
            )
        }
        taken_keys = [
            str(row["key"])
            for row in await conn.fetch(
                f"SELECT key FROM {t}.cronoq_tasks WHERE key = ANY($1::text[]) AND pool <> $2", list(keys), move.pool
            )
        ]
        names = [
            str(row["name"])
            for row in await conn.fetch(f"SELECT name, spec FROM {s}.cronoq_recurring")
            if template_pool(row["spec"]) == move.pool
        ]
        taken_names = [
            str(row["name"])
            for row in await conn.fetch(
                f"SELECT name, spec FROM {t}.cronoq_recurring WHERE name = ANY($1::text[])", names
            )
            if template_pool(row["spec"]) != move.pool
        ]
        _check(move, source_shard, live, keys, taken_keys, names, taken_names)
        moved = await conn.fetchval(f"SELECT count(*) FROM {s}.cronoq_tasks WHERE pool = $1", move.pool)
        await conn.execute(
            f"INSERT INTO {t}.cronoq_task_transitions ({tran_cols}) SELECT {tran_cols} FROM {s}.cronoq_task_transitions"
            f" WHERE task_id IN (SELECT id FROM {s}.cronoq_tasks WHERE pool = $1)"
            f" AND task_id NOT IN (SELECT id FROM {t}.cronoq_tasks WHERE pool = $1) ORDER BY seq",
            move.pool,
        )
        await conn.execute(
            f"INSERT INTO {t}.cronoq_tasks ({task_cols}) SELECT {task_cols} FROM {s}.cronoq_tasks WHERE pool = $1"
            " ON CONFLICT (id) DO NOTHING",
            move.pool,
        )
        await conn.execute(
            f"INSERT INTO {t}.cronoq_recurring ({rec_cols}) SELECT {rec_cols} FROM {s}.cronoq_recurring"
            " WHERE name = ANY($1::text[]) ON CONFLICT (name) DO NOTHING",
            names,
        )
        await conn.execute(
            f"INSERT INTO {s}.cronoq_forwarded (id, pool, shard, version) SELECT id, pool, $2, $3 FROM {s}.cronoq_tasks"
            " WHERE pool = $1 ON CONFLICT (id) DO NOTHING",
            move.pool,
            move.target,
            move.version,
        )
        await conn.execute(f"DELETE FROM {s}.cronoq_tasks WHERE pool = $1", move.pool)
        await conn.execute(f"DELETE FROM {s}.cronoq_recurring WHERE name = ANY($1::text[])", names)
        for schema in (s, t):
            await conn.execute(
                f"INSERT INTO {schema}.cronoq_topology (pool, shard, version) VALUES ($1, $2, $3)"
                f" ON CONFLICT (pool) DO UPDATE SET shard = excluded.shard, version = excluded.version"
                f" WHERE {schema}.cronoq_topology.version < excluded.version",
                move.pool,
                move.target,
                move.version,
            )
        await conn.execute(
            f"UPDATE {s}.cronoq_moves SET phase = 'done', message = '' WHERE pool = $1 AND move_id = $2",
            move.pool,
            move.move_id,
        )
        for schema in (store.schema, target_schema):  # both leaders learn it at the commit
            await conn.execute(notify_sql("$1"), schema)
    return Transferred(int(moved), len(names))
