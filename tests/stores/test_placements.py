"""The durable pool placements of a shard, in a real SQLite file and a real Postgres schema:
seeded from the file once, kept over later seeds, moved forward only, bad rows refused."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from cronoq.stores import Corrupt
from cronoq.stores.placements import advance_placement, load_placements, placement_watch
from cronoq.stores.postgres import PostgresStore, quote_schema
from cronoq.stores.sqlite import SqliteStore

SEED = {"default": ("s1", 1), "p2": ("s2", 1)}


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path, postgres_dsn: str, pg_schema: str
                ) -> AsyncIterator[Any]:  # fmt: skip
    opened: Any
    if request.param == "sqlite":
        opened = SqliteStore(tmp_path / "s1.db", shard="s1")
    else:
        opened = PostgresStore(postgres_dsn, schema=pg_schema, shard="s1")
    await opened.open()
    yield opened
    await opened.close()


async def execute(store: Any, sql: str) -> None:
    """A statement on the store's database, outside the code under test."""
    if isinstance(store, SqliteStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute(sql.replace("{t}", "cronoq_topology"))
        return
    conn = await asyncpg.connect(store.dsn)
    try:
        await conn.execute(sql.replace("{t}", f"{quote_schema(store.schema)}.cronoq_topology"))
    finally:
        await conn.close()


async def test_the_first_seed_is_written_and_a_later_one_only_adds_new_pools(store: Any) -> None:
    assert await load_placements(store, SEED) == SEED
    # A later start with a file that disagrees about p2 and knows a new pool p3.
    assert await load_placements(store, {"default": ("s1", 1), "p2": ("s1", 1), "p3": ("s2", 1)}) == {
        **SEED,
        "p3": ("s2", 1),
    }


async def test_a_placement_moves_forward_never_back(store: Any) -> None:
    await load_placements(store, SEED)
    assert await advance_placement(store, "p2", "s1", 2)
    assert not await advance_placement(store, "p2", "s2", 2)  # that version is taken
    assert not await advance_placement(store, "p2", "s2", 1)
    assert await advance_placement(store, "p9", "s2", 1)  # a pool the record did not know
    assert await load_placements(store, SEED) == {"default": ("s1", 1), "p2": ("s1", 2), "p9": ("s2", 1)}


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE {t} SET shard = '' WHERE pool = 'p2'",
        "INSERT INTO {t} (pool, shard, version) VALUES ('" + "x" * 300 + "', 's1', 1)",
        "UPDATE {t} SET version = 4611686018427387905 WHERE pool = 'p2'",
    ],
)
async def test_an_unusable_row_is_refused_as_corrupt_naming_it(store: Any, statement: str) -> None:
    await load_placements(store, SEED)
    await execute(store, statement)
    with pytest.raises(Corrupt, match="cronoq_topology holds an unusable row"):
        await load_placements(store, SEED)


async def test_a_watch_reads_the_placements_and_on_postgres_hears_each_change(store: Any) -> None:
    await load_placements(store, SEED)
    async with placement_watch(store) as watch:
        assert await watch.read() == SEED
        assert watch.notified is isinstance(store, PostgresStore)
        assert await advance_placement(store, "p2", "s1", 2)  # another connection, as another node's
        if watch.notified:
            await asyncio.wait_for(watch.changed.wait(), 30)  # woken by the commit, not by a poll
        assert await watch.read() == {"default": ("s1", 1), "p2": ("s1", 2)}
