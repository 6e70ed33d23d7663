"""Waiting for a condition in tests: poll it until it holds, with a deadline that turns a hang into
a failure. Use it where no event says the condition now holds; never sleep for a guessed time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

LIMIT = 10.0  # seconds before a wait that should succeed counts as a hang


async def eventually(check: Callable[[], Any], limit: float = LIMIT, step: float = 0.005) -> Any:
    """Poll ``check`` (sync or async) until it returns something truthy; that value is returned."""
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {limit}s: {check}")
        await asyncio.sleep(step)


def eventually_sync(check: Callable[[], Any], limit: float = LIMIT, step: float = 0.005) -> Any:
    """``eventually`` for code without an event loop (subprocesses, sockets)."""
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {limit}s: {check}")
        time.sleep(step)
