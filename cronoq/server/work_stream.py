"""The ``Workers.Work`` stream: worker protocol 3 over the shard service's worker sessions.

Register first (within ``REGISTER_TIMEOUT_S``), then leases, aborts and a final Shutdown flow out
of the session's bounded outbound queue while heartbeats and outcomes flow in. A lease's outcome
counts only while the stream still holds the lease; anything later is ignored. When the stream
ends for any reason the leases it held fail as retryable.

**Batching.** A grpc-aio message costs each side about a tenth of a millisecond of CPU, as much
as the rest of a task's handling. A worker that announces ``Register.batch_bytes`` (``cronoq.client``
workers do; published workers never do, and get exactly one lease per message) is told
``Registered.batching`` and from then on gets what the queue holds at each turn of the writer as
one ``ServerMessage.batch`` (leases, then aborts), no larger than the smaller of its
``batch_bytes`` and the server's ``max_message_bytes``; it may report several outcomes and
heartbeats in one ``WorkerMessage.batch``. Nothing waits for a batch to fill: under light load a
batch holds one lease and leaves at once; under load the leases that queued while the previous
message was being written leave together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc

from cronoq.config import Role
from cronoq.engine import Failure, Outcome, Success
from cronoq.proto import cronoq_pb2 as pb
from cronoq.shard.blob import Blob
from cronoq.shard.service import CANCELLED_BY_WORKER, PROTOCOL_VERSION, ShardService
from cronoq.shard.workers import AbortOut, ClosedOut, LeaseOut, Outbound, ShutdownOut, WorkerSession

from . import convert
from .api import Api
from .auth import Principal
from .errors import ApiError, Code, from_exception
from .unary import StreamSlots

__all__ = ["BATCH_HEADROOM", "REGISTER_TIMEOUT_S", "SHUTDOWN_LINGER_S", "WorkStreams"]

log = logging.getLogger("cronoq.server")

REGISTER_TIMEOUT_S = 10.0
"""A Work stream must send Register within this long."""
SHUTDOWN_LINGER_S = 1.0
"""After Shutdown, how long a Work stream stays open for the worker to close it."""
BATCH_HEADROOM = 4096
"""Bytes a batch leaves unused below its limit, for the framing around its leases."""
_NO_OUTPUT = Success(Blob(b"", ""))
"""The outcome of every completion without output or content type (most of them): immutable,
so one instance serves them all instead of three new objects per task."""

PrincipalOf = Callable[[Any], Principal]


async def abort_call(context: Any, error: ApiError) -> Any:
    """End a gRPC call with ``error``'s status, message and metadata."""
    if error.metadata:
        await context.abort(error.code.grpc, error.message, trailing_metadata=error.metadata)
    await context.abort(error.code.grpc, error.message)


class WorkStreams:
    """Accepts Work streams for the shard this server leads."""

    def __init__(self, api: Api, principal_of: PrincipalOf, streams: StreamSlots | None = None) -> None:
        self.api = api
        self.limits = api.limits
        self._principal_of = principal_of
        self.streams = streams if streams is not None else StreamSlots(api.limits.max_streams_per_caller)

    async def serve(self, context: Any) -> None:
        """One Work stream, from its Register to its end."""
        slot = contextlib.ExitStack()
        try:
            # Credentials decide first, but a refusal is reported only after the worker's
            # Register has been read: ending the call while the client is still writing its first
            # message can surface on the client as an INTERNAL error instead of our status.
            refusal: ApiError | None = None
            try:
                principal = self._principal_of(context)
                principal.require(Role.WORKER)
                self.api.current()
            except ApiError as error:
                refusal = error
            try:
                first = await asyncio.wait_for(context.read(), REGISTER_TIMEOUT_S)
            except TimeoutError:
                raise refusal or ApiError(
                    Code.DEADLINE_EXCEEDED, f"no Register message within {REGISTER_TIMEOUT_S:g} s"
                ) from None
            except ApiError as unreadable:  # a malformed first message; credentials still come first
                raise refusal or unreadable from None
            if refusal is not None:
                raise refusal
            if first is grpc.aio.EOF:
                return
            if first.WhichOneof("msg") != "register":
                raise ApiError.invalid("the first message of a Work stream must be Register")
            # One of the caller's stream slots (limits.max_streams_per_caller) until the stream ends.
            slot.enter_context(self.streams.hold(principal, "Work"))
            service, session = self._register(principal, first.register)
        except ApiError as error:
            slot.close()
            await abort_call(context, error)
            return
        except BaseException:
            slot.close()
            raise
        with slot:
            batch_limit = 0
            if first.register.batch_bytes:
                # At least one lease per message whatever the worker says (a lease goes alone as before).
                batch_limit = max(1, min(first.register.batch_bytes, self.limits.max_message_bytes) - BATCH_HEADROOM)
            await _WorkStream(self, service, session, context, batch_limit).run()

    def _check_register(self, principal: Principal, register: pb.Register) -> tuple[str, int, str, dict[str, str]]:
        """``(pool, granted slots, name, labels)`` of an acceptable Register; ApiError otherwise."""
        if register.protocol_version < PROTOCOL_VERSION:
            raise ApiError(
                Code.FAILED_PRECONDITION,
                f"worker protocol {register.protocol_version} is too old; this server needs protocol "
                f"{PROTOCOL_VERSION}",
            )
        pool = register.pool or self.api.default_pool
        convert.text(pool, "pool")
        self.api.check_pool(principal, pool)
        labels = dict(register.labels)
        for name, value in labels.items():
            convert.text(name, "label name", self.limits.max_tag_len)
            convert.text(value, "label value", self.limits.max_tag_len)
        principal.check_labels(labels)
        name = convert.text(register.worker_name, "worker_name", self.limits.max_key_len)
        if register.slots < 1:
            raise ApiError.invalid("a worker needs at least one slot")
        section = self.api.config.pool(pool)
        return pool, min(register.slots, section.slots_cap(self.limits)), name, labels

    def _register(self, principal: Principal, register: pb.Register) -> tuple[ShardService, WorkerSession]:
        pool, granted, name, labels = self._check_register(principal, register)
        service = self.api.current()
        try:
            session = service.register_worker(pool, granted, name, labels, register.protocol_version)
        except Exception as exc:
            raise from_exception(exc) from exc
        log.info(
            "worker %d (%s, %s) registered for pool %s: %d slots granted of %d requested%s",
            session.id,
            name or "unnamed",
            principal.name,
            pool,
            granted,
            register.slots,
            ", batching" if register.batch_bytes else "",
        )
        return service, session


