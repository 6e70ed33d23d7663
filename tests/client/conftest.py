"""Fixtures: a fake cronoq server on a loopback port, and a helper that runs a Worker against it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cronoq.client import Worker
from tests.client.fake_server import FakeCronoq, start_server

TOKEN = "worker-token-0123456789"


@pytest.fixture
async def fake() -> AsyncIterator[FakeCronoq]:
    servicer = FakeCronoq()
    server = await start_server(servicer)
    try:
        yield servicer
    finally:
        await server.stop(0)


@pytest.fixture
async def other() -> AsyncIterator[FakeCronoq]:
    """A second server (another shard)."""
    servicer = FakeCronoq()
    server = await start_server(servicer)
    try:
        yield servicer
    finally:
        await server.stop(0)


class Running:
    """A Worker with its run() task."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.task: asyncio.Task[None] = asyncio.create_task(worker.run())

    async def stop(self, grace: float = 5.0) -> None:
        await asyncio.wait_for(self.worker.stop(grace), 15)
        await asyncio.wait_for(self.task, 15)


@pytest.fixture
async def start_worker() -> AsyncIterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(target: str, handler: Any, pool: str = "default", **kw: Any) -> Running:
        kw.setdefault("backoff", (0.01, 0.05))
        running = Running(Worker(target, pool, handler, **kw))
        started.append(running)
        return running

    yield start
    for running in started:
        if not running.task.done():
            with contextlib.suppress(Exception):
                await running.stop(grace=0.5)
        with contextlib.suppress(BaseException):
            await running.task
