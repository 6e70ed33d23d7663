"""The link listener of a server: peer links (``cronoq.router.link``), forwarded unary calls from
other shards, and worker links (``worker_link``), Work streams of ``cronoq.client`` workers.

The listener runs for the whole process on an extra port of the gRPC listener's host, with the
same TLS (and client-certificate requirement) as the gRPC listener; the preface a connection
sends says which kind it is. The port is named only in answers to gRPC calls that can move (the
trailing metadata of forwarded calls, the initial metadata of Work streams whose worker offered
to), and only while this node leads its shard. Everything on a link is checked as on gRPC: the
caller's token authenticates each call or stream (a link itself grants nothing), and the limits
apply. A forwarded call is answered by the router, from this shard only; a node that does not lead
its shard answers ``NOT_SERVING`` without running anything, and a leader that steps down closes its
peer links, so forwarding nodes go back to gRPC and find the new leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, cast

from google.protobuf.message import DecodeError

from cronoq._linkwire import PEER_PREFACE, FrameReader, enable_keepalive, frame_limit
from cronoq.config import Config
from cronoq.router import Router
from cronoq.router.link import METHODS, NOT_SERVING, decode_request, encode_reply
from cronoq.router.router import UNAVAILABLE_SHARDS_KEY

from .api import Api
from .auth import Authenticator
from .errors import ApiError, Code, from_exception
from .unary import UnaryRunner
from .worker_link import HELLO, WorkerLinkStream, serve_work

__all__ = ["LinkServer"]

log = logging.getLogger("cronoq.server")

PREFACE_TIMEOUT_S = 10.0
"""A connection that has not sent its preface (and, on a worker link, its hello) by then is closed."""
STANDBY_LINGER_S = 1.0

def _handler_name(method: str) -> str:
    """The router's name for a ``cronoq.v1`` method: ``SubmitBatch`` -> ``submit_batch``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", method).lower()


def _server_ssl(config: Config) -> ssl.SSLContext | None:
    tls = config.server.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert, tls.key)
    if tls.client_ca is not None:  # as on the gRPC listener: every client presents a certificate
        context.load_verify_locations(tls.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class LinkServer:
    """Accepts peer links and answers the calls they carry."""

    def __init__(self, api: Api, router: Router, authenticator: Authenticator,
                 work: Callable[[Any, Any], Awaitable[None]], unary: UnaryRunner) -> None:  # fmt: skip
        self.api = api
        self.work = work
        self.unary = unary
        self.router = router
        self.auth = authenticator
        self.limits = api.limits
        self._limit = frame_limit(api.limits.max_message_bytes)
        self._handlers: list[Callable[[Any, Any], Awaitable[Any]]] = [
            getattr(router, _handler_name(method.name)) for method in METHODS
        ]
        self._server: asyncio.Server | None = None
        self._connections: set[_LinkConnection] = set()
        self.port = 0

    async def start(self, host: str, config: Config) -> int:
        """Listen on ``host`` at a port the OS picks; returns the port."""
        loop = asyncio.get_running_loop()
        # One address only: a name such as "localhost" could otherwise get a different port per address.
        infos = await loop.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        address = str(infos[0][4][0])
        self._server = await loop.create_server(lambda: _LinkConnection(self), address, 0, ssl=_server_ssl(config))
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("listening (links) port %d", self.port)
        return self.port

    def retire(self) -> None:
        """Close every peer link (this node stopped leading: forwarding nodes must look again).
        Work streams on worker links end by themselves, after their workers got Shutdown."""
        for connection in list(self._connections):
            if connection.is_peer:
                connection.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            connection.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)

    # ---------------------------------------------------------------------------- one call

    async def answer(self, frame: bytes) -> bytes:
        """The reply frame to one request frame (never raises for the call's own failures)."""
        call_id, number, timeout, authorization, body = decode_request(frame)
        if number >= len(METHODS):
            return encode_reply(call_id, Code.UNIMPLEMENTED.grpc.value[0], f"unknown link method {number}", (), b"")
        method = METHODS[number]
        try:
            principal = self.auth.authenticate(authorization).as_forwarded()
            if not self.api.serving:
                return encode_reply(call_id, NOT_SERVING, "not the leader of this shard", (), b"")
            try:
                request = method.request.FromString(body)
            except DecodeError:
                raise ApiError.invalid(f"malformed {method.name} request") from None
            response, missing = await self.unary.run(principal, self._handlers[number], request, timeout)
        except Exception as exc:
            error = from_exception(exc)
            return encode_reply(call_id, error.code.grpc.value[0], error.message, error.metadata, b"")
        metadata = ((UNAVAILABLE_SHARDS_KEY, ",".join(missing)),) if missing else ()
        return encode_reply(call_id, 0, "", metadata, response.SerializeToString())


