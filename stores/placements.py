"""The durable pool placements of one shard (``docs/pool-moves.md``, section 1).

Each shard's store holds ``cronoq_topology (pool, shard, version)``: the placements that shard
knows. ``load_placements`` seeds it with the configuration file's placements where a pool has none
(insert-if-absent, so replicas starting together agree) and returns what the store holds.
``advance_placement`` moves one pool's placement forward (never back).

The table is created by schema migration 7 (``_schema.py``), which every opened store has run.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .base import Corrupt, Unavailable

__all__ = [
    "NOTIFY_CHANNEL",
    "PlacementWatch",
    "Placements",
    "advance_placement",
    "load_placements",
    "notify_sql",
    "placement_watch",
    "read_placements",
]

Placements = dict[str, tuple[str, int]]
"""pool -> (shard, version)"""

MAX_NAME = 200
MAX_VERSION = 2**62


def _checked(rows: list[Any]) -> Placements:
    out: Placements = {}
    for pool, shard, version in rows:
        if (
            not isinstance(pool, str)
            or not isinstance(shard, str)
            or not 0 < len(pool) <= MAX_NAME
            or not 0 < len(shard) <= MAX_NAME
            or isinstance(version, bool)
            or not isinstance(version, int)
            or not 1 <= version <= MAX_VERSION
        ):
            raise Corrupt(f"cronoq_topology holds an unusable row: pool={pool!r} shard={shard!r} version={version!r}")
        out[pool] = (shard, version)
    return out


async def load_placements(store: Any, seed: Mapping[str, tuple[str, int]]) -> Placements:
    """The placements ``store`` holds, after adding ``seed``'s for pools it has none of.

    ``store`` is an opened ``SqliteStore`` or ``PostgresStore`` (their files and schemas exist
    then, with the owner-only permissions the stores set)."""
    from .postgres import PostgresStore
    from .sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        return await asyncio.to_thread(_sqlite_load, str(store.path), dict(seed))
    if isinstance(store, PostgresStore):
        return await _pg_load(store, dict(seed))
    raise TypeError(f"{type(store).__name__} keeps no durable placements")


async def read_placements(store: Any) -> Placements:
    """The placements ``store`` holds, without seeding (empty when it keeps none yet)."""
    from .postgres import PostgresStore, quote_schema
    from .sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        return await asyncio.to_thread(_sqlite_read, str(store.path))
    if isinstance(store, PostgresStore):
        s = quote_schema(store.schema)
        async with pg_connection(store) as conn:
            rows = await conn.fetch(f"SELECT pool, shard, version FROM {s}.cronoq_topology")
        return _checked([(row["pool"], row["shard"], row["version"]) for row in rows])
    raise TypeError(f"{type(store).__name__} keeps no durable placements")


NOTIFY_CHANNEL = "cronoq_placements"
"""Postgres channel a commit that changes a schema's placements notifies, with the schema's name."""


def notify_sql(schema_param: str) -> str:
    """The statement, inside a transaction that changes placements, that tells the listeners of
    the schema named by ``schema_param`` (delivered when it commits)."""
    return f"SELECT pg_notify('{NOTIFY_CHANNEL}', {schema_param})"


@dataclass(slots=True)
class PlacementWatch:
    """Reads of a store's placements, and a wait for their next change: on Postgres a
    notification (``LISTEN`` on the one connection it keeps), elsewhere just the timeout."""

    read: Callable[[], Awaitable[Placements]]
    changed: asyncio.Event
    notified: bool
    """Whether changes are notified (Postgres): then polls are only a slow fallback."""

    async def wait(self, timeout: float) -> None:
        """Until a change was notified, or ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), timeout)
        self.changed.clear()


