"""A leader frozen past its lease (SIGSTOP) is replaced, and once woken it writes nothing.

Real ``cronoq-server`` processes (1 shard x 2 replicas, from the cluster launcher) on Postgres (a
schema of the shared server) and on SQLite, with a short test-only lease. The frozen leader keeps
its database sessions (its kernel still answers), so with Postgres only the lease can tell the
standby that it is gone. While it is frozen a Submit is sent to it directly; it reaches the
process only when it wakes, and must not be written. The store's rows are fingerprinted before
the zombie wakes and compared once it has stepped down.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from cronoq.cluster.launcher import Cluster
from cronoq.cluster.layout import ClusterOptions
from cronoq.cluster.probe import http_status
from cronoq.cluster.replica import Replica

from cronoq.client import Client, ClientError, Lease, Worker

# Short enough for a quick test, long enough that a busy machine does not miss renewals.
LEASE = {"lease_ttl_s": 2.0, "lease_renew_s": 0.4, "lock_poll_s": 0.1}
# Each channel gets connections of its own: gRPC otherwise shares one connection between channels
# to the same address, and the endpoint proxy keeps a connection on the replica it was opened to
# (a new channel could then reuse one that leads to the frozen leader).
OWN_CONNECTIONS = [("grpc.use_local_subchannel_pool", 1)]
TIMEOUT_S = 60.0


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout: float = TIMEOUT_S) -> None:
    """Poll ``check`` until it holds (the servers are other processes: there is no event to await)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def readyz(replica: Replica) -> int | None:
    return await http_status("127.0.0.1", replica.http_port, "/readyz", 0.5)


Fingerprint = Callable[[], Awaitable[str]]


def pg_fingerprint(dsn: str, schema: str) -> Fingerprint:
    """Every row a leader writes (the lease row, renewed by the new leader, aside)."""
    tables = ("cronoq_tasks", "cronoq_task_events", "cronoq_task_transitions", "cronoq_recurring", "cronoq_meta",
              "cronoq_leader")  # fmt: skip

    async def fingerprint() -> str:
        conn = await asyncpg.connect(dsn)
        try:
            parts = [
                await conn.fetchval(
                    f"SELECT coalesce(string_agg(t::text, '|' ORDER BY t::text), '') FROM \"{schema}\".{table} t"
                )
                for table in tables
            ]
        finally:
            await conn.close()
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()

    return fingerprint


def sqlite_fingerprint(path: Path) -> Fingerprint:
    tables = ("cronoq_tasks", "cronoq_task_transitions", "cronoq_recurring", "cronoq_meta")

    async def fingerprint() -> str:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = [sorted(map(repr, conn.execute(f"SELECT * FROM {table}").fetchall())) for table in tables]
            # The lease row's expiry moves with every renewal; its epoch and holder must not.
            rows.append([repr(conn.execute("SELECT epoch, holder FROM cronoq_leader").fetchall())])
        finally:
            conn.close()
        return hashlib.sha256(repr(rows).encode()).hexdigest()

    return fingerprint


async def pg_keys(dsn: str, schema: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {r[0] for r in await conn.fetch(f'SELECT key FROM "{schema}".cronoq_tasks WHERE key IS NOT NULL')}
    finally:
        await conn.close()


def sqlite_keys(path: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT key FROM cronoq_tasks WHERE key IS NOT NULL")}
    finally:
        conn.close()


@pytest.fixture(params=["postgres", "sqlite"])
async def frozen_cluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Cluster, Fingerprint, Callable[[], Awaitable[set[str]]]]]:
    dsn: str | None = None
    prefix = f"cronoq_fz{uuid.uuid4().hex[:10]}_"
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres_dsn")
    options = ClusterOptions(shards=1, replicas=2, dsn=dsn, state=tmp_path, base_port=0, restart=False,
                             schema_prefix=prefix, store_settings=LEASE)  # fmt: skip
    cluster = Cluster(options, say=lambda _line: None)
    await cluster.start()
    try:
        if dsn is not None:
            schema = f"{prefix}s1"

            async def keys() -> set[str]:
                return await pg_keys(dsn, schema)

            yield cluster, pg_fingerprint(dsn, schema), keys
        else:
            path = tmp_path / "s1.db"

            async def keys() -> set[str]:
                return sqlite_keys(path)

            yield cluster, sqlite_fingerprint(path), keys
    finally:
        for replica in cluster.replicas:
            if replica.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(replica.pid, signal.SIGCONT)  # never leave a stopped process behind
        await cluster.stop()
        if dsn is not None:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{prefix}s1" CASCADE')
            finally:
                await conn.close()


