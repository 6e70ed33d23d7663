"""Results of the embedded scheduler: the ``TaskHandle`` a submission returns, and how payloads
and outputs are kept (already encoded for the store, or marked as not storable)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from cronoq.stores.base import Codec

from ._scheduler_attempts import Command


class TaskHandle:
    """A submitted task. Await it (or ``result()``) for the executor's return value.

    A task that did not succeed raises ``TaskFailed``. Cancelling the coroutine that awaits a
    handle does not cancel the task; ``cancel()`` does.
    """

    __slots__ = ("_future", "_post", "duplicate", "id")

    def __init__(
        self, post: Callable[[Command], None], task_id: int, duplicate: bool, future: asyncio.Future[Any]
    ) -> None:
        self._post = post  # hands the scheduler's driver a command
        self.id = task_id
        self.duplicate = duplicate
        self._future = future

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.shield(self._future).__await__()

    def result(self) -> Awaitable[Any]:
        """An awaitable of the task's result (the same as awaiting the handle)."""
        return asyncio.shield(self._future)

    def done(self) -> bool:
        """Whether the result is known (awaiting the handle would not wait)."""
        return self._future.done()

    def cancel(self) -> None:
        """Cancel the task itself, not just this handle (like ``Scheduler.cancel``)."""
        if not self._future.done():
            task_id = self.id
            self._post(lambda core, now: core.cancel(now, task_id))

    def __repr__(self) -> str:
        return f"TaskHandle(id={self.id}, duplicate={self.duplicate}, done={self.done()})"


def fail(future: asyncio.Future[Any], error: BaseException) -> None:
    """Fail a handle's future without asyncio logging "exception never retrieved" for it:
    a handle nobody awaits is fine (the failure is also in the status events)."""
    if not future.done():
        future.set_exception(error)
        future.exception()


class Encoded:
    """A payload or output already encoded by the scheduler's codec (to check that the store can
    hold it): the store takes ``data`` as is, executors and handles get ``value``."""

    __slots__ = ("data", "value")

    def __init__(self, value: Any, data: bytes) -> None:
        self.value = value
        self.data = data


class Unstored:
    """An output the codec cannot encode: handed to waiters in memory, stored as a marker."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


UNSTORED = object()  # what the store codec decodes the marker to
UNSTORED_MARK = b"\x00cronoq: output not stored\x00"


class StoreCodec:
    """The scheduler's codec as seen by its store: outputs that could not be encoded are stored
    as a marker, which reads back as "output no longer available"."""

    __slots__ = ("inner",)

    def __init__(self, inner: Codec) -> None:
        self.inner = inner

    def encode(self, obj: Any, /) -> bytes:
        kind = type(obj)
        if kind is Encoded:
            return obj.data  # type: ignore[no-any-return]
        if kind is Unstored:
            return UNSTORED_MARK
        return self.inner.encode(obj)

    def decode(self, data: bytes, /) -> Any:
        if data == UNSTORED_MARK:
            return UNSTORED
        return self.inner.decode(data)
