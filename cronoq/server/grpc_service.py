"""gRPC servicers of ``cronoq.v1``: Tasks and Admin over ``Api``, and the Workers.Work stream.

Every call authenticates first (``authorization`` metadata or a mapped client certificate), then
runs the transport-independent handler of ``cronoq.server.api``; an ``ApiError`` becomes the
call's status. Unary calls are bounded by ``max_wait_s + request_timeout_s`` (CANCELLED past
that) and by ``max_concurrent_requests`` in flight (RESOURCE_EXHAUSTED beyond).

The Work stream is served by ``work_stream.WorkStreams``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from cronoq.config import Config
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from cronoq.router import FORWARDED, UNAVAILABLE_SHARDS_KEY, Router, collect_unavailable

from .api import Api
from .auth import Authenticator, Principal
from .errors import ApiError, from_exception
from .unary import UnaryRunner
from .work_stream import REGISTER_TIMEOUT_S, SHUTDOWN_LINGER_S, WorkStreams
from .work_stream import abort_call as _abort

__all__ = ["REGISTER_TIMEOUT_S", "SHUTDOWN_LINGER_S", "GrpcServices", "server_options"]

log = logging.getLogger("cronoq.server")

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def server_options(config: Config, *, standby: bool) -> list[tuple[str, Any]]:
    """grpc server options: message size, keepalive pings, streams per connection; a standby
    also closes every connection about a second after accepting it."""
    limits = config.limits
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", limits.max_message_bytes),
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.keepalive_time_ms", max(1, round(limits.keepalive_interval_s * 1000))),
        ("grpc.keepalive_timeout_ms", max(1, round(limits.keepalive_timeout_s * 1000))),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        # Refuse to share a port with another process: a second server on the same address
        # must fail with "Address already in use", not silently split the traffic.
        ("grpc.so_reuseport", 0),
    ]
    if standby:
        options += [("grpc.max_connection_age_ms", 1000), ("grpc.max_connection_age_grace_ms", 500)]
    return options


def _cert_names(context: grpc.aio.ServicerContext[Any, Any]) -> list[str]:
    """DNS names of the client certificate the TLS layer verified (none without mTLS)."""
    try:
        auth = context.auth_context()
    except Exception:  # pragma: no cover - depends on the transport
        return []
    values = auth.get("peer_dns") or auth.get("x509_subject_alternative_name") or []
    names = []
    for value in values:
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        if text:
            names.append(text)
    return names


def _metadata_value(context: grpc.aio.ServicerContext[Any, Any], name: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class GrpcServices(pbg.TasksServicer, pbg.AdminServicer, pbg.WorkersServicer):
    """All three services on one object. ``standby`` servers authenticate, then refuse.

    Tasks and Admin calls go through ``router`` (this shard, or forwarded to the shard concerned);
    Work streams are served by this shard only."""

    def __init__(self, api: Api, authenticator: Authenticator, *, router: Router | None = None,
                 standby: bool = False, unary: UnaryRunner | None = None) -> None:  # fmt: skip
        self.api = api
        self.router = router if router is not None else Router(api.config, api)
        self.auth = authenticator
        self.standby = standby
        self.limits = api.limits
        self.unary = unary if unary is not None else UnaryRunner(api.limits)
        self.work_streams = WorkStreams(api, self.principal_of)

    def add_to(self, server: grpc.aio.Server) -> None:
        pbg.add_TasksServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        pbg.add_AdminServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        pbg.add_WorkersServicer_to_server(self, server)  # type: ignore[no-untyped-call]

    def _principal(self, context: grpc.aio.ServicerContext[Any, Any]) -> Principal:
        principal = self.auth.authenticate(_metadata_value(context, "authorization"), _cert_names(context))
        if self.standby:
            raise ApiError.unavailable()
        if _metadata_value(context, FORWARDED) is not None:
            principal = principal.as_forwarded()
        return principal

    def principal_of(self, context: grpc.aio.ServicerContext[Any, Any]) -> Principal:
        """The caller of ``context``'s call, as every call of this listener authenticates it (for
        the services registered beside these: ``cronoq.server.forward``)."""
        return self._principal(context)

    async def _unary(self, context: grpc.aio.ServicerContext[Any, Any], request: Req,
                     handler: Callable[[Principal, Req], Awaitable[Resp]]) -> Resp:  # fmt: skip
        try:
            principal = self._principal(context)
            response, missing = await self.unary.run(principal, handler, request)
            if missing:
                context.set_trailing_metadata(((UNAVAILABLE_SHARDS_KEY, ",".join(missing)),))
            return response
        except Exception as exc:
            return await _abort(context, from_exception(exc))  # type: ignore[no-any-return]

    # ------------------------------------------------------------------------------- Tasks

    async def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        return await self._unary(context, request, self.router.submit)

    async def SubmitBatch(self, request: pb.SubmitBatchRequest, context: Any) -> pb.SubmitBatchResponse:
        return await self._unary(context, request, self.router.submit_batch)

    async def Cancel(self, request: pb.CancelRequest, context: Any) -> pb.CancelResponse:
        return await self._unary(context, request, self.router.cancel)

    async def Get(self, request: pb.GetRequest, context: Any) -> pb.TaskInfo:
        return await self._unary(context, request, self.router.get)

    async def ListTasks(self, request: pb.ListTasksRequest, context: Any) -> pb.ListTasksResponse:
        return await self._unary(context, request, self.router.list_tasks)

    async def Wait(self, request: pb.WaitRequest, context: Any) -> pb.TaskResult:
        return await self._unary(context, request, self.router.wait)

    async def Watch(self, request: pb.WatchRequest, context: Any) -> None:
        try:
            principal = self._principal(context)
            with collect_unavailable() as missing:
                events = await self.router.watch(principal, request)
            try:
                # Headers go out as soon as the subscription exists, so a router forwarding this
                # watch knows the shard is in; shards it could not reach are named here.
                await context.send_initial_metadata(((UNAVAILABLE_SHARDS_KEY, ",".join(missing)),) if missing else ())
                async for event in events:
                    await context.write(event)
            finally:
                await events.aclose()  # type: ignore[attr-defined]  # ends the subscription at once
        except Exception as exc:
            await _abort(context, from_exception(exc))

    # ------------------------------------------------------------------------------- Admin

    async def Snapshot(self, request: pb.Empty, context: Any) -> pb.SnapshotResponse:
        return await self._unary(context, request, self.router.snapshot)

    async def AddRecurring(self, request: pb.RecurringRequest, context: Any) -> pb.Empty:
        return await self._unary(context, request, self.router.add_recurring)

    async def RemoveRecurring(self, request: pb.RemoveRecurringRequest, context: Any) -> pb.RemoveRecurringResponse:
        return await self._unary(context, request, self.router.remove_recurring)

    async def ListWorkers(self, request: pb.Empty, context: Any) -> pb.ListWorkersResponse:
        return await self._unary(context, request, self.router.list_workers)

    async def ListRecurring(self, request: pb.Empty, context: Any) -> pb.ListRecurringResponse:
        return await self._unary(context, request, self.router.list_recurring)

    # ------------------------------------------------------------------------------- Workers

    async def Work(self, request_iterator: Any, context: Any) -> None:
        await self.work_streams.serve(context)
