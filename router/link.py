"""The peer link: a lean connection that carries forwarded unary calls to another shard's leader.

Each forwarded gRPC call costs both nodes several hundred microseconds of grpc-aio machinery
(call setup, metadata, status, thread hand-offs) for what is usually a small message: about as much
as the work it forwards. So a leader that has a link listener names its port in the trailing
metadata of the forwarded gRPC calls it answers (``cronoq-peer-link``), and the forwarding node
opens one connection to that port on the shard endpoint's host (TLS with ``[server.peer_tls]`` when
the endpoint is ``https://``) and sends its later forwarded unary calls over it: the same
``cronoq.v1`` request message, the caller's own ``authorization``, a time limit; back come the
status code, message, ``cronoq-*`` metadata and response message a gRPC call would have given.
Nodes that do not advertise a link (older versions, ``server.links = false``) are reached over
gRPC as before, and so are watches and calls that carry a trace.

Wire format (all integers big-endian):

- each side first sends ``PREFACE``, then frames (``cronoq._linkwire``);
- request: ``u32 call id, u8 method, u32 time limit in ms, u16 authorization length``, the
  authorization (UTF-8), the serialized request message;
- response: ``u32 call id``, a status (``cronoq._linkwire``), the serialized response message.

Status is a gRPC status code, or ``NOT_SERVING`` from a node that is not its shard's leader: the
call was not run, and the forwarding node sends it over gRPC instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import grpc

from cronoq._linkwire import (
    LENGTH,
    PEER_PREFACE,
    FrameReader,
    WriteGate,
    decode_status,
    enable_keepalive,
    encode_status,
    frame,
    frame_limit,
    status_code,
)
from cronoq.proto import cronoq_pb2 as pb

__all__ = [
    "LINK_KEY",
    "METHODS",
    "METHOD_NUMBER",
    "NOT_SERVING",
    "PREFACE",
    "FrameReader",
    "LinkBroken",
    "LinkClient",
    "LinkMethod",
    "LinkNotServing",
    "PeerLinks",
    "Reply",
    "client_ssl_context",
    "decode_reply",
    "decode_request",
    "enable_keepalive",
    "encode_reply",
    "encode_request",
    "frame_limit",
]

log = logging.getLogger("cronoq.router")

LINK_KEY = "cronoq-peer-link"
"""Trailing metadata of a forwarded gRPC call: the answering leader's link port."""
PREFACE = PEER_PREFACE
NOT_SERVING = 255
"""Reply status of a node that does not lead its shard (nothing was run)."""
CONNECT_TIMEOUT_S = 3.0

_REQUEST = struct.Struct(">IBIH")
_CALL_ID = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class LinkMethod:
    """A unary ``cronoq.v1`` method that may travel over a link."""

    service: str  # "tasks" or "admin", as the router names them
    name: str
    request: Any
    response: Any


METHODS: tuple[LinkMethod, ...] = (
    LinkMethod("tasks", "Submit", pb.SubmitRequest, pb.SubmitResponse),
    LinkMethod("tasks", "SubmitBatch", pb.SubmitBatchRequest, pb.SubmitBatchResponse),
    LinkMethod("tasks", "Get", pb.GetRequest, pb.TaskInfo),
    LinkMethod("tasks", "Wait", pb.WaitRequest, pb.TaskResult),
    LinkMethod("tasks", "Cancel", pb.CancelRequest, pb.CancelResponse),
    LinkMethod("tasks", "ListTasks", pb.ListTasksRequest, pb.ListTasksResponse),
    LinkMethod("admin", "Snapshot", pb.Empty, pb.SnapshotResponse),
    LinkMethod("admin", "AddRecurring", pb.RecurringRequest, pb.Empty),
    LinkMethod("admin", "RemoveRecurring", pb.RemoveRecurringRequest, pb.RemoveRecurringResponse),
    LinkMethod("admin", "ListWorkers", pb.Empty, pb.ListWorkersResponse),
    LinkMethod("admin", "ListRecurring", pb.Empty, pb.ListRecurringResponse),
)
"""Index in this tuple = method number on the wire (append only)."""
METHOD_NUMBER = {(method.service, method.name): number for number, method in enumerate(METHODS)}


class LinkBroken(Exception):
    """The link failed: the call's outcome on the other side is unknown."""


class LinkNotServing(Exception):
    """The other node does not lead its shard: the call was not run there."""


@dataclass(frozen=True, slots=True)
class Reply:
    status: grpc.StatusCode
    message: str
    metadata: tuple[tuple[str, str], ...]
    body: bytes


# ------------------------------------------------------------------------------------ encoding


