"""A coroutine the launcher keeps running in the background until it is closed."""

from __future__ import annotations

import abc
import asyncio


class BackgroundLoop(abc.ABC):
    """Subclasses implement ``_run``; ``start`` launches it once, ``close`` cancels and awaits it."""

    _task: asyncio.Task[None] | None = None

    @abc.abstractmethod
    async def _run(self) -> None:
        """The loop itself; it runs until cancelled by ``close``."""

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
