"""Task history read back from every store (memory, a real SQLite file, a real Postgres schema):
finished tasks by filter and cursor, one task with its spec, its recorded transitions, and what
pruning leaves behind."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cronoq.engine.actions import PutTask, SetStatus, TaskRecord
from cronoq.engine.types import NS_PER_S, TaskSpec, TaskStatus
from cronoq.engine.views import TaskQuery
from cronoq.stores import MemoryStore
from cronoq.stores.history import HistoryRead, clamp_cursor, fan_out, shard_bounds
from cronoq.stores.postgres import PostgresStore
from cronoq.stores.sqlite import SqliteStore

T0 = 1_700_000_000 * NS_PER_S
POOLS = ("a", "b")
KINDS = ("mail", "resize", "bill")


def _spec(n: int) -> TaskSpec:
    return TaskSpec(payload={"n": n}, pool=POOLS[n % 2], kind=KINDS[n % 3], key=f"order-{n:03d}",
                    tenant="acme" if n % 4 == 0 else None, tags={"n": str(n)})  # fmt: skip


def _final(n: int) -> TaskStatus:
    return TaskStatus.FAILED if n % 5 == 0 else TaskStatus.SUCCEEDED


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        made: Any = MemoryStore()
    elif request.param == "sqlite":
        made = SqliteStore(tmp_path / "h.db")
    else:
        dsn = request.getfixturevalue("postgres_dsn")
        made = PostgresStore(dsn, schema=f"h_{uuid.uuid4().hex[:12]}", compact_after=1_000_000)
    try:
        yield made
    finally:
        if isinstance(made, PostgresStore):
            import asyncpg

            conn = await asyncpg.connect(made.dsn)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{made.schema}" CASCADE')
            finally:
                await conn.close()
        await made.close()


async def _fill(store: Any, count: int = 30) -> int:
    """Tasks 1..count, submitted a second apart; every task but the last two finished (after a
    failed first attempt for every third). Returns the epoch."""
    epoch = await store.acquire_leadership()
    await store.commit(epoch, [PutTask(TaskRecord(n, POOLS[n % 2], _spec(n), T0 + n * NS_PER_S, TaskStatus.READY, 3))
                               for n in range(1, count + 1)])  # fmt: skip
    running = [SetStatus(n, TaskStatus.RUNNING, 1, T0 + 100 * NS_PER_S) for n in range(1, count + 1)]
    await store.commit(epoch, running)
    retried = [n for n in range(1, count - 1) if n % 3 == 0]
    await store.commit(epoch, [SetStatus(n, TaskStatus.RETRYING, 1, T0 + 101 * NS_PER_S, f"boom {n}",
                                         T0 + 102 * NS_PER_S) for n in retried])  # fmt: skip
    await store.commit(epoch, [SetStatus(n, TaskStatus.RUNNING, 2, T0 + 102 * NS_PER_S) for n in retried])
    finished = []
    for n in range(1, count - 1):
        status = _final(n)
        attempt = 2 if n in retried else 1
        output = {"out": n} if status is TaskStatus.SUCCEEDED else None
        finished.append(SetStatus(n, status, attempt, T0 + (200 + n) * NS_PER_S, None if output else f"bad {n}",
                                  output=output, has_output=output is not None))  # fmt: skip
    await store.commit(epoch, finished)
    return epoch


async def _ids(
    store: HistoryRead, query: TaskQuery, after: int = 0, limit: int = 100, descending: bool = False
) -> list[int]:
    return [info.id for info in await store.history(query, after, limit, descending)]


async def test_lists_finished_tasks_by_every_filter(store: Any) -> None:
    await _fill(store)
    done = list(range(1, 29))
    assert await _ids(store, TaskQuery()) == done  # tasks 29 and 30 are live: the engine lists them
    assert await _ids(store, TaskQuery(pools=frozenset({"a"}))) == [n for n in done if n % 2 == 0]
    assert await _ids(store, TaskQuery(pools=frozenset({"a", "b"}), kinds=frozenset({"mail", "bill"}))) == [
        n for n in done if n % 3 != 1
    ]
    assert await _ids(store, TaskQuery(statuses=frozenset({TaskStatus.FAILED}))) == [n for n in done if n % 5 == 0]
    assert await _ids(store, TaskQuery(tenants=frozenset({"acme"}))) == [n for n in done if n % 4 == 0]
    assert await _ids(store, TaskQuery(key_prefix="order-01")) == list(range(10, 20))
    assert await _ids(store, TaskQuery(key_prefix="order-00", kinds=frozenset({"resize"}))) == [1, 4, 7]
    window = TaskQuery(created_from=T0 + 5 * NS_PER_S, created_to=T0 + 9 * NS_PER_S)
    assert await _ids(store, window) == [5, 6, 7, 8]
    assert await _ids(store, TaskQuery(kinds=frozenset({"nothing"}))) == []


async def test_pages_follow_the_cursor_both_ways(store: Any) -> None:
    await _fill(store)
    query = TaskQuery(pools=frozenset({"b"}))
    first = await _ids(store, query, limit=4)
    assert first == [1, 3, 5, 7]
    assert await _ids(store, query, after=first[-1], limit=4) == [9, 11, 13, 15]
    newest = await _ids(store, query, limit=3, descending=True)
    assert newest == [27, 25, 23]
    assert await _ids(store, query, after=newest[-1], limit=3, descending=True) == [21, 19, 17]


async def test_one_task_with_its_spec_and_transitions(store: Any) -> None:
    await _fill(store)
    task = await store.history_task(9)
    assert task is not None
    assert (task.record.spec.kind, task.record.spec.key, task.record.spec.payload) == ("mail", "order-009", {"n": 9})
    assert task.status is TaskStatus.SUCCEEDED and task.attempt == 2
    changes = await store.transitions(9)
    assert [(c.status, c.attempt, c.message) for c in changes] == [
        (TaskStatus.RUNNING, 1, None),
        (TaskStatus.RETRYING, 1, "boom 9"),
        (TaskStatus.RUNNING, 2, None),
        (TaskStatus.SUCCEEDED, 2, None),
    ]
    assert changes[1].retry_at == T0 + 102 * NS_PER_S
    assert changes[-1].at == T0 + 209 * NS_PER_S
    assert await store.history_task(999) is None
    assert await store.transitions(999) == []


async def test_pruning_takes_the_transitions_along(store: Any) -> None:
    await _fill(store)
    assert await store.prune(T0 + 210 * NS_PER_S) == 9  # tasks 1..9 finished before
    assert await store.history_task(9) is None
    assert await store.transitions(9) == []
    assert await _ids(store, TaskQuery(), limit=3) == [10, 11, 12]
    assert [c.status for c in await store.transitions(12)][-1] is TaskStatus.SUCCEEDED


def test_a_multi_valued_filter_is_asked_once_per_value() -> None:
    query = TaskQuery(pools=frozenset({"a", "b", "c"}), kinds=frozenset({"x", "y"}))
    assert [q.kinds for q in fan_out(query)] == [frozenset({"x"}), frozenset({"y"})]
    single = TaskQuery(pools=frozenset({"a"}), kinds=frozenset({"x", "y"}))
    assert fan_out(single) == [single]


def test_cursors_are_clamped_to_the_shard() -> None:
    low, high = shard_bounds(200)  # ids above 2**63: stored as negative numbers
    assert clamp_cursor(0, False, 200) == low - 1
    assert clamp_cursor(5, False, 200) == low - 1
    assert clamp_cursor(low + 7, False, 200) == low + 7
    assert clamp_cursor(high, False, 200) is None
    assert clamp_cursor(0, True, 200) == 0
    assert clamp_cursor(low, True, 200) is None
    assert clamp_cursor(high + 1, True, 200) == 0
    assert clamp_cursor(9, False, 0) == 9
