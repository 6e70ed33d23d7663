"""Framing shared by cronoq's links: lean connections that carry what would otherwise be one
grpc-aio message (or call) at a time, between cronoq's own processes.

Two kinds share one listener on a leader, told apart by the preface the connecting side sends
first (the listener echoes it): peer links between the nodes of a sharded cluster
(``cronoq.router.link``) and worker links (``cronoq.server.worker_link`` and the ``Worker`` of
``cronoq.client``). After the preface, either side sends frames: a big-endian ``u32`` length and
that many bytes. A status (gRPC code, message, ``cronoq-*`` metadata) is encoded as
``u8 code, u16 message length, u32 metadata length``, the message (UTF-8), the metadata (UTF-8
``key NUL value NUL`` pairs).
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections import deque
from typing import Any

import grpc

__all__ = [
    "HALF_CLOSE",
    "HELLO",
    "LENGTH",
    "MESSAGE",
    "PEER_PREFACE",
    "PREFACES",
    "STATUS",
    "WORKER_LINK_KEY",
    "WORKER_PREFACE",
    "FrameReader",
    "Inbox",
    "WriteGate",
    "decode_status",
    "enable_keepalive",
    "encode_status",
    "frame",
    "frame_limit",
    "status_code",
]

WORKER_LINK_KEY = "cronoq-worker-link"
"""Work stream metadata: "1" from a worker that can move to a link; the port in the answer."""
HELLO, MESSAGE, HALF_CLOSE, STATUS = 1, 2, 3, 4
"""First byte of a worker link's frames (see ``cronoq.server.worker_link``)."""

PEER_PREFACE = b"CRONOQ-LINK/1 PEER\n"
WORKER_PREFACE = b"CRONOQ-LINK/1 WORK\n"
PREFACES = (PEER_PREFACE, WORKER_PREFACE)

LENGTH = struct.Struct(">I")
_STATUS = struct.Struct(">BHI")

Metadata = tuple[tuple[str, str], ...]


_STATUS_CODES = {status.value[0]: status for status in grpc.StatusCode}


def status_code(number: int) -> grpc.StatusCode:
    """The gRPC status a link's status number stands for (UNKNOWN for numbers gRPC has not)."""
    return _STATUS_CODES.get(number, grpc.StatusCode.UNKNOWN)


def frame(body: bytes) -> bytes:
    return LENGTH.pack(len(body)) + body


def frame_limit(max_message_bytes: int) -> int:
    """Largest frame either side accepts: one message plus room for its header."""
    return max_message_bytes + 64 * 1024


def encode_status(code: int, message: str, metadata: Metadata) -> bytes:
    # "replace": a message may quote a caller's text, which may hold what UTF-8 cannot (lone surrogates).
    text = message.encode("utf-8", "replace")[:0xFFFF]
    meta = "".join(f"{key}\0{value}\0" for key, value in metadata).encode("utf-8", "replace")
    return _STATUS.pack(code, len(text), len(meta)) + text + meta


def decode_status(body: bytes, offset: int = 0) -> tuple[int, str, Metadata, int]:
    """``(code, message, metadata, end offset)``; ValueError when truncated."""
    if len(body) < offset + _STATUS.size:
        raise ValueError("short status")
    code, text_len, meta_len = _STATUS.unpack_from(body, offset)
    start = offset + _STATUS.size
    end = start + text_len + meta_len
    if len(body) < end:
        raise ValueError("truncated status")
    message = body[start : start + text_len].decode("utf-8", "replace")
    parts = body[start + text_len : end].decode("utf-8", "replace").split("\0")[:-1]
    return code, message, tuple(zip(parts[0::2], parts[1::2], strict=False)), end


def enable_keepalive(transport: asyncio.BaseTransport, idle_s: float, timeout_s: float) -> None:
    """TCP keepalive on a link's socket, so that a peer gone without a word (a partition, a host
    that died) is noticed within about ``idle_s + timeout_s`` even while the link is idle."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):  # Linux
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, max(1, round(idle_s)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, round(timeout_s / 3)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    except (OSError, AttributeError):  # pragma: no cover - platform without these options
        pass


class Inbox:
    """What arrived on a link for its one reader: ``get`` waits for the next item, or returns None
    once the inbox is closed and drained."""

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False

    def put(self, item: Any) -> None:
        self._items.append(item)
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()

    def interrupt(self) -> None:
        """A ``get`` waiting now raises CancelledError (as a read on a cancelled grpc call does)."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.cancel()

    async def get(self) -> Any | None:
        while not self._items:
            if self.closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._items.popleft()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class WriteGate:
    """A link's flow control: while its transport is paused (the peer reads too slowly), writers
    wait here; ``resume`` also releases them when the connection is gone."""

    def __init__(self) -> None:
        self._resumed: asyncio.Future[None] | None = None

    @property
    def paused(self) -> bool:
        return self._resumed is not None

    def pause(self) -> None:
        if self._resumed is None:
            self._resumed = asyncio.get_running_loop().create_future()

    def resume(self) -> None:
        resumed, self._resumed = self._resumed, None
        if resumed is not None and not resumed.done():
            resumed.set_result(None)

    async def wait(self) -> None:
        if self._resumed is not None:
            await self._resumed


class FrameReader:
    """Splits a byte stream into its preface (one of ``prefaces``) and length-prefixed frames."""

    def __init__(self, limit: int, prefaces: tuple[bytes, ...] = PREFACES) -> None:
        self.limit = limit
        self._prefaces = prefaces
        self._buffer = bytearray()
        self.preface: bytes | None = None
        """The preface seen, once it has arrived whole."""

    @property
    def preface_seen(self) -> bool:
        return self.preface is not None

    def feed(self, data: bytes) -> list[bytes]:
        """The complete frames ``data`` finishes; ValueError on a foreign preface or an oversized frame."""
        buffer = self._buffer
        buffer += data
        if self.preface is None:
            for preface in self._prefaces:
                if buffer[: len(preface)] == preface:
                    self.preface = preface
                    del buffer[: len(preface)]
                    break
            else:
                if any(preface.startswith(bytes(buffer)) for preface in self._prefaces):
                    return []  # still arriving
                raise ValueError("not a cronoq link")
        frames = []
        offset = 0
        available = len(buffer)
        while available - offset >= 4:
            (length,) = LENGTH.unpack_from(buffer, offset)
            if length > self.limit:
                raise ValueError(f"frame of {length} bytes is larger than {self.limit}")
            if available - offset - 4 < length:
                break
            frames.append(bytes(buffer[offset + 4 : offset + 4 + length]))
            offset += 4 + length
        if offset:
            del buffer[:offset]
        return frames