class _LinkConnection(asyncio.Protocol):
    """One accepted link. On a peer link each request frame runs as its own task and replies go
    out as they finish; a worker link carries one Work stream (``worker_link``)."""

    def __init__(self, server: LinkServer) -> None:
        self.server = server
        self.reader = FrameReader(server._limit)
        self.transport: asyncio.Transport | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.greeted = False
        self.work: WorkerLinkStream | None = None
        self._preface_timer: asyncio.TimerHandle | None = None

    @property
    def is_peer(self) -> bool:
        return self.reader.preface == PEER_PREFACE

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        limits = self.server.limits
        enable_keepalive(transport, limits.keepalive_interval_s, limits.keepalive_timeout_s)
        self.server._connections.add(self)
        loop = asyncio.get_running_loop()
        self._preface_timer = loop.call_later(PREFACE_TIMEOUT_S, self._no_preface)
        if not self.server.api.serving:
            # As on the gRPC listener: a standby lets each connection go about a second after
            # accepting it (whatever it carried was refused meanwhile).
            loop.call_later(STANDBY_LINGER_S, self.close)

    def _no_preface(self) -> None:
        # A peer link may then stay idle between calls; a worker link must have said hello.
        if not self.greeted or (not self.is_peer and self.work is None):
            self.close()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
            if not self.greeted and self.reader.preface is not None:
                self.greeted = True
                assert self.transport is not None
                self.transport.write(self.reader.preface)
            if self.is_peer:
                for body in frames:
                    task = asyncio.ensure_future(self._answer(body))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
            else:
                for body in frames:
                    self._work_frame(body)
        except ValueError as exc:
            log.warning("link from %s closed: %s", self._peer(), exc)
            self.close()

    def _work_frame(self, body: bytes) -> None:
        if self.work is not None:
            self.work.deliver(body)
            return
        if not body or body[0] != HELLO:
            raise ValueError("a worker link starts with a hello")
        assert self.transport is not None
        self.work = WorkerLinkStream(self.transport, body[1:].decode("utf-8", "replace") or None)
        log.info("work stream from %s on a worker link", self._peer())
        task = asyncio.ensure_future(serve_work(self.server.work, self.work))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, body: bytes) -> None:
        try:
            reply = await self.server.answer(body)
        except ValueError as exc:  # a malformed frame: the link cannot be trusted any more
            log.warning("peer link from %s closed: %s", self._peer(), exc)
            self.close()
            return
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(reply)

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return str(peer[0]) if peer else "unknown"

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def pause_writing(self) -> None:
        if self.work is not None:
            self.work.gate.pause()

    def resume_writing(self) -> None:
        if self.work is not None:
            self.work.gate.resume()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        if self._preface_timer is not None:
            self._preface_timer.cancel()
        if self.work is not None:
            # The Work stream reads the end of its input and ends as a disconnected gRPC one does.
            self.work.lost()
        else:
            # Nobody waits for these answers any more (as gRPC cancels its handlers).
            for task in list(self.tasks):
                task.cancel()
        self.transport = None
