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

The answer each caller gets is the one a Submit of its own would have got (``cronoq._batching``,
shared with the client's producer-side coalescing): a batch refused with a status that means
nothing was written is sent again one Submit per task; when the outcome is unknown (the shard
unreachable, a timeout) every caller gets that error and nothing is retried; a caller that gave up
before its request left is dropped from the batch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from cronoq._batching import RESEND_CONCURRENCY, Lane, LaneBatcher
from cronoq.proto import cronoq_pb2 as pb

__all__ = ["REFUSED", "RESEND_CONCURRENCY", "Route", "SubmitCoalescer"]

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


def _too_few() -> Exception:
    return RuntimeError("the shard answered a batch with too few tasks")


class SubmitCoalescer:
    """Sends Submits through per-lane queues with ``send_one`` / ``send_batch``; see the module
    docstring."""

    def __init__(self, *, max_tasks: int, max_bytes: int, status_of: StatusOf, send_one: SendOne,
                 send_batch: SendBatch, calls_per_lane: int = 1) -> None:  # fmt: skip
        def refused(exc: BaseException) -> bool:
            return status_of(exc) in REFUSED

        self._lanes: dict[tuple[str, bytes], Lane[Route]] = {}
        self._batcher = LaneBatcher(send_one=send_one, send_batch=send_batch, refused=refused, too_few=_too_few,
                                    calls=calls_per_lane, max_tasks=max_tasks, max_bytes=max_bytes, idle=self._drop,
                                    task_name="cronoq-forward-batch")  # fmt: skip
        self.max_tasks = self._batcher.max_tasks
        self.max_bytes = self._batcher.max_bytes
        self.calls_per_lane = self._batcher.calls

    @property
    def lanes(self) -> int:
        """How many lanes exist now (each has a call in flight)."""
        return len(self._lanes)

    async def submit(self, route: Route, request: pb.SubmitRequest) -> pb.SubmitResponse:
        """``request`` answered through its route's lane."""
        name = route.lane()
        lane = self._lanes.get(name)
        if lane is None:
            lane = self._lanes[name] = Lane(name)
        return await self._batcher.submit(lane, route, request)

    def _drop(self, lane: Lane[Route]) -> None:
        """An idle lane: nothing of it is kept."""
        name = lane.key
        if isinstance(name, tuple) and self._lanes.get(name) is lane:
            del self._lanes[name]

    async def close(self) -> None:
        await self._batcher.close(list(self._lanes.values()))
