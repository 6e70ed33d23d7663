"""Coalescing of forwarded submissions: many callers' Submits to one shard travel as one SubmitBatch.

A forwarded call costs the forwarding node a full gRPC client call on top of the server call it
answers, about as much CPU as the owning shard spends accepting the task. Under load most of that
is avoidable: Submits for the same peer with the same credentials share a lane that keeps at most
``calls_per_lane`` calls in flight; a Submit that finds them all busy waits, and when one returns
the waiting Submits leave together as one SubmitBatch (up to a size and byte budget). With no load
nothing waits: a Submit that finds a free call is sent at once, as a plain Submit.

The answer each caller gets is the one a Submit of its own would have got:

- a batch is atomic on the owning shard, so when it is refused (a status that means nothing was
  written: invalid input, unknown pool, a full queue, ...) every request of it is sent again on
  its own and gets its own precise answer;
- when the outcome is unknown (the shard unreachable, a timeout) every caller gets that error, as
  a lone forwarded Submit would, and nothing is retried (that could create tasks twice);
- a caller that gave up before its request left is dropped from the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field

import grpc

from cronoq.proto import cronoq_pb2 as pb

__all__ = ["SubmitCoalescer"]

Status = grpc.StatusCode
REFUSED = frozenset(
    {
        Status.INVALID_ARGUMENT,
        Status.NOT_FOUND,
        Status.ALREADY_EXISTS,
        Status.PERMISSION_DENIED,
        Status.FAILED_PRECONDITION,
        Status.RESOURCE_EXHAUSTED,
        Status.OUT_OF_RANGE,
        Status.UNAUTHENTICATED,
    }
)
"""Statuses with which a shard refuses a batch without writing any of it."""

SendOne = Callable[[pb.SubmitRequest], Awaitable[pb.SubmitResponse]]
SendBatch = Callable[[pb.SubmitBatchRequest], Awaitable[pb.SubmitBatchResponse]]
StatusOf = Callable[[BaseException], "grpc.StatusCode | None"]

_Waiting = tuple[pb.SubmitRequest, "asyncio.Future[pb.SubmitResponse]"]


@dataclass(slots=True)
class _Lane:
    """Submits for one (peer, credentials): how many calls are in flight, and who waits."""

    send_one: SendOne
    send_batch: SendBatch
    in_flight: int = 0
    waiting: list[_Waiting] = field(default_factory=list)


class SubmitCoalescer:
    """Sends Submits through per-key lanes; see the module docstring."""

    def __init__(self, *, max_tasks: int, max_bytes: int, status_of: StatusOf, calls_per_lane: int = 1) -> None:
        self.max_tasks = max(1, max_tasks)
        self.calls_per_lane = max(1, calls_per_lane)
        self.max_bytes = max(1, max_bytes)
        self._status_of = status_of
        self._lanes: dict[Hashable, _Lane] = {}
        self._flushers: set[asyncio.Task[None]] = set()

    async def submit(self, key: Hashable, request: pb.SubmitRequest, send_one: SendOne,
                     send_batch: SendBatch) -> pb.SubmitResponse:  # fmt: skip
        """``request`` answered through the lane ``key``; ``send_one`` / ``send_batch`` reach the
        lane's peer with the lane's credentials (the lane keeps the first ones it was given)."""
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(send_one, send_batch)
        if lane.in_flight >= self.calls_per_lane:
            future: asyncio.Future[pb.SubmitResponse] = asyncio.get_running_loop().create_future()
            lane.waiting.append((request, future))
            return await future
        lane.in_flight += 1
        try:
            return await lane.send_one(request)
        finally:
            self._after_send(lane)

    def _after_send(self, lane: _Lane) -> None:
        """A call of the lane returned: it carries the waiting Submits on, or is freed."""
        if not lane.waiting:
            lane.in_flight -= 1
            return
        flusher = asyncio.get_running_loop().create_task(self._flush(lane), name="cronoq-forward-batch")
        self._flushers.add(flusher)
        flusher.add_done_callback(self._flushers.discard)

    async def _flush(self, lane: _Lane) -> None:
        group: list[_Waiting] = []
        try:
            while lane.waiting:
                group = self._take(lane)
                if len(group) == 1:
                    await self._answer_alone(lane, *group[0])
                elif group:
                    await self._answer_together(lane, group)
        except asyncio.CancelledError:  # shutting down: nobody is left to answer these callers
            for _, future in [*group, *lane.waiting]:
                future.cancel()
            lane.waiting.clear()
            raise
        finally:
            lane.in_flight -= 1

    def _take(self, lane: _Lane) -> list[_Waiting]:
        """The next requests to send, in arrival order, within the batch budget."""
        group: list[_Waiting] = []
        size = 0
        while lane.waiting and len(group) < self.max_tasks:
            request, future = lane.waiting[0]
            if future.done():  # the caller gave up before anything was sent
                lane.waiting.pop(0)
                continue
            cost = request.task.ByteSize() + 8
            if group and size + cost > self.max_bytes:
                break
            lane.waiting.pop(0)
            group.append((request, future))
            size += cost
        return group

    @staticmethod
    async def _answer_alone(lane: _Lane, request: pb.SubmitRequest,
                            future: asyncio.Future[pb.SubmitResponse]) -> None:  # fmt: skip
        try:
            response = await lane.send_one(request)
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(response)

    async def _answer_together(self, lane: _Lane, group: list[_Waiting]) -> None:
        batch = pb.SubmitBatchRequest(tasks=[request.task for request, _ in group])
        try:
            answer = await lane.send_batch(batch)
        except Exception as exc:
            if self._status_of(exc) in REFUSED:  # nothing was written: let each find out why
                await asyncio.gather(*(self._answer_alone(lane, request, future) for request, future in group))
                return
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), response in zip(group, answer.tasks, strict=False):
            if not future.done():
                future.set_result(response)
        for _, future in group[len(answer.tasks):]:  # a malformed answer: never leave a caller hanging
            if not future.done():
                future.set_exception(RuntimeError("the shard answered a batch with too few tasks"))

    async def close(self) -> None:
        for flusher in list(self._flushers):
            flusher.cancel()
        for flusher in list(self._flushers):
            with contextlib.suppress(BaseException):
                await flusher
