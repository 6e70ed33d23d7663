"""Attempts of the embedded scheduler: the ``TaskContext`` an executor gets, and running it.

Each attempt runs in its own asyncio task (a plain function in the loop's default thread pool,
awaited from such a task). The scheduler marks an aborted attempt and cancels its asyncio task
through ``abort_attempt``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from cronoq.engine import Core, Dispatch
from cronoq.engine.types import NS_PER_S

from ._options import seconds_to_ns

log = logging.getLogger("cronoq")

Command = Callable[[Core, int], Any]
"""A driver command: run inside a step with the engine and the step's time."""


class TaskContext:
    """What an executor knows about the attempt it runs; passed as its first argument.

    ``id`` and ``attempt`` (1 for the first) together are a fencing token: attempt numbers never
    repeat for a task. ``tags`` are the task's tags (strings), ``group`` the labels of the
    capacity group it runs on, ``timeout`` the per-attempt timeout in seconds.
    """

    # Built once per attempt, so it only keeps the lease: the fields are read from it when asked
    # for, and the two dicts (copies, so an executor cannot change the engine's) on first use.
    __slots__ = ("_cancelled", "_group", "_lease", "_post", "_tags", "_task")

    def __init__(self, post: Callable[[Command], None], lease: Dispatch) -> None:
        self._post = post  # the scheduler's thread-safe way to hand the driver a command
        self._lease = lease
        self._cancelled = False
        self._tags: dict[str, str] | None = None
        self._group: dict[str, str] | None = None
        self._task: asyncio.Task[None] | None = None  # the attempt's asyncio task, once spawned

    @property
    def id(self) -> int:
        """The task's id."""
        return self._lease.task_id

    @property
    def attempt(self) -> int:
        """This attempt's number, 1 for the first; never repeats for a task."""
        return self._lease.attempt

    @property
    def kind(self) -> str:
        """The task's kind."""
        return self._lease.kind

    @property
    def key(self) -> str | None:
        """The task's idempotency key, if it has one."""
        return self._lease.key

    @property
    def pool(self) -> str:
        """The pool the attempt runs in."""
        return self._lease.pool

    @property
    def tags(self) -> dict[str, str]:
        """The task's tags (the same dict on every access)."""
        tags = self._tags
        if tags is None:
            tags = self._tags = dict(self._lease.tags)
        return tags

    @property
    def group(self) -> dict[str, str]:
        """The labels of the capacity group the attempt runs on (the same dict on every access)."""
        group = self._group
        if group is None:
            group = self._group = dict(self._lease.group)
        return group

    @property
    def timeout(self) -> float | None:
        """The per-attempt timeout in seconds, if any."""
        timeout = self._lease.timeout
        return timeout / NS_PER_S if timeout is not None else None

    @property
    def deadline(self) -> float | None:
        """The task's deadline as Unix seconds, if it has one."""
        deadline = self._lease.deadline
        return deadline / NS_PER_S if deadline is not None else None

    def is_cancelled(self) -> bool:
        """Whether the engine aborted this attempt (cancellation, timeout, lost lease, shutdown).

        Async executors are cancelled at their next ``await``; plain functions cannot be
        interrupted and should poll this in long loops.
        """
        return self._cancelled

    def heartbeat(self) -> None:
        """Keep this attempt's lease alive; needed only in pools with a ``lease_ttl``.

        Safe to call from a plain (sync) executor's thread as well as from the event loop.
        """
        lease_id = self._lease.id
        self._post(lambda core, now: core.heartbeat(now, lease_id))

    def __repr__(self) -> str:
        return f"TaskContext(id={self.id}, attempt={self.attempt}, pool={self.pool!r}, kind={self.kind!r})"


def lease_of(ctx: TaskContext) -> Dispatch:
    """The lease the attempt runs under."""
    return ctx._lease


def set_task(ctx: TaskContext, task: asyncio.Task[None]) -> None:
    """Remember the attempt's asyncio task (to cancel it when the attempt is aborted)."""
    ctx._task = task


def abort_attempt(ctx: TaskContext) -> asyncio.Task[None] | None:
    """Mark the attempt aborted; its asyncio task if it still runs (for the caller to cancel)."""
    ctx._cancelled = True
    task = ctx._task
    return task if task is not None and not task.done() else None


if sys.version_info >= (3, 12):

    def spawn(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        # Start at once, as a proper task: most executors either finish or await I/O right away.
        return asyncio.Task(coro, loop=loop, eager_start=True)

else:

    def spawn(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return loop.create_task(coro)


async def invoke(executor: Callable[..., Any], is_async: bool, ctx: TaskContext, payload: Any) -> Any:
    """Run an executor: awaited if async, else in the loop's default thread pool."""
    if is_async:
        return await executor(ctx, payload)
    result = await asyncio.get_running_loop().run_in_executor(None, functools.partial(executor, ctx, payload))
    if inspect.isawaitable(result):
        result = await result
    return result


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether an executor is a coroutine function (through partials and async ``__call__``)."""
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    call = getattr(target, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def retry_after_ns(value: object) -> int | None:
    """An executor's retry_after hint in ns; a hint that is not a sane duration is ignored."""
    if value is None:
        return None
    try:
        return seconds_to_ns(value, "retry_after")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        log.warning("ignoring an invalid retry_after hint: %r", value)
        return None
