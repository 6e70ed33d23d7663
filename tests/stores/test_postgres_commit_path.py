"""Postgres commit statements: their plans stay on the primary key, a repeated step upserts, and
a step encoded ahead (``prepare``) commits as it would have without."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from cronoq.engine.actions import Mutation, PutTask, SetStatus, TaskRecord
from cronoq.engine.types import TaskSpec, TaskStatus
from cronoq.stores import _pg_events as E
from cronoq.stores import _rows as R
from cronoq.stores import postgres as P
from cronoq.stores.postgres import PostgresStore

T0 = 1_700_000_000_000_000_000


def put(task_id: int, status: TaskStatus = TaskStatus.READY) -> PutTask:
    return PutTask(TaskRecord(task_id, "default", TaskSpec(payload={"i": task_id}), T0, status, 3))


@pytest.fixture
async def store(postgres_dsn: str, pg_schema: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore(postgres_dsn, schema=pg_schema, lock_poll=0.05, max_connections=1)
    yield s
    await s.close()


async def generic_plan(store: PostgresStore, epoch: int, step: list[Mutation]) -> str:
    """The plan Postgres caches for the step's statement once it stops planning per call."""
    sql, args, _ = store._sql.build(epoch, store.holder, P._encode(step, store.codec), E.commit_seq(epoch, 1))
    async with store._pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        return "\n".join(row[0] for row in await conn.fetch("EXPLAIN " + sql, *args))


async def test_commits_and_compaction_never_scan_the_task_table(store: PostgresStore) -> None:
    # A plan made while the table is small is kept as the table grows: it must not scan the table
    # (which a small table invites), or every later commit reads the whole table.
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [put(i) for i in range(1, 4)])
    steps: list[list[Mutation]] = [
        [SetStatus(i, TaskStatus.RUNNING, 1, T0) for i in range(1, 4)],
        [SetStatus(1, TaskStatus.SUCCEEDED, 1, T0, output=1, has_output=True), put(10)],
    ]
    for step in steps:
        plan = await generic_plan(store, epoch, step)
        assert "Seq Scan on cronoq_tasks" not in plan, plan
        assert "Index Scan using cronoq_tasks_pkey" not in plan, plan  # statuses are only appended
        await store.commit(epoch, step)
    # Folding the log into the task rows finds each row through the primary key.
    async with store._pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off")
        await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        compact = E.compact_sql(store._s)
        plan = "\n".join(row[0] for row in await conn.fetch("EXPLAIN " + compact, epoch, 1 << 62))
    assert "Seq Scan on cronoq_tasks" not in plan and "Index Cond: (id = l.id)" in plan, plan
    # No join that rescans one side per row of the other (which is what made an earlier version
    # of the statement quadratic in the number of statuses).
    assert "Join Filter" not in plan and "Materialize" not in plan, plan


async def test_recovery_may_still_scan_the_table(store: PostgresStore) -> None:
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [put(i) for i in range(1, 50)])
    rec = await store.recover(T0)
    assert [t.record.id for t in rec.tasks] == list(range(1, 50))
    async with store._pool.acquire() as conn:  # SET LOCAL ended with recovery's transaction
        assert await conn.fetchval("SHOW enable_seqscan") == "off"
        assert await conn.fetchval("SHOW jit") == "off"  # no LLVM compile of a costly-looking plan


async def test_a_step_committed_again_is_upserted(store: PostgresStore) -> None:
    epoch = await store.acquire_leadership()
    first: list[Mutation] = [put(1), put(2), SetStatus(2, TaskStatus.RUNNING, 1, T0 + 1)]
    await store.commit(epoch, first)
    seen: list[str] = []
    async with store._pool.acquire() as conn:  # the pool's only connection
        conn.add_query_logger(lambda record: seen.append(record.query))

    # The same tasks again, changed: the plain INSERT meets them, and the upsert replaces them.
    again: list[Any] = [put(1, TaskStatus.BLOCKED), put(2), put(3)]
    await store.commit(epoch, again)
    assert len(seen) == 2 and "ON CONFLICT (id) DO UPDATE" in seen[1] and "ON CONFLICT (id)" not in seen[0]
    rec = await store.recover(T0)
    assert [(t.record.id, t.status, t.attempt) for t in rec.tasks] == [
        (1, TaskStatus.BLOCKED, 0),
        (2, TaskStatus.READY, 0),
        (3, TaskStatus.READY, 0),
    ]

    seen.clear()
    await store.commit(epoch, [put(4)])
    assert len(seen) == 1  # new tasks: one statement


async def test_pruning_finds_finished_tasks_through_their_index(store: PostgresStore) -> None:
    # The finish-time index leaves live tasks out (schema version 3); pruning still uses it.
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [put(i) for i in range(1, 20)])
    async with store._pool.acquire() as conn:
        plan = "\n".join(
            row[0]
            for row in await conn.fetch(
                f"EXPLAIN DELETE FROM {store._s}.cronoq_tasks WHERE finished_at IS NOT NULL AND finished_at < $1", T0
            )
        )
    assert "cronoq_tasks_finished_idx" in plan, plan


async def test_a_step_prepared_ahead_commits_the_same_rows(store: PostgresStore) -> None:
    epoch = await store.acquire_leadership()
    first: list[Mutation] = [put(1), put(2), SetStatus(2, TaskStatus.RUNNING, 1, T0 + 1)]
    second: list[Mutation] = [SetStatus(1, TaskStatus.RUNNING, 1, T0 + 2), put(3)]
    third: list[Mutation] = [SetStatus(1, TaskStatus.SUCCEEDED, 1, T0 + 3, output="out", has_output=True)]
    # The driver prepares a step while the one before is in flight: the prepared ones are taken
    # by their own commit (the same list object), in order, and a step nobody prepared still goes.
    store.prepare(first)
    store.prepare(second)
    await store.commit(epoch, first)
    await store.commit(epoch, second)
    await store.commit(epoch, third)
    assert not store._prepared
    rec = await store.recover(T0)
    assert [(t.record.id, t.status, t.attempt) for t in rec.tasks] == [
        (1, TaskStatus.SUCCEEDED, 1),
        (2, TaskStatus.RUNNING, 1),
        (3, TaskStatus.READY, 0),
    ]
    assert await store.load_output(1) == (True, "out")


async def test_a_step_that_cannot_be_stored_is_refused_by_its_commit_even_when_prepared(
    store: PostgresStore,
) -> None:
    epoch = await store.acquire_leadership()
    nul_key = TaskRecord(2, "default", TaskSpec(payload=1, key="a\0b"), T0, TaskStatus.READY, 3)
    bad: list[Mutation] = [put(1), PutTask(nul_key)]
    store.prepare(bad)  # raises nothing: the commit is where the refusal belongs
    with pytest.raises(ValueError, match="NUL"):
        await store.commit(epoch, bad)
    assert (await store.recover(T0)).tasks == []


async def test_task_rows_travel_in_the_order_of_the_tables_own_row_type(store: PostgresStore) -> None:
    # Task rows are sent as an array of cronoq_tasks rows, field by field in TASK_COLUMNS order.
    await store.open()
    async with store._pool.acquire() as conn:
        columns = await conn.fetch(
            "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0"
            " AND NOT attisdropped ORDER BY attnum",
            f"{store._s}.cronoq_tasks",
        )
    assert tuple(c[0] for c in columns) == R.TASK_COLUMNS