def encode_request(call_id: int, method: int, timeout_s: float, authorization: str | None, body: bytes) -> bytes:
    auth = (authorization or "").encode("utf-8", "replace")
    millis = max(1, min(0xFFFFFFFF, round(timeout_s * 1000)))
    header = _REQUEST.pack(call_id, method, millis, len(auth))
    return LENGTH.pack(len(header) + len(auth) + len(body)) + header + auth + body


def decode_request(frame: bytes) -> tuple[int, int, float, str | None, bytes]:
    """``(call id, method, time limit s, authorization or None, request bytes)``; ValueError when
    the frame is malformed."""
    if len(frame) < _REQUEST.size:
        raise ValueError("short request frame")
    call_id, method, millis, auth_len = _REQUEST.unpack_from(frame)
    start = _REQUEST.size
    if len(frame) < start + auth_len:
        raise ValueError("truncated request frame")
    authorization = frame[start : start + auth_len].decode() if auth_len else None
    return call_id, method, millis / 1000, authorization, frame[start + auth_len :]


def encode_reply(call_id: int, status: int, message: str, metadata: tuple[tuple[str, str], ...], body: bytes) -> bytes:
    return frame(_CALL_ID.pack(call_id) + encode_status(status, message, metadata) + body)


def decode_reply(body: bytes) -> tuple[int, int, str, tuple[tuple[str, str], ...], bytes]:
    if len(body) < _CALL_ID.size:
        raise ValueError("short reply frame")
    (call_id,) = _CALL_ID.unpack_from(body)
    status, message, metadata, end = decode_status(body, _CALL_ID.size)
    return call_id, status, message, metadata, body[end:]


# ------------------------------------------------------------------------------------ client


