"""SQLite store: lease-based leadership between instances sharing one file, file modes, migrations."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cronoq.engine.actions import PutTask, TaskRecord
from cronoq.engine.types import TaskSpec, TaskStatus
from cronoq.stores import Fenced, SchemaTooNew, Unavailable
from cronoq.stores import _schema as schema
from cronoq.stores.sqlite import SqliteStore, apply_migrations

from .support import eventually, refused_claims

T0 = 1_700_000_000_000_000_000


def put(task_id: int) -> PutTask:
    return PutTask(TaskRecord(task_id, "default", TaskSpec(payload={"i": task_id}), T0, TaskStatus.READY, 3))


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[list[SqliteStore]]:
    opened: list[SqliteStore] = []
    yield opened
    for store in opened:
        await store.close()


def make(stores: list[SqliteStore], path: Path, **kw: Any) -> SqliteStore:
    kw.setdefault("lock_poll", 0.05)
    store = SqliteStore(path, **kw)
    stores.append(store)
    return store


async def test_one_leader_and_immediate_takeover_after_release(tmp_path: Path, stores: list[SqliteStore]) -> None:
    path = tmp_path / "c.db"
    a = make(stores, path)
    b = make(stores, path)
    epoch_a = await asyncio.wait_for(a.acquire_leadership(), 5)
    refused = refused_claims(b)
    waiting = asyncio.create_task(b.acquire_leadership())
    await eventually(lambda: len(refused) >= 3, "three refused claims")  # the lease (10 s) is held
    assert not waiting.done()

    await a.commit(epoch_a, [put(1)])
    loop = asyncio.get_running_loop()
    released_at = loop.time()
    await a.release_leadership()
    epoch_b = await asyncio.wait_for(waiting, 5)
    assert loop.time() - released_at < 1.0  # no lease expiry wait
    assert epoch_b == epoch_a + 1

    with pytest.raises(Fenced):
        await a.commit(epoch_a, [put(2)])
    await b.commit(epoch_b, [put(3)])
    assert [t.record.id for t in (await b.recover(T0)).tasks] == [1, 3]


async def test_takeover_when_leader_stops_renewing(tmp_path: Path, stores: list[SqliteStore]) -> None:
    path = tmp_path / "c.db"
    a = make(stores, path, lease_ttl=1.0, lease_renew=0.2)
    b = make(stores, path, lease_ttl=1.0, lease_renew=0.2)
    epoch_a = await a.acquire_leadership()
    acquired = time.monotonic()
    refused = refused_claims(b)
    waiting = asyncio.create_task(b.acquire_leadership())
    # Renewals keep the lease alive past its TTL: a claim is still refused well after it.
    await eventually(lambda: bool(refused) and refused[-1] > acquired + 1.5, "a refused claim past the TTL")
    assert not waiting.done()

    # Freeze the leader's renewals, as if its process were paused.
    a._lease.pause_renewals()
    epoch_b = await asyncio.wait_for(waiting, 5)
    assert epoch_b > epoch_a
    assert a.epoch == epoch_a  # the paused leader has not noticed yet ...
    with pytest.raises(Fenced):  # ... but its write transaction checks the lease
        await a.commit(epoch_a, [put(1)])
    assert a.lost.is_set()
    assert (await b.recover(T0)).tasks == []


async def test_renewal_notices_a_takeover(tmp_path: Path, stores: list[SqliteStore]) -> None:
    path = tmp_path / "c.db"
    a = make(stores, path, lease_ttl=1.0, lease_renew=0.1)
    epoch = await a.acquire_leadership()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'intruder'")
    finally:
        conn.close()
    await asyncio.wait_for(a.lost.wait(), 5)
    assert a.epoch is None
    with pytest.raises(Fenced):
        await a.commit(epoch, [put(1)])
    # It can compete again once the intruder's lease runs out (it has none: expiry unchanged).
    assert await asyncio.wait_for(a.acquire_leadership(), 5) == epoch + 2
    assert not a.lost.is_set()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_files_are_owner_only(tmp_path: Path, stores: list[SqliteStore]) -> None:
    path = tmp_path / "c.db"
    old = os.umask(0)  # even a permissive umask must not widen the files
    try:
        a = make(stores, path)
        epoch = await a.acquire_leadership()
        await a.commit(epoch, [put(1)])
    finally:
        os.umask(old)
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        assert p.exists(), p
        assert _mode(p) == 0o600, (p, oct(_mode(p)))


async def test_pragmas(tmp_path: Path, stores: list[SqliteStore]) -> None:
    full = make(stores, tmp_path / "full.db")
    normal = make(stores, tmp_path / "normal.db", full_sync=False)
    for store, expected in ((full, 2), (normal, 1)):
        await store.open()
        mode = await store._call("test", lambda s=store: s._db().execute("PRAGMA journal_mode").fetchone()[0])
        sync = await store._call("test", lambda s=store: s._db().execute("PRAGMA synchronous").fetchone()[0])
        assert (mode, sync) == ("wal", expected)


def _versions(path: Path) -> list[int]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT version FROM cronoq_schema_version ORDER BY version")]
    finally:
        conn.close()


async def test_fresh_file_is_at_latest_version(tmp_path: Path, stores: list[SqliteStore]) -> None:
    path = tmp_path / "c.db"
    await make(stores, path).open()
    assert _versions(path) == list(range(1, schema.LATEST + 1))
    assert schema.LATEST == 7


async def test_upgrade_from_version_1(tmp_path: Path, stores: list[SqliteStore]) -> None:
    path = tmp_path / "c.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert apply_migrations(conn, target=1) == 1
        # A task written by a version-1 build.
        conn.execute(
            "INSERT INTO cronoq_tasks (id, pool, kind, priority, key, tenant, status, attempt, max_attempts,"
            " message, submitted_at, started_at, finished_at, retry_at, spec, payload, output, has_output)"
            " VALUES (7, 'default', 'old', 2, 'legacy', NULL, 'ready', 0, 3, NULL, ?, NULL, NULL, NULL,"
            ' \'{"status":"ready"}\', ?, NULL, 0)',
            (T0, b'{"v":1}'),
        )
        conn.execute("UPDATE cronoq_meta SET id_high_water = 7")
        # And a schedule, from before schedules could be paused.
        conn.execute(
            "INSERT INTO cronoq_recurring (name, cron, spec, payload, next_at, last_task_id)"
            ' VALUES (\'nightly\', \'0 2 * * *\', \'{"overlap":"skip","tolerance":1000000000,"on_miss":"run_late",'
            '"template":{"kind":"default","priority":2}}\', ?, NULL, NULL)',
            (b"null",),
        )
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "cronoq_shard" not in names
    finally:
        conn.close()
    assert _versions(path) == [1]

    store = make(stores, path, shard="s1")
    rec = await store.recover(T0)
    assert _versions(path) == [1, 2, 3, 4, 5, 6, 7]  # 3 and 6 change nothing in SQLite (Postgres only)
    assert [(t.record.id, t.record.spec.key, t.record.spec.payload) for t in rec.tasks] == [(7, "legacy", {"v": 1})]
    assert [(r.spec.name, r.paused) for r in rec.recurring] == [("nightly", False)]
    conn = sqlite3.connect(path)
    try:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert {"cronoq_shard", "cronoq_tasks_key_idx", "cronoq_tasks_finished_idx"} <= names
        assert conn.execute("SELECT shard FROM cronoq_shard").fetchall() == [("s1",)]
    finally:
        conn.close()


async def test_newer_schema_is_refused(tmp_path: Path, stores: list[SqliteStore]) -> None:
    path = tmp_path / "c.db"
    await make(stores, path).open()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(
            "INSERT INTO cronoq_schema_version (version, description, applied_at) VALUES (?, 'future', 0)",
            (schema.LATEST + 1,),
        )
    finally:
        conn.close()
    with pytest.raises(SchemaTooNew, match="upgrade cronoq"):
        await make(stores, path).acquire_leadership()


async def test_commit_timeout_is_unavailable(tmp_path: Path, stores: list[SqliteStore]) -> None:
    path = tmp_path / "c.db"
    store = make(stores, path, commit_timeout=0.3, busy_timeout=5.0)
    epoch = await store.acquire_leadership()
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(Unavailable, match="longer than"):
            await store.commit(epoch, [put(1)])
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()
    await store.commit(epoch, [put(2)])  # the interrupted commit left the connection usable
    assert [t.record.id for t in (await store.recover(T0)).tasks] == [2]