@contextlib.asynccontextmanager
async def placement_watch(store: Any) -> AsyncIterator[PlacementWatch]:
    """``read_placements`` for frequent reads, told of changes when the store can (Postgres)."""
    from .postgres import PostgresStore, quote_schema

    if not isinstance(store, PostgresStore):
        yield PlacementWatch(lambda: read_placements(store), asyncio.Event(), notified=False)
        return
    s = quote_schema(store.schema)
    async with pg_connection(store) as conn:
        watch = PlacementWatch(lambda: _pg_read(conn, s), asyncio.Event(), notified=True)

        def heard(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            if payload == store.schema:
                watch.changed.set()

        await conn.add_listener(NOTIFY_CHANNEL, heard)
        yield watch


async def _pg_read(conn: Any, s: str) -> Placements:
    rows = await conn.fetch(f"SELECT pool, shard, version FROM {s}.cronoq_topology")
    return _checked([(row["pool"], row["shard"], row["version"]) for row in rows])


def _sqlite_read(path: str) -> Placements:
    try:
        conn = _sqlite_connect(path)
        try:
            rows = conn.execute("SELECT pool, shard, version FROM cronoq_topology").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise Unavailable(f"reading the pool placements: {exc}") from exc
    return _checked(rows)


async def advance_placement(store: Any, pool: str, shard: str, version: int) -> bool:
    """Record ``pool -> shard`` at ``version`` unless the store holds that version or a later one;
    whether it was written."""
    from .postgres import PostgresStore
    from .sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        return await asyncio.to_thread(_sqlite_advance, str(store.path), pool, shard, version)
    if isinstance(store, PostgresStore):
        return await _pg_advance(store, pool, shard, version)
    raise TypeError(f"{type(store).__name__} keeps no durable placements")


# ---------------------------------------------------------------------------------------- SQLite


def _sqlite_connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def _sqlite_load(path: str, seed: Placements) -> Placements:
    try:
        conn = _sqlite_connect(path)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO cronoq_topology (pool, shard, version) VALUES (?, ?, ?) ON CONFLICT (pool) DO NOTHING",
                [(pool, shard, version) for pool, (shard, version) in seed.items()],
            )
            rows = conn.execute("SELECT pool, shard, version FROM cronoq_topology").fetchall()
            conn.execute("COMMIT")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise Unavailable(f"reading the pool placements: {exc}") from exc
    return _checked(rows)


def _sqlite_advance(path: str, pool: str, shard: str, version: int) -> bool:
    try:
        conn = _sqlite_connect(path)
        try:
            conn.execute("BEGIN IMMEDIATE")
            changed = conn.execute(
                "INSERT INTO cronoq_topology (pool, shard, version) VALUES (?, ?, ?)"
                " ON CONFLICT (pool) DO UPDATE SET shard = excluded.shard, version = excluded.version"
                " WHERE cronoq_topology.version < excluded.version",
                (pool, shard, version),
            ).rowcount
            conn.execute("COMMIT")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise Unavailable(f"writing a pool placement: {exc}") from exc
    return bool(changed)


# -------------------------------------------------------------------------------------- Postgres


@contextlib.asynccontextmanager
async def pg_connection(store: Any) -> AsyncIterator[Any]:
    """A connection of its own (a few statements at start and per move: not worth a pool slot)."""
    import asyncpg

    try:
        conn = await asyncpg.connect(store.dsn, timeout=store.session_timeout)
    except (OSError, asyncpg.PostgresError) as exc:
        raise Unavailable(f"reading the pool placements: {type(exc).__name__}") from exc
    try:
        yield conn
    finally:
        await conn.close()


async def _pg_load(store: Any, seed: Placements) -> Placements:
    from .postgres import lock_key, quote_schema

    s = quote_schema(store.schema)
    pools = list(seed)
    async with pg_connection(store) as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(store.schema, "migrate"))
        await conn.execute(
            f"INSERT INTO {s}.cronoq_topology (pool, shard, version)"
            f" SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[]) ON CONFLICT (pool) DO NOTHING",
            pools,
            [seed[pool][0] for pool in pools],
            [seed[pool][1] for pool in pools],
        )
        rows = await conn.fetch(f"SELECT pool, shard, version FROM {s}.cronoq_topology")
    return _checked([(row["pool"], row["shard"], row["version"]) for row in rows])


async def _pg_advance(store: Any, pool: str, shard: str, version: int) -> bool:
    from .postgres import lock_key, quote_schema

    s = quote_schema(store.schema)
    async with pg_connection(store) as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(store.schema, "migrate"))
        status = await conn.execute(
            f"INSERT INTO {s}.cronoq_topology (pool, shard, version) VALUES ($1, $2, $3)"
            f" ON CONFLICT (pool) DO UPDATE SET shard = excluded.shard, version = excluded.version"
            f" WHERE {s}.cronoq_topology.version < excluded.version",
            pool,
            shard,
            version,
        )
        await conn.execute(notify_sql("$1"), store.schema)
    return bool(status.endswith(" 1"))
