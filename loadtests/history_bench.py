"""Page latency of the task history against the number of stored tasks, on SQLite and Postgres.

For each store and each size (10**3 .. 10**6 finished tasks by default) the benchmark fills a fresh
database with finished rows, one submitted per second, spread over 4 pools, 100 kinds, 10 tenants,
2 % failed, then reads pages of 100 through the store's ``history`` (the read the servers use):

* ``all``: the first page, no filter;          * ``pool``: one pool;
* ``failed``: status failed (2 % of the rows);  * ``rare_kind``: a kind of 1 % of the rows;
* ``tenant``: one tenant;                       * ``key_prefix``: keys with a 4-digit prefix;
* ``window``: the 10 minutes before the end;    * ``deep``: a page from the middle (cursor);
* ``newest``: newest first.

The sizes are measured interleaved (every round reads every case of every size once, in a
shuffled order) so that a shared machine's noise falls on all of them alike. Output: one JSON
object per line and case: store, tasks, case, and ``p50_ms`` / ``p95_ms`` of the page reads.

    python loadtests/history_bench.py [--sizes 1000,10000,100000,1000000] [--rounds 30]
                                      [--stores sqlite,postgres] [--dsn postgresql://...]

Postgres: ``--dsn`` or ``CRONOQ_TEST_DSN``, else the local server at 127.0.0.1:5432 (database
``postgres``); each size gets a schema of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cronoq.engine.types import NS_PER_S, TaskStatus
from cronoq.engine.views import TaskQuery
from cronoq.stores.postgres import PostgresStore
from cronoq.stores.sqlite import SqliteStore

T0 = 1_700_000_000 * NS_PER_S
PAGE = 100
SPEC = '{"status":"ready"}'


def _row(i: int) -> tuple[Any, ...]:
    submitted = T0 + i * NS_PER_S
    status = "failed" if i % 50 == 7 else "succeeded"
    return (i, f"pool{i % 4}", f"kind{i % 100}", 2, f"order-{i:08d}", f"tenant{i % 10}", status, 1, 3,
            "boom" if status == "failed" else None, submitted, submitted, submitted + NS_PER_S, None, SPEC,
            b"null", None, False)  # fmt: skip


async def _fill_sqlite(path: Path, count: int) -> SqliteStore:
    store = SqliteStore(path, full_sync=False)
    await store.open()
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("BEGIN")
        marks = ", ".join("?" * 18)
        for start in range(1, count + 1, 50_000):
            conn.executemany(f"INSERT INTO cronoq_tasks VALUES ({marks})",
                             [_row(i) for i in range(start, min(start + 50_000, count + 1))])  # fmt: skip
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()
    store = SqliteStore(path, full_sync=False)
    await store.open()
    return store


async def _fill_postgres(dsn: str, schema: str, count: int) -> PostgresStore:
    import asyncpg

    store = PostgresStore(dsn, schema=schema)
    await store.open()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            f'INSERT INTO "{schema}".cronoq_tasks SELECT g, \'pool\' || (g % 4), \'kind\' || (g % 100), 2,'
            " 'order-' || lpad(g::text, 8, '0'), 'tenant' || (g % 10),"
            " CASE WHEN g % 50 = 7 THEN 'failed' ELSE 'succeeded' END, 1, 3,"
            " CASE WHEN g % 50 = 7 THEN 'boom' END, $1::bigint + g * $2::bigint, $1::bigint + g * $2::bigint,"
            " $1::bigint + (g + 1) * $2::bigint, NULL, $3, 'null'::bytea, NULL, false"
            " FROM generate_series(1, $4::bigint) AS g",
            T0, NS_PER_S, SPEC, count,
        )  # fmt: skip
        await conn.execute(f'VACUUM ANALYZE "{schema}".cronoq_tasks')
    finally:
        await conn.close()
    return store


def _cases(count: int) -> dict[str, tuple[TaskQuery, int, bool]]:
    end = T0 + count * NS_PER_S
    prefix = f"order-{count // 2:08d}"[:-4]  # 10**4 keys share it (all of them below 10**4 tasks)
    return {
        "all": (TaskQuery(), 0, False),
        "pool": (TaskQuery(pools=frozenset({"pool1"})), 0, False),
        "failed": (TaskQuery(statuses=frozenset({TaskStatus.FAILED})), 0, False),
        "rare_kind": (TaskQuery(kinds=frozenset({"kind42"})), 0, False),
        "tenant": (TaskQuery(tenants=frozenset({"tenant3"})), 0, False),
        "key_prefix": (TaskQuery(key_prefix=prefix), 0, False),
        "window": (TaskQuery(created_from=end - 600 * NS_PER_S, created_to=end), 0, False),
        "deep": (TaskQuery(), count // 2, False),
        "newest": (TaskQuery(), 0, True),
    }


async def _measure(stores: dict[tuple[str, int], Any], rounds: int) -> dict[tuple[str, int, str], list[float]]:
    reads: list[tuple[tuple[str, int, str], Callable[[], Awaitable[Any]]]] = []
    for (kind, count), store in stores.items():
        for case, (query, after, newest) in _cases(count).items():

            def read(store: Any = store, query: TaskQuery = query, after: int = after, newest: bool = newest) -> Any:
                return store.history(query, after, PAGE + 1, newest)

            reads.append(((kind, count, case), read))
    times: dict[tuple[str, int, str], list[float]] = {name: [] for name, _ in reads}
    for name, read in reads:  # warm every statement and page once
        assert await read(), name
    for _ in range(rounds):
        random.shuffle(reads)
        for name, read in reads:
            started = time.perf_counter()
            await read()
            times[name].append((time.perf_counter() - started) * 1000)
    return times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument(
        "--dsn", default=os.environ.get("CRONOQ_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
    )
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    kinds = args.stores.split(",")
    stores: dict[tuple[str, int], Any] = {}
    schemas: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cronoq-history-bench-") as scratch:
        try:
            for count in sizes:
                if "sqlite" in kinds:
                    stores[("sqlite", count)] = await _fill_sqlite(Path(scratch) / f"{count}.db", count)
                if "postgres" in kinds:
                    schema = f"history_bench_{count}_{uuid.uuid4().hex[:6]}"
                    schemas.append(schema)
                    stores[("postgres", count)] = await _fill_postgres(args.dsn, schema, count)
            times = await _measure(stores, args.rounds)
            for (kind, count, case), samples in sorted(times.items()):
                samples.sort()
                print(json.dumps({"store": kind, "tasks": count, "case": case, "page_size": PAGE,
                                  "p50_ms": round(statistics.median(samples), 3),
                                  "p95_ms": round(samples[int(len(samples) * 0.95) - 1], 3)}), flush=True)  # fmt: skip
        finally:
            for store in stores.values():
                await store.close()
            if schemas:
                import asyncpg

                conn = await asyncpg.connect(args.dsn)
                try:
                    for schema in schemas:
                        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                finally:
                    await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