class _WorkStream:
    """One registered Work stream. ``batch_limit`` > 0: the worker takes batches of that many bytes."""

    def __init__(
        self, streams: WorkStreams, service: ShardService, session: WorkerSession, context: Any, batch_limit: int
    ) -> None:
        self.streams = streams
        self.service = service
        self.session = session
        self.context = context
        self.batching = batch_limit != 0
        self.batch_limit = batch_limit
        section = streams.api.config.pool(session.pool)
        self.slots_cap = section.slots_cap(streams.limits)
        self.lease_ttl_s = section.lease_ttl_s
        # What the stream carried, for its last log line: how well batching worked.
        self.leases_out = self.messages_out = self.reports_in = self.messages_in = 0

    async def run(self) -> None:
        session, context = self.session, self.context
        reason = "worker disconnected"
        error: ApiError | None = None
        writer: asyncio.Task[str] | None = None
        reader: asyncio.Task[str] | None = None
        try:
            registered = pb.Registered(
                worker_id=session.id,
                lease_ttl_s=self.lease_ttl_s,
                slots=session.slots,
                protocol_version=PROTOCOL_VERSION,
                max_message_bytes=self.streams.limits.max_message_bytes,
                batching=self.batching,
            )
            await context.write(pb.ServerMessage(registered=registered))
            writer = asyncio.ensure_future(self._write_batches() if self.batching else self._write())
            reader = asyncio.ensure_future(self._read())
            done, _ = await asyncio.wait({writer, reader}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                failure = reader.exception()
                if isinstance(failure, ApiError):  # a malformed message (the deserializer refused it)
                    reason, error = "malformed message", failure
                elif failure is None and reader.result() == "second register":
                    reason = "second register"
                    error = ApiError.invalid("a second Register ends the stream")
            elif writer.exception() is None:
                if writer.result() == "shutdown":
                    # Give the worker a moment to close its side, then end the call.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(reader), SHUTDOWN_LINGER_S)
                    reason = "server shutting down"
                else:
                    ended_by = session.ended_by
                    reason = ended_by.value if ended_by is not None else "worker stopped reading its stream"
                    error = ApiError(Code.UNAVAILABLE, f"disconnected: {reason}")
        finally:
            # No read or write may be in flight when the call's status goes out.
            pending = [task for task in (writer, reader) if task is not None]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self.service.unregister_worker(session, reason)
            log.info(
                "work stream of worker %d ended: %d leases in %d messages, %d reports in %d messages",
                session.id,
                self.leases_out,
                self.messages_out,
                self.reports_in,
                self.messages_in,
            )
        if error is not None:
            await abort_call(context, error)

    async def _next(self) -> Outbound | None:
        """The next outbound item, waiting only when the queue is empty; None once the session is
        closed and drained. Closing the session wakes a waiting writer (``WorkerSession.close``)."""
        queue = self.session.outbound
        try:
            return queue.get_nowait()
        except asyncio.QueueEmpty:
            if self.session.closed:
                return None
            return await queue.get()

    async def _write(self) -> str:
        """One message per lease: the published protocol."""
        write = self.context.write
        lease_message = convert.lease_server_message
        while True:
            out = await self._next()
            if out is None:
                return "closed"
            if type(out) is LeaseOut:  # by far the most frequent
                self.leases_out += 1
                self.messages_out += 1
                await write(lease_message(out.lease))
            elif isinstance(out, AbortOut):
                await write(pb.ServerMessage(abort=pb.Abort(lease=out.lease_id, reason=out.reason)))
            elif isinstance(out, ShutdownOut):
                await _write_shutdown(write, out)
                return "shutdown"

    async def _write_batches(self) -> str:
        """Everything queued at each turn as one batch (see the module docstring)."""
        write = self.context.write
        queue = self.session.outbound
        fill_lease = convert.fill_lease
        limit = self.batch_limit
        out = await self._next()
        while out is not None:
            if isinstance(out, ShutdownOut):
                await _write_shutdown(write, out)
                return "shutdown"
            if isinstance(out, ClosedOut):
                out = await self._next()
                continue
            message = pb.ServerMessage()
            batch = message.batch
            size = 0
            # Take what is queued now, without waiting, until the batch is full.
            while type(out) is LeaseOut or type(out) is AbortOut:
                if isinstance(out, LeaseOut):
                    lease = batch.leases.add()
                    # An upper bound from fill_lease: ByteSize() per lease cost a third as much again.
                    grown = size + fill_lease(lease, out.lease) + 8
                    if grown > limit and size:
                        # Past what the worker takes (a lease bigger than the headroom): it goes
                        # first in the next message. A lease alone is sent whatever its size.
                        del batch.leases[-1]
                        break
                else:
                    abort = batch.aborts.add(lease=out.lease_id, reason=out.reason)
                    grown = size + abort.ByteSize() + 8
                size = grown
                if size >= limit:
                    out = None
                    break
                try:
                    out = queue.get_nowait()
                except asyncio.QueueEmpty:
                    out = None
            self.leases_out += len(batch.leases)
            self.messages_out += 1
            await write(message)
            if out is None:
                out = await self._next()
        return "closed"

    async def _read(self) -> str:
        session, read = self.session, self.context.read
        eof = grpc.aio.EOF
        while True:
            message = await read()
            if message is eof:
                return "worker closed the stream"
            kind = message.WhichOneof("msg")
            self.messages_in += 1
            # Outcomes and heartbeats first: they are nearly all of a busy stream's traffic.
            if kind == "batch":
                self._batch(message.batch)
            elif kind == "complete":
                self.reports_in += 1
                self._complete(message.complete)
            elif kind == "heartbeat":
                lease = message.heartbeat.lease
                if lease in session.running:
                    self.service.worker_heartbeat(session, lease)
            elif kind == "fail":
                self._fail(message.fail)
            elif kind == "cancelled":
                self._cancelled(message.cancelled.lease)
            elif kind == "nack":
                self._nack(message.nack)
            elif kind == "set_slots":
                slots = min(message.set_slots.slots, self.slots_cap)
                self.service.set_worker_slots(session, slots)
                log.info("worker %d now has %d slots", session.id, slots)
            elif kind == "register":
                return "second register"

    def _batch(self, batch: pb.WorkerBatch) -> None:
        session, service = self.session, self.service
        running = session.running
        self.reports_in += len(batch.completes) + len(batch.fails) + len(batch.heartbeats)
        for beat in batch.heartbeats:
            if beat.lease in running:
                service.worker_heartbeat(session, beat.lease)
        # The outcomes of the message go to the shard together (one engine command), in order;
        # the shard skips those of leases the stream no longer holds.
        reports: list[tuple[int, Outcome]] = [
            (done.lease, Success(_output(done)) if done.output or done.content_type else _NO_OUTPUT)
            for done in batch.completes
        ]
        for fail in batch.fails:
            reports.append((fail.lease, _failure(fail)))
        for cancelled in batch.cancelled:
            reports.append((cancelled.lease, CANCELLED_BY_WORKER))
        if reports:
            service.worker_reports(session, reports)
        for nack in batch.nacks:
            self._nack(nack)

    def _complete(self, done: pb.Complete) -> None:
        if done.lease in self.session.running:
            self.service.worker_complete(self.session, done.lease, _output(done))

    def _fail(self, fail: pb.Fail) -> None:
        if fail.lease in self.session.running:
            failure = _failure(fail)
            self.service.worker_fail(self.session, fail.lease, failure.message, failure.permanent, failure.retry_after)

    def _cancelled(self, lease: int) -> None:
        if lease in self.session.running:
            self.service.worker_cancelled(self.session, lease)

    def _nack(self, nack: pb.Nack) -> None:
        self.service.worker_nack(self.session, nack.lease, convert.sanitize_message(nack.reason))


async def _write_shutdown(write: Callable[[pb.ServerMessage], Any], out: ShutdownOut) -> None:
    await write(pb.ServerMessage(shutdown=pb.Shutdown(reason=out.reason, not_leader=out.not_leader)))


def _output(done: pb.Complete) -> Blob:
    content_type = done.content_type
    if content_type:
        content_type = convert.sanitize_message(content_type)[: convert.MAX_CONTENT_TYPE_LEN]
    return Blob(bytes(done.output), content_type)


def _failure(fail: pb.Fail) -> Failure:
    return Failure(convert.sanitize_message(fail.message), fail.permanent, _retry_after(fail))


def _retry_after(fail: pb.Fail) -> int | None:
    if not fail.HasField("retry_after_s"):
        return None
    try:
        return convert.duration_ns(fail.retry_after_s, "retry_after_s")
    except ApiError:
        return None  # a nonsensical hint is dropped rather than failing the stream
