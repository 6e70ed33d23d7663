"""The Postgres status event log (schema version 3): appended by commits, folded by compaction and
by recovery, consulted by ``load_output``, cleaned by quarantine and pruning, fenced like commits."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from cronoq.engine.actions import PutTask, SetStatus, TaskRecord
from cronoq.engine.types import TaskSpec, TaskStatus
from cronoq.stores import Fenced
from cronoq.stores import _schema as schema_mod
from cronoq.stores.postgres import PostgresStore, apply_migrations

T0 = 1_700_000_000_000_000_000
HOUR = 3600 * 10**9


def put(task_id: int, spec: TaskSpec | None = None) -> PutTask:
    return PutTask(TaskRecord(task_id, "default", spec or TaskSpec(payload={"i": task_id}), T0, TaskStatus.READY, 3))


def running(task_id: int, at: int, attempt: int = 1) -> SetStatus:
    return SetStatus(task_id, TaskStatus.RUNNING, attempt, at)


def succeeded(task_id: int, at: int, output: Any) -> SetStatus:
    return SetStatus(task_id, TaskStatus.SUCCEEDED, 1, at, output=output, has_output=True)


@pytest.fixture
async def stores() -> AsyncIterator[list[PostgresStore]]:
    opened: list[PostgresStore] = []
    yield opened
    for store in opened:
        await store.close()


@pytest.fixture
async def db(postgres_dsn: str, pg_schema: str) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(postgres_dsn)
    yield conn
    await conn.close()


def make(stores: list[PostgresStore], dsn: str, schema: str, **kw: Any) -> PostgresStore:
    kw.setdefault("lock_poll", 0.05)
    store = PostgresStore(dsn, schema=schema, **kw)
    stores.append(store)
    return store


async def table_row(db: Any, schema: str, task_id: int) -> Any:
    return await db.fetchrow(
        f'SELECT status, attempt, started_at, finished_at, has_output FROM "{schema}".cronoq_tasks WHERE id = $1',
        task_id,
    )


async def logged_ids(db: Any, schema: str) -> list[int]:
    """The task ids of the status rows in the log, in commit order."""
    texts = await db.fetch(f'SELECT statuses FROM "{schema}".cronoq_task_events ORDER BY seq')
    return [status[0] for (text,) in texts for status in json.loads(text)]


async def event_count(db: Any, schema: str) -> int:
    return len(await logged_ids(db, schema))


async def test_statuses_are_appended_and_read_back_on_top_of_the_rows(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], db: Any
) -> None:
    store = make(stores, postgres_dsn, pg_schema)
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [put(1), put(2)])
    await store.commit(epoch, [running(1, T0 + 1), running(2, T0 + 1)])
    await store.commit(epoch, [succeeded(1, T0 + 2, {"ok": 1})])

    # The rows still hold what their own step wrote; the log holds the rest, a row per commit.
    assert tuple(await table_row(db, pg_schema, 1)) == ("ready", 0, None, None, False)
    assert await logged_ids(db, pg_schema) == [1, 2, 1]
    assert await db.fetchval(f'SELECT count(*) FROM "{pg_schema}".cronoq_task_events') == 2

    reader = make(stores, postgres_dsn, pg_schema)
    rec = {t.record.id: t for t in (await reader.recover(T0 + 3)).tasks}
    one, two = rec[1], rec[2]
    assert (one.status, one.attempt, one.started_at, one.finished_at, one.has_output) == (
        TaskStatus.SUCCEEDED, 1, T0 + 1, T0 + 2, True,
    )  # fmt: skip
    assert (two.status, two.started_at, two.finished_at) == (TaskStatus.RUNNING, T0 + 1, None)
    assert await reader.load_output(1) == (True, {"ok": 1})
    assert await reader.load_output(2) == (False, None)


async def test_compaction_folds_the_log_into_the_rows(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], db: Any
) -> None:
    store = make(stores, postgres_dsn, pg_schema)
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [put(1), put(2), put(3)])
    await store.commit(epoch, [running(1, T0 + 1), running(2, T0 + 1)])
    assert await store.compact() == 2
    # Task 1 finishes after its start was folded; task 3 starts and finishes within one fold.
    await store.commit(epoch, [succeeded(1, T0 + 2, "one"), running(3, T0 + 3)])
    await store.commit(epoch, [succeeded(3, T0 + 4, "three")])
    assert await store.compact() == 3

    assert await event_count(db, pg_schema) == 0
    assert tuple(await table_row(db, pg_schema, 1)) == ("succeeded", 1, T0 + 1, T0 + 2, True)
    assert tuple(await table_row(db, pg_schema, 2)) == ("running", 1, T0 + 1, None, False)
    assert tuple(await table_row(db, pg_schema, 3)) == ("succeeded", 1, T0 + 3, T0 + 4, True)
    assert await store.load_output(3) == (True, "three")
    assert await store.compact() == 0


async def test_the_leader_compacts_in_the_background(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], db: Any
) -> None:
    store = make(stores, postgres_dsn, pg_schema, compact_after=4)
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [put(i) for i in range(1, 5)])
    await store.commit(epoch, [running(i, T0 + 1) for i in range(1, 5)])  # reaches compact_after
    for _ in range(500):  # the fold runs on its own; wait for it rather than for a fixed time
        if await event_count(db, pg_schema) == 0:
            break
        await asyncio.sleep(0.01)
    assert await event_count(db, pg_schema) == 0
    assert {r[0] for r in await db.fetch(f'SELECT status FROM "{pg_schema}".cronoq_tasks')} == {"running"}


async def test_recovery_applies_the_retention_window_to_what_the_log_says(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore]
) -> None:
    store = make(stores, postgres_dsn, pg_schema)
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [put(1), put(2)])
    await store.commit(epoch, [succeeded(1, T0 + 1, 1), succeeded(2, T0 + 2 * HOUR, 2)])
    reader = make(stores, postgres_dsn, pg_schema)
    rec = await reader.recover(T0 + 2 * HOUR + 1, retention=HOUR)
    assert [t.record.id for t in rec.tasks] == [2]  # task 1 finished before the window


async def test_quarantine_drops_the_events_of_the_row(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], db: Any
) -> None:
    store = make(stores, postgres_dsn, pg_schema)
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [put(1), put(2)])
    await store.commit(epoch, [running(1, T0 + 1), running(2, T0 + 1)])
    await db.execute(f'UPDATE "{pg_schema}".cronoq_tasks SET spec = $1 WHERE id = 1', "{not json")

    first = {t.record.id: t for t in (await make(stores, postgres_dsn, pg_schema).recover(T0 + 5)).tasks}
    assert first[1].status is TaskStatus.DEAD_LETTERED and (first[1].message or "").startswith("quarantined: ")
    assert first[2].status is TaskStatus.RUNNING
    assert await logged_ids(db, pg_schema) == [2]
    again = {t.record.id: t for t in (await make(stores, postgres_dsn, pg_schema).recover(T0 + 9)).tasks}
    assert again[1].status is TaskStatus.DEAD_LETTERED  # no event folded back over the quarantine


async def test_prune_removes_tasks_that_finished_only_in_the_log(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], db: Any
) -> None:
    store = make(stores, postgres_dsn, pg_schema)
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [put(1), put(2)])
    await store.commit(epoch, [succeeded(1, T0 + 1, 1), running(2, T0 + 1)])
    assert await store.prune(T0 + 10) == 1
    assert [r[0] for r in await db.fetch(f'SELECT id FROM "{pg_schema}".cronoq_tasks')] == [2]
    assert await event_count(db, pg_schema) == 0


async def test_a_stale_leader_cannot_compact(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], db: Any
) -> None:
    old = make(stores, postgres_dsn, pg_schema)
    epoch = await old.acquire_leadership()
    await old.commit(epoch, [put(1)])
    await old.commit(epoch, [running(1, T0 + 1)])
    # Another instance takes over while the old one still believes it leads.
    await db.execute(f'UPDATE "{pg_schema}".cronoq_leader SET epoch = epoch + 1 WHERE id = 1')
    with pytest.raises(Fenced):
        await old.compact()
    assert old.lost.is_set()
    assert await event_count(db, pg_schema) == 1  # nothing folded


async def test_upgrade_from_v2_keeps_the_rows(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], db: Any
) -> None:
    assert await apply_migrations(db, pg_schema, target=2) == 2
    s = f'"{pg_schema}"'
    await db.execute(
        f"INSERT INTO {s}.cronoq_tasks (id, pool, kind, priority, status, attempt, max_attempts, submitted_at,"
        " started_at, spec, payload, has_output) VALUES (5, 'default', 'old', 1, 'running', 1, 3, $1, $2,"
        ' \'{"status":"ready"}\', $3, false)',
        T0,
        T0 + 1,
        b'{"v":2}',
    )
    assert await db.fetchval("SELECT to_regclass($1)", f"{s}.cronoq_task_events") is None

    store = make(stores, postgres_dsn, pg_schema)
    epoch = await store.acquire_leadership()
    assert await db.fetchval(f"SELECT max(version) FROM {s}.cronoq_schema_version") == schema_mod.LATEST == 7
    await store.commit(epoch, [succeeded(5, T0 + 2, "done")])
    rec = await make(stores, postgres_dsn, pg_schema).recover(T0 + 3)
    [task] = rec.tasks
    assert (task.record.id, task.record.spec.payload, task.status, task.started_at, task.finished_at) == (
        5, {"v": 2}, TaskStatus.SUCCEEDED, T0 + 1, T0 + 2,
    )  # fmt: skip
    assert await store.load_output(5) == (True, "done")
    indexdef = await db.fetchval(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname = 'cronoq_tasks_finished_idx'", pg_schema
    )
    assert indexdef.endswith("WHERE (finished_at IS NOT NULL)"), indexdef
    # New tasks go into the upgraded table as rows of its own type (the commit's encoding).
    await store.commit(epoch, [put(6, TaskSpec(payload=[6], key="six", tags={"t": "v"}))])
    rec = await make(stores, postgres_dsn, pg_schema).recover(T0 + 3)
    new = rec.tasks[-1]
    assert (new.record.id, new.record.spec.payload, new.record.spec.key, new.record.spec.tags) == (
        6, [6], "six", {"t": "v"},
    )  # fmt: skip


def test_event_order_follows_commits_and_leaders() -> None:
    from cronoq.stores._pg_events import commit_seq

    assert commit_seq(1, 1) < commit_seq(1, 2) < commit_seq(1, 2**40 - 1) < commit_seq(2, 1)
    assert commit_seq(2**23 - 1, 2**40 - 1) < 2**63  # still a bigint
    for epoch, number in ((1, 0), (1, 2**40), (0, 1), (2**23, 1)):
        with pytest.raises(ValueError):
            commit_seq(epoch, number)


async def test_a_damaged_log_row_does_not_keep_a_leader_from_starting(
    postgres_dsn: str, pg_schema: str, stores: list[PostgresStore], db: Any
) -> None:
    store = make(stores, postgres_dsn, pg_schema)
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [put(1), put(2)])
    await store.commit(epoch, [running(1, T0 + 1)])
    await store.commit(epoch, [running(2, T0 + 2)])
    s = f'"{pg_schema}"'
    first_seq = await db.fetchval(f"SELECT min(seq) FROM {s}.cronoq_task_events")
    await db.execute(f"UPDATE {s}.cronoq_task_events SET statuses = '[[1, \"running\"' WHERE seq = $1", first_seq)
    await db.execute(f"INSERT INTO {s}.cronoq_task_events VALUES ($1, '[[2], 7, [2, \"x\"]]')", first_seq + 10**6)
    rec = {t.record.id: t for t in (await make(stores, postgres_dsn, pg_schema).recover(T0 + 3)).tasks}
    assert rec[1].status is TaskStatus.READY  # its only status row was unreadable
    assert (rec[2].status, rec[2].started_at) == (TaskStatus.RUNNING, T0 + 2)  # the odd rows were skipped