async def test_a_frozen_leader_is_replaced_and_fenced_when_it_wakes(
    frozen_cluster: tuple[Cluster, Fingerprint, Callable[[], Awaitable[set[str]]]],
) -> None:
    cluster, fingerprint, stored_keys = frozen_cluster
    shard = cluster.shard("s1")
    zombie = shard.leader
    assert zombie is not None and zombie.pid is not None
    successor = next(replica for replica in shard.replicas if replica is not zombie)
    target = shard.plan.grpc_target
    executions: list[tuple[int, int]] = []

    async def handler(lease: Lease) -> dict[str, int]:
        executions.append((lease.task_id, lease.attempt))
        return {"attempt": lease.attempt}

    async def run_worker() -> tuple[Worker, asyncio.Task[None]]:
        worker = Worker(
            target, "default", handler, slots=4, token=cluster.token("worker"), name="w", options=OWN_CONNECTIONS
        )
        running = asyncio.create_task(worker.run())
        await worker.wait_registered(timeout=TIMEOUT_S)
        return worker, running

    def connect(address: str = target) -> Client:
        return Client(address, token=cluster.token("client"), options=OWN_CONNECTIONS)

    # Tasks run under the first leader, then tasks left pending for its successor.
    async with connect() as client:
        worker, running = await run_worker()
        first = [(await client.submit({"n": i}, key=f"first-{i}", call_timeout=10)).id for i in range(3)]
        for task_id in first:
            assert (await client.wait(task_id, timeout=TIMEOUT_S)).status == "succeeded"
        await worker.stop()
        await running
        pending = [(await client.submit({"n": i}, key=f"pending-{i}", call_timeout=10)).id for i in range(3)]

    os.kill(zombie.pid, signal.SIGSTOP)
    # A write sent to the frozen leader itself: it reaches the process only when it wakes.
    async with connect(f"127.0.0.1:{zombie.grpc_port}") as direct:
        zombie_write = asyncio.create_task(direct.submit({"z": 1}, key="zombie-write", call_timeout=TIMEOUT_S))

        await eventually(lambda: _is(readyz(successor), 200), "the standby to lead")
        await eventually(lambda: _same(shard, successor), "the endpoint to follow the new leader")
        async with connect() as client:
            later = [(await client.submit({"n": i}, key=f"later-{i}", call_timeout=10)).id for i in range(3)]
            worker, running = await run_worker()
            for task_id in pending + later:
                assert (await client.wait(task_id, timeout=TIMEOUT_S)).status == "succeeded"
            await worker.stop()
            await running

            before = await fingerprint()
            os.kill(zombie.pid, signal.SIGCONT)
            with pytest.raises(ClientError):
                await asyncio.wait_for(zombie_write, TIMEOUT_S)  # refused: not acknowledged
            await eventually(lambda: _logged(zombie, "leadership lost"), "the woken leader to step down")
            assert await readyz(zombie) != 200
            assert await readyz(successor) == 200

            # The woken leader wrote nothing, and nothing ran twice.
            assert await fingerprint() == before
            assert "zombie-write" not in await stored_keys()
            assert sorted(executions) == sorted({(task_id, 1) for task_id in first + pending + later})

            # The new leader still serves.
            extra = (await client.submit({"n": 9}, key="after-wake", call_timeout=10)).id
            assert (await client.get(extra)).id == extra
            expected = {"after-wake", *(f"{k}-{i}" for k in ("first", "pending", "later") for i in range(3))}
            assert expected <= await stored_keys()


async def _is(status: Awaitable[int | None], expected: int) -> bool:
    return await status == expected


async def _same(shard: object, replica: Replica) -> bool:
    return getattr(shard, "leader", None) is replica


async def _logged(replica: Replica, text: str) -> bool:
    return text in replica.log_tail(20_000)
