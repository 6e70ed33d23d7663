"""Coalescing of forwarded submissions: many callers' Submits to one shard travel as one SubmitBatch.

A forwarded call costs the forwarding node a full gRPC client call on top of the server call it
answers, about as much CPU as the owning shard spends accepting the task. Under load most of that
is avoidable: Submits for the same peer with the same credentials share a lane that keeps at most
``calls_per_lane`` calls in flight; a Submit that finds them all busy waits, and when one returns
the waiting Submits leave together as one SubmitBatch (up to a size and byte budget). With no load
nothing waits: a Submit that finds a free call is sent at once, as a plain Submit.

A lane is named by the peer and a digest of the credentials (the token itself is never a key) and
holds only its count of calls in flight and the Submits waiting, each with its own ``Route``: a
lane left idle is dropped at once, and nothing of a caller outlives its answer.

The answer each caller gets is the one a Submit of its own would have got:

- a batch is atomic on the owning shard, so when it is refused (a status that means nothing was
  written: invalid input, unknown pool, a full queue, ...) every request of it is sent again on
  its own (``RESEND_CONCURRENCY`` at a time) and gets its own precise answer;
- when the outcome is unknown (the shard unreachable, a timeout) every caller gets that error, as
  a lone forwarded Submit would, and nothing is retried (that could create tasks twice);
- a caller that gave up before its request left is dropped from the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from cronoq.proto import cronoq_pb2 as pb

__all__ = ["Route", "SubmitCoalescer"]

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

RESEND_CONCURRENCY = 16
"""Submits in flight at once when a refused batch is sent again one by one: all of a batch at once
could exceed what the peer lets one credential have in flight, and a Submit refused for that is not
the answer its own task deserves."""

StatusOf = Callable[[BaseException], "grpc.StatusCode | None"]


@dataclass(frozen=True, slots=True)
class Route:
    """Where one Submit goes: the peer shard, the caller's credentials and whatever the senders
    need to reach it (``target``, passed back to them untouched)."""

    shard: str
    authorization: str | None = field(repr=False)
    target: Any = field(repr=False, compare=False)

    def lane(self) -> tuple[str, bytes]:
        """The lane's name: the shard and a digest of the credentials."""
        credential = (self.authorization or "").encode("utf-8", "surrogatepass")
        return self.shard, hashlib.blake2b(credential, digest_size=16).digest()


SendOne = Callable[[Route, pb.SubmitRequest], Awaitable[pb.SubmitResponse]]
SendBatch = Callable[[Route, pb.SubmitBatchRequest], Awaitable[pb.SubmitBatchResponse]]

_Waiting = tuple[pb.SubmitRequest, "asyncio.Future[pb.SubmitResponse]", Route]


@dataclass(slots=True)
class _Lane:
    """Submits for one (peer, credentials): how many calls are in flight, and who waits."""

    in_flight: int = 0
    waiting: deque[_Waiting] = field(default_factory=deque)


class SubmitCoalescer:
    """Sends Submits through per-lane queues with ``send_one`` / ``send_batch``; see the module
    docstring."""

    def __init__(self, *, max_tasks: int, max_bytes: int, status_of: StatusOf, send_one: SendOne,
                 send_batch: SendBatch, calls_per_lane: int = 1) -> None:  # fmt: skip
        self.max_tasks = max(1, max_tasks)
        self.calls_per_lane = max(1, calls_per_lane)
        self.max_bytes = max(1, max_bytes)
        self._status_of = status_of
        self._send_one = send_one
        self._send_batch = send_batch
        self._lanes: dict[tuple[str, bytes], _Lane] = {}
        self._flushers: set[asyncio.Task[None]] = set()

    @property
    def lanes(self) -> int:
        """How many lanes exist now (each has a call in flight)."""
        return len(self._lanes)

    async def submit(self, route: Route, request: pb.SubmitRequest) -> pb.SubmitResponse:
        """``request`` answered through its route's lane."""
        name = route.lane()
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = _Lane()
        if lane.in_flight >= self.calls_per_lane:
            future: asyncio.Future[pb.SubmitResponse] = asyncio.get_running_loop().create_future()
            lane.waiting.append((request, future, route))
            return await future
        lane.in_flight += 1
        try:
            return await self._send_one(route, request)
        finally:
            self._after_send(name, lane)

    def _after_send(self, name: tuple[str, bytes], lane: _Lane) -> None:
        """A call of the lane returned: it carries the waiting Submits on, or is freed."""
        if not lane.waiting:
            self._release(name, lane)
            return
        flusher = asyncio.get_running_loop().create_task(self._flush(name, lane), name="cronoq-forward-batch")
        self._flushers.add(flusher)
        flusher.add_done_callback(self._flushers.discard)

    def _release(self, name: tuple[str, bytes], lane: _Lane) -> None:
        lane.in_flight -= 1
        if not lane.in_flight and not lane.waiting and self._lanes.get(name) is lane:
            del self._lanes[name]  # idle: nothing of it is kept

    async def _flush(self, name: tuple[str, bytes], lane: _Lane) -> None:
        group: list[_Waiting] = []
        try:
            while lane.waiting:
                group = self._take(lane)
                if len(group) == 1:
                    await self._answer_alone(*group[0])
                elif group:
                    await self._answer_together(group)
                group = []
        except asyncio.CancelledError:  # shutting down: nobody is left to answer these callers
            for _, future, _ in [*group, *lane.waiting]:
                future.cancel()
            lane.waiting.clear()
            raise
        finally:
            self._release(name, lane)

    def _take(self, lane: _Lane) -> list[_Waiting]:
        """The next requests to send, in arrival order, within the batch budget."""
        group: list[_Waiting] = []
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
                            route: Route) -> None:  # fmt: skip
        try:
            response = await self._send_one(route, request)
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(response)

    async def _answer_together(self, group: list[_Waiting]) -> None:
        batch = pb.SubmitBatchRequest(tasks=[request.task for request, _, _ in group])
        try:
            # Every route of a lane carries the same credentials: the first one's reach the peer.
            answer = await self._send_batch(group[0][2], batch)
        except Exception as exc:
            if self._status_of(exc) in REFUSED:  # nothing was written: let each find out why
                gate = asyncio.Semaphore(RESEND_CONCURRENCY)

                async def alone(waiting: _Waiting) -> None:
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
                future.set_exception(RuntimeError("the shard answered a batch with too few tasks"))

    async def close(self) -> None:
        for flusher in list(self._flushers):
            flusher.cancel()
        for flusher in list(self._flushers):
            with contextlib.suppress(BaseException):
                await flusher
