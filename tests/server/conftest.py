"""One shared cronoq-server process (with credentials of every kind) for the server tests, and
helpers to run workers against it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cronoq.client import Client, Lease, Worker
from tests.server.harness import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    LABELED_WORKER_TOKEN,
    TOKENS_TOML,
    WORKER_TOKEN,
    ServerProcess,
)

FAST_RETRY = "retry = { max_attempts = 3, initial_backoff_s = 0.02, max_backoff_s = 0.05 }"

SHARED_CONFIG = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
shutdown_grace_s = 1

[limits]
max_wait_s = 5
max_slots_per_worker = 4
max_list = 50
max_key_len = 64

{TOKENS_TOML}
[[auth.tokens]]
token = "{LABELED_WORKER_TOKEN}"
role = "worker"
labels = ["gpu=a100"]

[[pools]]
name = "default"
{FAST_RETRY}

[[pools]]
name = "other"

[[pools]]
name = "dag"
{FAST_RETRY}

[[pools]]
name = "tiny"
max_pending = 1
overflow = "reject"

[[pools]]
name = "fixed"
max = 2

[[pools]]
name = "crash"
lease_ttl_s = 1
{FAST_RETRY}

[[pools]]
name = "watched"

[[pools]]
name = "labeled"

[[resources]]
kind = "semaphore"
name = "gpu"
permits = 2
"""


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("shared"), SHARED_CONFIG, name="shared").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[Client]:
    async with Client(server.address, token=CLIENT_TOKEN) as c:
        yield c


@pytest.fixture
async def admin(server: ServerProcess) -> AsyncIterator[Client]:
    async with Client(server.address, token=ADMIN_TOKEN) as c:
        yield c


Handler = Callable[[Lease], Awaitable[Any]]


class RunningWorker:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.task: asyncio.Task[None] = asyncio.ensure_future(worker.run())

    async def stop(self, grace: float = 2.0) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.worker.stop(grace), 10)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.task, 10)


@pytest.fixture
async def workers(server: ServerProcess) -> AsyncIterator[Callable[..., Awaitable[RunningWorker]]]:
    """Start ``cronoq.client.Worker``s against the shared server; all stop after the test."""
    started: list[RunningWorker] = []

    async def start(
        pool: str, handler: Handler, *, token: str = WORKER_TOKEN, wait: bool = True, **kw: Any
    ) -> RunningWorker:
        kw.setdefault("backoff", (0.05, 0.2))
        running = RunningWorker(Worker(server.address, pool, handler, token=token, **kw))
        started.append(running)
        if wait:
            await running.worker.wait_registered(10)
        return running

    try:
        yield start
    finally:
        for running in started:
            await running.stop()
