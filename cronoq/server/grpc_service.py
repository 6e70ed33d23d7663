"""gRPC servicers of ``cronoq.v1``: Tasks and Admin over ``Api``, and the Workers.Work stream.

Every call authenticates first (``authorization`` metadata or a mapped client certificate), then
runs the transport-independent handler of ``cronoq.server.api``; an ``ApiError`` becomes the
call's status. A request message that is not valid protobuf is INVALID_ARGUMENT (the services
are registered with deserializers that do not raise; see ``add_to``). Unary calls are bounded
by ``max_wait_s + request_timeout_s`` (CANCELLED past that) and by the server's in-flight limits
(``UnaryRunner``: RESOURCE_EXHAUSTED beyond). ``server_options`` bounds what a connection may
cost before any of this: connections, handshake time, metadata size, idle time, pings.

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

__all__ = [
    "REGISTER_TIMEOUT_S",
    "SHUTDOWN_LINGER_S",
    "GrpcServices",
    "Malformed",
    "register_services",
    "server_options",
]

log = logging.getLogger("cronoq.server")


class _UnquotedMetadata(logging.Filter):
    """grpc's Python layer logs a metadata value that is not UTF-8 at ERROR, quoting it whole
    ("Invalid encoding on b'Bearer ...'"): any caller could put its (or a guessed) token in the
    log that way, and flood it. The record keeps its place, at debug level, without the value."""

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Invalid encoding on"):
            record.msg, record.args, record.exc_info, record.exc_text = (
                "a gRPC metadata value was not UTF-8 (not shown)",
                (),
                None,
                None,
            )
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


logging.getLogger("grpc._cython.cygrpc").addFilter(_UnquotedMetadata())

Req = TypeVar("Req")
Resp = TypeVar("Resp")


_INT_MAX = 2**31 - 1
"""Channel arguments are C ints."""


def _ms(seconds: float) -> int:
    return max(1, min(_INT_MAX, round(seconds * 1000)))


def server_options(config: Config, *, standby: bool) -> list[tuple[str, Any]]:
    """grpc server options: message size, keepalive pings, streams per connection, and the
    bounds of ``[limits]`` that hold before authentication; a standby also closes every
    connection about a second after accepting it.

    grpc core itself defends HTTP/2 against a client that resets streams in a tight loop
    ("rapid reset": reset streams count against MAX_CONCURRENT_STREAMS until their calls end,
    and requests per read are capped), answers pings past ``min_ping_interval`` with strikes and
    then GOAWAY, and closes a transport whose peer does not read the frames it induces."""
    limits = config.limits
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", limits.max_message_bytes),
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.keepalive_time_ms", _ms(limits.keepalive_interval_s)),
        ("grpc.keepalive_timeout_ms", _ms(limits.keepalive_timeout_s)),
        # grpcio waits grpc.http2.ping_timeout_ms (60 s by default) for the answer to its own
        # pings, not keepalive_timeout_ms: without it a vanished client's connection (and its
        # streams' leases) would be held three times longer than configured.
        ("grpc.http2.ping_timeout_ms", _ms(limits.keepalive_timeout_s)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        # Before authentication: connections held at once, time to finish the TLS and HTTP/2
        # handshakes, size of the metadata (headers) of a call, and time a connection may idle.
        ("grpc.max_allowed_incoming_connections", min(_INT_MAX, limits.max_connections)),
        ("grpc.server_handshake_timeout_ms", _ms(limits.header_timeout_s)),
        ("grpc.max_metadata_size", min(_INT_MAX, limits.max_header_bytes)),
        ("grpc.absolute_max_metadata_size", min(_INT_MAX, limits.max_header_bytes)),
        ("grpc.max_connection_idle_ms", _ms(limits.idle_timeout_s)),
        # Refuse to share a port with another process: a second server on the same address
        # must fail with "Address already in use", not silently split the traffic.
        ("grpc.so_reuseport", 0),
    ]
    if standby:
        options += [("grpc.max_connection_age_ms", 1000), ("grpc.max_connection_age_grace_ms", 500)]
    return options


def cert_names(context: grpc.aio.ServicerContext[Any, Any]) -> list[str]:
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


def metadata_value(context: grpc.aio.ServicerContext[Any, Any], name: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class Malformed:
    """What a unary request deserializes to when its bytes are not a valid message: the servicer
    authenticates the caller, then answers INVALID_ARGUMENT. (grpc would answer a deserializer's
    exception with UNKNOWN and log a traceback at ERROR, for any caller.)"""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def error(self) -> ApiError:
        return malformed(self.type_name)


def malformed(type_name: str) -> ApiError:
    return ApiError.invalid(f"malformed request: the bytes are not a valid {type_name} message")


def _lenient(message_type: Any) -> Callable[[bytes], Any]:
    """The deserializer of a unary request: the message, or ``Malformed``."""
    parse, name = message_type.FromString, message_type.DESCRIPTOR.name

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception:  # DecodeError; RecursionError for nesting too deep
            return Malformed(name)

    return deserialize


def _refusing(message_type: Any) -> Callable[[bytes], Any]:
    """The deserializer of a streamed request: ``context.read()`` raises the INVALID_ARGUMENT
    ``ApiError`` that ends the call."""
    parse, name = message_type.FromString, message_type.DESCRIPTOR.name

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception:
            raise malformed(name) from None

    return deserialize


_HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def register_services(server: grpc.aio.Server, module: Any, servicer: Any, names: tuple[str, ...]) -> None:
    """Serve the services ``names`` of the protobuf ``module`` from ``servicer``'s methods of the
    same names, with deserializers that never raise (``_lenient``, ``_refusing``)."""
    for name in names:
        service = module.DESCRIPTOR.services_by_name[name]
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in service.methods:
            request_type = getattr(module, method.input_type.name, None) or _message_class(method.input_type)
            response_type = getattr(module, method.output_type.name, None) or _message_class(method.output_type)
            kind = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
            deserializer = _refusing(request_type) if method.client_streaming else _lenient(request_type)
            handlers[method.name] = kind(
                getattr(servicer, method.name),
                request_deserializer=deserializer,
                response_serializer=response_type.SerializeToString,
            )
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
        server.add_registered_method_handlers(service.full_name, handlers)


def _message_class(descriptor: Any) -> Any:
    """The generated class of a message defined in another file (the console reuses cronoq.v1's)."""
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(descriptor)


class GrpcServices(pbg.TasksServicer, pbg.AdminServicer, pbg.WorkersServicer):
    """All three services on one object. ``standby`` servers authenticate, then refuse.

    Tasks and Admin calls go through ``router`` (this shard, or forwarded to the shard concerned);
    Work streams are served by this shard only."""

    def __init__(
        self,
        api: Api,
        authenticator: Authenticator,
        *,
        router: Router | None = None,
        standby: bool = False,
        unary: UnaryRunner | None = None,
    ) -> None:
        self.api = api
        self.router = router if router is not None else Router(api.config, api)
        self.auth = authenticator
        self.standby = standby
        self.limits = api.limits
        self.unary = unary if unary is not None else UnaryRunner(api.limits)
        self.work_streams = WorkStreams(api, self.principal_of, self.unary.streams)

    def add_to(self, server: grpc.aio.Server) -> None:
        """Register every method of ``cronoq.v1`` (and of the console's ``cronoq.console.v1``) as the
        generated ``add_*Servicer_to_server`` would, but with deserializers that turn malformed bytes
        into INVALID_ARGUMENT."""
        register_services(server, pb, self, ("Tasks", "Admin", "Workers"))
        from .console_grpc import ConsoleServicer  # the console's calls (cronoq.console.v1)

        ConsoleServicer(self).add_to(server)

    def _principal(self, context: grpc.aio.ServicerContext[Any, Any]) -> Principal:
        principal = self.auth.authenticate(metadata_value(context, "authorization"), cert_names(context))
        if self.standby:
            raise ApiError.unavailable()
        if metadata_value(context, FORWARDED) is not None:
            principal = principal.as_forwarded()
        return principal

    def principal_of(self, context: grpc.aio.ServicerContext[Any, Any]) -> Principal:
        """The caller of ``context``'s call, as every call of this listener authenticates it (for
        the services registered beside these: ``cronoq.server.forward``)."""
        return self._principal(context)

    async def _unary(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        request: Req,
        handler: Callable[[Principal, Req], Awaitable[Resp]],
    ) -> Resp:
        try:
            principal = self._principal(context)
            if isinstance(request, Malformed):
                raise request.error()
            # The caller's gRPC deadline bounds the call here and on any shard it is forwarded to.
            response, missing = await self.unary.run(principal, handler, request, deadline=context.time_remaining())
            if missing:
                context.set_trailing_metadata(((UNAVAILABLE_SHARDS_KEY, ",".join(missing)),))
            return response
        except Exception as exc:
            return await _abort(context, from_exception(exc))  # type: ignore[no-any-return]

    run_unary = _unary
    """How the services registered beside these (``console_grpc``) run a unary call."""

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
            if isinstance(request, Malformed):
                raise request.error()
            with self.unary.streams.hold(principal, "Watch"):
                with collect_unavailable() as missing:
                    events = await self.router.watch(principal, request)
                try:
                    # Headers go out as soon as the subscription exists, so a router forwarding this
                    # watch knows the shard is in; shards it could not reach are named here.
                    await context.send_initial_metadata(
                        ((UNAVAILABLE_SHARDS_KEY, ",".join(missing)),) if missing else ()
                    )
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
