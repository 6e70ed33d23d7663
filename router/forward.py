"""Forwarded calls over one gRPC stream per peer shard: ``cronoq.v1.Peers/Forward``.

A grpc-aio unary call costs the forwarding node a few hundred microseconds of CPU and its caller
most of a millisecond, about as much as the call's own work. So each node keeps one long-lived
Forward stream to each peer shard it forwards to and sends its forwarded unary calls over it, with
the calls ready at each turn of the stream's writer in one message, and the answers coming back
the same way. Each call carries its caller's own ``authorization``, its time limit and trace
context; the peer authenticates, bounds and answers it as the same call made directly (see
``cronoq.server.forward``).

The stream is opened with the credentials of the call that needs it: the peer refuses a stream
without valid ones. When that refusal is about those credentials, only the calls that carry them
get it; the others open the stream with their own. Any other failure to open is the answer of
every call waiting for the stream (a peer that does not lead its shard says so as it would to a
direct call). A peer that does not have the method (an older version) is reached with unary calls
for a minute before the stream is tried again.

A stream that ends or breaks fails the calls still in flight on it as "outcome unknown"; the next
call opens a new one. A call not answered within its time limit plus ``ANSWER_GRACE_S`` raises
``TimeoutError``; when nothing at all came back on the stream meanwhile, the stream ends too (a
peer that silent is not trusted with the next calls).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import grpc
from cronoq.cluster.peers import Peer

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg

__all__ = [
    "ANSWER_GRACE_S",
    "FORWARD_METHODS",
    "ForwardStreams",
    "ForwardUnsupported",
    "OpenRefused",
    "StreamLost",
    "method_path",
    "status_code",
]

log = logging.getLogger("cronoq.router")

FORWARDED = "cronoq-forwarded"
ANSWER_GRACE_S = 1.0
"""How much longer than a call's time limit its answer is waited for (the peer bounds the call by
that limit and answers; only a peer that cannot answer at all leaves it to the forwarding side)."""
UNSUPPORTED_RETRY_S = 60.0
"""How long a peer without the Forward method is reached with unary calls before trying again."""
OPEN_TIMEOUT_S = 10.0
"""Longest an opening stream waits for the peer's answer before it is given up."""
BATCH_HEADROOM = 4096


@dataclass(frozen=True, slots=True)
class ForwardMethod:
    """A unary ``cronoq.v1`` method that may be forwarded."""

    service: str  # "tasks" or "admin", as the router names them
    name: str
    request: Any
    response: Any

    @property
    def path(self) -> str:
        return f"/cronoq.v1.{'Tasks' if self.service == 'tasks' else 'Admin'}/{self.name}"


FORWARD_METHODS: dict[str, ForwardMethod] = {
    method.path: method
    for method in (
        ForwardMethod("tasks", "Submit", pb.SubmitRequest, pb.SubmitResponse),
        ForwardMethod("tasks", "SubmitBatch", pb.SubmitBatchRequest, pb.SubmitBatchResponse),
        ForwardMethod("tasks", "Get", pb.GetRequest, pb.TaskInfo),
        ForwardMethod("tasks", "Wait", pb.WaitRequest, pb.TaskResult),
        ForwardMethod("tasks", "Cancel", pb.CancelRequest, pb.CancelResponse),
        ForwardMethod("tasks", "ListTasks", pb.ListTasksRequest, pb.ListTasksResponse),
        ForwardMethod("admin", "Snapshot", pb.Empty, pb.SnapshotResponse),
        ForwardMethod("admin", "AddRecurring", pb.RecurringRequest, pb.Empty),
        ForwardMethod("admin", "RemoveRecurring", pb.RemoveRecurringRequest, pb.RemoveRecurringResponse),
        ForwardMethod("admin", "ListWorkers", pb.Empty, pb.ListWorkersResponse),
        ForwardMethod("admin", "ListRecurring", pb.Empty, pb.ListRecurringResponse),
    )
}
"""The methods a Forward stream carries, by gRPC method path."""

_PATHS = {(method.service, method.name): path for path, method in FORWARD_METHODS.items()}
_STATUS_CODES = {status.value[0]: status for status in grpc.StatusCode}


def method_path(service: str, name: str) -> str:
    """``("tasks", "Submit")`` -> ``"/cronoq.v1.Tasks/Submit"``."""
    return _PATHS[(service, name)]


