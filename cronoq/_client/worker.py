"""``Worker``: serve a pool over the Work stream, reconnecting and following shard redirects."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import grpc.aio

from cronoq._client.channel import (
    auth_metadata,
    check_redirect,
    open_channel,
    receive_limit,
    redirect_endpoint,
    wants_tls,
    with_keepalive,
)
from cronoq._client.common import GRPC_DEFAULT_RECEIVE, PROTOCOL_VERSION, log
from cronoq._client.encoding import encode_value, str_map
from cronoq._client.errors import FATAL_CODES, CancelTask, ClientError, Reject
from cronoq._client.results import Handler, Lease
from cronoq._client.session import RunningLease, SessionEnd, WorkSession, serialize_outgoing
from cronoq._client.tracing import SPAN_NAME, TRACEPARENT, attempt_tracer, propagate_api
from cronoq.errors import Permanent, Retryable
from cronoq.proto import cronoq_pb2 as pb

_REDIRECT_ONLY_OPTIONS = frozenset({"grpc.ssl_target_name_override", "grpc.default_authority"})
_OUTPUT_HEADROOM = 1024
_CLOSE_WAIT_S = 5.0
_SESSION_RESET_FACTOR = 10.0
_CLOSED_BY_SERVER = "stream closed by the server"
_BATCH_HEADROOM = 4096
"""Bytes a batch of outcomes leaves unused below the server's message limit."""
_WORK_METHOD = "/cronoq.v1.Workers/Work"


def heartbeat_interval(lease_ttl: float | None, registered_ttl: float | None) -> float | None:
    """Seconds between heartbeats of one lease, or None when no TTL is known (no heartbeats).

    The lease's own TTL wins when present and non-zero, else the TTL from ``Registered``.
    """
    ttl = lease_ttl if lease_ttl else registered_ttl
    if not ttl or ttl <= 0:
        return None
    return max(ttl / 3.0, 0.01)


