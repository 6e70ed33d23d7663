"""A leader frozen past its lease, at the store level: it is replaced, and every write path of
the woken leader is fenced by the database (Postgres and SQLite, real servers and files).

"Frozen" here is a store whose renewals stopped (``pause_renewals``), as in a paused process. To
show that the *database* refuses the woken leader, not only its own clock, most tests also
pretend that its clock did not notice the pause (the lease deadline pushed to infinity): what it
then tries to write must still be refused, and the rows stay as they were.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from cronoq.engine.actions import PutTask, SetStatus, TaskRecord
from cronoq.engine.types import NS_PER_S, TaskSpec, TaskStatus
from cronoq.stores import Fenced, Unavailable
from cronoq.stores.postgres import PostgresStore
from cronoq.stores.sqlite import SqliteStore

from .support import eventually, refused_claims

T0 = 1_700_000_000_000_000_000
HOUR = 3600 * NS_PER_S
TTL = 0.6
PG_TABLES = ("cronoq_tasks", "cronoq_task_events", "cronoq_task_transitions", "cronoq_meta", "cronoq_leader")
RENEW = 0.1


def put(task_id: int) -> PutTask:
    return PutTask(TaskRecord(task_id, "default", TaskSpec(payload={"i": task_id}, key=f"k{task_id}"), T0,
                              TaskStatus.READY, 3))  # fmt: skip


def finish(task_id: int, at: int) -> SetStatus:
    return SetStatus(task_id, TaskStatus.SUCCEEDED, 1, at)


@dataclass
class Kind:
    """One store kind: how to make a store, read every row, and corrupt one."""

    name: str
    make: Callable[..., Any]
    fingerprint: Callable[[], Awaitable[str]]
    corrupt: Callable[[int], Awaitable[None]]


@pytest.fixture(params=["postgres", "sqlite"])
async def kind(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Kind]:
    opened: list[Any] = []
    if request.param == "postgres":
        dsn: str = request.getfixturevalue("postgres_dsn")
        schema = f"cronoq_t_{uuid.uuid4().hex[:16]}"
        s = f'"{schema}"'

        def make_pg(**kw: Any) -> PostgresStore:
            kw.setdefault("lock_poll", 0.05)
            store = PostgresStore(dsn, schema=schema, **kw)
            opened.append(store)
            return store

        async def pg_rows() -> str:
            conn = await asyncpg.connect(dsn)
            try:
                parts = [
                    await conn.fetchval(
                        f"SELECT coalesce(string_agg(t::text, '|' ORDER BY t::text), '') FROM {s}.{t} t"
                    )
                    for t in PG_TABLES
                ]
            finally:
                await conn.close()
            return hashlib.sha256("\n".join(parts).encode()).hexdigest()

        async def pg_corrupt(task_id: int) -> None:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f"UPDATE {s}.cronoq_tasks SET spec = '{{not json' WHERE id = $1", task_id)
            finally:
                await conn.close()

        yield Kind("postgres", make_pg, pg_rows, pg_corrupt)
        for store in opened:
            await store.close()
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
        finally:
            await conn.close()
        return
    else:
        path = tmp_path / "c.db"

        def make_sqlite(**kw: Any) -> SqliteStore:
            kw.setdefault("lock_poll", 0.05)
            store = SqliteStore(path, **kw)
            opened.append(store)
            return store

        def sql(text: str, args: tuple[Any, ...] = ()) -> list[Any]:
            conn = sqlite3.connect(path, isolation_level=None)
            try:
                return conn.execute(text, args).fetchall()
            finally:
                conn.close()

        async def sqlite_rows() -> str:
            rows = [sorted(map(repr, sql(f"SELECT * FROM {t}"))) for t in ("cronoq_tasks", "cronoq_meta")]
            rows.append(sql("SELECT epoch, holder FROM cronoq_leader"))
            return hashlib.sha256(repr(rows).encode()).hexdigest()

        async def sqlite_corrupt(task_id: int) -> None:
            sql("UPDATE cronoq_tasks SET spec = '{not json' WHERE id = ?", (task_id,))

        yield Kind("sqlite", make_sqlite, sqlite_rows, sqlite_corrupt)
    for store in opened:
        await store.close()


async def frozen_and_replaced(kind: Kind) -> tuple[Any, int, Any, int]:
    """A leader with two tasks (one finished long ago, its status still in Postgres's event log)
    that freezes, and the standby that replaces it once its lease expired."""
    a = kind.make(lease_ttl=TTL, lease_renew=RENEW)
    epoch_a = await asyncio.wait_for(a.acquire_leadership(), 10)
    await a.commit(epoch_a, [put(1), put(2)])
    await a.commit(epoch_a, [finish(1, T0 - 10 * HOUR)])
    a._lease.pause_renewals()
    b = kind.make(lease_ttl=TTL, lease_renew=RENEW)
    epoch_b = await asyncio.wait_for(b.acquire_leadership(), 10)
    assert epoch_b > epoch_a
    assert a.epoch == epoch_a  # it has not noticed anything
    a._lease._deadline = math.inf  # nor will its clock: only the database can stop it now
    return a, epoch_a, b, epoch_b


async def fenced(call: Callable[[], Awaitable[Any]]) -> Fenced:
    """What ``call`` raises once it reaches the database. (Postgres: the takeover ended the old
    leader's pooled sessions, so the first attempt may find its connection gone: Unavailable,
    which the driver retries, as done here.)"""
    for _ in range(5):
        try:
            await call()
        except Unavailable:
            continue
        except Fenced as exc:
            return exc
        raise AssertionError("the write of a replaced leader went through")
    raise AssertionError("the store stayed unavailable")


async def test_a_woken_leader_cannot_commit(kind: Kind) -> None:
    a, epoch_a, b, epoch_b = await frozen_and_replaced(kind)
    before = await kind.fingerprint()
    await fenced(lambda: a.commit(epoch_a, [put(3), finish(2, T0)]))
    assert a.lost.is_set() and a.epoch is None
    assert await kind.fingerprint() == before
    await b.commit(epoch_b, [put(4)])  # the new leader writes as usual
    assert [t.record.id for t in (await b.recover(T0)).tasks] == [2, 4]


async def test_a_woken_leader_cannot_prune(kind: Kind) -> None:
    a, _, b, _ = await frozen_and_replaced(kind)
    before = await kind.fingerprint()
    # Task 1 finished before T0. (With Postgres the compaction that a prune starts with is
    # refused first; the delete is fenced in its own transaction too.)
    await fenced(lambda: a.prune(T0))
    assert a.lost.is_set()
    assert await kind.fingerprint() == before
    assert await b.prune(T0) == 1


async def test_a_woken_leader_cannot_mark_corrupt_rows(kind: Kind) -> None:
    a, _, b, _ = await frozen_and_replaced(kind)
    await kind.corrupt(2)
    before = await kind.fingerprint()
    await fenced(lambda: a.recover(T0))
    assert a.lost.is_set()
    assert await kind.fingerprint() == before  # the row is as it was: not marked by the old leader
    rec = await b.recover(T0)  # the new leader marks it
    assert {t.record.id: t.status for t in rec.tasks}[2] is TaskStatus.DEAD_LETTERED
    assert await kind.fingerprint() != before


@pytest.mark.parametrize("kind", ["postgres"], indirect=True)  # only Postgres keeps a status event log
async def test_a_woken_leader_cannot_fold_the_event_log(kind: Kind) -> None:
    a, _, _, _ = await frozen_and_replaced(kind)
    before = await kind.fingerprint()
    await fenced(a.compact)
    assert await kind.fingerprint() == before


async def test_a_lease_that_ran_out_refuses_writes_before_asking_the_database(kind: Kind) -> None:
    """No standby took over, but the leader was paused past its lease: on waking it stops leading
    before any write, and can compete again."""
    a = kind.make(lease_ttl=TTL, lease_renew=RENEW)
    epoch = await asyncio.wait_for(a.acquire_leadership(), 10)
    await a.commit(epoch, [put(1)])
    a._lease.pause_renewals()
    await eventually(lambda: a._lease.remaining == 0, "the lease ran out")  # the pause: nothing else happens
    before = await kind.fingerprint()
    with pytest.raises(Fenced):
        await a.commit(epoch, [put(2)])
    assert a.lost.is_set() and a.epoch is None
    assert await kind.fingerprint() == before
    again = await asyncio.wait_for(a.acquire_leadership(), 10)
    assert again == epoch + 1
    await a.commit(again, [put(3)])


async def test_a_live_leader_keeps_its_lease(kind: Kind) -> None:
    a = kind.make(lease_ttl=TTL, lease_renew=RENEW)
    epoch = await asyncio.wait_for(a.acquire_leadership(), 10)
    acquired = time.monotonic()
    b = kind.make(lease_ttl=TTL, lease_renew=RENEW)
    refused = refused_claims(b)
    waiting = asyncio.create_task(b.acquire_leadership())
    # Several lease lifetimes later a claim is still refused: renewals keep the lease.
    await eventually(lambda: bool(refused) and refused[-1] > acquired + 5 * TTL, "a refused claim 5 TTLs on")
    assert not waiting.done()
    await a.commit(epoch, [put(1)])
    assert not a.lost.is_set()
    await a.release_leadership()
    assert await asyncio.wait_for(waiting, 10) == epoch + 1


async def test_takeover_ends_the_frozen_holders_sessions_only(postgres_dsn: str, pg_schema: str) -> None:
    stores: list[PostgresStore] = []

    def make(**kw: Any) -> PostgresStore:
        store = PostgresStore(postgres_dsn, schema=pg_schema, lock_poll=0.05, lease_ttl=TTL, lease_renew=RENEW, **kw)
        stores.append(store)
        return store

    admin = await asyncpg.connect(postgres_dsn)
    try:

        async def sessions(tag: str) -> set[int]:
            rows = await admin.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name IN ($1, $2)",
                f"cronoq/{tag}",
                f"cronoq-lock/{tag}",
            )
            return {row[0] for row in rows}

        a, bystander, b = make(), make(), make()
        epoch = await a.acquire_leadership()
        await a.commit(epoch, [put(1)])
        await bystander.open()
        frozen = await sessions(a.tag)
        assert len(frozen) == 2  # its pooled connection and its lock session
        others = await sessions(bystander.tag)
        a._lease.pause_renewals()
        await asyncio.wait_for(b.acquire_leadership(), 10)
        # (asyncpg's pool of ``a`` may open a new connection at once; a frozen process would not.)
        assert not frozen & await sessions(a.tag)
        assert others and others <= await sessions(bystander.tag)
        assert len(await sessions(b.tag)) == 2
        assert [t.record.id for t in (await bystander.recover(T0)).tasks] == [1]
    finally:
        await admin.close()
        for store in stores:
            await store.close()
