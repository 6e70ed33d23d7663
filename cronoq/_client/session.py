"""One Work stream of a Worker: batching of outgoing reports, heartbeats, running leases."""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from cronoq._client.common import log
from cronoq._client.results import Lease
from cronoq.proto import cronoq_pb2 as pb


def _batch_tag(field: str) -> bytes:
    """The tag of ``WorkerBatch.<field>`` entries (a length-delimited field, number below 16)."""
    number = pb.WorkerBatch.DESCRIPTOR.fields_by_name[field].number
    return bytes([number << 3 | 2])


_BATCHED = {
    "heartbeat": _batch_tag("heartbeats"),
    "complete": _batch_tag("completes"),
    "fail": _batch_tag("fails"),
    "nack": _batch_tag("nacks"),
    "cancelled": _batch_tag("cancelled"),
}
"""The WorkerMessage kinds a batch carries, and the tag of their field in ``WorkerBatch``."""
_BATCH_FIELD_TAG = bytes([pb.WorkerMessage.DESCRIPTOR.fields_by_name["batch"].number << 3 | 2])


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def serialize_outgoing(message: pb.WorkerMessage | bytes) -> bytes:
    """What the Work stream sends: a message, or a batch already encoded (``WorkSession._batch``)."""
    return message if type(message) is bytes else message.SerializeToString()  # type: ignore[union-attr]


@dataclass(eq=False, slots=True)
class RunningLease:
    """A lease being served: its handler task and why we cancelled it (None: we did not).

    ``serial`` tells this record apart from any later one for the same lease id."""

    lease: Lease
    serial: int
    task: asyncio.Task[None] | None = None
    stopped_by: str | None = None
    error: BaseException | None = None  # what the handler raised, for the attempt's span


# Leases due for a heartbeat a little early are beaten now rather than re-arming the timer for
# a sliver of time (event loops may fire a timer up to their clock resolution early).
_BEAT_EARLY_S = 0.001


class Heartbeats:
    """The heartbeats of one stream's leases, driven by a single loop timer.

    A timer task per lease costs a task, a timer and a cancellation for every lease even when the
    handler finishes long before its first beat is due. Here a lease costs one heap entry: the
    timer fires for the earliest due beat, sends the beats of leases still running and schedules
    their next ones; entries of leases that ended are dropped when they come up (or compacted).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        send: Callable[[pb.WorkerMessage], None],
        still_running: Callable[[int, int], bool],
    ) -> None:
        self._loop = loop
        self._send = send
        self._still_running = still_running
        self._due: list[tuple[float, int, int, float]] = []  # (when, serial, lease id, period)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def add(self, lease_id: int, serial: int, period: float, running: int) -> None:
        """Beat ``lease_id`` every ``period`` seconds from one period on, while it still runs."""
        due = self._due
        if len(due) > 4 * running + 1024:
            # Many ended leases wait in the heap for a beat they will not get: drop them now.
            due[:] = [entry for entry in due if self._still_running(entry[2], entry[1])]
            heapq.heapify(due)
        when = self._loop.time() + period
        heapq.heappush(due, (when, serial, lease_id, period))
        if when < self._timer_at:
            self._arm(when)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = math.inf
        self._due.clear()

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._fire)
        self._timer_at = when

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = math.inf
        due = self._due
        now = self._loop.time()
        while due and due[0][0] <= now + _BEAT_EARLY_S:
            _, serial, lease_id, period = heapq.heappop(due)
            if self._still_running(lease_id, serial):
                self._send(pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=lease_id)))
                heapq.heappush(due, (now + period, serial, lease_id, period))
        if due:
            self._arm(due[0][0])


class SessionEnd(NamedTuple):
    reason: str
    shutdown: bool
    not_leader: bool


class WorkSession:
    """One ``Work`` stream: the call, an outbox drained by a single writer task, and its state.

    Once the server said ``batching``, ``batch_limit`` is set and the writer sends what the outbox
    holds at each turn (outcomes and heartbeats) as one ``WorkerMessage.batch``, up to that many
    bytes; it never waits for more to come."""

    def __init__(self, call: Any, still_running: Callable[[int, int], bool]) -> None:
        self.call = call
        self.batch_limit = 0
        # A plain deque and one wake-up future: an outcome costs an append, and the writer is woken
        # only when it sleeps on an empty outbox (``None`` in the outbox ends the writes).
        self.outbox: deque[pb.WorkerMessage | None] = deque()
        self._writer_idle: asyncio.Future[None] | None = None
        self.registered = False
        self.writes_open = True
        self.cancelled_locally = False
        self.closed = asyncio.Event()
        self.heartbeats = Heartbeats(asyncio.get_running_loop(), self.send, still_running)

    def _put(self, item: pb.WorkerMessage | None) -> None:
        self.outbox.append(item)
        idle = self._writer_idle
        if idle is not None:
            self._writer_idle = None
            if not idle.done():
                idle.set_result(None)

    def send(self, message: pb.WorkerMessage) -> None:
        if self.writes_open:
            self._put(message)

    def close_writes(self) -> None:
        if self.writes_open:
            self.writes_open = False
            self._put(None)

    def cancel(self) -> None:
        self.cancelled_locally = True
        self.writes_open = False
        self.call.cancel()

    async def write_loop(self) -> None:
        outbox = self.outbox
        write = self.call.write
        loop = asyncio.get_running_loop()
        try:
            while True:
                # Write what is queued back to back; sleep only on an empty outbox.
                if not outbox:
                    idle = self._writer_idle = loop.create_future()
                    await idle
                    continue
                message = outbox.popleft()
                if message is None:
                    await self.call.done_writing()
                    return
                if self.batch_limit and outbox and message.WhichOneof("msg") in _BATCHED:
                    await write(self._batch(message))
                else:
                    await write(message)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the reader sees the stream's final status
            log.debug("work stream write ended: %r", e)
            self.writes_open = False

    def _batch(self, first: pb.WorkerMessage) -> bytes:
        """``first`` and the reports queued behind it, as one encoded ``WorkerMessage.batch``
        within ``batch_limit``.

        Encoded by hand because copying each report into a WorkerBatch costs several times what
        encoding it does: a WorkerMessage holding one report encodes as ``<its field's tag>
        <length><report>``, and the same report as an entry of WorkerBatch's repeated field as
        ``<that field's tag><length><report>``; only the first byte differs (tags below 16)."""
        outbox = self.outbox
        parts: list[bytes] = []
        message = first
        kind = first.WhichOneof("msg")
        size = 0
        while True:
            data = message.SerializeToString()
            parts.append(_BATCHED[kind])
            parts.append(data[1:])
            size += len(data)
            following = outbox[0] if outbox else None
            if following is None or size >= self.batch_limit:
                break
            kind = following.WhichOneof("msg")
            if kind not in _BATCHED:
                break
            message = outbox.popleft()  # type: ignore[assignment]  # a report: ``None`` is no kind of ours
        body = b"".join(parts)
        return _BATCH_FIELD_TAG + _varint(len(body)) + body
