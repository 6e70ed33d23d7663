"""Submits that find every call busy wait in a lane and leave together as one SubmitBatch.

Shared by the producer-side coalescing of ``cronoq.client`` (one lane per ``Client``) and the
router's coalescing of forwarded Submits (one lane per peer and credentials). A lane keeps at most
``calls`` calls in flight; a Submit that finds one free is sent at once as a plain Submit, one that
finds them all busy waits, and each returning call carries the waiting Submits on as SubmitBatch
calls (up to ``max_tasks`` tasks and ``max_bytes``) until none wait.

Every caller gets the answer a Submit of its own would have got:

- a batch is atomic, so one refused with a status that means nothing was written (``refused``
  says which) is sent again one Submit per task, ``RESEND_CONCURRENCY`` at a time, each getting its
  own precise answer;
- when the outcome is unknown (unreachable, a deadline), every caller of the batch gets that error
  and nothing is retried (that could create tasks twice);
- a caller that gave up before its request left is dropped from the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from cronoq.proto import cronoq_pb2 as pb

__all__ = ["RESEND_CONCURRENCY", "Lane", "LaneBatcher"]

RESEND_CONCURRENCY = 16
"""Submits in flight at once when a refused batch is sent again task by task: a batch may hold
hundreds of tasks, more than a server lets one credential (or one connection's HTTP/2 streams)
have in flight, and a Submit refused for that is not the answer its own task deserves."""

R = TypeVar("R")
"""Whatever the senders need to reach the server (the router's ``Route``; nothing for a client)."""

_Waiting = tuple[pb.SubmitRequest, "asyncio.Future[pb.SubmitResponse]", R]


@dataclass(eq=False, slots=True)
class Lane(Generic[R]):
    """Submits that share calls: how many calls are in flight, and who waits (``key``: the
    owner's name for the lane, untouched here)."""

    key: object = None
    in_flight: int = 0
    waiting: deque[_Waiting[R]] = field(default_factory=deque)


class LaneBatcher(Generic[R]):
    """Sends Submits through lanes with ``send_one`` / ``send_batch`` (see the module docstring).

    ``idle(lane)`` is called whenever a lane is left with no call in flight and nobody waiting;
    ``too_few()`` is the error of callers a malformed batch answer has no task for."""

    def __init__(self, *, send_one: Callable[[R, pb.SubmitRequest], Awaitable[pb.SubmitResponse]],
                 send_batch: Callable[[R, pb.SubmitBatchRequest], Awaitable[pb.SubmitBatchResponse]],
                 refused: Callable[[BaseException], bool], too_few: Callable[[], Exception],
                 calls: int, max_tasks: int, max_bytes: int, idle: Callable[[Lane[R]], None] | None = None,
                 task_name: str = "cronoq-submit-batch") -> None:  # fmt: skip
        self.calls = max(1, calls)
        self.max_tasks = max(1, max_tasks)
        self.max_bytes = max(1, max_bytes)
        self._send_one = send_one
        self._send_batch = send_batch
        self._refused = refused
        self._too_few = too_few
        self._idle = idle
        self._task_name = task_name
        self._flushers: set[asyncio.Task[None]] = set()
        self.batches_sent = 0
        """SubmitBatch calls made for waiting Submits (for tests and benchmarks)."""

    async def submit(self, lane: Lane[R], route: R, request: pb.SubmitRequest) -> pb.SubmitResponse:
        """``request`` answered through ``lane`` as a Submit of its own would be."""
        if lane.in_flight >= self.calls:
            future: asyncio.Future[pb.SubmitResponse] = asyncio.get_running_loop().create_future()
            lane.waiting.append((request, future, route))
            return await future
        lane.in_flight += 1
        try:
            return await self._send_one(route, request)
        finally:
            self._call_returned(lane)

    def _call_returned(self, lane: Lane[R]) -> None:
        """A call of ``lane`` returned: it carries the waiting Submits on, or frees its place."""
        if not lane.waiting:
            self._release(lane)
            return
        flusher = asyncio.get_running_loop().create_task(self._flush(lane), name=self._task_name)
        self._flushers.add(flusher)
        flusher.add_done_callback(self._flushers.discard)

    def _release(self, lane: Lane[R]) -> None:
        lane.in_flight -= 1
        if not lane.in_flight and not lane.waiting and self._idle is not None:
            self._idle(lane)

    async def _flush(self, lane: Lane[R]) -> None:
        group: list[_Waiting[R]] = []
        try:
            while lane.waiting:
                group = self._take(lane)
                if len(group) == 1:
                    await self._answer_alone(*group[0])
                elif group:
                    await self._answer_together(group)
                group = []
        except asyncio.CancelledError:  # closing: nobody is left to answer these callers
            for _, future, _ in [*group, *lane.waiting]:
                future.cancel()
            lane.waiting.clear()
            raise
        finally:
            self._release(lane)

    def _take(self, lane: Lane[R]) -> list[_Waiting[R]]:
        """The next requests to send, in arrival order, within the batch budget."""
        group: list[_Waiting[R]] = []
        waiting = lane.waiting
        size = 0
        while waiting and len(group) < self.max_tasks:
            request, future, _ = waiting[0]
            if future.done():  # the caller gave up before anything was sent
                waiting.popleft()
                continue
            cost = request.task.ByteSize() + 8
            if group and size + cost > self.max_bytes:
                break
            group.append(waiting.popleft())
            size += cost
        return group

    async def _answer_alone(self, request: pb.SubmitRequest, future: asyncio.Future[pb.SubmitResponse],
                            route: R) -> None:  # fmt: skip
        try:
            response = await self._send_one(route, request)
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(response)

    async def _answer_together(self, group: list[_Waiting[R]]) -> None:
        batch = pb.SubmitBatchRequest(tasks=[request.task for request, _, _ in group])
        self.batches_sent += 1
        try:
            # Every route of a lane carries the same credentials: the first one's reach the server.
            answer = await self._send_batch(group[0][2], batch)
        except Exception as exc:
            if self._refused(exc):  # nothing was written: each finds out on its own what its answer is
                gate = asyncio.Semaphore(RESEND_CONCURRENCY)

                async def alone(waiting: _Waiting[R]) -> None:
                    async with gate:
                        await self._answer_alone(*waiting)

                await asyncio.gather(*(alone(waiting) for waiting in group))
                return
            for _, future, _ in group:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future, _), response in zip(group, answer.tasks, strict=False):
            if not future.done():
                future.set_result(response)
        for _, future, _ in group[len(answer.tasks) :]:  # a malformed answer: never leave a caller hanging
            if not future.done():
                future.set_exception(self._too_few())

    async def close(self, lanes: Iterable[Lane[R]] = ()) -> None:
        """Stop sending: flushes in progress end, and callers still waiting in ``lanes`` are cancelled."""
        for flusher in list(self._flushers):
            flusher.cancel()
        for flusher in list(self._flushers):
            with contextlib.suppress(BaseException):
                await flusher
        for lane in lanes:
            for _, future, _ in lane.waiting:
                future.cancel()
            lane.waiting.clear()
