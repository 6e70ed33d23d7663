"""Status events of the embedded scheduler: the public ``StatusEvent``, the ``EventStream`` a
caller reads them from, and the hub that feeds every open stream."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from cronoq.engine import Resolve
from cronoq.engine import StatusEvent as EngineEvent
from cronoq.engine.types import NS_PER_S

from .errors import EventsLagged


@dataclass(frozen=True, slots=True)
class StatusEvent:
    """A task changed status: ``id``, ``pool``, ``key``, ``status``, ``attempt``, ``at`` (Unix
    seconds) and ``message`` (the final message of a failed task, else usually None)."""

    id: int
    pool: str
    key: str | None
    status: str
    attempt: int
    at: float
    message: str | None


def public_event(event: EngineEvent | Resolve) -> StatusEvent:
    """The public form of an engine event or resolution."""
    return StatusEvent(
        event.id, event.pool, event.key, event.status.value, event.attempt, event.at / NS_PER_S, event.message
    )


class EventStream:
    """Status events as they happen, from ``Scheduler.events()``.

    An async iterator of ``StatusEvent``, and an async context manager that closes the stream.
    It buffers up to the scheduler's ``event_capacity`` events; when the consumer falls behind,
    the oldest are dropped and counted in ``lagged``. With ``on_lag="raise"`` the next iteration
    raises ``EventsLagged`` instead, and iterating again continues with the buffered events. The
    stream ends when it is closed or the scheduler shuts down.
    """

    def __init__(self, capacity: int, on_lag: Literal["skip", "raise"], unregister: Callable[[EventStream], None]):
        if on_lag not in ("skip", "raise"):
            raise ValueError("on_lag must be 'skip' or 'raise'")
        self._buffer: deque[StatusEvent] = deque()
        self._capacity = max(1, capacity)
        self._on_lag = on_lag
        self._lagged = 0
        self._unreported = 0
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._unregister = unregister

    @property
    def lagged(self) -> int:
        """How many events this stream dropped because its buffer was full."""
        return self._lagged

    @property
    def closed(self) -> bool:
        """Whether the stream ended (closed, or the scheduler shut down)."""
        return self._closed

    def _push(self, event: StatusEvent) -> None:
        if self._closed:
            return
        buffer = self._buffer
        if len(buffer) >= self._capacity:
            buffer.popleft()
            self._lagged += 1
            self._unreported += 1
        buffer.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end(self) -> None:
        self._closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> StatusEvent:
        while True:
            if self._on_lag == "raise" and self._unreported:
                skipped, self._unreported = self._unreported, 0
                raise EventsLagged(skipped)
            if self._buffer:
                return self._buffer.popleft()
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        """End the stream; events already buffered can still be read."""
        if not self._closed:
            self._end()
            self._unregister(self)

    async def aclose(self) -> None:
        """``close()``, as a coroutine."""
        self.close()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *args: object) -> None:
        self.close()


class EventHub:
    """The open event streams of one scheduler: each event reaches all of them."""

    __slots__ = ("_streams",)

    def __init__(self) -> None:
        self._streams: set[EventStream] = set()

    def __bool__(self) -> bool:
        return bool(self._streams)

    def open(self, capacity: int, on_lag: Literal["skip", "raise"]) -> EventStream:
        stream = EventStream(capacity, on_lag, self._streams.discard)
        self._streams.add(stream)
        return stream

    def publish(self, event: EngineEvent | Resolve) -> None:
        public = public_event(event)
        for stream in self._streams:
            stream._push(public)

    def end_all(self) -> None:
        """The scheduler stopped: every stream ends (its buffered events can still be read)."""
        for stream in list(self._streams):
            stream._end()
        self._streams.clear()
