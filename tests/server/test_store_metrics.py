"""The leadership and store series of ``/metrics`` (the alert rules in deploy/prometheus use them):
``cronoq_leader_epoch``, ``cronoq_store_commit_errors_total``, ``cronoq_store_fenced_commits_total``.

A real server process layer (``ServerApp``) on a real SQLite file; the store's trouble is made
the way it happens in production: another process holds the write lock, or another leader took
the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from cronoq.config import Config
from cronoq.shard.blob import BlobCodec
from cronoq.stores.sqlite import SqliteStore

from cronoq.client import Client
from cronoq.server.app import Listening, ServerApp

TOKEN = "store-metrics-admin-token-0123456789"

CONFIG = f"""
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 0.5

[[auth.tokens]]
token = "{TOKEN}"
role = "admin"
"""


class Running:
    def __init__(self, app: ServerApp, listening: asyncio.Queue[Listening]) -> None:
        self.app = app
        self.listening = listening

    async def leader(self) -> str:
        """The gRPC address once the app (again) leads its shard."""
        while (event := await asyncio.wait_for(self.listening.get(), 20)).role != "leader":
            pass
        return event.grpc

    async def scrape(self) -> dict[str, float]:
        assert self.app.http is not None
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{self.app.http.url}/metrics", headers={"authorization": f"Bearer {TOKEN}"}) as response,
        ):
            assert response.status == 200, await response.text()
            text = await response.text()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[Running, Path]]:
    path = tmp_path / "state.db"
    # Short store timeouts so a held write lock turns into Unavailable quickly; renewals rare,
    # so a taken-over lease is found by the next commit (fencing), not by the renewal loop.
    store = SqliteStore(
        path, commit_timeout=0.3, busy_timeout=0.2, lease_ttl=60.0, lease_renew=30.0, lock_poll=0.05, codec=BlobCodec()
    )
    listening: asyncio.Queue[Listening] = asyncio.Queue()
    app = ServerApp(Config.parse(CONFIG), on_listening=listening.put_nowait, store=store)
    running = asyncio.ensure_future(app.run())
    try:
        yield Running(app, listening), path
    finally:
        app.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 15)


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def test_the_leader_exports_its_epoch_and_no_store_trouble(server: tuple[Running, Path]) -> None:
    running, _ = server
    await running.leader()
    values = await running.scrape()
    assert values["cronoq_leader_epoch"] >= 1
    assert values["cronoq_store_commit_errors_total"] == 0
    assert values["cronoq_store_fenced_commits_total"] == 0


async def test_commits_refused_while_the_file_is_locked_are_counted(server: tuple[Running, Path]) -> None:
    running, path = server
    address = await running.leader()
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        async with Client(address, token=TOKEN) as client:
            submitting = asyncio.ensure_future(client.submit(b"x"))
            trouble = running.app.api.store_trouble
            await until(lambda: trouble.commit_errors >= 2, "two refused commit attempts")
            assert not submitting.done()  # the submission waits for a durable commit
            blocker.execute("ROLLBACK")
            submitted = await asyncio.wait_for(submitting, 20)
            assert submitted.id
    finally:
        blocker.close()
    values = await running.scrape()
    assert values["cronoq_store_commit_errors_total"] >= 2
    assert values["cronoq_store_fenced_commits_total"] == 0


async def test_a_fenced_commit_is_counted_and_the_next_leadership_has_a_new_epoch(
    server: tuple[Running, Path],
) -> None:
    running, path = server
    address = await running.leader()
    first_epoch = (await running.scrape())["cronoq_leader_epoch"]
    intruder = sqlite3.connect(path, isolation_level=None)
    try:
        # Another server takes the lease (and lets it lapse at once, so this one can lead again).
        intruder.execute("UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'intruder', expires_at = 0")
    finally:
        intruder.close()
    async with Client(address, token=TOKEN) as client:
        with contextlib.suppress(Exception):
            await client.submit(b"refused: the commit is fenced")
    await running.leader()  # it stood by, then took the lease again
    values = await running.scrape()
    assert values["cronoq_store_fenced_commits_total"] == 1
    assert values["cronoq_leader_epoch"] == first_epoch + 2
