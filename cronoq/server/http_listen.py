"""The listening side of the HTTP gateway: sockets, and what every connection is held to before
(and while) a request reaches the gateway's handler.

A ``Listener`` owns one socket. Each accepted connection is a ``Connection``, which stays the
transport's protocol for the connection's whole life and passes bytes on to the protocol it
picked: aiohttp's HTTP/1.1 handler (``Http1Handler``) or ``http2.Http2Connection``. With TLS
the ALPN result decides; otherwise the first bytes do (the HTTP/2 preface or not).

What a connection is held to, whoever sent it (none of it needs credentials):

- ``limits.max_connections`` open connections per listener; more are closed as they arrive.
- ``limits.header_timeout_s`` to say which protocol it speaks and deliver a complete request
  head (HTTP/1.1: from the first byte of each request; HTTP/2: its first request), and to
  finish a TLS handshake. A slow sender ("slowloris") is cut off then (408 when it had begun).
- ``limits.max_header_bytes`` for a request head and ``limits.max_headers`` header fields
  (431 / 400), checked while the bytes arrive.
- ``limits.idle_timeout_s`` without a request in progress, then closed.
- ``limits.write_stall_timeout_s`` with its answer unread (the socket's buffer full), then cut.
- HTTP/2 streams have their own bounds (``http2.Http2Limits``: resets per second, zero windows).

On the gateway's listener (``lean=True``) a plain ``POST /v1/tasks`` is read and answered by the
lean path of ``http1_lean`` instead of aiohttp, under the same bounds: its head is held to the same
timeout and size here, its body must have arrived with it (at most 64 KiB, ``LEAN_MAX_BODY_BYTES``),
a client's further bytes wait in a buffer of at most one head and one body (reading pauses beyond),
one request at a time in arrival order, and the connection is closed after ``limits.idle_timeout_s``
without a request, as aiohttp does. The first request that is not that plain hands the connection
to aiohttp for good.

Refusals of malformed HTTP/1.1 are answered ``{"error", "code"}`` like every other error and
logged at debug level without the offending bytes, which may hold a credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import re
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from cronoq.config import LimitsConfig, TlsConfig, parse_socket_addr

from .http1_lean import LEAN_MAX_BODY_BYTES, LeanRequest, answer_bytes, lean_head
from .http2 import PREFACE, Http2Connection, Http2Limits, reset, retire

__all__ = ["ConnectionBounds", "Http1Handler", "ListenError", "Listener", "bind", "format_address",
           "request_finished", "request_started", "ssl_context"]  # fmt: skip

log = logging.getLogger("cronoq.server")

SHUTDOWN_TIMEOUT_S = 2.0
"""How long closing a listener waits for requests in flight before cancelling them."""

_HEAD_END = b"\r\n\r\n"
_SAFE_REASON = re.compile(r"[A-Za-z][A-Za-z0-9 ,.:()-]{0,100}")
"""What of a parser's complaint may be quoted back: aiohttp quotes the offending bytes in
``'...'``, which this leaves out."""


@dataclass(frozen=True, slots=True)
class ConnectionBounds:
    """The ``[limits]`` keys a listener's connections are held to."""

    max_connections: int
    header_timeout_s: float
    idle_timeout_s: float
    max_header_bytes: int
    max_headers: int
    write_stall_timeout_s: float
    http2: Http2Limits
    max_body_bytes: int = 1 << 20
    """``limits.max_http_body_bytes``: the largest body the lean HTTP/1.1 path holds."""

    @classmethod
    def of(cls, limits: LimitsConfig) -> ConnectionBounds:
        return cls(
            max_connections=limits.max_connections,
            header_timeout_s=limits.header_timeout_s,
            idle_timeout_s=limits.idle_timeout_s,
            max_header_bytes=limits.max_header_bytes,
            max_headers=limits.max_headers,
            write_stall_timeout_s=limits.write_stall_timeout_s,
            http2=Http2Limits(
                limits.max_concurrent_streams,
                idle_timeout_s=limits.idle_timeout_s,
                first_request_timeout_s=limits.header_timeout_s,
                max_resets_per_s=limits.max_stream_resets_per_s,
                write_stall_timeout_s=limits.write_stall_timeout_s,
                max_header_bytes=limits.max_header_bytes,
                max_headers=limits.max_headers,
            ),
            max_body_bytes=limits.max_http_body_bytes,
        )


