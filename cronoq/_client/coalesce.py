"""Producer-side coalescing: concurrent ``Client.submit`` calls leave together as ``SubmitBatch``.

A unary call costs both ends far more than the task it carries (on the server, a single Submit
costs several times the CPU of one task inside a batch of a hundred). A ``Client`` made with
``coalesce=True`` therefore keeps at most ``calls`` Submit or SubmitBatch calls in flight for its
single submits. A submit that finds one free is sent at once as a plain Submit, so an idle
producer waits for nothing; one that finds them all busy queues, and when a call returns, the
queued submits leave together as one SubmitBatch (up to ``max_tasks`` tasks and ``max_bytes``).

Each caller gets the answer its own Submit would have got:

- a batch is atomic on the server, so a batch refused with a status that means nothing was
  written (invalid input, unknown pool, a full queue, a limit, ...) is sent again one Submit per
  task (``RESEND_CONCURRENCY`` at a time), each getting its own precise answer or error;
- when the outcome is unknown (server unreachable, deadline passed), every caller of the batch
  gets that error, as a lone Submit would, and nothing is retried (that could create tasks twice);
- a caller that gave up (was cancelled) before its request left is dropped from the batch.

Only plain submits are merged: ``wait=True``, an explicit ``call_timeout`` and calls made inside
an OpenTelemetry span (whose trace context belongs to that one call) go alone as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable

from cronoq._client.errors import ClientError
from cronoq.proto import cronoq_pb2 as pb

__all__ = ["REFUSED_CODES", "SubmitCoalescer"]

REFUSED_CODES = frozenset(
    {
        "invalid_argument",
        "not_found",
        "already_exists",
        "permission_denied",
        "failed_precondition",
        "resource_exhausted",
        "out_of_range",
        "unauthenticated",
    }
)
"""``ClientError`` codes with which a server refuses a whole batch without writing any of it."""

RESEND_CONCURRENCY = 16
"""Submits in flight at once when a refused batch is sent again task by task: a batch holds
hundreds of tasks, more than a server lets one credential (or one connection's HTTP/2 streams)
have in flight, and a Submit refused for that would not be the answer its task deserves."""

SendOne = Callable[[pb.SubmitRequest], Awaitable[pb.SubmitResponse]]
SendBatch = Callable[[pb.SubmitBatchRequest], Awaitable[pb.SubmitBatchResponse]]
_Queued = tuple[pb.SubmitRequest, "asyncio.Future[pb.SubmitResponse]"]


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and exc.code in REFUSED_CODES


class SubmitCoalescer:
    """Sends single submits through ``send_one`` / ``send_batch`` (see the module docstring).
    Bound to the event loop it is first used on."""

    def __init__(self, send_one: SendOne, send_batch: SendBatch, *, calls: int, max_tasks: int,
                 max_bytes: int) -> None:  # fmt: skip
        self.calls = max(1, calls)
        self.max_tasks = max(1, max_tasks)
        self.max_bytes = max(1, max_bytes)
        self._send_one = send_one
        self._send_batch = send_batch
        self.in_flight = 0
        """Calls of this coalescer in flight now."""
        self._queued: deque[_Queued] = deque()
        self._flushers: set[asyncio.Task[None]] = set()
        self.batches_sent = 0
        """SubmitBatch calls made for coalesced submits (for tests and benchmarks)."""

    async def submit(self, request: pb.SubmitRequest) -> pb.SubmitResponse:
        """``request`` answered as a Submit of its own would be."""
        if self.in_flight >= self.calls:
            future: asyncio.Future[pb.SubmitResponse] = asyncio.get_running_loop().create_future()
            self._queued.append((request, future))
            return await future
        self.in_flight += 1
        try:
            return await self._send_one(request)
        finally:
            self._call_returned()

    def _call_returned(self) -> None:
        """A call returned: it carries the queued submits on, or frees its place."""
        if not self._queued:
            self.in_flight -= 1
            return
        flusher = asyncio.get_running_loop().create_task(self._flush(), name="cronoq-client-batch")
        self._flushers.add(flusher)
        flusher.add_done_callback(self._flushers.discard)

    async def _flush(self) -> None:
        group: list[_Queued] = []
        try:
            while self._queued:
                group = self._take()
                if len(group) == 1:
                    await self._answer_alone(*group[0])
                elif group:
                    await self._answer_together(group)
                group = []
        except asyncio.CancelledError:  # closing: nobody is left to answer these callers
            for _, future in [*group, *self._queued]:
                future.cancel()
            self._queued.clear()
            raise
        finally:
            self.in_flight -= 1

    def _take(self) -> list[_Queued]:
        """The next submits to send, in arrival order, within the batch budget."""
        group: list[_Queued] = []
        queued = self._queued
        size = 0
        while queued and len(group) < self.max_tasks:
            request, future = queued[0]
            if future.done():  # the caller gave up before anything was sent
                queued.popleft()
                continue
            cost = request.task.ByteSize() + 8
            if group and size + cost > self.max_bytes:
                break
            group.append(queued.popleft())
            size += cost
        return group

    async def _answer_alone(self, request: pb.SubmitRequest, future: asyncio.Future[pb.SubmitResponse]) -> None:
        try:
            response = await self._send_one(request)
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(response)

    async def _answer_together(self, group: list[_Queued]) -> None:
        batch = pb.SubmitBatchRequest(tasks=[request.task for request, _ in group])
        self.batches_sent += 1
        try:
            answer = await self._send_batch(batch)
        except Exception as exc:
            if _refused(exc):  # nothing was written: each finds out on its own what its answer is
                gate = asyncio.Semaphore(RESEND_CONCURRENCY)

                async def alone(queued: _Queued) -> None:
                    async with gate:
                        await self._answer_alone(*queued)

                await asyncio.gather(*(alone(queued) for queued in group))
                return
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), response in zip(group, answer.tasks, strict=False):
            if not future.done():
                future.set_result(response)
        for _, future in group[len(answer.tasks) :]:  # a malformed answer: never leave a caller hanging
            if not future.done():
                future.set_exception(ClientError("internal", "the server answered a batch with too few tasks"))

    async def close(self) -> None:
        """Stop sending: callers still queued are cancelled."""
        for flusher in list(self._flushers):
            flusher.cancel()
        for flusher in list(self._flushers):
            with contextlib.suppress(BaseException):
                await flusher
        for _, future in self._queued:
            future.cancel()
        self._queued.clear()
