"""Shared pieces of the driver-and-store tests: a sink that keeps what a driver hands out, a wait
for a condition, and the database of one test (memory, a real SQLite file or a Postgres schema of
its own) with direct row edits behind the store's back."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cronoq.engine import Dispatch, Resolve
from cronoq.stores import _rows as R
from cronoq.stores.memory import MemoryState, MemoryStore

WAIT_S = 30.0  # generous: the machine may be busy


class Sink:
    """Keeps what the driver hands out (the driver's ``Sink`` protocol)."""

    def __init__(self) -> None:
        self.dispatched: list[Dispatch] = []
        self.resolved: list[Resolve] = []
        self.aborted: list[Any] = []

    def dispatch(self, leases: Sequence[Dispatch]) -> None:
        self.dispatched.extend(leases)

    def abort(self, aborts: Sequence[Any]) -> None:
        self.aborted.extend(aborts)

    def resolve(self, results: Sequence[Resolve]) -> None:
        self.resolved.extend(results)

    def publish(self, events: Sequence[Any]) -> None: ...

    def scale(self, scales: Sequence[Any]) -> None: ...

    def space_available(self, pools: Sequence[str | None]) -> None: ...


async def eventually(condition: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def refused_claims(store: Any) -> list[float]:
    """A spy on a store's lease claims (each claim still runs): the ``time.monotonic()`` of every
    claim refused because another instance holds the lease."""
    refused: list[float] = []
    backend = store._lease.backend
    claim = backend.claim

    async def spied_claim() -> int | None:
        epoch: int | None = await claim()
        if epoch is None:
            refused.append(time.monotonic())
        return epoch

    backend.claim = spied_claim
    return refused


class Database:
    """Where the stores of one test live. ``store()`` opens a new instance over it each time
    (several instances stand for several processes, or a restart)."""

    def __init__(self, kind: str, directory: Path, dsn: str | None = None) -> None:
        self.kind = kind
        self.path = directory / f"{uuid.uuid4().hex[:12]}.db"
        self.dsn = dsn
        self.schema = f"cronoq_s_{uuid.uuid4().hex[:16]}"
        self.memory = MemoryState()

    def store(self, **settings: Any) -> Any:
        if self.kind == "memory":
            return MemoryStore(state=self.memory, **settings)
        if self.kind == "sqlite":
            from cronoq.stores.sqlite import SqliteStore

            settings.setdefault("lock_poll", 0.02)
            return SqliteStore(self.path, **settings)
        from cronoq.stores.postgres import PostgresStore

        assert self.dsn is not None
        settings.setdefault("lock_poll", 0.02)
        return PostgresStore(self.dsn, schema=self.schema, **settings)

    async def set_column(self, task_id: int, column: str, value: Any) -> None:
        """Edit a task row behind the store's back, as a bad migration or an old bug could."""
        if self.kind == "memory":
            self.memory.tasks[R.to_db_id(task_id)][R.TASK_COLUMNS.index(column)] = value
            return
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.path, isolation_level=None)
            try:
                conn.execute(f"UPDATE cronoq_tasks SET {column} = ? WHERE id = ?", (value, R.to_db_id(task_id)))
            finally:
                conn.close()
            return
        import asyncpg

        pg = await asyncpg.connect(self.dsn)
        try:
            await pg.execute(
                f'UPDATE "{self.schema}".cronoq_tasks SET {column} = $1 WHERE id = $2', value, R.to_db_id(task_id)
            )
        finally:
            await pg.close()

    async def schema_versions(self) -> list[int]:
        """The schema versions recorded in the database (SQL stores)."""
        if self.kind == "sqlite":
            conn = sqlite3.connect(self.path)
            try:
                return [row[0] for row in conn.execute("SELECT version FROM cronoq_schema_version ORDER BY version")]
            finally:
                conn.close()
        import asyncpg

        pg = await asyncpg.connect(self.dsn)
        try:
            rows = await pg.fetch(f'SELECT version FROM "{self.schema}".cronoq_schema_version ORDER BY version')
        finally:
            await pg.close()
        return [int(row[0]) for row in rows]

    async def drop(self) -> None:
        if self.kind == "postgres":
            import asyncpg

            pg = await asyncpg.connect(self.dsn)
            try:
                await pg.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            finally:
                await pg.close()
        self.path.unlink(missing_ok=True)
