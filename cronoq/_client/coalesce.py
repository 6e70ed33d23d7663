"""Producer-side coalescing: concurrent ``Client.submit`` calls leave together as ``SubmitBatch``.

A unary call costs both ends far more than the task it carries (on the server, a single Submit
costs several times the CPU of one task inside a batch of a hundred). A ``Client`` made with
``coalesce=True`` therefore keeps at most ``calls`` Submit or SubmitBatch calls in flight for its
single submits. A submit that finds one free is sent at once as a plain Submit, so an idle
producer waits for nothing; one that finds them all busy queues, and when a call returns, the
queued submits leave together as one SubmitBatch (up to ``max_tasks`` tasks and ``max_bytes``).

Each caller gets the answer its own Submit would have got (``cronoq._batching``, shared with the
router's coalescing of forwarded Submits): a batch refused with a status that means nothing was
written (invalid input, unknown pool, a full queue, a limit, ...) is sent again one Submit per
task; when the outcome is unknown every caller of the batch gets that error and nothing is
retried; a caller that gave up before its request left is dropped from the batch.

Only plain submits are merged: ``wait=True``, an explicit ``call_timeout`` and calls made inside
an OpenTelemetry span (whose trace context belongs to that one call) go alone as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from cronoq._batching import RESEND_CONCURRENCY, Lane, LaneBatcher
from cronoq._client.errors import ClientError
from cronoq.proto import cronoq_pb2 as pb

__all__ = ["REFUSED_CODES", "RESEND_CONCURRENCY", "SubmitCoalescer"]

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

SendOne = Callable[[pb.SubmitRequest], Awaitable[pb.SubmitResponse]]
SendBatch = Callable[[pb.SubmitBatchRequest], Awaitable[pb.SubmitBatchResponse]]


def _refused(exc: BaseException) -> bool:
    return isinstance(exc, ClientError) and exc.code in REFUSED_CODES


def _too_few() -> Exception:
    return ClientError("internal", "the server answered a batch with too few tasks")


class SubmitCoalescer:
    """Sends single submits through ``send_one`` / ``send_batch`` (see the module docstring).
    Bound to the event loop it is first used on."""

    def __init__(self, send_one: SendOne, send_batch: SendBatch, *, calls: int, max_tasks: int,
                 max_bytes: int) -> None:  # fmt: skip
        async def one(_: None, request: pb.SubmitRequest) -> pb.SubmitResponse:
            return await send_one(request)

        async def batch(_: None, request: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse:
            return await send_batch(request)

        self._lane: Lane[None] = Lane()
        self._batcher = LaneBatcher(
            send_one=one,
            send_batch=batch,
            refused=_refused,
            too_few=_too_few,
            calls=calls,
            max_tasks=max_tasks,
            max_bytes=max_bytes,
            task_name="cronoq-client-batch",
        )
        self.calls = self._batcher.calls
        self.max_tasks = self._batcher.max_tasks
        self.max_bytes = self._batcher.max_bytes

    @property
    def in_flight(self) -> int:
        """Calls of this coalescer in flight now."""
        return self._lane.in_flight

    @property
    def batches_sent(self) -> int:
        """SubmitBatch calls made for coalesced submits (for tests and benchmarks)."""
        return self._batcher.batches_sent

    async def submit(self, request: pb.SubmitRequest) -> pb.SubmitResponse:
        """``request`` answered as a Submit of its own would be."""
        return await self._batcher.submit(self._lane, None, request)

    async def close(self) -> None:
        """Stop sending: callers still queued are cancelled."""
        await self._batcher.close([self._lane])