class LinkClient(asyncio.Protocol):
    """The forwarding side of one link: calls in flight matched to replies by id."""

    def __init__(self, name: str, limit: int, on_lost: Callable[[LinkClient], None],
                 keepalive: tuple[float, float] = (20.0, 20.0)) -> None:  # fmt: skip
        self.name = name
        self._keepalive = keepalive
        self._reader = FrameReader(limit, (PEER_PREFACE,))
        self._on_lost = on_lost
        self._pending: dict[int, asyncio.Future[tuple[int, str, tuple[tuple[str, str], ...], bytes]]] = {}
        self._next_id = 0
        self._transport: asyncio.Transport | None = None
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._gate = WriteGate()
        self.alive = False

    @classmethod
    async def open(cls, name: str, host: str, port: int, *, ssl: Any, server_hostname: str | None, limit: int,
                   on_lost: Callable[[LinkClient], None], keepalive: tuple[float, float] = (20.0, 20.0)
                   ) -> LinkClient:  # fmt: skip
        loop = asyncio.get_running_loop()
        transport: asyncio.Transport | None = None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                transport, link = await loop.create_connection(
                    lambda: cls(name, limit, on_lost, keepalive), host, port, ssl=ssl, server_hostname=server_hostname
                )
                await link._ready
        except BaseException:
            if transport is not None:
                transport.close()
            raise
        link.alive = True
        return link

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        enable_keepalive(transport, *self._keepalive)
        self._transport.write(PREFACE)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except ValueError as exc:
            self._fail(f"protocol error: {exc}")
            return
        if not self._ready.done() and self._reader.preface is not None:
            self._ready.set_result(None)  # the whole preface came back
        for data_frame in frames:
            try:
                call_id, status, message, metadata, body = decode_reply(data_frame)
            except ValueError as exc:
                self._fail(f"protocol error: {exc}")
                return
            waiter = self._pending.pop(call_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result((status, message, metadata, body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        reason = f"connection lost: {exc}" if exc else "connection closed"
        if not self._ready.done():
            self._ready.set_exception(LinkBroken(reason))
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            if not waiter.done():
                waiter.set_exception(LinkBroken(reason))
        self._gate.resume()
        self._on_lost(self)

    def pause_writing(self) -> None:
        self._gate.pause()

    def resume_writing(self) -> None:
        self._gate.resume()

    def _fail(self, reason: str) -> None:
        log.warning("peer link to shard %s: %s", self.name, reason)
        if self._transport is not None:
            self._transport.abort()

    # calls

    async def call(self, method: int, request: Any, authorization: str | None, timeout: float) -> Reply:
        """Send one call and wait for its reply. ``LinkBroken`` when the link fails first (the
        outcome is unknown), ``LinkNotServing`` when the peer does not lead its shard, TimeoutError
        past ``timeout``."""
        if not self.alive or self._transport is None:
            raise LinkNotServing("link closed")
        self._next_id = call_id = (self._next_id + 1) & 0xFFFFFFFF
        waiter = asyncio.get_running_loop().create_future()
        self._pending[call_id] = waiter
        try:
            if self._gate.paused:
                await self._gate.wait()
                if not self.alive:
                    raise LinkNotServing("link closed")
            self._transport.write(encode_request(call_id, method, timeout, authorization, request.SerializeToString()))
            async with asyncio.timeout(timeout):
                status, message, metadata, body = await waiter
        finally:
            self._pending.pop(call_id, None)
        if status == NOT_SERVING:
            raise LinkNotServing(message)
        return Reply(status_code(status), message, metadata, body)

    def close(self) -> None:
        self.alive = False
        if self._transport is not None:
            self._transport.close()


# ------------------------------------------------------------------------------------ dialing


def client_ssl_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """TLS for links to ``https://`` shards, as ``[server.peer_tls]`` says (system roots without a CA)."""
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


class PeerLinks:
    """The open links of one node, by shard name: opened when a peer advertises one, dropped
    when they fail, tried again after a growing pause (a port that cannot be reached, for
    example behind a load balancer that only passes the gRPC port, costs one attempt a minute)."""

    RETRY_FIRST_S = 1.0
    RETRY_MAX_S = 60.0

    def __init__(self, *, enabled: bool, limit: int, ssl_context: Callable[[], ssl.SSLContext],
                 keepalive: tuple[float, float] = (20.0, 20.0)) -> None:  # fmt: skip
        self.enabled = enabled
        self._limit = limit
        self._keepalive = keepalive
        self._ssl_context = ssl_context
        self._links: dict[str, LinkClient] = {}
        self._opening: dict[str, asyncio.Task[None]] = {}
        self._retry_at: dict[str, float] = {}
        self._pause: dict[str, float] = {}

    def get(self, shard: str) -> LinkClient | None:
        return self._links.get(shard)

    def wanted(self, shard: str) -> bool:
        """Whether the next gRPC call to ``shard`` should look for an advertised link."""
        return (
            self.enabled
            and shard not in self._links
            and shard not in self._opening
            and time.monotonic() >= self._retry_at.get(shard, 0.0)
        )

    def advertised(self, shard: str, endpoint: str, metadata: Any) -> None:
        """Open a link to ``shard`` if its answer (trailing metadata) named a link port."""
        if shard in self._links or shard in self._opening:
            return
        port = None
        for key, value in metadata or ():
            if key == LINK_KEY and isinstance(value, str) and value.isdigit():
                port = int(value)
        if port is None or not 0 < port < 65536:
            self._retry_later(shard)  # it has none (yet): ask again later, not on every call
            return
        self._opening[shard] = asyncio.ensure_future(self._open(shard, endpoint, port))

    async def _open(self, shard: str, endpoint: str, port: int) -> None:
        parts = urlsplit(endpoint)
        host = parts.hostname or ""
        tls = parts.scheme == "https"
        try:
            link = await LinkClient.open(
                shard, host, port,
                ssl=self._ssl_context() if tls else None,
                server_hostname=host if tls else None,
                limit=self._limit,
                on_lost=self._lost,
                keepalive=self._keepalive,
            )  # fmt: skip
        except (OSError, TimeoutError, LinkBroken, ssl.SSLError) as exc:
            log.info("no peer link to shard %s at %s:%d (%s); forwarding over gRPC", shard, host, port, exc)
            self._retry_later(shard)
            return
        finally:
            self._opening.pop(shard, None)
        self._links[shard] = link
        self._pause.pop(shard, None)
        log.info("peer link to shard %s open (%s:%d)", shard, host, port)

    def _retry_later(self, shard: str) -> None:
        pause = min(self._pause.get(shard, self.RETRY_FIRST_S / 2) * 2, self.RETRY_MAX_S)
        self._pause[shard] = pause
        self._retry_at[shard] = time.monotonic() + pause

    def _lost(self, link: LinkClient) -> None:
        if self._links.get(link.name) is link:
            del self._links[link.name]
            log.info("peer link to shard %s closed; forwarding over gRPC until it is advertised again", link.name)

    def drop(self, link: LinkClient) -> None:
        """Stop using ``link`` (its node no longer serves the shard)."""
        self._lost(link)
        link.close()

    async def close(self) -> None:
        for task in list(self._opening.values()):
            task.cancel()
        for task in list(self._opening.values()):
            with contextlib.suppress(BaseException):
                await task
        for link in list(self._links.values()):
            link.close()
        self._links.clear()
