"""Handing a pool's rows between two shards' stores (``cronoq.stores.pool_moves``), on real SQLite
files and real Postgres schemas: the move happens once whatever fails half-way, a leader that lost
its lease moves nothing of the source, and a refused move changes nothing."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from cronoq.engine.actions import PutRecurring, PutTask, TaskRecord
from cronoq.engine.types import Dep, RecurringSpec, TaskSpec, TaskStatus
from cronoq.stores import Fenced, Unavailable
from cronoq.stores import _schema as schema_mod
from cronoq.stores.placements import load_placements, placement_watch, read_placements
from cronoq.stores.pool_moves import (
    MoveRefused,
    MoveRow,
    forwarded_to,
    read_moves,
    recover_pool,
    request_move,
    set_move_phase,
    transfer,
)
from cronoq.stores.postgres import apply_migrations as pg_migrations
from cronoq.stores.sqlite import apply_migrations as sqlite_migrations

from tests.stores.support import Database

T0 = 1_700_000_000_000_000_000
S1 = 1 << 56
SEED = {"default": ("s1", 1), "p1": ("s1", 1), "p2": ("s2", 1)}
MOVE = MoveRow("p1", "m1", "s2", 2, "requested", "", T0)


def pool_of_template(spec_text: object) -> str | None:
    data = json.loads(spec_text) if isinstance(spec_text, str | bytes) else {}
    return data.get("template", {}).get("pool")


def task(task_id: int, pool: str, key: str | None = None, deps: tuple[Dep, ...] = ()) -> PutTask:
    spec = TaskSpec(payload={"n": task_id}, pool=pool, key=key, deps=deps)
    return PutTask(TaskRecord(task_id, pool, spec, T0, TaskStatus.READY, 3))


@pytest.fixture(params=["sqlite", "postgres"])
async def shards(request: pytest.FixtureRequest, tmp_path: Path, postgres_dsn: str) -> AsyncIterator[list[Any]]:
    """Source and target databases (s1, s2), their stores open, the source led."""
    databases = [Database(request.param, tmp_path, postgres_dsn) for _ in range(2)]
    stores = [database.store(shard=name) for database, name in zip(databases, ("s1", "s2"), strict=True)]
    for store in stores:
        await store.open()
        await load_placements(store, SEED)
    opened = [*databases, *stores]
    yield opened
    for store in opened[2:]:
        await store.close()
    for database in databases:
        await database.drop()


def namespace(database: Database) -> str:
    return str(database.path) if database.kind == "sqlite" else database.schema


async def rows(store: Any) -> dict[int, str]:
    """Every task id the store recovers, with its pool."""
    return {item.record.id: item.record.pool for item in (await store.recover(T0)).tasks}


async def test_a_move_interrupted_half_way_is_carried_out_once_by_the_next_leader(shards: list[Any]) -> None:
    source_db, target_db, source, target = shards
    epoch = await source.acquire_leadership()
    await source.commit(epoch, [task(S1 + 1, "p1", key="a"), task(S1 + 2, "p1"), task(S1 + 3, "default")])
    await source.commit(epoch, [PutRecurring(RecurringSpec("yearly", "0 0 1 1 *", TaskSpec(pool="p1")), T0, None)])
    await request_move(source, epoch, MOVE)
    # The leader that requested it loses the lease before carrying it out: a new one takes over.
    await source.release_leadership()
    successor = source_db.store(shard="s1")
    shards.append(successor)  # closed by the fixture
    new_epoch = await successor.acquire_leadership()
    with pytest.raises(Fenced):
        await transfer(source, epoch, MOVE, "s1", namespace(target_db), pool_of_template)
    # Whatever the stale leader managed, the source still has every row and the move is pending.
    assert await rows(successor) == {S1 + 1: "p1", S1 + 2: "p1", S1 + 3: "default"}
    assert (await read_moves(successor))["p1"].phase == "requested"
    assert (await read_placements(successor))["p1"] == ("s1", 1)
    # Nothing reached the target: Postgres moves in one transaction, and SQLite marks the move
    # ``transferring`` (fenced) before it writes the target's file.
    assert await rows(target) == {}

    async with placement_watch(target) as watch:
        done = await transfer(successor, new_epoch, MOVE, "s1", namespace(target_db), pool_of_template)
        if watch.notified:  # Postgres: the target's leader hears of the handover at its commit
            await asyncio.wait_for(watch.changed.wait(), 30)
        assert (await watch.read())["p1"] == ("s2", 2)
    assert (done.tasks, done.schedules) == (2, 1)
    # Repeating it (a crash right after) finds nothing more to do and changes nothing.
    assert (await transfer(successor, new_epoch, MOVE, "s1", namespace(target_db), pool_of_template)).tasks == 0
    assert await rows(successor) == {S1 + 3: "default"}
    assert await rows(target) == {S1 + 1: "p1", S1 + 2: "p1"}
    assert [item.spec.name for item in (await target.recover(T0)).recurring] == ["yearly"]
    assert (await successor.recover(T0)).recurring == []
    assert await forwarded_to(successor, S1 + 1) == ("p1", "s2", 2)
    assert await forwarded_to(successor, S1 + 3) is None
    assert (await read_placements(successor))["p1"] == ("s2", 2)
    assert (await read_placements(target))["p1"] == ("s2", 2)
    assert (await read_moves(successor))["p1"].phase == "done"


@pytest.mark.parametrize("shards", ["postgres"], indirect=True)  # moves are live on Postgres only
async def test_a_live_handover_reads_back_only_the_pool_and_refuses_a_move_aborted_meanwhile(
    shards: list[Any],
) -> None:
    """What a target leader adds to its running engine is exactly the pool's rows (Postgres, where
    moves are live); a move aborted while its leader was about to hand it over stays put."""
    _, target_db, source, target = shards
    epoch = await source.acquire_leadership()
    await source.commit(epoch, [task(S1 + 1, "p1", key="a"), task(S1 + 2, "p1"), task(S1 + 3, "default")])
    await source.commit(epoch, [PutRecurring(RecurringSpec("yearly", "0 0 1 1 *", TaskSpec(pool="p1")), T0, None)])
    await request_move(source, epoch, MOVE)
    assert await set_move_phase(source, epoch, "p1", MOVE.move_id, "aborted", "by an admin", T0)
    with pytest.raises(MoveRefused, match="aborted"):
        await transfer(source, epoch, MOVE, "s1", namespace(target_db), pool_of_template)
    assert await rows(target) == {}
    mine = await recover_pool(source, "p1", T0, 10**15, pool_of_template)
    assert [item.record.id for item in mine.tasks] == [S1 + 1, S1 + 2]
    assert [schedule.spec.name for schedule in mine.recurring] == ["yearly"]

    again = MoveRow("p1", "m2", "s2", 2, "requested", "", T0)
    await request_move(source, epoch, again)
    await transfer(source, epoch, again, "s1", namespace(target_db), pool_of_template)
    target_epoch = await target.acquire_leadership()
    await target.commit(target_epoch, [task((2 << 56) + 1, "p2")])
    arrived = await recover_pool(target, "p1", T0, 10**15, pool_of_template)
    assert [item.record.id for item in arrived.tasks] == [S1 + 1, S1 + 2]
    assert [schedule.spec.name for schedule in arrived.recurring] == ["yearly"]
    assert (await recover_pool(source, "p1", T0, 10**15, pool_of_template)).tasks == []


async def test_a_move_splitting_live_dependencies_or_reusing_keys_is_refused_and_changes_nothing(
    shards: list[Any],
) -> None:
    source_db, target_db, source, target = shards
    epoch = await source.acquire_leadership()
    await source.commit(epoch, [task(S1 + 1, "default", key="shared"), task(S1 + 2, "p1", deps=(Dep(S1 + 1),))])
    with pytest.raises(MoveRefused, match="pool 'p1' has live dependency edges with pools 'default' of shard 's1'"):
        await transfer(source, epoch, MOVE, "s1", namespace(target_db), pool_of_template)
    assert await rows(source) == {S1 + 1: "default", S1 + 2: "p1"}
    assert await rows(target) == {}
    assert (await read_placements(target))["p1"] == ("s1", 1)

    # Without the edge, a key of the pool already used in the target is refused.
    await source.commit(epoch, [task(S1 + 3, "p1", key="k")])
    target_epoch = await target.acquire_leadership()
    await target.commit(target_epoch, [task((2 << 56) + 1, "p2", key="k")])
    edge_free = MoveRow("p1", "m2", "s2", 2, "requested", "", T0)
    await source_db.set_column(S1 + 2, "finished_at", T0)  # the dependent task finished: no live edge
    with pytest.raises(MoveRefused, match="keys of pool 'p1' are in use in shard 's2': 'k'"):
        await transfer(source, epoch, edge_free, "s1", namespace(target_db), pool_of_template)
    assert set(await rows(target)) == {(2 << 56) + 1}


async def migrated_to_v6(kind: str, tmp_path: Path, postgres_dsn: str, pool_tables: bool) -> Database:
    """A database as a version-6 build left it, with one task of pool p1 and, when ``pool_tables``,
    the move tables an earlier build of pool moves created beside the migrated ones."""
    database = Database(kind, tmp_path, postgres_dsn)
    early = (
        "CREATE TABLE {s}cronoq_topology (pool text PRIMARY KEY, shard text NOT NULL, version bigint NOT NULL)",
        "INSERT INTO {s}cronoq_topology VALUES ('p1', 's1', 1)",
    )
    if kind == "sqlite":
        conn = sqlite3.connect(database.path, isolation_level=None)
        try:
            assert sqlite_migrations(conn, target=6) == 6
            for statement in early if pool_tables else ():
                conn.execute(statement.format(s=""))
        finally:
            conn.close()
        return database
    conn = await asyncpg.connect(postgres_dsn)
    try:
        assert await pg_migrations(conn, database.schema, target=6) == 6
        for statement in early if pool_tables else ():
            await conn.execute(statement.format(s=f'"{database.schema}".'))
    finally:
        await conn.close()
    return database


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
@pytest.mark.parametrize("pool_tables", [False, True], ids=["v6", "v6-with-early-move-tables"])
async def test_a_version_6_store_gains_the_move_tables_by_migration_7(
    kind: str, pool_tables: bool, tmp_path: Path, postgres_dsn: str
) -> None:
    source_db = await migrated_to_v6(kind, tmp_path, postgres_dsn, pool_tables)
    target_db = Database(kind, tmp_path, postgres_dsn)
    source, target = source_db.store(shard="s1"), target_db.store(shard="s2")
    try:
        epoch = await source.acquire_leadership()  # opening migrates
        await target.open()
        assert await source_db.schema_versions() == list(range(1, schema_mod.LATEST + 1)) == [1, 2, 3, 4, 5, 6, 7]
        # An early build's placement is kept; the others are seeded beside it.
        assert await load_placements(source, SEED) == SEED
        await load_placements(target, SEED)
        await source.commit(epoch, [task(S1 + 1, "p1", key="a")])
        assert await read_moves(source) == {}
        await request_move(source, epoch, MOVE)
        assert (await transfer(source, epoch, MOVE, "s1", namespace(target_db), pool_of_template)).tasks == 1
        assert await rows(target) == {S1 + 1: "p1"}
        assert await forwarded_to(source, S1 + 1) == ("p1", "s2", 2)
    finally:
        for store in (source, target):
            await store.close()
        for database in (source_db, target_db):
            await database.drop()


async def test_a_move_to_a_shard_whose_store_was_never_opened_waits_for_it(shards: list[Any], tmp_path: Path) -> None:
    source_db, _, source, _ = shards
    epoch = await source.acquire_leadership()
    await source.commit(epoch, [task(S1 + 1, "p1")])
    unopened = Database(source_db.kind, tmp_path, source_db.dsn)
    try:
        with pytest.raises(Unavailable, match="store of shard 's2' is at schema version 0, a pool move needs 7"):
            await transfer(source, epoch, MOVE, "s1", namespace(unopened), pool_of_template)
        assert await rows(source) == {S1 + 1: "p1"}
    finally:
        await unopened.drop()