def status_code(number: int) -> grpc.StatusCode:
    """The gRPC status a reply's code stands for (UNKNOWN for numbers gRPC has not)."""
    return _STATUS_CODES.get(number, grpc.StatusCode.UNKNOWN)


class StreamLost(Exception):
    """The stream broke with the call in flight: its outcome at the peer is unknown."""


class ForwardUnsupported(Exception):
    """The call cannot travel in the stream (nothing was sent): use a unary call. The peer has no
    Forward method, or the request is too large to fit one message with its envelope."""


class OpenRefused(Exception):
    """The peer refused to open the stream (nothing was run): its status is the call's answer."""

    def __init__(self, code: grpc.StatusCode, details: str, metadata: tuple[tuple[str, str], ...],
                 authorization: str | None) -> None:  # fmt: skip
        super().__init__(details)
        self.code = code
        self.details = details
        self.metadata = metadata
        self.authorization = authorization


_CREDENTIAL_REFUSALS = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})

_Outgoing = tuple[int, str, bytes, str, float, str]
"""A call waiting for the writer: id, method path, request bytes, authorization, timeout, traceparent."""


class PeerStream:
    """One open Forward stream: calls in flight matched to replies by id."""

    def __init__(self, name: str, call: Any, max_message_bytes: int) -> None:
        self.name = name
        self._call = call
        self._limit = max(1, max_message_bytes - BATCH_HEADROOM)
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[pb.ForwardedReply]] = {}
        self._outbox: deque[_Outgoing | int] = deque()  # an int: cancel that call
        self._wake: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()
        self.heard = self._loop.time()
        """When the peer last sent anything on the stream."""
        self.alive = True
        self._tasks = (
            asyncio.ensure_future(self._write_loop()),
            asyncio.ensure_future(self._read_loop()),
        )

    async def call(self, path: str, request: bytes, authorization: str | None, traceparent: str | None,
                   timeout: float) -> pb.ForwardedReply:  # fmt: skip
        """Send one call and wait for its reply: ``StreamLost`` when the stream breaks first,
        ``TimeoutError`` past ``timeout + ANSWER_GRACE_S`` (see the module docstring)."""
        if not self.alive:
            raise StreamLost("stream closed")
        call_id = next(self._ids)
        waiter: asyncio.Future[pb.ForwardedReply] = self._loop.create_future()
        self._pending[call_id] = waiter
        sent = self._loop.time()
        self._send((call_id, path, request, authorization or "", timeout, traceparent or ""))
        try:
            async with asyncio.timeout(timeout + ANSWER_GRACE_S):
                return await waiter
        except TimeoutError:
            if self.heard <= sent:
                self.close(f"nothing heard for {timeout + ANSWER_GRACE_S:g} s")
            raise
        except asyncio.CancelledError:
            if self._pending.pop(call_id, None) is not None and self.alive:
                self._send(call_id)  # the peer stops it too
            raise
        finally:
            self._pending.pop(call_id, None)

    def _send(self, item: _Outgoing | int) -> None:
        self._outbox.append(item)
        wake, self._wake = self._wake, None
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _write_loop(self) -> None:
        outbox, write = self._outbox, self._call.write
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not outbox:
                    self._wake = loop.create_future()
                    await self._wake
                    continue
                # Everything ready now, in one message, within the size limit.
                message = pb.ForwardRequest()
                calls = message.calls
                size = 0
                while outbox and size < self._limit:
                    item = outbox.popleft()
                    if type(item) is int:
                        calls.add(id=item, cancel=True)
                        size += 16
                        continue
                    call_id, path, request, authorization, timeout, traceparent = item  # type: ignore[misc]
                    calls.add(id=call_id, method=path, request=request, authorization=authorization,
                              timeout_s=timeout, traceparent=traceparent)  # fmt: skip
                    size += len(request) + len(path) + len(authorization) + len(traceparent) + 32
                await write(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the calls sent cannot be answered any more
            self.close(f"write failed: {exc}")

    async def _read_loop(self) -> None:
        reason = "stream ended"
        try:
            while True:
                message = await self._call.read()
                if message is grpc.aio.EOF:
                    break
                self.heard = self._loop.time()
                pending = self._pending
                for reply in message.replies:
                    waiter = pending.pop(reply.id, None)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(reply)
        except grpc.aio.AioRpcError as exc:
            reason = f"{exc.code().name.lower()}: {exc.details() or 'stream failed'}"
        except asyncio.CancelledError:
            reason = "stream closed"
        finally:
            self._end(reason)

    def _end(self, reason: str) -> None:
        if not self.alive:
            return
        self.alive = False
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            if not waiter.done():
                waiter.set_exception(StreamLost(reason))
        log.info("forward stream to shard %s closed (%s)", self.name, reason)

    def close(self, reason: str = "closed") -> None:
        self._end(reason)
        self._call.cancel()
        for task in self._tasks:
            task.cancel()


@dataclass(slots=True)
class _PeerState:
    stream: PeerStream | None = None
    opening: asyncio.Task[PeerStream] | None = None
    opening_with: str | None = None
    unsupported_until: float = 0.0


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class ForwardStreams:
    """This node's Forward streams, one per peer shard, opened on demand."""

    def __init__(self, max_message_bytes: int) -> None:
        self._max_message_bytes = max_message_bytes
        self._peers: dict[str, _PeerState] = {}

    def supported(self, shard: str) -> bool:
        """False for a while after ``shard`` turned out not to have the Forward method."""
        state = self._peers.get(shard)
        return state is None or time.monotonic() >= state.unsupported_until

    async def call(self, peer: Peer, path: str, request: Any, authorization: str | None,
                   traceparent: str | None, timeout: float) -> pb.ForwardedReply:  # fmt: skip
        """``request`` (a message of method ``path``) answered by ``peer``. Raises ``OpenRefused``,
        ``ForwardUnsupported``, ``StreamLost`` or ``TimeoutError`` (see the module docstring)."""
        body = request.SerializeToString()
        if len(body) + len(path) + len(authorization or "") + len(traceparent or "") + 64 > self._max_message_bytes:
            raise ForwardUnsupported("too large for the stream")
        state = self._peers.get(peer.name)
        stream = state.stream if state is not None else None
        if stream is None or not stream.alive:
            async with asyncio.timeout(timeout + ANSWER_GRACE_S):
                stream = await self._stream(peer, authorization)
        return await stream.call(path, body, authorization, traceparent, timeout)

    async def _stream(self, peer: Peer, authorization: str | None) -> PeerStream:
        state = self._peers.setdefault(peer.name, _PeerState())
        while True:
            stream = state.stream
            if stream is not None and stream.alive:
                return stream
            if state.opening is None:
                opening = state.opening = asyncio.ensure_future(self._open(peer, state, authorization))
                opening.add_done_callback(_retrieve)  # its waiters may all have given up
                state.opening_with = authorization
            opener = state.opening_with
            try:
                return await asyncio.shield(state.opening)
            except OpenRefused as refused:
                if refused.code not in _CREDENTIAL_REFUSALS or opener == authorization:
                    raise
                # Another caller's credentials were refused: try with this caller's own.

    async def _open(self, peer: Peer, state: _PeerState, authorization: str | None) -> PeerStream:
        try:
            metadata = ((FORWARDED, "1"), ("authorization", authorization)) if authorization else ((FORWARDED, "1"),)
            call = pbg.PeersStub(peer.channel).Forward(metadata=metadata)  # type: ignore[no-untyped-call]
            # The peer answers with its headers once it accepted the stream's credentials.
            try:
                async with asyncio.timeout(OPEN_TIMEOUT_S):
                    await call.initial_metadata()
            except TimeoutError:
                call.cancel()
                raise StreamLost(f"no answer to opening the stream within {OPEN_TIMEOUT_S:g} s") from None
            if call.done():
                code = await call.code()
                details = await call.details() or ""
                trailing = tuple((str(k), v) for k, v in (await call.trailing_metadata() or ()) if isinstance(v, str))
                if code is grpc.StatusCode.UNIMPLEMENTED:
                    state.unsupported_until = time.monotonic() + UNSUPPORTED_RETRY_S
                    log.info("shard %s has no Forward stream; forwarding with unary calls", peer.name)
                    raise ForwardUnsupported(details)
                raise OpenRefused(code, details, trailing, authorization)
            stream = PeerStream(peer.name, call, self._max_message_bytes)
            state.stream = stream
            log.info("forward stream to shard %s open", peer.name)
            return stream
        finally:
            state.opening = None

    async def close(self) -> None:
        for state in self._peers.values():
            if state.opening is not None:
                state.opening.cancel()
                with contextlib.suppress(BaseException):
                    await state.opening
            if state.stream is not None:
                state.stream.close("node shutting down")
        self._peers.clear()
