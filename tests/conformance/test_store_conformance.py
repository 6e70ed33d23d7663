"""One behaviour for every store: memory, SQLite (a real file) and Postgres (a real server).

Each test runs once per store. A ``Backend`` opens store instances over one underlying database
(several instances stand for several processes or a restart) and can edit rows behind the
store's back, the way an operator with a SQL shell could.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from cronoq.engine.actions import (
    DeleteRecurring,
    Mutation,
    PutRecurring,
    PutTask,
    RecoveredTask,
    SetStatus,
    TaskRecord,
)
from cronoq.engine.types import (
    NS_PER_S,
    Dep,
    EdgeCond,
    FixedStart,
    MissPolicy,
    OverlapPolicy,
    Priority,
    RecurringSpec,
    RetryPolicy,
    TaskSpec,
    TaskStatus,
)
from cronoq.stores import (
    Fenced,
    JsonCodec,
    MemoryState,
    MemoryStore,
    ShardMismatch,
    Store,
    StoreError,
)
from cronoq.stores import _rows as R

S = NS_PER_S
T0 = 1_700_000_000 * S  # a fixed "now" in Unix nanoseconds
HOUR = 3600 * S


class Backend:
    """Opens stores over one database and pokes at its rows directly."""

    name = ""

    def __init__(self) -> None:
        self.stores: list[Any] = []

    def make(self, **kw: Any) -> Any:
        raise NotImplementedError

    def open(self, **kw: Any) -> Any:
        store = self.make(**kw)
        self.stores.append(store)
        return store

    async def set_column(self, task_id: int, column: str, value: Any) -> None:
        raise NotImplementedError

    async def get_column(self, task_id: int, column: str) -> Any:
        raise NotImplementedError

    async def set_recurring_spec(self, name: str, value: str) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        for store in self.stores:
            await store.close()


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.state = MemoryState()

    def make(self, **kw: Any) -> Any:
        return MemoryStore(state=self.state, **kw)

    async def set_column(self, task_id: int, column: str, value: Any) -> None:
        self.state.tasks[R.to_db_id(task_id)][R.TASK_COLUMNS.index(column)] = value

    async def get_column(self, task_id: int, column: str) -> Any:
        return self.state.tasks[R.to_db_id(task_id)][R.TASK_COLUMNS.index(column)]

    async def set_recurring_spec(self, name: str, value: str) -> None:
        row = list(self.state.recurring[name])
        row[R.RECURRING_COLUMNS.index("spec")] = value
        self.state.recurring[name] = tuple(row)


class SqliteBackend(Backend):
    name = "sqlite"

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def make(self, **kw: Any) -> Any:
        from cronoq.stores.sqlite import SqliteStore

        kw.setdefault("lock_poll", 0.05)
        return SqliteStore(self.path, **kw)

    def _sql(self, sql: str, args: tuple[Any, ...]) -> Any:
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            return conn.execute(sql, args).fetchone()
        finally:
            conn.close()

    async def set_column(self, task_id: int, column: str, value: Any) -> None:
        self._sql(f"UPDATE cronoq_tasks SET {column} = ? WHERE id = ?", (value, R.to_db_id(task_id)))

    async def get_column(self, task_id: int, column: str) -> Any:
        return self._sql(f"SELECT {column} FROM cronoq_tasks WHERE id = ?", (R.to_db_id(task_id),))[0]

    async def set_recurring_spec(self, name: str, value: str) -> None:
        self._sql("UPDATE cronoq_recurring SET spec = ? WHERE name = ?", (value, name))


class PostgresBackend(Backend):
    name = "postgres"

    def __init__(self, dsn: str) -> None:
        super().__init__()
        self.dsn = dsn
        self.schema = f"cronoq_c_{uuid.uuid4().hex[:16]}"

    def make(self, **kw: Any) -> Any:
        from cronoq.stores.postgres import PostgresStore

        kw.setdefault("lock_poll", 0.05)
        return PostgresStore(self.dsn, schema=self.schema, **kw)

    async def _sql(self, sql: str, *args: Any) -> Any:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            return await conn.fetchval(sql, *args)
        finally:
            await conn.close()

    async def set_column(self, task_id: int, column: str, value: Any) -> None:
        await self._sql(
            f'UPDATE "{self.schema}".cronoq_tasks SET {column} = $1 WHERE id = $2', value, R.to_db_id(task_id)
        )

    async def get_column(self, task_id: int, column: str) -> Any:
        return await self._sql(f'SELECT {column} FROM "{self.schema}".cronoq_tasks WHERE id = $1', R.to_db_id(task_id))

    async def set_recurring_spec(self, name: str, value: str) -> None:
        await self._sql(f'UPDATE "{self.schema}".cronoq_recurring SET spec = $1 WHERE name = $2', value, name)

    async def aclose(self) -> None:
        await super().aclose()
        await self._sql(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    b: Backend
    if request.param == "memory":
        b = MemoryBackend()
    elif request.param == "sqlite":
        b = SqliteBackend(tmp_path / "cronoq.db")
    else:
        b = PostgresBackend(request.getfixturevalue("postgres_dsn"))
    try:
        yield b
    finally:
        await b.aclose()


async def leader(backend: Backend, **kw: Any) -> tuple[Any, int]:
    store = backend.open(**kw)
    epoch = await asyncio.wait_for(store.acquire_leadership(), 10)
    return store, epoch


# ---------------------------------------------------------------------------------------------
# Builders


def record(
    task_id: int,
    spec: TaskSpec | None = None,
    *,
    pool: str = "default",
    submitted_at: int = T0,
    status: TaskStatus = TaskStatus.READY,
    max_attempts: int = 3,
) -> TaskRecord:
    return TaskRecord(task_id, pool, spec or TaskSpec(pool=pool), submitted_at, status, max_attempts)


def put(task_id: int, spec: TaskSpec | None = None, **kw: Any) -> PutTask:
    return PutTask(record(task_id, spec, **kw))


def finish(task_id: int, at: int, status: TaskStatus = TaskStatus.SUCCEEDED, **kw: Any) -> SetStatus:
    return SetStatus(task_id, status, kw.pop("attempt", 1), at, **kw)


def rich_spec() -> TaskSpec:
    return TaskSpec(
        payload={"doc": 42, "text": "grüße", "nested": [1, 2.5, None, True]},
        pool="llm",
        kind="summarise",
        priority=Priority.HIGH,
        key="summary:42",
        deadline=T0 + 90 * S,
        fixed_start=FixedStart(T0 + 60 * S, tolerance=5 * S, on_miss=MissPolicy.SKIP),
        duration_hint=12 * S,
        timeout=30 * S,
        retry=RetryPolicy(max_attempts=5, initial_backoff=2 * S, multiplier=1.5, max_backoff=40 * S, jitter=False),
        deps=(Dep(1, EdgeCond.ON_SUCCESS), Dep("extract", EdgeCond.ON_FAILURE), Dep(2, EdgeCond.ON_COMPLETE)),
        resources={"gpu": 2, "openai": 1},
        tags={"traceparent": "00-abc-def-01", "team": "search"},
        labels={"region": "eu", "arch": "arm64"},
        tenant="acme",
    )


def recurring_spec(name: str, **kw: Any) -> RecurringSpec:
    template = TaskSpec(
        payload=kw.pop("payload", {"report": name}),
        pool="reports",
        kind="report",
        priority=Priority.LOW,
        key=None,
        timeout=60 * S,
        retry=RetryPolicy.none(),
        tags={"cron": "yes"},
        labels={"zone": "a"},
        tenant="ops",
        resources={"db": 1},
        deps=(Dep("nightly-prep", EdgeCond.ON_COMPLETE),),
    )
    return RecurringSpec(
        name=name,
        cron=kw.pop("cron", "*/5 * * * *"),
        template=template,
        tz=kw.pop("tz", "Europe/Berlin"),
        overlap=kw.pop("overlap", OverlapPolicy.QUEUE),
        tolerance=kw.pop("tolerance", 3 * S),
        on_miss=kw.pop("on_miss", MissPolicy.FAIL),
        deadline_after=kw.pop("deadline_after", 120 * S),
    )


def by_id(tasks: list[RecoveredTask]) -> dict[int, RecoveredTask]:
    return {t.record.id: t for t in tasks}


# ---------------------------------------------------------------------------------------------
# Round trips


async def test_every_field_round_trips(backend: Backend) -> None:
    store, epoch = await leader(backend)
    big_id = (200 << 56) | (3 << 40) | 7  # shard 200: above 2**63
    spec = rich_spec()
    plain = TaskSpec(payload=b"\x00\xffraw bytes", pool=None, kind="default")
    extract = TaskSpec(payload=None, pool="etl", key="extract", tenant=None)
    records = [
        record(1, extract, pool="etl", submitted_at=T0 - 5 * S, status=TaskStatus.READY, max_attempts=3),
        record(2, plain, pool="default", submitted_at=T0 - 4 * S, status=TaskStatus.SCHEDULED, max_attempts=1),
        record(3, spec, pool="llm", submitted_at=T0 - 3 * S, status=TaskStatus.BLOCKED, max_attempts=5),
        record(big_id, TaskSpec(payload="x", pool="default"), submitted_at=T0),
    ]
    muts: list[Mutation] = [PutTask(r) for r in records]
    muts.append(PutRecurring(recurring_spec("hourly"), next_at=T0 + HOUR, last_task_id=3))
    muts.append(PutRecurring(recurring_spec("nullable", tz=None, deadline_after=None), None, None))
    await store.commit(epoch, muts)

    fresh = backend.open()
    rec = await fresh.recover(T0)
    assert [t.record for t in rec.tasks] == records  # every field, in id order
    for t in rec.tasks:
        assert t.status is t.record.status
        assert (t.attempt, t.message, t.started_at, t.finished_at, t.retry_at, t.has_output) == (
            0,
            None,
            None,
            None,
            None,
            False,
        )
    assert rec.tasks[1].record.spec.payload == b"\x00\xffraw bytes"
    assert isinstance(rec.tasks[1].record.spec.payload, bytes)
    assert rec.tasks[1].record.spec.pool is None
    assert [(r.spec, r.next_at, r.last_task_id) for r in rec.recurring] == [
        (recurring_spec("hourly"), T0 + HOUR, 3),
        (recurring_spec("nullable", tz=None, deadline_after=None), None, None),
    ]
    assert rec.id_high_water == big_id


async def test_status_history_latest_wins(backend: Backend) -> None:
    store, epoch = await leader(backend)
    await store.commit(epoch, [put(1), put(2)])
    await store.commit(
        epoch,
        [
            SetStatus(1, TaskStatus.RUNNING, 1, T0 + 1 * S),
            SetStatus(2, TaskStatus.RUNNING, 1, T0 + 1 * S),
            SetStatus(1, TaskStatus.RETRYING, 1, T0 + 2 * S, message="boom", retry_at=T0 + 4 * S),
        ],
    )
    rec = by_id((await backend.open().recover(T0 + 3 * S)).tasks)
    assert (rec[1].status, rec[1].attempt, rec[1].message) == (TaskStatus.RETRYING, 1, "boom")
    assert (rec[1].started_at, rec[1].retry_at, rec[1].finished_at) == (T0 + 1 * S, T0 + 4 * S, None)
    assert (rec[2].status, rec[2].started_at) == (TaskStatus.RUNNING, T0 + 1 * S)

    await store.commit(
        epoch,
        [
            SetStatus(1, TaskStatus.RUNNING, 2, T0 + 5 * S),
            SetStatus(1, TaskStatus.SUCCEEDED, 2, T0 + 6 * S, output={"answer": 42}, has_output=True),
            SetStatus(2, TaskStatus.DEAD_LETTERED, 1, T0 + 7 * S, message="gave up"),
        ],
    )
    rec = by_id((await backend.open().recover(T0 + 8 * S)).tasks)
    one = rec[1]
    assert (one.status, one.attempt, one.message, one.retry_at) == (TaskStatus.SUCCEEDED, 2, None, None)
    assert (one.started_at, one.finished_at, one.has_output) == (T0 + 5 * S, T0 + 6 * S, True)
    assert (rec[2].status, rec[2].message, rec[2].finished_at) == (TaskStatus.DEAD_LETTERED, "gave up", T0 + 7 * S)
    assert rec[2].started_at == T0 + 1 * S  # kept from the earlier Running
    assert rec[1].record.status is TaskStatus.READY  # the record keeps the submitted status
    assert await store.load_output(1) == (True, {"answer": 42})


async def test_whole_life_in_one_step(backend: Backend) -> None:
    store, epoch = await leader(backend)
    await store.commit(
        epoch,
        [
            SetStatus(9, TaskStatus.RUNNING, 1, T0),  # unknown task: nothing to update
            put(1),
            SetStatus(1, TaskStatus.RUNNING, 1, T0 + 1),
            SetStatus(1, TaskStatus.RETRYING, 1, T0 + 2, message="flaky", retry_at=T0 + 10),
            SetStatus(1, TaskStatus.RUNNING, 2, T0 + 11),
            SetStatus(1, TaskStatus.SUCCEEDED, 2, T0 + 12, output=b"\x01\x02", has_output=True),
        ],
    )
    rec = await backend.open().recover(T0 + 20)
    assert [t.record.id for t in rec.tasks] == [1]
    t = rec.tasks[0]
    assert (t.status, t.attempt, t.started_at, t.finished_at, t.message) == (
        TaskStatus.SUCCEEDED,
        2,
        T0 + 11,
        T0 + 12,
        None,
    )
    assert await backend.open().load_output(1) == (True, b"\x01\x02")


async def test_commit_is_idempotent(backend: Backend) -> None:
    store, epoch = await leader(backend)
    step: list[Mutation] = [
        put(1, TaskSpec(key="k")),
        SetStatus(1, TaskStatus.RUNNING, 1, T0 + 1),
        PutRecurring(recurring_spec("r"), T0, None),
    ]
    await store.commit(epoch, step)
    first = await backend.open().recover(T0)
    await store.commit(epoch, step)
    again = await backend.open().recover(T0)
    assert first == again
    assert len(again.tasks) == 1 and len(again.recurring) == 1


async def test_steps_prepared_ahead_commit_as_they_would_without(backend: Backend) -> None:
    # The driver hands a step to the store's optional ``prepare`` while the commit before it is
    # in flight; a store without the hook just commits (and must then give the same result).
    store, epoch = await leader(backend)
    prepare = getattr(store, "prepare", lambda mutations: None)
    steps: list[list[Mutation]] = [
        [put(1, rich_spec()), put(2), SetStatus(2, TaskStatus.RUNNING, 1, T0 + 1)],
        [SetStatus(1, TaskStatus.RUNNING, 1, T0 + 2), put(3, TaskSpec(key="three"))],
        [finish(1, T0 + 3, output={"answer": 42}, has_output=True), finish(2, T0 + 3, TaskStatus.FAILED, message="x")],
    ]
    prepare(steps[0])
    for done, step in enumerate(steps):
        if done + 1 < len(steps):
            prepare(steps[done + 1])  # prepared before the one ahead of it commits
        await store.commit(epoch, step)
    rec = by_id((await backend.open().recover(T0 + 4)).tasks)
    assert sorted(rec) == [1, 2, 3]
    assert (rec[1].status, rec[1].started_at, rec[1].finished_at) == (TaskStatus.SUCCEEDED, T0 + 2, T0 + 3)
    assert rec[1].record.spec == rich_spec()
    assert (rec[2].status, rec[2].message, rec[2].started_at) == (TaskStatus.FAILED, "x", T0 + 1)
    assert (rec[3].status, rec[3].record.spec.key) == (TaskStatus.READY, "three")
    assert await store.load_output(1) == (True, {"answer": 42})

    # A step that cannot be stored is refused by its commit, prepared or not, and writes nothing.
    bad: list[Mutation] = [put(4), put(5, TaskSpec(key="a\0b"))]
    prepare(bad)
    with pytest.raises(ValueError, match="NUL"):
        await store.commit(epoch, bad)
    assert sorted(by_id((await backend.open().recover(T0 + 4)).tasks)) == [1, 2, 3]


async def test_terminal_tasks_outside_retention(backend: Backend) -> None:
    store, epoch = await leader(backend)
    old = T0 - 3 * HOUR
    await store.commit(
        epoch,
        [
            put(1, TaskSpec(key="parent-by-key"), submitted_at=old),
            put(2, submitted_at=old),
            put(3, submitted_at=old),
            put(4, TaskSpec(key="recent"), submitted_at=old),
            put(5, TaskSpec(key="parent-by-key"), submitted_at=old),  # an older holder of the key
            put(6, TaskSpec(deps=(Dep(2),)), status=TaskStatus.BLOCKED),
            put(7, TaskSpec(deps=(Dep("parent-by-key", EdgeCond.ON_COMPLETE),)), status=TaskStatus.BLOCKED),
            put(8, TaskSpec(deps=(Dep(3),))),  # a finished child does not pull its parent
            put(9, TaskSpec(deps=(Dep(999), Dep("never-seen"))), status=TaskStatus.BLOCKED),
        ],
    )
    await store.commit(
        epoch,
        [
            finish(1, old + 1),
            finish(2, old + 2, TaskStatus.FAILED, message="bad"),
            finish(3, old + 3),
            finish(4, T0 - 10 * S),
            finish(5, old + 5, TaskStatus.CANCELLED),
            finish(8, T0 - 2 * HOUR),
        ],
    )
    rec = await backend.open().recover(T0, HOUR)
    got = by_id(rec.tasks)
    # 4: within retention. 2: a live task depends on it by id. 5: the newest task with the key.
    # 6, 7, 9: live. Not 1 (older holder of the key), 3 (only a finished task depends on it), 8.
    assert sorted(got) == [2, 4, 5, 6, 7, 9]
    assert [t.record.id for t in rec.tasks] == [2, 4, 5, 6, 7, 9]
    assert (got[2].status, got[2].message) == (TaskStatus.FAILED, "bad")
    assert got[5].status is TaskStatus.CANCELLED
    # A longer retention brings everything back.
    assert len((await backend.open().recover(T0, 4 * HOUR)).tasks) == 9


async def test_prune_keeps_live_recent_and_high_water(backend: Backend) -> None:
    store, epoch = await leader(backend)
    await store.commit(epoch, [put(i) for i in range(1, 7)])
    await store.commit(
        epoch,
        [
            finish(1, T0 - 10 * HOUR),
            finish(2, T0 - 9 * HOUR, TaskStatus.SHED),
            finish(3, T0 - 1 * S, output="kept", has_output=True),
            SetStatus(4, TaskStatus.RUNNING, 1, T0 - 20 * HOUR),
            SetStatus(5, TaskStatus.RETRYING, 1, T0 - 20 * HOUR, retry_at=T0),
        ],
    )
    assert await store.prune(T0 - HOUR) == 2
    assert await store.prune(T0 - HOUR) == 0
    rec = await backend.open().recover(T0, 100 * HOUR)
    assert [t.record.id for t in rec.tasks] == [3, 4, 5, 6]
    assert await store.load_output(3) == (True, "kept")
    assert await store.load_output(1) == (False, None)

    await store.commit(epoch, [finish(i, T0) for i in (3, 4, 5, 6)])
    assert await store.prune(T0 + 1) == 4
    rec = await backend.open().recover(T0 + 1, 100 * HOUR)
    assert rec.tasks == []
    assert rec.id_high_water == 6


async def test_load_output(backend: Backend) -> None:
    store, epoch = await leader(backend)
    await store.commit(epoch, [put(1), put(2), put(3), put(4)])
    await store.commit(
        epoch,
        [
            finish(1, T0, output={"a": [1, 2]}, has_output=True),
            finish(2, T0, output=None, has_output=True),
            finish(3, T0, TaskStatus.FAILED, message="no output"),
        ],
    )
    other = backend.open()
    assert await other.load_output(1) == (True, {"a": [1, 2]})
    assert await other.load_output(2) == (True, None)
    assert await other.load_output(3) == (False, None)
    assert await other.load_output(4) == (False, None)
    assert await other.load_output(12345) == (False, None)


async def test_recurring_upsert_and_delete(backend: Backend) -> None:
    store, epoch = await leader(backend)
    await store.commit(
        epoch,
        [
            PutRecurring(recurring_spec("a"), T0, None),
            PutRecurring(recurring_spec("b"), T0, None),
            PutRecurring(recurring_spec("d"), T0, None),
        ],
    )
    await store.commit(
        epoch,
        [
            PutRecurring(recurring_spec("a", cron="0 * * * *"), T0 + HOUR, 77),
            DeleteRecurring("b"),
            PutRecurring(recurring_spec("c"), T0, None),
            DeleteRecurring("c"),  # put then delete in one step: gone
            DeleteRecurring("d"),
            PutRecurring(recurring_spec("d", overlap=OverlapPolicy.ALLOW), T0 + 5, 3),  # delete then put
            DeleteRecurring("missing"),
        ],
    )
    rec = await backend.open().recover(T0)
    got = {r.spec.name: r for r in rec.recurring}
    assert sorted(got) == ["a", "d"]
    assert (got["a"].spec.cron, got["a"].next_at, got["a"].last_task_id) == ("0 * * * *", T0 + HOUR, 77)
    assert got["d"].spec == recurring_spec("d", overlap=OverlapPolicy.ALLOW)
    assert (got["d"].next_at, got["d"].last_task_id) == (T0 + 5, 3)
    assert not got["a"].paused and not got["d"].paused


async def test_a_paused_schedule_stays_paused_until_resumed(backend: Backend) -> None:
    store, epoch = await leader(backend)
    await store.commit(epoch, [PutRecurring(recurring_spec("a"), T0, None), PutRecurring(recurring_spec("b"), T0, 4)])
    await store.commit(epoch, [PutRecurring(recurring_spec("a"), None, None, paused=True)])
    rec = await backend.open().recover(T0)
    assert [(r.spec.name, r.next_at, r.last_task_id, r.paused) for r in rec.recurring] == [
        ("a", None, None, True),
        ("b", T0, 4, False),
    ]
    await store.commit(epoch, [PutRecurring(recurring_spec("a"), T0 + HOUR, None, paused=False)])
    rec = await backend.open().recover(T0)
    assert [(r.spec.name, r.next_at, r.paused) for r in rec.recurring] == [("a", T0 + HOUR, False), ("b", T0, False)]


# ---------------------------------------------------------------------------------------------
# Leadership and fencing


async def test_epochs_increase_and_persist(backend: Backend) -> None:
    store = backend.open()
    assert isinstance(store, Store)
    first = await asyncio.wait_for(store.acquire_leadership(), 10)
    assert store.epoch == first
    await store.release_leadership()
    assert store.epoch is None
    second = await asyncio.wait_for(store.acquire_leadership(), 10)
    assert second > first
    await store.close()
    third = await asyncio.wait_for(backend.open().acquire_leadership(), 10)
    assert third > second


async def test_stale_epoch_is_fenced_and_writes_nothing(backend: Backend) -> None:
    old, old_epoch = await leader(backend)
    await old.commit(old_epoch, [put(1)])
    await old.release_leadership()
    new, new_epoch = await leader(backend)
    assert new_epoch > old_epoch

    with pytest.raises(Fenced):
        await old.commit(old_epoch, [put(2), SetStatus(1, TaskStatus.RUNNING, 1, T0)])
    with pytest.raises(Fenced):
        await new.commit(old_epoch, [put(3)])
    rec = await new.recover(T0)
    assert [(t.record.id, t.status) for t in rec.tasks] == [(1, TaskStatus.READY)]

    await new.commit(new_epoch, [put(4)])
    assert [t.record.id for t in (await new.recover(T0)).tasks] == [1, 4]
    assert not new.lost.is_set()


async def test_commit_without_leadership_is_fenced(backend: Backend) -> None:
    store = backend.open()
    with pytest.raises(Fenced):
        await store.commit(1, [put(1)])
    assert (await store.recover(T0)).tasks == []


# ---------------------------------------------------------------------------------------------
# Text rules and codecs


@pytest.mark.parametrize(
    "bad",
    [
        lambda: put(2, TaskSpec(key="a\0b")),
        lambda: put(2, TaskSpec(kind="k\0")),
        lambda: put(2, TaskSpec(tags={"t\0": "v"})),
        lambda: put(2, TaskSpec(tags={"t": "v\0"})),
        lambda: put(2, TaskSpec(labels={"l": "\0"})),
        lambda: put(2, TaskSpec(tenant="\0")),
        lambda: put(2, TaskSpec(resources={"gpu\0": 1})),
        lambda: put(2, TaskSpec(deps=(Dep("p\0"),))),
        lambda: put(2, pool="po\0ol"),
        lambda: PutRecurring(recurring_spec("r\0"), T0, None),
        lambda: DeleteRecurring("r\0"),
    ],
    ids=[
        "key",
        "kind",
        "tag-name",
        "tag-value",
        "label",
        "tenant",
        "resource",
        "dep-key",
        "pool",
        "recurring",
        "delete-recurring",
    ],
)
async def test_nul_is_refused_before_writing(backend: Backend, bad: Callable[[], Mutation]) -> None:
    store, epoch = await leader(backend)
    with pytest.raises(ValueError, match="NUL"):
        await store.commit(epoch, [put(1), bad()])
    rec = await store.recover(T0)
    assert rec.tasks == [] and rec.recurring == []


async def test_nul_in_messages_is_replaced(backend: Backend) -> None:
    store, epoch = await leader(backend)
    await store.commit(epoch, [put(1), put(2)])
    await store.commit(
        epoch,
        [
            finish(1, T0, TaskStatus.FAILED, message="bad\0byte"),
            finish(2, T0, TaskStatus.FAILED, message="lone \ud800 surrogate"),
        ],
    )
    got = by_id((await backend.open().recover(T0)).tasks)
    assert got[1].message == "bad\ufffdbyte"
    assert got[2].message == "lone \ufffd surrogate"


async def test_unencodable_payload_writes_nothing(backend: Backend) -> None:
    store, epoch = await leader(backend)
    with pytest.raises(TypeError):
        await store.commit(epoch, [put(1), put(2, TaskSpec(payload=object()))])
    assert (await store.recover(T0)).tasks == []


class TupleCodec:
    """A codec the default could not imitate: tuples survive the round trip."""

    def encode(self, obj: Any, /) -> bytes:
        def wrap(o: Any) -> Any:
            if isinstance(o, tuple):
                return {"__tuple__": [wrap(x) for x in o]}
            return o

        return json.dumps(wrap(obj)).encode()

    def decode(self, data: bytes, /) -> Any:
        return json.loads(data, object_hook=lambda d: tuple(d["__tuple__"]) if "__tuple__" in d else d)


async def test_payloads_and_outputs_go_through_the_codec(backend: Backend) -> None:
    store, epoch = await leader(backend, codec=TupleCodec())
    await store.commit(epoch, [put(1, TaskSpec(payload=(1, (2, 3))))])
    await store.commit(epoch, [finish(1, T0, output=("ok", 1), has_output=True)])
    rec = await backend.open(codec=TupleCodec()).recover(T0)
    assert rec.tasks[0].record.spec.payload == (1, (2, 3))
    assert await backend.open(codec=TupleCodec()).load_output(1) == (True, ("ok", 1))
    assert await backend.open(codec=JsonCodec()).load_output(1) == (True, {"__tuple__": ["ok", 1]})


# ---------------------------------------------------------------------------------------------
# Quarantine


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        ("spec", "{not json", "spec is not valid JSON"),
        ("payload", b"\xff\xfe not json", "payload cannot be decoded"),
        ("status", "exploded", "unknown status"),
    ],
)
async def test_corrupt_rows_are_quarantined(backend: Backend, column: str, value: Any, reason: str) -> None:
    store, epoch = await leader(backend)
    await store.commit(epoch, [put(1, TaskSpec(key="bad", kind="etl")), put(2), put(3, TaskSpec(deps=(Dep(1),)))])
    await backend.set_column(1, column, value)

    rec = await backend.open().recover(T0 + 5)
    got = by_id(rec.tasks)
    assert sorted(got) == [1, 2, 3]
    bad = got[1]
    assert bad.status is TaskStatus.DEAD_LETTERED and rec.quarantined == 1
    assert bad.message is not None and bad.message.startswith("quarantined: ") and reason in bad.message
    assert (bad.record.spec.key, bad.record.spec.kind, bad.record.pool) == ("bad", "etl", "default")
    assert bad.finished_at == T0 + 5
    assert got[2].status is TaskStatus.READY  # the others are untouched
    # The row itself is marked dead-lettered in the store.
    assert await backend.get_column(1, "status") == "dead_lettered"
    assert (await backend.get_column(1, "message")).startswith("quarantined: ")
    again = by_id((await backend.open().recover(T0 + 10)).tasks)
    assert again[1].status is TaskStatus.DEAD_LETTERED and again[1].finished_at == T0 + 5


async def test_corrupt_recurring_rows_are_skipped(backend: Backend) -> None:
    store, epoch = await leader(backend)
    await store.commit(
        epoch, [PutRecurring(recurring_spec("good"), T0, None), PutRecurring(recurring_spec("bad"), T0, None)]
    )
    await backend.set_recurring_spec("bad", '{"template": 5}')
    rec = await backend.open().recover(T0)
    assert [r.spec.name for r in rec.recurring] == ["good"] and rec.quarantined == 1
    # The engine may write the schedule again; that repairs the row.
    await store.commit(epoch, [PutRecurring(recurring_spec("bad"), T0 + 1, None)])
    assert [r.spec.name for r in (await backend.open().recover(T0)).recurring] == ["bad", "good"]


async def test_corrupt_output_raises_corrupt(backend: Backend) -> None:
    from cronoq.stores import Corrupt

    store, epoch = await leader(backend)
    await store.commit(epoch, [put(1), finish(1, T0, output=[1], has_output=True)])
    await backend.set_column(1, "output", b"\xff{")
    with pytest.raises(Corrupt):
        await store.load_output(1)


# ---------------------------------------------------------------------------------------------
# Shards


async def test_store_of_another_shard_is_refused(backend: Backend) -> None:
    store, epoch = await leader(backend, shard="alpha")
    await store.commit(epoch, [put(1)])
    await store.close()

    with pytest.raises(ShardMismatch, match="alpha") as info:
        await backend.open(shard="beta").recover(T0)
    assert isinstance(info.value, StoreError)
    with pytest.raises(ShardMismatch):
        await backend.open(shard=None).acquire_leadership()
    assert [t.record.id for t in (await backend.open(shard="alpha").recover(T0)).tasks] == [1]


async def test_empty_store_may_change_shard(backend: Backend) -> None:
    await backend.open(shard="alpha").open()
    store, epoch = await leader(backend, shard="beta")
    await store.commit(epoch, [put(1)])
    with pytest.raises(ShardMismatch):
        await backend.open(shard="alpha").open()


# ---------------------------------------------------------------------------------------------
# Large steps


async def test_large_step_in_one_commit(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    store, epoch = await leader(backend)
    n = 10_000
    spec = TaskSpec(payload={"n": 1}, kind="bulk", tags={"batch": "b1"}, deps=(Dep("root"),))
    step: list[Mutation] = [put(i, spec, submitted_at=T0 + i) for i in range(1, n + 1)]
    started = time.perf_counter()
    await store.commit(epoch, step)
    put_secs = time.perf_counter() - started

    statuses: list[Mutation] = [SetStatus(i, TaskStatus.RUNNING, 1, T0 + n + i) for i in range(1, n + 1)]
    started = time.perf_counter()
    await store.commit(epoch, statuses)
    status_secs = time.perf_counter() - started

    started = time.perf_counter()
    rec = await backend.open().recover(T0 + 2 * n)
    recover_secs = time.perf_counter() - started
    assert len(rec.tasks) == n
    assert [t.record.id for t in rec.tasks] == list(range(1, n + 1))
    assert all(t.status is TaskStatus.RUNNING and t.attempt == 1 for t in rec.tasks)
    assert rec.tasks[-1].started_at == T0 + 2 * n
    assert rec.id_high_water == n
    with capsys.disabled():
        print(
            f"\n[{backend.name}] 10k PutTask commit {put_secs * 1000:.0f} ms, "
            f"10k SetStatus commit {status_secs * 1000:.0f} ms, recover {recover_secs * 1000:.0f} ms"
        )
