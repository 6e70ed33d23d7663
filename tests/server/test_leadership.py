"""Leadership moving away from a serving leader (Postgres store): workers are told, the server
stands by and leads again once it can."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from cronoq.stores.postgres import lock_key

from cronoq.client import Client, ClientError, Lease, Worker
from tests.server.harness import ADMIN_TOKEN, ServerProcess


async def _take_over_lock(dsn: str, schema: str) -> Any:
    """End the leader's lock session and hold its advisory lock ourselves, as a replica taking
    over would; returns the connection holding it (closing it frees the lock)."""
    import asyncpg

    key = lock_key(schema)
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    conn = await asyncpg.connect(dsn)
    ended = await conn.fetch(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
        "AND classid::bigint = $1 AND objid::bigint = $2 AND granted",
        unsigned >> 32,
        unsigned & 0xFFFFFFFF,
    )
    assert len(ended) == 1
    await conn.execute("SELECT pg_advisory_lock($1)", key)
    return conn


async def test_a_leader_that_loses_its_lock_tells_workers_and_leads_again(
    tmp_path: Path, postgres_dsn: str, pg_schema: str
) -> None:
    config = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
shutdown_grace_s = 0.5

[store]
kind = "postgres"
url = "{postgres_dsn}"
schema = "{pg_schema}"

[[auth.tokens]]
token = "{ADMIN_TOKEN}"
role = "admin"
"""
    server = ServerProcess(tmp_path, config, name="pg").start()
    try:

        async def handler(lease: Lease) -> bytes:
            return lease.payload

        worker = Worker(server.address, "default", handler, token=ADMIN_TOKEN, backoff=(0.05, 0.2))
        serving = asyncio.ensure_future(worker.run())
        await worker.wait_registered(10)
        async with Client(server.address, token=ADMIN_TOKEN) as client:
            before = await client.submit(b"first", key="before", wait=True, wait_timeout=10)
            assert before.result is not None and before.result.output == b"first"

            holder = await _take_over_lock(postgres_dsn, pg_schema)
            try:
                await asyncio.to_thread(server.wait_for, "standby", 30)
                async with Client(server.address, token=ADMIN_TOKEN) as standby:
                    with pytest.raises(ClientError) as err:
                        await standby.submit(b"")
                    assert err.value.code == "unavailable"
            finally:
                await holder.close()
            await asyncio.to_thread(server.wait_for, "listening", 30)
            for _ in range(100):
                if worker.worker_id is not None and worker.connections >= 2 and worker.granted_slots:
                    break
                await asyncio.sleep(0.1)
            assert worker.last_shutdown is not None and "leader" in worker.last_shutdown

            # Served again, with the state recovered from the store.
            for _ in range(100):
                try:
                    after = await client.submit(b"second", key="after", wait=True, wait_timeout=10)
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            assert after.result is not None and after.result.output == b"second"
            assert (await client.get("before")).status == "succeeded"
            assert after.id > before.id
        await worker.stop(1)
        await serving
        assert "leadership" in server.stderr()
    finally:
        server.stop()
