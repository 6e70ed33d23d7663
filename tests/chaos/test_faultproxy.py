"""The drills' TCP fault proxy in front of a real Postgres: it knows which process opened each
connection and whether it is a lock session, holds the bytes of a blackholed connection until
healed, and resets connections."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest
from cronoq.chaos.faultproxy import Connection, FaultProxy

CHILD = """
import asyncio, sys
import asyncpg

async def main() -> None:
    conn = await asyncpg.connect(sys.argv[1], server_settings={"application_name": sys.argv[2]})
    print(await conn.fetchval("SELECT 41 + 1"), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await conn.close()

asyncio.run(main())
"""


def _via(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    netloc = f"{parts.username}@127.0.0.1:{port}" if parts.username else f"127.0.0.1:{port}"
    return parts._replace(netloc=netloc).geturl()


@pytest.fixture
async def proxy(postgres_dsn: str) -> AsyncIterator[FaultProxy]:
    upstream = urlsplit(postgres_dsn).port or 5432
    owners: dict[int, str] = {}
    faults = FaultProxy(upstream, owners=lambda: owners)
    await faults.start()
    faults.test_owners = owners  # type: ignore[attr-defined]
    yield faults
    await faults.close()


async def test_each_connection_is_known_by_its_process_and_application(proxy: FaultProxy, postgres_dsn: str) -> None:
    owners: dict[int, str] = proxy.test_owners  # type: ignore[attr-defined]
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, _via(postgres_dsn, proxy.port), "cronoq-lock/0123456789abcdef",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    owners[child.pid] = "replica-a"
    try:
        assert child.stdout is not None and child.stdin is not None
        assert (await asyncio.wait_for(child.stdout.readline(), 60)).strip() == b"42"
        [connection] = proxy.connections
        assert connection.owner == "replica-a" and connection.lock_session
        # Reset: the child's next query would fail; its connection is gone from the proxy.
        assert proxy.reset(lambda c: c.owner == "replica-a") == 1
        child.stdin.write(b"\n")
        await child.stdin.drain()
        await asyncio.wait_for(child.wait(), 60)
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()


async def test_a_blackholed_connection_gets_its_answer_only_after_the_heal(
    proxy: FaultProxy, postgres_dsn: str
) -> None:
    conn = await asyncpg.connect(_via(postgres_dsn, proxy.port), server_settings={"application_name": "cronoq"})
    try:
        [connection] = proxy.connections
        assert not connection.lock_session and connection.owner is None  # this process is nobody's server

        def data(c: Connection) -> bool:
            return not c.lock_session

        selector = proxy.blackhole(data)
        query = asyncio.ensure_future(conn.fetchval("SELECT 7"))
        # The query's bytes reach the proxy and stay there: no answer while they are held.
        while proxy.held_chunks == 0:
            await asyncio.sleep(0.01)
        assert not query.done()
        proxy.heal(selector)
        assert await asyncio.wait_for(query, 30) == 7
    finally:
        await conn.close()