# ====================================================================================== sockets


class ListenError(OSError):
    """A listener could not bind its address; the message names it and the reason."""


def bind(addr: str) -> socket.socket:
    host, port = parse_socket_addr(addr)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {addr}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def format_address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """TLS for the main listener, on the same terms as the gRPC one: client certificates are
    required when ``client_ca`` is configured."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    if tls.client_ca is not None:
        context.load_verify_locations(tls.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


# ====================================================================================== HTTP/1.1


def _error_bytes(status: int, message: str) -> bytes:
    reason = http.HTTPStatus(status).phrase.lower().replace(" ", "_").replace("-", "_")
    return json.dumps({"error": message, "code": reason}, separators=(",", ":")).encode()


class Http1Handler(web.RequestHandler):
    """aiohttp's HTTP/1.1 protocol, answering what its parser refuses without echoing it.

    aiohttp logs a malformed request at ERROR with the parser's message, which quotes the
    offending header line (an ``authorization`` value included) and answers it in plain text
    with the same quote. Here such a request gets a short JSON error, and the log a debug line
    naming only the kind of problem."""

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:  # fmt: skip
        if status < 500:
            log.debug("http: malformed request refused (%s)", type(exc).__name__ if exc else status)
        else:
            log.error("http: internal error answering a request", exc_info=exc)
        if request.writer.output_size > 0:  # part of an answer went out: nothing more can be said
            raise ConnectionError("the answer was cut short")
        if isinstance(exc, LineTooLong):
            status, text = 431, "a request line or header is too long"
        elif status >= 500:
            text = "internal error"
        else:
            text = "malformed HTTP request"
            complaint = exc.message if isinstance(exc, HttpProcessingError) else ""
            first = str(complaint).split("\n", 1)[0].strip().rstrip(":")
            if _SAFE_REASON.fullmatch(first):
                text += f": {first}"
        response = web.Response(status=status, body=_error_bytes(status, text), content_type="application/json")
        response.force_close()
        return response


# ==================================================================================== connections

_HEAD, _REQUEST, _IDLE, _CLOSING = "head", "request", "idle", "closing"
# After a refusal: how long the client's further bytes are read and dropped before the socket
# closes. Closing with unread bytes makes the kernel answer RST, which can destroy the refusal
# before the client reads it ("lingering close", as web servers do).
LINGER_S = 2.0


class Connection(asyncio.Protocol):
    """One accepted connection: its bounds, and the protocol it speaks behind them."""

    def __init__(self, listener: Listener) -> None:
        self._listener = listener
        self._bounds = listener.bounds
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._inner: asyncio.Protocol | None = None
        self._http1 = False
        self._undecided = b""
        self._counted = False
        # HTTP/1.1 request heads: where the connection is, and the head arriving now.
        self._state = _HEAD
        self._head_bytes = 0
        self._head_tail = b""
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_since = 0.0
        self._stall_timer: asyncio.TimerHandle | None = None
        # The lean HTTP/1.1 path (``http1_lean``): the bytes not yet served while the connection is
        # on it (None once aiohttp serves it), the request being answered, and its idle timer.
        self._lean: bytearray | None = None
        self._lean_task: asyncio.Task[None] | None = None
        self._lean_paused = False
        self._write_paused = False
        self._close_when_answered = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._lean_max_body = min(self._bounds.max_body_bytes, LEAN_MAX_BODY_BYTES)
        self._lean_buffer_limit = self._bounds.max_header_bytes + self._lean_max_body
        """Buffered beyond this, reading pauses until a request is served."""

    # ------------------------------------------------------------------------ asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        listener = self._listener
        if len(listener.connections) >= self._bounds.max_connections:
            listener.refused += 1
            reset(self._transport)
            return
        listener.connections.add(self)
        self._counted = True
        ssl_object: ssl.SSLObject | ssl.SSLSocket | None = transport.get_extra_info("ssl_object")
        if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            self._start(http1=False, first=b"")
            return
        # Plain, or TLS without ALPN h2: the first bytes tell, within the head timeout.
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._state is _CLOSING:
            return  # refused: what the client still sends is dropped until the socket closes
        inner = self._inner
        if self._lean is not None:
            self._http1_data(data)
        elif inner is None:
            self._decide(data)
        elif self._http1:
            self._http1_data(data)
        else:
            inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._state is _CLOSING:
            return False  # the client read the refusal and hung up: close now
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        self._write_paused = True
        if self._stall_timer is None:
            self._stall_timer = self._loop.call_later(self._bounds.write_stall_timeout_s, self._stalled)
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self._inner is not None:
            self._inner.resume_writing()
        if self._lean is not None:
            self._lean_next()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._head_timer, self._stall_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._stall_timer = self._idle_timer = None
        if self._lean_task is not None:
            self._lean_task.cancel()  # as aiohttp cancels a handler whose client went away
        if self._counted:
            self._counted = False
            self._listener.connections.discard(self)
        if self._inner is not None:
            self._inner.connection_lost(exc)

    # ------------------------------------------------------------------------ protocol choice

    def _decide(self, data: bytes) -> None:
        buffered = self._undecided + data
        if buffered.startswith(PREFACE):
            self._undecided = b""
            self._cancel_head_timer()  # HTTP/2 bounds its first request itself
            self._start(http1=False, first=buffered)
        elif not PREFACE.startswith(buffered):
            self._undecided = b""
            self._start(http1=True, first=buffered)
        else:
            self._undecided = buffered  # a strict prefix of the preface so far

    def _start(self, *, http1: bool, first: bytes) -> None:
        transport = self._transport
        assert transport is not None
        self._http1 = http1
        if http1 and self._listener.lean:
            # aiohttp's protocol is made only when the connection is handed to it: until then it
            # would count the connection as idle (and close it after its keep-alive time).
            self._lean = bytearray()
        else:
            inner = self._inner = self._listener.http1() if http1 else self._listener.http2()
            inner.connection_made(transport)
        if first and not transport.is_closing():
            if http1:
                self._http1_data(first)
            else:
                assert self._inner is not None
                self._inner.data_received(first)

    # ------------------------------------------------------------------------ HTTP/1.1 heads

    def _http1_data(self, data: bytes) -> None:
        if self._lean is not None:
            self._lean += data
            self._lean_next()
            if self._lean is not None and len(self._lean) > self._lean_buffer_limit and not self._lean_paused:
                # A client far ahead of its answers (or not reading them) waits until one is served.
                self._lean_paused = True
                if self._transport is not None:
                    self._transport.pause_reading()
            return
        if self._state is _IDLE:
            # The first byte of the next request: its head must be complete within the timeout.
            self._state, self._head_bytes, self._head_tail = _HEAD, 0, b""
            self._arm_head_timer()
        if self._state is _HEAD:
            scanned = self._head_tail + data
            end = scanned.find(_HEAD_END)
            if end < 0:
                self._head_bytes += len(data)
                self._head_tail = scanned[-3:]
            else:
                self._head_bytes += end + len(_HEAD_END) - len(self._head_tail)
                self.request_started()
            if self._head_bytes > self._bounds.max_header_bytes:
                self._refuse(431, f"the request head is larger than {self._bounds.max_header_bytes} bytes")
                return
        assert self._inner is not None
        self._inner.data_received(data)

    def request_started(self) -> None:
        """The head of an HTTP/1.1 request is complete (the gateway's handler runs it): no head
        deadline while it runs (its own time limit bounds it)."""
        if self._http1:
            self._state = _REQUEST  # the head timer, if running, finds no head when it fires

    def request_finished(self, body_read: bool) -> None:
        """The gateway answered; the next bytes begin the next request, unless the rest of this
        request's body is still to come (aiohttp reads it and drops it, or closes)."""
        if self._http1 and body_read:
            self._state = _IDLE

    # ------------------------------------------------------------------------ the lean path

    def _lean_next(self) -> None:
        """Serve the next request buffered on the lean path, if one may start now: none is being
        answered, the client reads its answers, and its head (and body) are complete."""
        buffer = self._lean
        if buffer is None or self._lean_task is not None or self._write_paused or self._close_when_answered:
            return
        transport = self._transport
        if not buffer or transport is None or transport.is_closing():
            return
        bounds = self._bounds
        if self._state is _IDLE:  # the first byte of the next request: as in _http1_data
            self._state = _HEAD
            self._arm_head_timer()
        end = buffer.find(_HEAD_END)
        head_size = len(buffer) if end < 0 else end + len(_HEAD_END)
        if head_size > bounds.max_header_bytes:
            self._lean = None
            self._refuse(431, f"the request head is larger than {bounds.max_header_bytes} bytes")
            return
        if end < 0:
            self._head_bytes = head_size  # the head timer answers 408 if it never completes
            if self._lean_paused:  # what is buffered is less than a head: read the rest
                self._lean_paused = False
                transport.resume_reading()
            return
        parsed = lean_head(bytes(buffer[:end]), bounds.max_headers, self._lean_max_body)
        if parsed is None or len(buffer) < head_size + parsed[1]:
            self._hand_to_aiohttp()
            return
        headers, length = parsed
        body = bytes(buffer[head_size : head_size + length])
        del buffer[: head_size + length]
        self._state = _REQUEST
        self._listener.lean_requests += 1
        request = LeanRequest(headers, body, transport)
        self._lean_task = self._loop.create_task(self._lean_serve(request, transport))
        if self._lean_paused and len(buffer) <= self._lean_buffer_limit:
            self._lean_paused = False
            transport.resume_reading()

    def _hand_to_aiohttp(self) -> None:
        """aiohttp serves this connection from the request at the front of the buffer on."""
        assert self._lean is not None and self._lean_task is None
        data = bytes(self._lean)
        self._lean = None
        assert self._transport is not None
        inner = self._inner = self._listener.http1()
        inner.connection_made(self._transport)
        if self._write_paused:
            inner.pause_writing()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._lean_paused and self._transport is not None:
            self._lean_paused = False
            self._transport.resume_reading()
        self._state, self._head_bytes, self._head_tail = _IDLE, 0, b""
        self._http1_data(data)

    async def _lean_serve(self, request: LeanRequest, transport: asyncio.Transport) -> None:
        try:
            answer = answer_bytes(await self._listener.handler(request))
        except Exception as exc:  # the gateway answers its own errors; this is what aiohttp would do
            log.error("http: internal error answering a request", exc_info=exc)
            answer = None
        finally:
            self._lean_task = None
        if answer is None:
            body = _error_bytes(500, "internal error")
            answer = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(body), body), True)  # fmt: skip
        data, closes = answer
        if transport.is_closing():
            return
        transport.write(data)
        self._state = _IDLE
        if closes or self._close_when_answered:
            transport.close()
            return
        self._idle_since = self._loop.time()
        if self._idle_timer is None:
            self._idle_timer = self._loop.call_later(self._bounds.idle_timeout_s, self._idle_timer_fired)
        self._lean_next()

    def _idle_timer_fired(self) -> None:
        """Like ``_head_timer_fired``, one timer for many requests: close an idle connection."""
        self._idle_timer = None
        if self._lean is None or self._state is not _IDLE or self._lean_task is not None or self._write_paused:
            return  # a request is in progress or answers wait to be read (their own timers bound
            # them), or aiohttp serves the connection
        left = self._idle_since + self._bounds.idle_timeout_s - self._loop.time()
        if left > 0:
            self._idle_timer = self._loop.call_later(left, self._idle_timer_fired)
        elif self._transport is not None:
            self._transport.close()

    def _refuse(self, status: int, message: str) -> None:
        """Answer a request that never reached aiohttp, and hang up."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        body = _error_bytes(status, message)
        reason = http.HTTPStatus(status).phrase
        transport.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: "
                        f"{len(body)}\r\nconnection: close\r\n\r\n".encode() + body)  # fmt: skip
        if not transport.can_write_eof():
            transport.close()  # TLS: close_notify follows the answer
            return
        # The answer, then FIN; the socket closes when the client does, or LINGER_S later.
        self._state = _CLOSING
        self._cancel_head_timer()
        transport.write_eof()
        self._head_timer = self._loop.call_later(min(LINGER_S, self._bounds.header_timeout_s), transport.close)

    # ------------------------------------------------------------------------ timers

    def _arm_head_timer(self) -> None:
        """The head beginning now must be complete within ``header_timeout_s``. One timer serves
        a connection's many requests (a timer per request costs a keep-alive client's small
        requests a few percent): it keeps running past a complete head, and when it fires it
        looks at the head in progress then, if any, and waits for what that head has left."""
        self._head_since = self._loop.time()
        if self._head_timer is None:
            self._head_timer = self._loop.call_later(self._bounds.header_timeout_s, self._head_timer_fired)

    def _head_timer_fired(self) -> None:
        self._head_timer = None
        if self._state is not _HEAD:
            return  # no head arriving now; the next one arms the timer again
        left = self._head_since + self._bounds.header_timeout_s - self._loop.time()
        if left > 0:
            self._head_timer = self._loop.call_later(left, self._head_timer_fired)
        else:
            self._head_timed_out()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        self._listener.slow_heads += 1
        log.debug("http: no complete request within %g s; connection closed", self._bounds.header_timeout_s)
        if self._http1 and self._head_bytes:
            self._refuse(408, f"the request head did not arrive within {self._bounds.header_timeout_s:g} s")
        elif self._transport is not None:
            self._transport.close()

    def _stalled(self) -> None:
        """The client has not read its answers for ``write_stall_timeout_s``: cut it off."""
        self._stall_timer = None
        self._listener.stalled += 1
        log.debug("http: a client did not read its answers for %g s; connection reset",
                  self._bounds.write_stall_timeout_s)  # fmt: skip
        if self._transport is not None:
            reset(self._transport)

    # ------------------------------------------------------------------------ closing

    @property
    def decided(self) -> bool:
        """The connection has said which protocol it speaks."""
        return self._inner is not None or self._lean is not None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def retire(self, grace_s: float) -> None:
        """Close without cutting an answer short: at once while undecided, HTTP/1.1 once the
        request in progress is answered, HTTP/2 with GOAWAY (open streams get ``grace_s``)."""
        if self._lean is not None:
            self.retire_lean(grace_s)
        elif self._inner is None:
            self.close()
        else:
            retire(self._inner, grace_s)

    def retire_lean(self, grace_s: float) -> asyncio.Task[None] | None:
        """Retire a connection on the lean path: closed once its answer is written (cancelled
        after ``grace_s``), at once when none is being answered; the task answering, if any.
        A connection aiohttp serves is left alone (None)."""
        if self._lean is None:
            return None
        task = self._lean_task
        if task is None:
            self.close()
            return None
        self._close_when_answered = True
        self._loop.call_later(grace_s, task.cancel)
        return task


def _connection_of(request: Any) -> Connection | None:
    transport = getattr(request, "transport", None)
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, Connection) else None


def request_started(request: Any) -> None:
    """Tell the connection of ``request`` that its head is complete (see ``Connection``)."""
    if (connection := _connection_of(request)) is not None:
        connection.request_started()


def request_finished(request: Any) -> None:
    """Tell the connection of ``request`` that it has been answered."""
    if (connection := _connection_of(request)) is not None:
        at_eof = getattr(request.content, "at_eof", None)
        connection.request_finished(body_read=at_eof is None or bool(at_eof()))


# ====================================================================================== listeners


class Listener:
    """One listening socket and its connections. HTTP/1.1 connections are served by aiohttp's
    low-level server (``web.Server`` is documented as a protocol factory for
    ``loop.create_server``; ``Http1Handler`` is its protocol), HTTP/2 ones by ``Http2Connection``."""

    def __init__(self, handler: Callable[[Any], Any], bounds: ConnectionBounds, *, lean: bool = False) -> None:
        self.bounds = bounds
        self._handler = handler
        self.lean = lean
        """Plain ``POST /v1/tasks`` requests take the lean path (``http1_lean``): the gateway's listener."""
        # What aiohttp's HTTP/1.1 protocol is built with (``web.Server`` keeps the same for its own).
        self._http1_options: dict[str, Any] = {
            "access_log": None,
            "keepalive_timeout": bounds.idle_timeout_s,
            "max_line_size": bounds.max_header_bytes,
            "max_field_size": bounds.max_header_bytes,
            "max_headers": bounds.max_headers,
        }
        self.server = web.Server(handler, handler_cancellation=True, **self._http1_options)
        self.runner = web.ServerRunner(self.server, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
        self.socket_server: asyncio.AbstractServer | None = None
        self.connections: set[Connection] = set()
        self.http2_connections: set[Http2Connection] = set()
        # What the bounds turned away, for tests and load tests to read.
        self.refused = 0
        self.slow_heads = 0
        self.stalled = 0
        self.lean_requests = 0
        """Requests the lean HTTP/1.1 path served (the rest went to aiohttp or HTTP/2)."""

    @property
    def handler(self) -> Callable[[Any], Any]:
        """The request handler, for HTTP/1.1 (aiohttp's and the lean path) and HTTP/2 alike."""
        return self._handler

    def http1(self) -> asyncio.Protocol:
        # What ``web.Server.__call__`` does, with the protocol that keeps parser errors quiet.
        return Http1Handler(self.server, loop=asyncio.get_running_loop(), **self._http1_options)

    def http2(self) -> asyncio.Protocol:
        connection = Http2Connection(self._handler, self.bounds.http2, self.http2_connections.discard)
        self.http2_connections.add(connection)
        return connection

    async def start(self, sock: socket.socket, context: ssl.SSLContext | None,
                    on_accept: Callable[[Connection], None] | None = None) -> None:  # fmt: skip
        await self.runner.setup()

        def accept() -> Connection:
            connection = Connection(self)
            if on_accept is not None:
                on_accept(connection)
            return connection

        loop = asyncio.get_running_loop()
        handshake_s = self.bounds.header_timeout_s if context is not None else None
        self.socket_server = await loop.create_server(accept, sock=sock, ssl=context, backlog=128,
                                                      ssl_handshake_timeout=handshake_s)  # fmt: skip

    def retire_all(self, after_s: float, grace_s: float) -> None:
        loop = asyncio.get_running_loop()
        for connection in list(self.connections):
            loop.call_later(after_s, connection.retire, grace_s)

    async def close(self) -> None:
        """Stop accepting, then let both protocols finish what runs within ``SHUTDOWN_TIMEOUT_S``:
        aiohttp's runner for HTTP/1.1, GOAWAY and a wait for HTTP/2."""
        if self.socket_server is not None:
            self.socket_server.close()
        for connection in list(self.connections):
            if not connection.decided:
                connection.close()
        # Answers in progress on the lean path are written first: aiohttp's shutdown below would
        # close their connections at once, since aiohttp itself has no request in progress on them.
        answering = [task for connection in list(self.connections)
                     if (task := connection.retire_lean(SHUTDOWN_TIMEOUT_S)) is not None]  # fmt: skip
        if answering:
            await asyncio.wait(answering)
        await asyncio.gather(self.runner.cleanup(),
                             *(h2.shutdown(SHUTDOWN_TIMEOUT_S) for h2 in list(self.http2_connections)),
                             return_exceptions=True)  # fmt: skip
        with contextlib.suppress(Exception):
            for connection in list(self.connections):
                connection.close()
