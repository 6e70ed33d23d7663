"""Postgres store against a real server: advisory-lock leadership, fencing, keepalive, migrations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from cronoq.engine.actions import DeleteRecurring, PutRecurring, PutTask, SetStatus, TaskRecord
from cronoq.engine.types import RecurringSpec, TaskSpec, TaskStatus
from cronoq.stores import Fenced, SchemaTooNew, StoreError
from cronoq.stores import _schema as schema_mod
from cronoq.stores._pg_lease import PgLease
from cronoq.stores.postgres import PostgresStore, apply_migrations, lock_key, quote_schema

from ..waiting import eventually as until
from .support import eventually, refused_claims

T0 = 1_700_000_000_000_000_000


def put(task_id: int) -> PutTask:
    return PutTask(TaskRecord(task_id, "default", TaskSpec(payload={"i": task_id}), T0, TaskStatus.READY, 3))


@pytest.fixture
async def stores() -> AsyncIterator[list[PostgresStore]]:
    opened: list[PostgresStore] = []
    yield opened
    for store in opened:
        await store.close()


@pytest.fixture
async def admin(postgres_dsn: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(postgres_dsn)
    yield conn
    await conn.close()


def make(stores: list[PostgresStore], dsn: str, schema: str, **kw: Any) -> PostgresStore:
    kw.setdefault("lock_poll", 0.05)
    store = PostgresStore(dsn, schema=schema, **kw)
    stores.append(store)
    return store


async def test_one_leader_and_takeover_after_release(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore]
) -> None:
    a = make(stores, postgres_dsn, pg_schema)
    b = make(stores, postgres_dsn, pg_schema)
    epoch_a = await asyncio.wait_for(a.acquire_leadership(), 10)
    refused = refused_claims(b)
    waiting = asyncio.create_task(b.acquire_leadership())
    await eventually(lambda: len(refused) >= 3, "three refused claims")
    assert not waiting.done()

    await a.commit(epoch_a, [put(1)])
    await a.release_leadership()
    epoch_b = await asyncio.wait_for(waiting, 10)
    assert epoch_b == epoch_a + 1
    assert not a.lost.is_set()  # a release is not a loss

    with pytest.raises(Fenced):
        await a.commit(epoch_a, [put(2)])
    await b.commit(epoch_b, [put(3)])
    assert [t.record.id for t in (await b.recover(T0)).tasks] == [1, 3]


async def test_terminated_lock_session_hands_over_and_fences(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], admin: Any
) -> None:
    # ``a`` never renews over its lock session, so only the epoch check in the commit can stop it.
    a = make(stores, postgres_dsn, pg_schema, keepalive=3600, lease_ttl=7200)
    b = make(stores, postgres_dsn, pg_schema)
    epoch_a = await a.acquire_leadership()
    refused = refused_claims(b)
    waiting = asyncio.create_task(b.acquire_leadership())
    await eventually(lambda: len(refused) >= 3, "three refused claims")
    assert not waiting.done()

    pid = a.lock_session_pid
    assert pid is not None
    assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
    epoch_b = await asyncio.wait_for(waiting, 10)
    assert epoch_b > epoch_a
    assert a.epoch == epoch_a and not a.lost.is_set()  # it has not noticed ...
    with pytest.raises(Fenced):  # ... but the database refuses its writes
        await a.commit(epoch_a, [put(1), put(2)])
    assert a.lost.is_set()
    assert (await b.recover(T0)).tasks == []
    await b.commit(epoch_b, [put(3)])


async def test_a_standby_waits_in_the_lock_queue_and_takes_over_when_the_session_ends(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], admin: Any
) -> None:
    a = make(stores, postgres_dsn, pg_schema)
    epoch_a = await a.acquire_leadership()
    # A standby whose single wait for the lock lasts an hour: it can only take over in time if
    # the lock passes to it while it waits, not at a later poll.
    standby = PgLease(
        dsn=postgres_dsn,
        schema=pg_schema,
        s=quote_schema(pg_schema),
        key=lock_key(pg_schema),
        holder="standby",
        tag="standby",
        lease_ttl=8.0,
        session_timeout=10.0,
        lock_wait=3600.0,
    )
    claim = asyncio.create_task(standby.claim())
    try:
        waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1"
        await until(lambda: standby.pid is not None and admin.fetchval(waiting, standby.pid))
        assert not claim.done()
        # The leader's lock session ends, as it does when its process is killed.
        await admin.execute("SELECT pg_terminate_backend($1)", a.lock_session_pid)
        assert await asyncio.wait_for(claim, 30) == epoch_a + 1
        await eventually(a.lost.is_set, "the old leader to find its lock gone")
    finally:
        claim.cancel()
        await asyncio.gather(claim, return_exceptions=True)
        await standby.close()


async def test_a_dead_lock_session_is_restored_when_nobody_took_over(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], admin: Any
) -> None:
    """A short database hiccup (the lock session dies) does not cost leadership: the lock is taken
    back on a new session, with the same epoch, since no other instance led in between."""
    a = make(stores, postgres_dsn, pg_schema, keepalive=0.1)
    epoch = await a.acquire_leadership()
    old_pid = a.lock_session_pid
    await admin.fetchval("SELECT pg_terminate_backend($1)", old_pid)
    deadline = asyncio.get_running_loop().time() + 5
    while a.lock_session_pid in (None, old_pid) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    assert a.lock_session_pid not in (None, old_pid)
    assert a.epoch == epoch and not a.lost.is_set()
    await a.commit(epoch, [put(1)])


async def test_keepalive_notices_a_takeover_after_the_session_died(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], admin: Any
) -> None:
    a = make(stores, postgres_dsn, pg_schema, keepalive=1.0)
    b = make(stores, postgres_dsn, pg_schema, lock_poll=0.05)
    epoch = await a.acquire_leadership()
    standby = asyncio.ensure_future(b.acquire_leadership())
    await admin.fetchval("SELECT pg_terminate_backend($1)", a.lock_session_pid)
    assert await asyncio.wait_for(standby, 5) == epoch + 1
    await asyncio.wait_for(a.lost.wait(), 5)
    assert a.epoch is None
    with pytest.raises(Fenced):
        await a.commit(epoch, [put(1)])


async def test_unresponsive_session_is_declared_lost(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], admin: Any
) -> None:
    a = make(stores, postgres_dsn, pg_schema, keepalive=0.1, lease_ttl=0.8)
    await a.acquire_leadership()
    # Block the leader's renewals behind a table lock: its lease runs out before one gets through.
    async with admin.transaction():
        await admin.execute(f'LOCK TABLE "{pg_schema}".cronoq_lease IN ACCESS EXCLUSIVE MODE')
        await asyncio.wait_for(a.lost.wait(), 5)
    assert a.epoch is None


async def test_lock_session_settings(postgres_dsn: str, pg_schema: str, stores: list[PostgresStore]) -> None:
    a = make(stores, postgres_dsn, pg_schema, keepalive=3600, lease_ttl=7200, session_timeout=12)
    await a.acquire_leadership()
    conn = a._lock.conn
    if await conn.fetchval("SELECT inet_server_addr() IS NULL"):
        pytest.skip("CRONOQ_TEST_DSN uses a Unix socket, where the server ignores TCP keepalive settings")
    assert await conn.fetchval("SHOW tcp_keepalives_idle") == "6"
    assert await conn.fetchval("SHOW tcp_keepalives_interval") == "2"
    assert await conn.fetchval("SHOW tcp_keepalives_count") == "3"
    assert await conn.fetchval("SELECT setting FROM pg_settings WHERE name = 'tcp_user_timeout'") == "12000"


async def test_a_commit_is_one_statement_whatever_its_size(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore]
) -> None:
    a = make(stores, postgres_dsn, pg_schema, max_connections=1)
    epoch = await a.acquire_leadership()

    def steps(n: int, first: int) -> list[list[Any]]:
        ids = range(first, first + n)
        return [
            [put(i) for i in ids],
            [
                *(SetStatus(i, TaskStatus.RUNNING, 1, T0) for i in ids),
                PutRecurring(RecurringSpec("r", "* * * * *", TaskSpec()), T0, None),
                DeleteRecurring("gone"),
            ],
            [SetStatus(i, TaskStatus.SUCCEEDED, 1, T0, output=i, has_output=True) for i in ids],
        ]

    for step in steps(3, 10_000):  # warm up: asyncpg prepares (and caches) each statement shape once
        await a.commit(epoch, step)
    seen: list[str] = []
    async with a._pool.acquire() as conn:  # the pool's only connection
        conn.add_query_logger(lambda record: seen.append(record.query))
    for step in steps(2000, 1):
        await a.commit(epoch, step)
    assert len(seen) == 3, seen
    assert all(q.startswith("WITH fence AS") for q in seen)
    rec = await a.recover(T0)
    assert len(rec.tasks) == 2003 and [r.spec.name for r in rec.recurring] == ["r"]
    assert await a.load_output(2000) == (True, 2000)


async def test_fresh_schema_and_upgrade_from_v1(postgres_dsn: str, pg_schema: str, stores: list[PostgresStore]) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        assert await apply_migrations(conn, pg_schema, target=1) == 1
        s = f'"{pg_schema}"'
        await conn.execute(
            f"INSERT INTO {s}.cronoq_tasks (id, pool, kind, priority, key, status, attempt, max_attempts,"
            " submitted_at, spec, payload, has_output) VALUES (7, 'default', 'old', 2, 'legacy', 'ready', 0, 3,"
            ' $1, \'{"status":"ready"}\', $2, false)',
            T0,
            b'{"v":1}',
        )
        assert await conn.fetchval("SELECT to_regclass($1)", f"{s}.cronoq_shard") is None

        store = make(stores, postgres_dsn, pg_schema, shard="s1")
        rec = await store.recover(T0)
        assert [(t.record.id, t.record.spec.payload) for t in rec.tasks] == [(7, {"v": 1})]
        versions = await conn.fetch(f"SELECT version FROM {s}.cronoq_schema_version ORDER BY version")
        assert [r[0] for r in versions] == [1, 2, 3, 4, 5, 6, 7] == list(range(1, schema_mod.LATEST + 1))
        assert await conn.fetchval(f"SELECT shard FROM {s}.cronoq_shard") == "s1"
        indexes = {r[0] for r in await conn.fetch("SELECT indexname FROM pg_indexes WHERE schemaname = $1", pg_schema)}
        assert {"cronoq_tasks_key_idx", "cronoq_tasks_finished_idx"} <= indexes
    finally:
        await conn.close()


async def test_concurrent_first_start(postgres_dsn: str, pg_schema: str, stores: list[PostgresStore]) -> None:
    many = [make(stores, postgres_dsn, pg_schema) for _ in range(4)]
    await asyncio.gather(*(s.open() for s in many))
    conn = await asyncpg.connect(postgres_dsn)
    try:
        rows = await conn.fetch(f'SELECT version FROM "{pg_schema}".cronoq_schema_version')
        assert sorted(r[0] for r in rows) == list(range(1, schema_mod.LATEST + 1)) == [1, 2, 3, 4, 5, 6, 7]
    finally:
        await conn.close()


async def test_newer_schema_is_refused(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], admin: Any
) -> None:
    await make(stores, postgres_dsn, pg_schema).open()
    await admin.execute(
        f"INSERT INTO \"{pg_schema}\".cronoq_schema_version (version, description) VALUES ($1, 'future')",
        schema_mod.LATEST + 1,
    )
    with pytest.raises(SchemaTooNew, match="upgrade cronoq"):
        await make(stores, postgres_dsn, pg_schema).acquire_leadership()


async def test_tables_of_another_role_are_refused(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], admin: Any
) -> None:
    role = f"{pg_schema}_other"
    try:
        await admin.execute(f'CREATE ROLE "{role}"')
    except asyncpg.InsufficientPrivilegeError:
        pytest.skip("the test database user may not create roles, needed to fake a foreign owner")
    try:
        await admin.execute(f'CREATE SCHEMA "{pg_schema}"')
        await admin.execute(f'CREATE TABLE "{pg_schema}".cronoq_tasks (id bigint)')
        await admin.execute(f'ALTER TABLE "{pg_schema}".cronoq_tasks OWNER TO "{role}"')
        with pytest.raises(StoreError, match="belong to another role"):
            await make(stores, postgres_dsn, pg_schema).open()
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')
        await admin.execute(f'DROP ROLE "{role}"')


def test_schema_names_are_checked(postgres_dsn: str) -> None:
    for bad in ("", "a-b", 'x"; DROP TABLE y; --', "a" * 64, "sch ema"):
        with pytest.raises(ValueError, match="schema name"):
            PostgresStore(postgres_dsn, schema=bad)
