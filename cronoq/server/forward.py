"""The receiving end of ``cronoq.v1.Peers/Forward``: calls other nodes forward to this shard.

Internal to a cronoq cluster (``cronoq.router.forward`` is the sending end). A Forward stream is
opened with some caller's credentials and refused without valid ones (and by a standby, as every
call is). Each call in it is then handled as the same call made directly to this server, marked
forwarded (answered by this shard, never forwarded again):

- authenticated by its own ``authorization``, never by the stream's;
- bounded by the server's ``UnaryRunner`` (the in-flight limit, the time bound, the call's own
  time limit), inside the SERVER span the direct call would get when it carries a trace;
- answered with the status, message and ``cronoq-*`` metadata the direct call would end with
  (except an answer within a few bytes of ``max_message_bytes``, which no longer fits a message
  with its envelope: RESOURCE_EXHAUSTED, saying to call the shard directly).

Calls run concurrently; the answers ready at each turn of the writer leave in one message. A
stream holds at most ``MAX_OPEN_CALLS`` calls whose answers are not yet written, and stops reading
while it does (or while more than two messages' worth of answers wait for a peer that does not
read them), so gRPC's flow control holds the sender back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from cronoq.router import UNAVAILABLE_SHARDS_KEY, Router
from cronoq.router.forward import BATCH_HEADROOM, FORWARD_METHODS

from . import telemetry
from .auth import Authenticator, Principal
from .errors import ApiError, Code, from_exception
from .unary import UnaryRunner
from .work_stream import abort_call

__all__ = ["MAX_OPEN_CALLS", "ForwardService"]

log = logging.getLogger("cronoq.server")

MAX_OPEN_CALLS = 256
"""Calls of one stream running or waiting for their answer to be written."""

Handler = Callable[[Any, Any], Awaitable[Any]]


def _handler_name(method: str) -> str:
    """The router's name for a ``cronoq.v1`` method: ``SubmitBatch`` -> ``submit_batch``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", method).lower()


class ForwardService(pbg.PeersServicer):
    """The Peers service of one listener."""

    def __init__(
        self,
        router: Router,
        authenticator: Authenticator,
        unary: UnaryRunner,
        principal_of: Callable[[Any], Principal],
        max_message_bytes: int,
    ) -> None:
        self.auth = authenticator
        self.unary = unary
        self._principal_of = principal_of
        self.max_reply_bytes = max(1, max_message_bytes - BATCH_HEADROOM)
        self.max_message_bytes = max_message_bytes
        self.handlers: dict[str, Handler] = {
            path: getattr(router, _handler_name(method.name)) for path, method in FORWARD_METHODS.items()
        }

    def add_to(self, server: grpc.aio.Server) -> None:
        from .grpc_service import register_services  # malformed messages end the stream, INVALID_ARGUMENT

        register_services(server, pb, self, ("Peers",))

    async def Forward(self, request_iterator: Any, context: Any) -> None:
        slot = contextlib.ExitStack()
        try:
            principal = self._principal_of(context)  # the stream's own credentials (and a standby refuses)
            slot.enter_context(self.unary.streams.hold(principal, "Forward"))  # limits.max_streams_per_caller
        except ApiError as error:
            await abort_call(context, error)
            return
        with slot:
            await context.send_initial_metadata(())
            malformed = await _ForwardStream(self, context).run()
        if malformed is not None:
            await abort_call(context, malformed)

    async def answer(self, call: pb.ForwardedCall) -> pb.ForwardedReply:
        """The reply to one forwarded call (never raises for the call's own failures)."""
        handler = self.handlers.get(call.method)
        method = FORWARD_METHODS.get(call.method)
        reply = pb.ForwardedReply(id=call.id)
        if handler is None or method is None:
            reply.code = Code.UNIMPLEMENTED.grpc.value[0]
            reply.message = "this method cannot be forwarded"
            return reply
        timeout = call.timeout_s if math.isfinite(call.timeout_s) and call.timeout_s > 0 else None
        with telemetry.forwarded_call_span(call.method, call.traceparent) as record:
            try:
                principal = self.auth.authenticate(call.authorization or None).as_forwarded()
                try:
                    request = method.request.FromString(call.request)
                except DecodeError:
                    raise ApiError.invalid(f"malformed {method.name} request") from None
                response, missing = await self.unary.run(principal, handler, request, deadline=timeout)
            except Exception as exc:
                error = from_exception(exc)
                reply.code = error.code.grpc.value[0]
                reply.message = error.message
                reply.metadata.update(error.metadata)
                record(error.code.grpc, error.message)
                return reply
            record(grpc.StatusCode.OK, "")
        if missing:
            reply.metadata[UNAVAILABLE_SHARDS_KEY] = ",".join(missing)
        reply.response = response.SerializeToString()
        if reply.ByteSize() + 16 > self.max_message_bytes:  # it would not fit a message of the stream
            reply.Clear()
            reply.id = call.id
            reply.code = Code.RESOURCE_EXHAUSTED.grpc.value[0]
            reply.message = "the answer is too large to forward; call the shard's endpoint"
        return reply


