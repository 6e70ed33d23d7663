"""The worker's end of a worker link (``cronoq.server.worker_link``): a Work stream without grpc-aio.

``WorkerLinkCall`` offers the part of a grpc.aio stream-stream call that ``cronoq.client.Worker``
uses (``read``, ``write``, ``done_writing``, ``cancel``, ``done``), so the Worker runs a session on
it exactly as on gRPC. The server's final status arrives as a frame: OK reads as the end of the
stream, anything else raises ``grpc.aio.AioRpcError`` with the status, message and metadata the
gRPC stream would have ended with; a connection lost without a status is UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import Any, cast

import grpc

from cronoq._linkwire import (
    HALF_CLOSE,
    HELLO,
    MESSAGE,
    STATUS,
    WORKER_PREFACE,
    FrameReader,
    Inbox,
    WriteGate,
    decode_status,
    enable_keepalive,
    frame,
    status_code,
)
from cronoq.proto import cronoq_pb2 as pb

__all__ = ["CONNECT_TIMEOUT_S", "WorkerLinkCall", "link_ssl_context"]

CONNECT_TIMEOUT_S = 3.0
_MESSAGE = bytes([MESSAGE])


def link_ssl_context() -> ssl.SSLContext:
    """TLS for a link to a server reached over TLS with gRPC's default roots (``tls=True``): the
    bundle in ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` when set, else the system's."""
    return ssl.create_default_context(cafile=os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH") or None)


class WorkerLinkCall(asyncio.Protocol):
    def __init__(self, limit: int) -> None:
        self._reader = FrameReader(limit, (WORKER_PREFACE,))
        self._transport: asyncio.Transport | None = None
        self._inbox = Inbox()
        self._gate = WriteGate()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._status: tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]] | None = None
        self._cancelled = False

    @classmethod
    async def open(cls, host: str, port: int, *, authorization: str | None, ssl_context: ssl.SSLContext | None,
                   limit: int = 64 << 20) -> WorkerLinkCall:  # fmt: skip
        """Connect, exchange prefaces, then say hello with ``authorization``."""
        loop = asyncio.get_running_loop()
        transport: asyncio.Transport | None = None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                transport, call = await loop.create_connection(
                    lambda: cls(limit), host, port, ssl=ssl_context, server_hostname=host if ssl_context else None
                )
                transport.write(WORKER_PREFACE)
                # The token goes out only once the other side answered as a cronoq link listener
                # would, never to whatever else might listen on that port.
                await call._ready
                transport.write(frame(bytes([HELLO]) + (authorization or "").encode("utf-8", "replace")))
        except BaseException:
            if transport is not None:
                transport.close()
            raise
        return call

    # ------------------------------------------------------------------ the call's interface

    async def read(self) -> Any:
        message = await self._inbox.get()
        if message is not None:
            return message
        assert self._status is not None  # the inbox closes with the status
        code, details, metadata = self._status
        if code is grpc.StatusCode.OK:
            return grpc.aio.EOF
        raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*metadata), details)

    async def write(self, message: Any) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ConnectionError("the worker link is closed")
        transport.write(frame(_MESSAGE + message.SerializeToString()))
        await self._gate.wait()

    async def done_writing(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frame(bytes([HALF_CLOSE])))

    def cancel(self) -> bool:
        if self._status is not None or self._cancelled:
            return False
        self._cancelled = True
        if self._transport is not None:
            self._transport.close()
        self._inbox.interrupt()
        return True

    def done(self) -> bool:
        return self._status is not None or self._cancelled

    async def initial_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata()

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        enable_keepalive(transport, 20.0, 20.0)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
            if not self._ready.done() and self._reader.preface is not None:
                self._ready.set_result(None)
            for body in frames:
                kind = body[0] if body else 0
                if kind == MESSAGE:
                    self._inbox.put(pb.ServerMessage.FromString(body[1:]))
                elif kind == STATUS:
                    code, message, metadata, _ = decode_status(body, 1)
                    self._end(status_code(code), message, metadata)
                else:
                    raise ValueError(f"unexpected frame kind {kind}")
        except Exception as exc:
            self._end(grpc.StatusCode.INTERNAL, f"worker link protocol error: {exc}", ())
            if self._transport is not None:
                self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._ready.done():
            self._ready.set_exception(ConnectionError(f"worker link closed: {exc or 'by the server'}"))
        self._end(grpc.StatusCode.UNAVAILABLE, f"worker link lost: {exc or 'connection closed'}", ())
        self._gate.resume()

    def pause_writing(self) -> None:
        self._gate.pause()

    def resume_writing(self) -> None:
        self._gate.resume()

    def _end(self, code: grpc.StatusCode, message: str, metadata: tuple[tuple[str, str], ...]) -> None:
        if self._status is None:
            self._status = (code, message, metadata)
        self._inbox.close()
