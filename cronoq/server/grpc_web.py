"""gRPC-Web on the gRPC listener (``[server.grpc_web]``), beside native gRPC, on the same port.

grpcio speaks only HTTP/2 and offers no hook for another protocol on its port, so with gRPC-Web on,
``GrpcWebFront`` owns the gRPC address and grpcio listens on a private Unix socket instead (in a
directory only this process's user can enter). Every connection is sorted by its first bytes,
which are only looked at (``MSG_PEEK``), never consumed:

* Plain TCP: the HTTP/2 connection preface (``PRI * HTTP/2.0``) means native gRPC, and the bytes
  are copied both ways between the client and grpcio's socket, unparsed. Anything else is
  HTTP/1.1, which carries gRPC-Web only: aiohttp parses it and ``_handle`` answers.
* TLS: the ClientHello's ALPN list decides, without terminating TLS. gRPC clients offer only
  ``h2`` (and ``grpc-exp``): the connection goes to grpcio's own TLS listener on the socket, so
  client certificates stay grpcio's business. Browsers also offer ``http/1.1``: TLS ends here,
  with ``http/1.1`` selected, and no client certificate is asked for (gRPC-Web callers send
  tokens). So gRPC-Web over HTTP/2 never happens on this port: browsers speak HTTP/1.1 to it.

gRPC-Web requests (``application/grpc-web`` or ``application/grpc-web+proto``; binary framing)
run the same handlers as native gRPC: the router's (``Router`` of ``cronoq.router``), under the
same authentication (``authorization: Bearer``) and the same ``UnaryRunner`` bounds. Unary calls
and the Watch stream are served; Workers.Work (bidirectional) and plain gRPC over HTTP/1.1 get
UNIMPLEMENTED. CORS: preflights from ``allowed_origins`` are answered for POST with exactly the
request headers the spec lists, and answers to those origins expose grpc-status, grpc-message and
grpc-status-details-bin; other origins get no CORS headers, and credentialed CORS is never
allowed. With authentication off (and no ``insecure_no_auth``) every request must name a loopback
host, as on the HTTP API, else PERMISSION_DENIED.

Before anyone is authenticated, the front holds connections to the HTTP listener's bounds, with the
HTTP listener's own code (``http_listen``): at most ``limits.max_connections`` open (native and
gRPC-Web together; more are reset as they arrive), ``header_timeout_s`` to say which protocol a
connection speaks, finish a TLS handshake and deliver each request head, ``max_header_bytes`` and
``max_headers`` for a head, ``idle_timeout_s`` between requests, ``write_stall_timeout_s`` for an
answer (a Watch) the client does not read. Native gRPC connections are then grpcio's to bound,
except for what grpcio does not count: stream resets, pings and SETTINGS of a plain-TCP client are
counted here from frame headers as the bytes pass, and past ``limits.max_stream_resets_per_s``
the client gets GOAWAY(ENHANCE_YOUR_CALM) between two of grpcio's frames and is disconnected
(grpcio itself has no rate for them; over TLS the bytes cannot be read here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import ssl
import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import web
from google.protobuf.message import DecodeError, Message

from cronoq.config import Config, is_loopback_host
from cronoq.proto import console_pb2 as cpb
from cronoq.proto import cronoq_pb2 as pb
from cronoq.router import UNAVAILABLE_SHARDS_KEY, Router, collect_unavailable

from .api import Api
from .auth import Authenticator, Principal
from .errors import ApiError, Code, from_exception
from .http2 import ControlBudget, ControlFrames
from .http_listen import Connection, ConnectionBounds, Listener, request_finished, request_started
from .unary import UnaryRunner

__all__ = ["GrpcWebFront", "alpn_offers"]

log = logging.getLogger("cronoq.server")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_PEEK_BYTES = 16 * 1024 + 5  # a TLS record at most
_COPY_CHUNK = 256 * 1024

WEB_TYPES = ("application/grpc-web", "application/grpc-web+proto")
ALLOWED_HEADERS = "authorization, content-type, x-grpc-web, x-user-agent, grpc-timeout"
EXPOSED_HEADERS = "grpc-status, grpc-message, grpc-status-details-bin"
PREFLIGHT_MAX_AGE_S = 600
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


@dataclass(frozen=True, slots=True)
class _Method:
    request: type[Message]
    handler: Callable[[Principal, Any], Awaitable[Any]]
    streaming: bool = False


def alpn_offers(data: bytes) -> list[bytes] | None:
    """The ALPN protocols a TLS ClientHello at the start of ``data`` offers ([] without the
    extension); None while ``data`` holds only part of the record. ValueError when ``data`` does
    not start with a ClientHello."""
    if len(data) < 5:
        return None
    if data[0] != 0x16 or data[1] != 0x03:
        raise ValueError("not a TLS handshake")
    length = struct.unpack_from("!H", data, 3)[0]
    if len(data) < 5 + length:
        return None
    hello = data[5 : 5 + length]
    try:
        if hello[0] != 0x01:
            raise ValueError("not a ClientHello")
        at = 4 + 2 + 32  # handshake header, client version, random
        at += 1 + hello[at]  # session id
        at += 2 + struct.unpack_from("!H", hello, at)[0]  # cipher suites
        at += 1 + hello[at]  # compression methods
        if at >= len(hello):
            return []
        end = at + 2 + struct.unpack_from("!H", hello, at)[0]
        at += 2
        while at + 4 <= end:
            kind, size = struct.unpack_from("!HH", hello, at)
            at += 4
            if kind == 16:  # application_layer_protocol_negotiation
                offers, stop = [], at + 2 + struct.unpack_from("!H", hello, at)[0]
                at += 2
                while at < stop:
                    offers.append(bytes(hello[at + 1 : at + 1 + hello[at]]))
                    at += 1 + hello[at]
                return offers
            at += size
    except (IndexError, struct.error):
        raise ValueError("a malformed ClientHello") from None
    return []


def _frame(flag: int, body: bytes) -> bytes:
    return struct.pack("!BI", flag, len(body)) + body


def _trailers(code: Code | None, message: str, metadata: tuple[tuple[str, str], ...] = ()) -> bytes:
    lines = [f"grpc-status:{0 if code is None else code.grpc.value[0]}"]
    if message:
        lines.append(f"grpc-message:{_encode_message(message)}")
    lines += [f"{key}:{value}" for key, value in metadata]
    return _frame(0x80, ("\r\n".join(lines) + "\r\n").encode("utf-8", "replace"))


def _encode_message(message: str) -> str:
    """grpc-message is percent-encoded outside printable ASCII (and ``%`` itself)."""
    return quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _timeout(value: str | None) -> float | None:
    if not value:
        return None
    digits, unit = value[:-1], value[-1:]
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        raise ApiError.invalid(f"grpc-timeout {value!r} is not a gRPC timeout")
    return int(digits) * _TIMEOUT_UNITS[unit]


class GrpcWebFront:
    """The listener on the gRPC address when gRPC-Web is on (see the module docstring)."""

    def __init__(
        self, config: Config, api: Api, router: Router, authenticator: Authenticator, unary: UnaryRunner
    ) -> None:
        web_config = config.server.grpc_web
        assert web_config is not None
        self.origins = frozenset(web_config.allowed_origins)
        self.api = api
        self.router = router
        self.auth = authenticator
        self.unary = unary
        self.limits = config.limits
        self.guard_host = not authenticator.enabled and not config.server.insecure_no_auth
        self._tls = _web_tls(config)
        self._directory = tempfile.mkdtemp(prefix="cronoq-grpc-")  # 0700: only this user gets in
        self._sockets = 0
        self.target = ""
        """The Unix socket grpcio listens on now (``next_socket`` names the next one)."""
        self._listener: socket.socket | None = None
        self._acceptor: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()
        """Connections being sorted, and native ones being copied to grpcio."""
        self.bounds = ConnectionBounds.of(config.limits)
        self.http = _WebListener(self._serve, self.bounds)
        """The gRPC-Web (HTTP/1.1) connections, held to the HTTP listener's bounds."""
        self.refused = 0
        self._methods = self._method_table()

    def _method_table(self) -> dict[str, _Method]:
        r = self.router
        tasks, admin, console = "/cronoq.v1.Tasks/", "/cronoq.v1.Admin/", "/cronoq.console.v1.Console/"
        return {
            tasks + "Submit": _Method(pb.SubmitRequest, r.submit),
            tasks + "SubmitBatch": _Method(pb.SubmitBatchRequest, r.submit_batch),
            tasks + "Cancel": _Method(pb.CancelRequest, r.cancel),
            tasks + "Get": _Method(pb.GetRequest, r.get),
            tasks + "ListTasks": _Method(pb.ListTasksRequest, r.list_tasks),
            tasks + "Wait": _Method(pb.WaitRequest, r.wait),
            tasks + "Watch": _Method(pb.WatchRequest, r.watch, streaming=True),
            admin + "Snapshot": _Method(pb.Empty, r.snapshot),
            admin + "AddRecurring": _Method(pb.RecurringRequest, r.add_recurring),
            admin + "RemoveRecurring": _Method(pb.RemoveRecurringRequest, r.remove_recurring),
            admin + "ListWorkers": _Method(pb.Empty, r.list_workers),
            admin + "ListRecurring": _Method(pb.Empty, r.list_recurring),
            console + "SearchTasks": _Method(cpb.SearchTasksRequest, r.search_tasks),
            console + "GetTaskDetail": _Method(pb.GetRequest, r.task_detail),
            console + "ListShards": _Method(pb.Empty, r.list_shards),
            console + "ListSchedules": _Method(pb.Empty, r.list_schedules),
            console + "PauseSchedule": _Method(cpb.ScheduleRequest, r.pause_schedule),
            console + "ResumeSchedule": _Method(cpb.ScheduleRequest, r.resume_schedule),
        }

    # ------------------------------------------------------------------------------ listening

    def next_socket(self) -> str:
        """A fresh Unix socket path for the next grpcio listener (``unix:`` address)."""
        self._sockets += 1
        return os.path.join(self._directory, f"grpc-{self._sockets}.sock")

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); returns the port."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(1024)
        except OSError:
            listener.close()
            raise
        listener.setblocking(False)
        self._listener = listener
        self._acceptor = asyncio.get_running_loop().create_task(self._accept(listener), name="cronoq-grpc-web-accept")
        return int(listener.getsockname()[1])

    async def close(self) -> None:
        if self._acceptor is not None:
            self._acceptor.cancel()
            await asyncio.gather(self._acceptor, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for connection in list(self.http.connections):
            if not connection.decided:
                connection.close()
        with contextlib.suppress(Exception):
            await self.http.server.shutdown(1.0)
        for connection in list(self.http.connections):
            connection.close()
        shutil.rmtree(self._directory, ignore_errors=True)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:
                log.warning("grpc listener: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if len(self._connections) + len(self.http.connections) >= self.bounds.max_connections:
                self.refused += 1
                _reset(sock)
                continue
            task = loop.create_task(self._route(sock))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _route(self, sock: socket.socket) -> None:
        """Sort one connection (see the module docstring) and hand it on."""
        patience = self.bounds.header_timeout_s
        try:
            native = await asyncio.wait_for(self._sniff(sock), patience)
        except (TimeoutError, ValueError, OSError):
            sock.close()
            return
        if native:
            await self._splice(sock)
            return
        loop = asyncio.get_running_loop()
        http = self.http
        try:
            # The HTTP listener's connection protocol: head, idle and write-stall bounds.
            if self._tls is None:
                await loop.connect_accepted_socket(lambda: Connection(http), sock)
            else:
                await loop.connect_accepted_socket(
                    lambda: Connection(http), sock, ssl=self._tls, ssl_handshake_timeout=patience
                )
        except (OSError, ssl.SSLError, ConnectionError):
            sock.close()

    async def _sniff(self, sock: socket.socket) -> bool:
        """True for native gRPC (to grpcio), False for HTTP/1.1 (served here)."""
        seen = b""
        delay = 0.001
        while True:
            await _readable(sock)
            data = sock.recv(_PEEK_BYTES, socket.MSG_PEEK)
            if not data:
                raise ValueError("closed before saying anything")
            if self._tls is None:
                if data.startswith(PREFACE):
                    return True
                if not PREFACE.startswith(data):
                    return False
            else:
                offers = alpn_offers(data)
                if offers is not None:
                    return b"http/1.1" not in offers and bool(offers)
            if data == seen:  # the bytes peeked so far stay readable: wait for more, not spin
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.05)
            seen = data

    async def _splice(self, sock: socket.socket) -> None:
        """Copy bytes both ways between the client and grpcio, until both sides are done."""
        try:
            client_reader, client_writer = await asyncio.open_connection(sock=sock)
        except OSError:
            sock.close()
            return
        try:
            grpc_reader, grpc_writer = await asyncio.open_unix_connection(self.target)
        except OSError:
            client_writer.close()
            return
        try:
            if self._tls is None:  # frames readable: resets, pings and SETTINGS counted on the way
                guard = _ControlGuard(self.bounds.http2.max_resets_per_s)
                await asyncio.gather(
                    guard.copy_in(client_reader, grpc_writer), guard.copy_out(grpc_reader, client_writer)
                )
            else:
                await asyncio.gather(_copy(client_reader, grpc_writer), _copy(grpc_reader, client_writer))
        finally:
            for writer in (client_writer, grpc_writer):
                writer.close()

    # ------------------------------------------------------------------------------ gRPC-Web

    def _cors(self, request: web.BaseRequest) -> dict[str, str]:
        origin = request.headers.get("Origin")
        if origin is None or origin not in self.origins:
            return {}
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Expose-Headers": EXPOSED_HEADERS,
            "Vary": "Origin",
        }

    async def _serve(self, request: web.BaseRequest) -> web.StreamResponse:
        request_started(request)  # the head is in: no head deadline while the call runs
        try:
            return await self._handle(request)
        finally:
            request_finished(request)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        cors = self._cors(request)
        if request.method == "OPTIONS":
            return self._preflight(request, cors)
        content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        try:
            if self.guard_host and not is_loopback_host(_host_name(request.headers.get("Host", ""))):
                raise ApiError(
                    Code.PERMISSION_DENIED,
                    "authentication is off, so only requests for a loopback "
                    "host (localhost, 127.0.0.1, [::1]) are answered",
                )
            if content_type in ("application/grpc", "application/grpc+proto"):
                raise ApiError(Code.UNIMPLEMENTED, "HTTP/1.1 carries only gRPC-Web here; use HTTP/2 for gRPC")
            if content_type.startswith("application/grpc-web-text"):
                raise ApiError(Code.UNIMPLEMENTED, "only binary gRPC-Web (application/grpc-web+proto) is served")
            if content_type not in WEB_TYPES:
                return web.Response(
                    status=415, text="gRPC-Web requests are POSTs of application/grpc-web+proto\n", headers=cors
                )
            if request.method != "POST":
                return web.Response(status=405, headers={"Allow": "POST", **cors})
            method = self._methods.get(request.path)
            if method is None:
                if request.path == "/cronoq.v1.Workers/Work":
                    raise ApiError(
                        Code.UNIMPLEMENTED,
                        "Workers.Work is a bidirectional stream, which gRPC-Web cannot carry; workers use native gRPC",
                    )
                raise ApiError(Code.UNIMPLEMENTED, f"unknown method {request.path}")
            message = method.request.FromString(await self._message(request))
            principal = self.auth.authenticate(request.headers.get("Authorization"))
            if not self.api.serving:
                raise ApiError.unavailable()
            timeout = _timeout(request.headers.get("grpc-timeout"))
            if method.streaming:
                return await self._stream(request, method, principal, message, content_type, cors)
            response, missing = await self.unary.run(principal, method.handler, message, deadline=timeout)
        except DecodeError:
            return _trailers_only(ApiError.invalid("the request message cannot be decoded"), content_type, cors)
        except Exception as exc:
            return _trailers_only(from_exception(exc), content_type, cors)
        metadata = ((UNAVAILABLE_SHARDS_KEY, ",".join(missing)),) if missing else ()
        body = _frame(0, response.SerializeToString()) + _trailers(None, "", metadata)
        return web.Response(body=body, headers={"Content-Type": content_type, **cors})

    def _preflight(self, request: web.BaseRequest, cors: dict[str, str]) -> web.Response:
        if not cors or request.headers.get("Access-Control-Request-Method", "").upper() != "POST":
            return web.Response(status=403)
        headers = {
            "Access-Control-Allow-Origin": cors["Access-Control-Allow-Origin"],
            "Vary": "Origin",
            "Access-Control-Allow-Methods": "POST",
            "Access-Control-Allow-Headers": ALLOWED_HEADERS,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
        }
        return web.Response(status=204, headers=headers)

    async def _message(self, request: web.BaseRequest) -> bytes:
        """The one message of a request body: one uncompressed frame within the size limit."""
        limit = self.limits.max_message_bytes
        if request.content_length is not None and request.content_length > limit + 5:
            raise ApiError(Code.RESOURCE_EXHAUSTED, f"the request is larger than {limit} bytes")
        chunks, size = [], 0
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limit + 5:
                raise ApiError(Code.RESOURCE_EXHAUSTED, f"the request is larger than {limit} bytes")
            chunks.append(chunk)
        body = b"".join(chunks)
        if len(body) < 5:
            raise ApiError.invalid("the request body holds no gRPC-Web message frame")
        flag, length = struct.unpack_from("!BI", body)
        if flag & 0x01:
            raise ApiError(Code.UNIMPLEMENTED, "compressed messages are not accepted")
        if flag != 0 or length != len(body) - 5:
            raise ApiError.invalid("the request body must be exactly one gRPC-Web message frame")
        return body[5:]

    async def _stream(
        self,
        request: web.BaseRequest,
        method: _Method,
        principal: Principal,
        message: Message,
        content_type: str,
        cors: dict[str, str],
    ) -> web.StreamResponse:
        """A server stream (Watch): subscribe first, then frames as events come, trailers last. It
        holds one of the caller's stream slots (``limits.max_streams_per_caller``) while open."""
        with self.unary.streams.hold(principal, "Watch"):
            return await self._serve_stream(request, method, principal, message, content_type, cors)

    async def _serve_stream(
        self,
        request: web.BaseRequest,
        method: _Method,
        principal: Principal,
        message: Message,
        content_type: str,
        cors: dict[str, str],
    ) -> web.StreamResponse:
        with collect_unavailable() as missing:
            events: AsyncIterator[Message] = await method.handler(principal, message)
        headers = {"Content-Type": content_type, **cors}
        if missing:
            headers[UNAVAILABLE_SHARDS_KEY] = ",".join(missing)
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        trailer = _trailers(None, "")
        try:
            async for event in events:
                await response.write(_frame(0, event.SerializeToString()))
        except Exception as exc:
            error = from_exception(exc)
            trailer = _trailers(error.code, error.message, error.metadata)
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]
        await response.write(trailer)
        await response.write_eof()
        return response


