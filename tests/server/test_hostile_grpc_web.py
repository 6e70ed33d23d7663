"""The gRPC-Web front (``[server.grpc_web]``, which owns the gRPC port) is bounded before
authentication like the HTTP listener: a real ``cronoq-server`` process with tight ``[limits]``,
attacked over raw sockets.

- a request head dripped a byte at a time ("slowloris") is answered 408 and closed after
  ``header_timeout_s``; a connection that says nothing is closed too;
- an idle keep-alive connection is closed after ``idle_timeout_s``;
- a head past ``max_header_bytes`` is refused 431;
- connections past ``max_connections`` (native gRPC and gRPC-Web together) are closed as they
  arrive, and native gRPC is served again once one goes;
- a native gRPC client resetting streams in a tight loop gets GOAWAY(ENHANCE_YOUR_CALM) past
  ``max_stream_resets_per_s`` (which grpcio alone never sends), while normal calls are served.

No assertion is about speed: each outcome gets a generous ``PATIENCE_S`` to happen.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.server.harness import METRICS_TOKEN
from tests.server.hostile_clients import ENHANCE_YOUR_CALM, closed_within, connect, slowloris
from tests.server.http_support import HttpServerProcess, process_config
from tests.server.test_hostile_listeners import _refused_or_open, during, flood, read_answer

PATIENCE_S = 30.0
"""How long an outcome may take before the test calls the server broken (never a pass criterion)."""

ORIGIN = "https://console.example"
WEB = f'\n[server.grpc_web]\nallowed_origins = ["{ORIGIN}"]\n'

BOUNDED = process_config(
    "header_timeout_s = 1\nidle_timeout_s = 2\nmax_header_bytes = 4096\nmax_headers = 20\nmax_stream_resets_per_s = 50",
    extra=WEB,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServerProcess]:
    proc = HttpServerProcess(tmp_path_factory.mktemp("hostile-web"), BOUNDED, name="web").start()
    try:
        yield proc
    finally:
        proc.stop()


def web_post(extra: bytes = b"") -> bytes:
    """A gRPC-Web request with a wrong content type: answered 415 at once, keeping the connection."""
    return (
        b"POST /cronoq.v1.Admin/Snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 0\r\n" + extra + b"\r\n"
    )


def test_a_slow_request_head_is_answered_408_and_closed(server: HttpServerProcess) -> None:
    closed_after, answer = slowloris(server.port, patience_s=PATIENCE_S)
    assert closed_after is not None, "a slowloris connection was held"
    assert answer.startswith(b"HTTP/1.1 408 "), answer


def test_a_connection_that_sends_nothing_is_closed(server: HttpServerProcess) -> None:
    with connect(server.port) as sock:
        assert closed_within(sock, PATIENCE_S) is not None


def test_an_idle_keep_alive_connection_is_closed(server: HttpServerProcess) -> None:
    with connect(server.port) as sock:
        sock.sendall(web_post())
        sock.settimeout(PATIENCE_S)
        assert sock.recv(65536).startswith(b"HTTP/1.1 415 ")
        assert closed_within(sock, PATIENCE_S) is not None, "an idle connection was held"


def test_a_request_head_past_max_header_bytes_is_refused_431(server: HttpServerProcess) -> None:
    lines = b"".join(f"X-Filler-{index}: {'v' * 300}\r\n".encode() for index in range(15))
    with connect(server.port) as sock:
        sock.sendall(web_post(lines))
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]


def test_rapid_reset_of_native_grpc_gets_goaway_while_normal_calls_are_served(server: HttpServerProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        admin = pbg.AdminStub(channel)
        metadata = (("authorization", f"Bearer {METRICS_TOKEN}"),)

        def snapshot() -> grpc.StatusCode:
            try:
                admin.Snapshot(pb.Empty(), metadata=metadata, timeout=PATIENCE_S)
            except grpc.RpcError as error:
                return error.code()  # type: ignore[no-any-return]
            return grpc.StatusCode.OK

        attack = flood(server.port, 4.0, grpc_port=True)
        outcomes, summary = during(attack, snapshot)
    assert outcomes and set(outcomes) == {grpc.StatusCode.OK}, outcomes
    assert summary["goaways"].get(str(ENHANCE_YOUR_CALM), 0) >= 1, summary  # type: ignore[attr-defined]


CAPPED = process_config("max_connections = 6\nheader_timeout_s = 60", extra=WEB)


def test_connections_past_max_connections_are_closed_as_they_arrive(tmp_path: Path) -> None:
    server = HttpServerProcess(tmp_path, CAPPED, name="web-capped").start()
    held: list[socket.socket] = []
    extra: list[socket.socket | None] = []
    try:
        # Three undecided, three gRPC-Web connections with a request answered: six in all.
        held = [connect(server.port) for _ in range(6)]
        for sock in held[3:]:
            sock.sendall(web_post())
            sock.settimeout(PATIENCE_S)
            assert sock.recv(65536).startswith(b"HTTP/1.1 415 ")
        extra = [_refused_or_open(server.port) for _ in range(4)]
        assert all(sock is None or closed_within(sock, PATIENCE_S) is not None for sock in extra)
        assert all(closed_within(sock, 0.2) is None for sock in held)
        # Once one goes, native gRPC is served again on the same port.
        held.pop().close()
        with grpc.insecure_channel(server.address) as channel:
            grpc.channel_ready_future(channel).result(timeout=PATIENCE_S)
    finally:
        for sock in [*held, *extra]:
            if sock is not None:
                sock.close()
        server.stop()