class _ForwardStream:
    """One Forward stream: its calls in flight and the answers waiting to be written.

    There is no writer task: the call whose answer finds nobody writing writes it itself, at once,
    together with every answer that is ready by then, and keeps writing while more answers wait
    (so under load each write carries what came in during the previous one). Handing the answer
    to a separate task would put it behind whatever else the same step woke, such as the leases
    going to workers.
    """

    def __init__(self, service: ForwardService, context: Any) -> None:
        self.service = service
        self.context = context
        self.running: dict[int, asyncio.Task[None]] = {}
        self.answers: deque[tuple[pb.ForwardedReply, int]] = deque()  # with its size
        self.answer_bytes = 0
        self.open_calls = 0
        self.writer: asyncio.Task[Any] | None = None
        """The task writing answers now, if any."""
        self._room: asyncio.Future[None] | None = None
        self._write_failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def run(self) -> ApiError | None:
        """Serve the stream until it ends; the error to end it with when a message was malformed."""
        reader = asyncio.ensure_future(self._read_loop())
        try:
            # The reader ends with the stream; a failed write ends it too.
            await asyncio.wait({reader, self._write_failed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            tasks = [reader, *self.running.values()]
            if self.writer is not None:
                tasks.append(self.writer)
            for task in tasks:
                task.cancel()  # nobody is left to answer (as gRPC cancels a cancelled call's handler)
            await asyncio.gather(*tasks, return_exceptions=True)
        failure = reader.exception() if reader.done() and not reader.cancelled() else None
        return failure if isinstance(failure, ApiError) else None

    async def _read_loop(self) -> None:
        read, eof = self.context.read, grpc.aio.EOF
        limit = self.service.max_reply_bytes * 2
        while True:
            while self.open_calls >= MAX_OPEN_CALLS or self.answer_bytes > limit:
                self._room = asyncio.get_running_loop().create_future()
                await self._room
            message = await read()
            if message is eof:
                break
            for call in message.calls:
                if call.cancel:
                    task = self.running.get(call.id)
                    if task is not None:
                        task.cancel()
                elif call.id not in self.running:
                    self.open_calls += 1
                    task = asyncio.ensure_future(self._run_call(call))
                    self.running[call.id] = task
        # The forwarding node closed its side: answer what is still running, then end.
        while self.open_calls:
            self._room = asyncio.get_running_loop().create_future()
            await self._room

    async def _run_call(self, call: pb.ForwardedCall) -> None:
        try:
            reply = await self.service.answer(call)
        except asyncio.CancelledError:
            self.open_calls -= 1
            self._make_room()
            raise
        finally:
            self.running.pop(call.id, None)
        size = reply.ByteSize() + 8
        self.answers.append((reply, size))
        self.answer_bytes += size
        if self.writer is None and not self._write_failed.done():
            self.writer = asyncio.current_task()
            try:
                await self._write_answers()
            finally:
                self.writer = None

    def _make_room(self) -> None:
        waiter = self._room
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _write_answers(self) -> None:
        """Write answers until none waits: those ready at each turn in one message within the limit."""
        answers, write = self.answers, self.context.write
        limit = self.service.max_reply_bytes
        try:
            while answers:
                message = pb.ForwardResponse()
                replies = message.replies
                size = written = 0
                while answers and (not written or size + answers[0][1] <= limit):
                    reply, reply_size = answers.popleft()
                    replies.append(reply)
                    size += reply_size
                    written += 1
                await write(message)
                self.answer_bytes -= size
                self.open_calls -= written
                self._make_room()
        except asyncio.CancelledError:
            raise
        except Exception:  # the stream cannot carry answers any more: end it
            if not self._write_failed.done():
                self._write_failed.set_result(None)