def _trailers_only(error: ApiError, content_type: str, cors: dict[str, str]) -> web.Response:
    headers = {
        "Content-Type": content_type if content_type.startswith("application/grpc") else WEB_TYPES[1],
        "grpc-status": str(error.code.grpc.value[0]),
        "grpc-message": _encode_message(error.message),
        **cors,
    }
    headers.update(error.metadata)
    return web.Response(status=200, headers=headers)


class _WebListener(Listener):
    """The HTTP listener's connection bounds for gRPC-Web, which browsers speak over HTTP/1.1 only:
    a connection that turns out to speak HTTP/2 here (after TLS chose ``http/1.1``) is closed."""

    def http2(self) -> asyncio.Protocol:
        return _Refused()


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


_GOAWAY_CALM = struct.pack("!IBBIII", 8, 0x7, 0, 0, 2**31 - 1, 0xB)[1:]
"""GOAWAY(ENHANCE_YOUR_CALM), every stream possibly processed (so nothing is retried elsewhere)."""


class _ControlGuard:
    """Both directions of one native gRPC connection through the front, with the client's
    resets, pings and SETTINGS held to a rate (``http2.ControlBudget``). Past it the client's
    bytes stop, grpcio's connection is closed, and once grpcio's last whole frame is out the
    client gets GOAWAY(ENHANCE_YOUR_CALM)."""

    def __init__(self, rate: int) -> None:
        self._budget = ControlBudget(rate)
        self.calmed = False

    async def copy_in(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = ControlFrames()
        try:
            while data := await reader.read(_COPY_CHUNK):
                found = frames.count(data)
                if found and not self._budget.spend(found):
                    self.calmed = True
                    log.debug("grpc: a client sent resets, pings or SETTINGS too fast; GOAWAY and closing")
                    writer.close()  # grpcio lets go of the connection and cancels its calls
                    return
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()

    async def copy_out(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = ControlFrames(preface=False)  # only to know where grpcio's frames end
        try:
            while data := await reader.read(_COPY_CHUNK):
                frames.count(data)
                writer.write(data)
                await writer.drain()
            if self.calmed and frames.between_frames:
                writer.write(_GOAWAY_CALM)
                await writer.drain()
            if self.calmed:
                writer.close()
            elif writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()


def _reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0): a refused connection leaves nothing in TIME_WAIT."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _host_name(header: str) -> str:
    header = header.strip()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    name, sep, port = header.rpartition(":")
    return name if sep and (port.isascii() and port.isdigit()) else header


def _web_tls(config: Config) -> ssl.SSLContext | None:
    """TLS for browsers (HTTP/1.1 only, no client certificate asked for)."""
    tls = config.server.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    context.set_alpn_protocols(["http/1.1"])
    return context


async def _readable(sock: socket.socket) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    fd = sock.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_COPY_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()