class Worker:
    """Serve a pool of a cronoq server: run ``handler(lease)`` for each lease, up to ``slots`` at once.

    ``await worker.run()`` serves until ``await worker.stop()`` or an error retrying cannot fix
    (raised as ``ClientError``). Lost connections are retried with exponential ``backoff``
    ``(initial, max)`` seconds unless ``reconnect=False``.

    ``link`` is accepted for compatibility with the cronoq version that had worker links, and
    ignored (with a DeprecationWarning): the Work stream batches over gRPC instead.
    """

    def __init__(
        self,
        target: str,
        pool: str,
        handler: Handler,
        *,
        slots: int = 1,
        token: str | None = None,
        name: str = "",
        tls: bool = False,
        credentials: grpc.ChannelCredentials | None = None,
        reconnect: bool = True,
        backoff: tuple[float, float] = (0.1, 5.0),
        grace: float = 10.0,
        options: Sequence[tuple[str, Any]] | None = None,
        labels: Mapping[str, str] | None = None,
        insecure_redirect_http: bool = False,
        link: bool | None = None,
    ) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError("slots must be an int of at least 1")
        if link is not None:
            warnings.warn(
                "Worker(link=...) has no effect: Work streams batch over gRPC; drop the argument",
                DeprecationWarning,
                stacklevel=2,
            )
        self.target = target
        self.pool = pool
        self.slots = slots
        self.labels: dict[str, str] = str_map(labels)
        self.name = name
        self.handler = handler
        self.reconnect = reconnect
        self.backoff = (float(backoff[0]), float(backoff[1]))
        self.grace = grace
        self.worker_id: int | None = None
        self.lease_ttl: float | None = None
        self.granted_slots: int | None = None
        self.server_protocol: int | None = None
        self.max_message_bytes: int | None = None
        self.last_shutdown: str | None = None
        self.connections = 0
        self._token = token or None
        self._tls = tls
        self._credentials = credentials
        self._options = with_keepalive(list(options or ()))
        self._insecure_redirect_http = insecure_redirect_http
        self._running: dict[int, RunningLease] = {}
        self._serials = itertools.count()
        self._orphans: set[asyncio.Task[None]] = set()
        self._session: WorkSession | None = None
        self._tracer: Any = None  # an OpenTelemetry tracer while the application set a provider
        self._active = False
        self._stopping = False
        self._stop_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._registered = asyncio.Event()
        self._wake = asyncio.Event()
        self._done = asyncio.Event()

    def __repr__(self) -> str:
        return f"Worker({self.target!r}, pool={self.pool!r}, slots={self.slots})"

    @property
    def running(self) -> int:
        """How many leases are being served right now."""
        return len(self._running)

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._registered = asyncio.Event()
            self._wake = asyncio.Event()
            self._done = asyncio.Event()

    async def wait_registered(self, timeout: float | None = None) -> None:
        """Wait until the server has accepted the worker's registration."""
        self._bind_loop()
        await asyncio.wait_for(self._registered.wait(), timeout)

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking leases, give running ones up to ``grace`` seconds, then end the stream."""
        if not self._active:
            return
        if self._stop_task is None:
            self._stopping = True
            self._stop_task = asyncio.ensure_future(self._shutdown(self.grace if grace is None else grace))
        await asyncio.shield(self._stop_task)

    async def run(self) -> None:
        """Serve until ``stop()`` or a fatal error; may be called again once it has returned."""
        self._bind_loop()
        if self._active:
            raise RuntimeError("this Worker is already running")
        self._active = True
        self._stopping = False
        self._stop_task = None
        self._wake.clear()
        self._done.clear()
        try:
            await self._serve()
        finally:
            self._active = False
            self._done.set()
            if self._orphans:
                await asyncio.wait(set(self._orphans), timeout=1.0)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        initial, maximum = self.backoff
        delay = initial
        followed = 0
        redirect: str | None = None
        while not self._stopping:
            target = redirect or self.target
            started = loop.time()
            not_leader = False
            try:
                end = await self._session_on(target, redirected=redirect is not None)
            except grpc.aio.AioRpcError as e:
                if self._stopping:
                    return
                endpoint = redirect_endpoint(e)
                if endpoint is not None:
                    warn = check_redirect(
                        endpoint,
                        current_target=target,
                        tls=self._tls,
                        credentials=self._credentials,
                        token=self._token,
                        insecure_redirect_http=self._insecure_redirect_http,
                        followed=followed,
                    )
                    if warn:
                        log.warning("following shard redirect to %s over plain http with a token", endpoint)
                    else:
                        log.info("pool %r is served by %s; reconnecting there", self.pool, endpoint)
                    followed += 1
                    redirect = endpoint
                    continue
                followed = 0
                error = ClientError.from_rpc(e)
                if e.code() in FATAL_CODES or not self.reconnect:
                    raise error from e
                if redirect is not None and e.code() == grpc.StatusCode.UNAVAILABLE:
                    redirect = None
                log.warning("work stream to %s failed (%s); reconnecting", target, error)
            else:
                followed = 0
                if self._stopping:
                    return
                if not self.reconnect:
                    raise ClientError("unavailable", f"work stream ended: {end.reason}")
                not_leader = end.not_leader
                log.info("work stream to %s ended (%s); reconnecting", target, end.reason)
            if not_leader or loop.time() - started > _SESSION_RESET_FACTOR * maximum:
                delay = initial
            await self._pause(delay)
            delay = min(delay * 2.0, maximum)

    async def _pause(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    # --- one stream

    async def _session_on(self, target: str, *, redirected: bool) -> SessionEnd:
        options = self._options
        if redirected:
            options = [(k, v) for k, v in options if k not in _REDIRECT_ONLY_OPTIONS]
        secure = wants_tls(target, self._tls, self._credentials)
        channel = open_channel(target, secure=secure, credentials=self._credentials, options=options)
        # Looked up per stream: an application may install its tracer provider after creating us.
        self._tracer = attempt_tracer()
        try:
            # As the generated stub, except that a batch may be handed over already encoded.
            work = channel.stream_stream(
                _WORK_METHOD, request_serializer=serialize_outgoing, response_deserializer=pb.ServerMessage.FromString
            )
            call = work(metadata=auth_metadata(self._token))
            return await self._run_session(WorkSession(call, self._still_running), receive_limit(options))
        finally:
            await channel.close()

    async def _run_session(self, session: WorkSession, receive_limit: int) -> SessionEnd:
        """Register on ``session``'s call and serve it until it ends; ``receive_limit`` is the
        largest message the channel takes (the batches the server may send)."""
        call = session.call
        self._session = session
        self.connections += 1
        session.send(
            pb.WorkerMessage(
                register=pb.Register(
                    pool=self.pool,
                    slots=self.slots,
                    worker_name=self.name,
                    protocol_version=PROTOCOL_VERSION,
                    labels=self.labels,
                    batch_bytes=receive_limit,
                )
            )
        )
        writer = asyncio.create_task(session.write_loop(), name="cronoq-worker-writer")
        try:
            return await self._read_loop(session)
        finally:
            session.closed.set()
            session.heartbeats.close()
            self._session = None
            self._registered.clear()
            self._forget_running("session ended")
            writer.cancel()
            if not call.done():
                call.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    async def _read_loop(self, session: WorkSession) -> SessionEnd:
        while True:
            try:
                message = await session.call.read()
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if session.cancelled_locally and not (current is not None and current.cancelling()):
                    return SessionEnd("stream cancelled by the worker", False, False)
                raise
            if message is grpc.aio.EOF:
                return SessionEnd(_CLOSED_BY_SERVER, False, False)
            kind = message.WhichOneof("msg")
            if kind == "batch":  # nearly every message of a busy stream
                batch = message.batch
                for lease in batch.leases:
                    self._on_lease(session, lease)
                for abort in batch.aborts:  # after the leases: one may concern them
                    self._on_abort(abort)
            elif kind == "lease":
                self._on_lease(session, message.lease)
            elif kind == "registered":
                self._on_registered(session, message.registered)
            elif kind == "abort":
                self._on_abort(message.abort)
            elif kind == "shutdown":
                reason = message.shutdown.reason or "shutdown"
                self.last_shutdown = reason
                return SessionEnd(reason, True, message.shutdown.not_leader)
            else:
                log.debug("ignoring unknown server message %r", kind)

    def _on_registered(self, session: WorkSession, m: pb.Registered) -> None:
        self.worker_id = m.worker_id
        self.lease_ttl = m.lease_ttl_s if m.HasField("lease_ttl_s") else None
        self.granted_slots = m.slots or self.slots
        self.server_protocol = m.protocol_version or 1
        self.max_message_bytes = m.max_message_bytes or None
        if m.batching:
            session.batch_limit = max(1, (self.max_message_bytes or GRPC_DEFAULT_RECEIVE) - _BATCH_HEADROOM)
        session.registered = True
        self._registered.set()
        log.info(
            "registered as worker %d for pool %r (%d slots, protocol %d)",
            self.worker_id,
            self.pool,
            self.granted_slots,
            self.server_protocol,
        )

    def _on_lease(self, session: WorkSession, m: pb.Lease) -> None:
        if self._stopping:
            self._give_back(session, m.lease, "worker is stopping")
            return
        limit = self.granted_slots or self.slots
        if len(self._running) >= limit:
            self._give_back(session, m.lease, "worker has no free slot")
            return
        lease = Lease.from_pb(m, self.pool)
        record = RunningLease(lease, next(self._serials))
        self._running[lease.id] = record
        record.task = asyncio.create_task(self._serve_lease(session, record))
        period = heartbeat_interval(lease.lease_ttl, self.lease_ttl)
        if period is not None:
            session.heartbeats.add(lease.id, record.serial, period, len(self._running))

    def _still_running(self, lease_id: int, serial: int) -> bool:
        """Whether the record ``serial`` still serves ``lease_id`` (it has not ended or been stopped)."""
        record = self._running.get(lease_id)
        return record is not None and record.serial == serial and record.stopped_by is None

    def _on_abort(self, m: pb.Abort) -> None:
        record = self._running.pop(m.lease, None)
        if record is None:
            return
        log.info("lease %d aborted by the server: %s", m.lease, m.reason)
        self._cancel(record, "aborted")

    def _cancel(self, record: RunningLease, why: str) -> None:
        record.stopped_by = why
        record.lease.cancelled.set()
        if record.task is not None and not record.task.done():
            record.task.cancel()
            self._orphans.add(record.task)
            record.task.add_done_callback(self._orphans.discard)

    def _forget_running(self, why: str) -> None:
        records = list(self._running.values())
        self._running.clear()
        for record in records:
            self._cancel(record, why)

    def _give_back(self, session: WorkSession, lease: int, reason: str) -> None:
        if (self.server_protocol or 1) >= 2:
            session.send(pb.WorkerMessage(nack=pb.Nack(lease=lease, reason=reason)))
        else:
            session.send(pb.WorkerMessage(fail=pb.Fail(lease=lease, message=reason, permanent=False)))

    async def _serve_lease(self, session: WorkSession, record: RunningLease) -> None:
        lease = record.lease
        try:
            tracer = self._tracer
            if tracer is None:
                reply = await self._outcome(record)
            else:
                reply = await self._traced_outcome(tracer, record)
        finally:
            # Leaving ``_running`` also ends the lease's heartbeats (see ``Heartbeats``).
            if self._running.get(lease.id) is record:
                del self._running[lease.id]
        if reply is not None and record.stopped_by is None:
            session.send(reply)

    async def _outcome(self, record: RunningLease) -> pb.WorkerMessage | None:
        """Run the handler and turn what it did into the message to send (None: send nothing)."""
        lease = record.lease
        try:
            value: Any = self.handler(lease)
            if inspect.isawaitable(value):
                value = await value
        except asyncio.CancelledError:
            if record.stopped_by is not None:
                return None
            return self._fail(lease.id, "handler was cancelled", permanent=False)
        except Reject as e:
            record.error = e
            if (self.server_protocol or 1) >= 2:
                return pb.WorkerMessage(nack=pb.Nack(lease=lease.id, reason=e.reason))
            return self._fail(lease.id, e.reason, permanent=False)
        except CancelTask as e:
            record.error = e
            if (self.server_protocol or 1) >= 2:
                return pb.WorkerMessage(cancelled=pb.Cancelled(lease=lease.id))
            return self._fail(lease.id, str(e) or "cancelled by the handler", permanent=True)
        except Retryable as e:
            record.error = e
            return self._fail(lease.id, str(e), permanent=False, retry_after=e.retry_after)
        except Permanent as e:
            record.error = e
            return self._fail(lease.id, str(e), permanent=True)
        except Exception as e:  # any handler failure is reported, not raised
            record.error = e
            log.debug("handler failed on lease %d", lease.id, exc_info=True)
            return self._fail(lease.id, f"{type(e).__name__}: {e}", permanent=False)
        try:
            output, content_type = encode_value(value)
        except (TypeError, ValueError) as e:
            return self._fail(lease.id, f"output is not encodable: {type(e).__name__}: {e}", permanent=True)
        limit = self.max_message_bytes
        if limit and len(output) + _OUTPUT_HEADROOM > limit:
            return self._fail(
                lease.id, f"output of {len(output)} bytes exceeds the server's {limit}-byte message limit", True
            )
        # Filled in place: a Complete passed to the WorkerMessage constructor would be copied.
        reply = pb.WorkerMessage()
        complete = reply.complete
        complete.SetInParent()
        complete.lease = lease.id
        if output:
            complete.output = output
        if content_type:
            complete.content_type = content_type
        return reply

    async def _traced_outcome(self, tracer: Any, record: RunningLease) -> pb.WorkerMessage | None:
        """``_outcome`` inside a ``cronoq.task`` span continuing the submitter's trace.

        The span is the handler's current span (its own spans and outgoing calls join the trace).
        Its parent is the lease's ``traceparent`` tag; without one it is a root span rather than a
        child of whatever span was current where the worker was started.
        """
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, Status, StatusCode

        lease = record.lease
        traceparent = lease.tags.get(TRACEPARENT)
        parent = propagate_api().extract({TRACEPARENT: traceparent}) if traceparent else Context()
        attributes: dict[str, str | int] = {
            "task.id": lease.task_id,
            "task.pool": lease.pool,
            "task.kind": lease.kind,
            "task.attempt": lease.attempt,
        }
        with tracer.start_as_current_span(
            SPAN_NAME,
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            reply = await self._outcome(record)
            if record.error is not None:
                span.record_exception(record.error)
            if reply is None:
                span.set_status(Status(StatusCode.ERROR, f"attempt ended: {record.stopped_by or 'no outcome'}"))
            else:
                kind = reply.WhichOneof("msg")
                if kind == "complete":
                    span.set_status(Status(StatusCode.OK))
                elif kind == "fail":
                    span.set_status(Status(StatusCode.ERROR, reply.fail.message))
                elif kind == "cancelled":
                    span.set_status(Status(StatusCode.ERROR, "cancelled by the handler"))
                elif kind == "nack":
                    # Handed back unrun: not a failure of the task, which runs elsewhere.
                    span.set_attribute("cronoq.rejected", True)
        return reply

    @staticmethod
    def _fail(lease: int, message: str, permanent: bool, retry_after: float | None = None) -> pb.WorkerMessage:
        fail = pb.Fail(lease=lease, message=message, permanent=permanent)
        if retry_after is not None:
            fail.retry_after_s = float(retry_after)
        return pb.WorkerMessage(fail=fail)

    # --- graceful stop

    async def _shutdown(self, grace: float) -> None:
        self._wake.set()
        session = self._session
        if session is not None:
            if not session.registered:
                session.cancel()
            else:
                session.send(pb.WorkerMessage(set_slots=pb.SetSlots(slots=0)))
                busy = [r.task for r in self._running.values() if r.task is not None]
                if busy:
                    await asyncio.wait(busy, timeout=max(grace, 0.0))
                self._forget_running("worker stopped")
                session.close_writes()
                try:
                    await asyncio.wait_for(session.closed.wait(), _CLOSE_WAIT_S)
                except TimeoutError:
                    session.cancel()
        await self._done.wait()
