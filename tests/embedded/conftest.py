"""Helpers shared by the embedded-API tests.

Every test runs a real scheduler on a real event loop. Durations are kept tiny, and nothing
asserts that something happened *within* a time: waits are bounded only to turn a hang into a
failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest

from ..waiting import LIMIT
from ..waiting import eventually as eventually  # the embedded tests' helpers, in one place

T = TypeVar("T")


async def within(awaitable: Awaitable[T], limit: float = LIMIT) -> T:
    """Await with a generous bound, so that a bug hangs one test and not the suite."""
    return await asyncio.wait_for(asyncio.ensure_future(awaitable), limit)


async def settle(turns: int = 20) -> None:
    """Give the loop (and the scheduler's driver) a few turns."""
    for _ in range(turns):
        await asyncio.sleep(0)


class Gate:
    """Executors wait at the gate until the test opens it; records who is waiting."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self.waiting: list[Any] = []

    async def wait(self, item: Any = None) -> None:
        self.waiting.append(item)
        try:
            await self._open.wait()
        finally:
            self.waiting.remove(item)

    def open(self) -> None:
        self._open.set()


@pytest.fixture
def gate() -> Gate:
    return Gate()
