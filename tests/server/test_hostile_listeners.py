"""Every listener is bounded before authentication (issue 14): a real ``cronoq-server`` process with
tight ``[limits]``, attacked over raw sockets by ``hostile_clients``.

- slow or silent connections are closed (``header_timeout_s``, ``idle_timeout_s``), on the gRPC, the
  HTTP and the metrics listener; a slow HTTP/1.1 request head is answered 408;
- request heads past ``max_header_bytes`` or ``max_headers`` are refused (431 / 400 / GOAWAY);
- an HTTP/2 client that resets streams in a tight loop gets GOAWAY(ENHANCE_YOUR_CALM) on the
  gateway, and normal requests complete meanwhile on both HTTP/2 listeners;
- an answer held at a zero window, or never read, is abandoned after ``write_stall_timeout_s``;
- connections past ``max_connections`` are closed as they arrive, on every listener.

No assertion is about speed: each outcome gets a generous ``PATIENCE_S`` to happen.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.server.harness import CLIENT_TOKEN, METRICS_TOKEN, ROOT
from tests.server.hostile_clients import (
    CANCEL,
    DATA,
    ENHANCE_YOUR_CALM,
    GOAWAY,
    HEADERS,
    RST_STREAM,
    SETTINGS_INITIAL_WINDOW_SIZE,
    RawH2,
    closed_within,
    connect,
    first_frame,
    http_headers,
    reset_within,
    slowloris,
)
from tests.server.http_support import HttpServerProcess, process_config

PATIENCE_S = 30.0
"""How long an outcome may take before the test calls the server broken (never a pass criterion)."""

BOUNDED = process_config(
    """
header_timeout_s = 1
idle_timeout_s = 2
write_stall_timeout_s = 1
max_header_bytes = 4096
max_headers = 20
max_stream_resets_per_s = 50
""",
    metrics=True,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServerProcess]:
    proc = HttpServerProcess(tmp_path_factory.mktemp("hostile"), BOUNDED, name="bounded").start()
    try:
        yield proc
    finally:
        proc.stop()


def ports(server: HttpServerProcess) -> dict[str, int]:
    return {"grpc": server.port, "http": server.http_port, "metrics": server.metrics_port}


def http_request(path: str, token: str | None = None, extra: bytes = b"") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + auth + extra + b"\r\n"


def read_answer(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (or PATIENCE_S passes)."""
    sock.settimeout(PATIENCE_S)
    answer = b""
    try:
        while data := sock.recv(65536):
            answer += data
    except (TimeoutError, ConnectionError):
        pass
    return answer


# ------------------------------------------------------------------------- slow and silent clients


@pytest.mark.parametrize("listener", ["http", "metrics"])
def test_a_request_head_that_never_ends_is_answered_408_and_closed(server: HttpServerProcess,
                                                                   listener: str) -> None:  # fmt: skip
    closed_after, answer = slowloris(ports(server)[listener], patience_s=PATIENCE_S)
    assert closed_after is not None, "a slowloris connection was held"
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b'"code":"request_timeout"' in answer


@pytest.mark.parametrize("listener", ["grpc", "http", "metrics"])
def test_a_connection_that_sends_nothing_is_closed(server: HttpServerProcess, listener: str) -> None:
    with connect(ports(server)[listener]) as sock:
        assert closed_within(sock, PATIENCE_S) is not None


@pytest.mark.parametrize("listener", ["grpc", "http"])
def test_an_http2_connection_without_requests_is_closed(server: HttpServerProcess, listener: str) -> None:
    client = RawH2(connect(ports(server)[listener]))
    try:
        kinds = [got.kind for got in client.frames(PATIENCE_S)]
        assert client.closed, "an idle HTTP/2 connection was held"
        assert GOAWAY in kinds
    finally:
        client.close()


def test_a_slow_head_after_an_answered_request_is_answered_408(server: HttpServerProcess) -> None:
    # The head timer of a keep-alive connection outlives the first request; it must still bound
    # the second request's head from that head's own first byte.
    with connect(server.http_port) as sock:
        sock.sendall(http_request("/healthz"))
        sock.settimeout(PATIENCE_S)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 "), first
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b'"code":"request_timeout"' in answer


def test_an_idle_keep_alive_connection_is_closed(server: HttpServerProcess) -> None:
    with connect(server.http_port) as sock:
        sock.sendall(http_request("/healthz"))
        sock.settimeout(PATIENCE_S)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        assert closed_within(sock, PATIENCE_S) is not None


# ------------------------------------------------------------------------------ request heads


def test_a_request_head_past_max_header_bytes_is_refused_431(server: HttpServerProcess) -> None:
    # Each line is well under the limit; together they are not.
    lines = b"".join(f"X-Filler-{index}: {'v' * 300}\r\n".encode() for index in range(15))
    with connect(server.http_port) as sock:
        sock.sendall(http_request("/healthz", extra=lines))
        answer = read_answer(sock)
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"request_header_fields_too_large" in answer


def test_more_header_fields_than_max_headers_are_refused(server: HttpServerProcess) -> None:
    lines = b"".join(f"X-Many-{index}: v\r\n".encode() for index in range(25))
    with connect(server.http_port) as sock:
        sock.sendall(http_request("/healthz", extra=lines))
        answer = read_answer(sock)
    assert answer.split(b" ", 2)[1] == b"400", answer[:200]  # aiohttp's parser answers as HTTP/1.0
    assert b'"code":"bad_request"' in answer
    # The same over HTTP/2: the stream is answered 431.
    client = RawH2(connect(server.http_port))
    try:
        client.request(1, http_headers("/healthz", "127.0.0.1") + [(f"x-many-{i}", "v") for i in range(25)])
        data = first_frame(client, DATA, 1, PATIENCE_S)
        assert data is not None and b"request_header_fields_too_large" in data.payload
    finally:
        client.close()


def test_an_http2_header_list_past_max_header_bytes_ends_the_connection(server: HttpServerProcess) -> None:
    client = RawH2(connect(server.http_port))
    try:
        list(client.frames(0.5))  # the server's SETTINGS, acknowledged: its header list limit applies
        client.request(1, [*http_headers("/healthz", "127.0.0.1"), ("x-big", "v" * 6000)])
        goaway = first_frame(client, GOAWAY, 0, PATIENCE_S)
        assert goaway is not None and goaway.goaway_code == ENHANCE_YOUR_CALM, goaway
    finally:
        client.close()


# -------------------------------------------------------------------------------- rapid reset


def flood(port: int, seconds: float, *, grpc_port: bool) -> subprocess.Popen[str]:
    """A rapid-reset attacker in a process of its own, at the lowest CPU priority so that on a
    small machine it does not starve the server and this test's own client."""
    args = ["--grpc"] if grpc_port else []
    return subprocess.Popen(["nice", "-n", "19", sys.executable, "-m", "tests.server.hostile_clients", "rapid-reset",
                             "--port", str(port), "--seconds", str(seconds), *args], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip


def during(attack: subprocess.Popen[str], request: object) -> tuple[list[object], dict[str, object]]:
    """Make normal requests one after the other while the attack runs: their outcomes, and the
    attacker's summary."""
    outcomes: list[object] = []
    while attack.poll() is None:
        outcomes.append(request())  # type: ignore[operator]
    stdout, _ = attack.communicate(timeout=PATIENCE_S)
    return outcomes, json.loads(stdout)


def test_rapid_reset_on_the_gateway_gets_goaway_while_normal_requests_complete(server: HttpServerProcess) -> None:
    import urllib.request

    def snapshot() -> int:
        request = urllib.request.Request(f"{server.http_url}/v1/snapshot",
                                         headers={"authorization": f"Bearer {METRICS_TOKEN}"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=PATIENCE_S) as answer:
            return int(answer.status)

    attack = flood(server.http_port, 4.0, grpc_port=False)
    outcomes, summary = during(attack, snapshot)
    assert outcomes and set(outcomes) == {200}, outcomes
    assert summary["goaways"].get(str(ENHANCE_YOUR_CALM), 0) >= 1, summary  # type: ignore[attr-defined]


def test_rapid_reset_on_the_grpc_listener_leaves_normal_calls_served(server: HttpServerProcess) -> None:
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
    assert summary["resets_sent"], summary


# ----------------------------------------------------------------------------- unread answers


def test_an_answer_held_at_a_zero_window_is_reset(server: HttpServerProcess) -> None:
    # A window of zero lets the answer's HEADERS out but none of its DATA.
    client = RawH2(connect(server.http_port), {SETTINGS_INITIAL_WINDOW_SIZE: 0})
    try:
        client.request(1, http_headers("/v1/openapi.json", "127.0.0.1", CLIENT_TOKEN))
        reset = first_frame(client, RST_STREAM, 1, PATIENCE_S)
        assert reset is not None and reset.reset_code == CANCEL, "an answer waited for a window forever"
        # The connection itself still serves.
        client.request(3, http_headers("/healthz", "127.0.0.1"))
        assert first_frame(client, HEADERS, 3, PATIENCE_S) is not None
    finally:
        client.close()


def test_a_client_that_never_reads_its_answers_is_cut_off(server: HttpServerProcess) -> None:
    with connect(server.http_port) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        # Pipelined requests whose answers (the OpenAPI document, tens of KiB each) are never read.
        request = http_request("/v1/openapi.json", CLIENT_TOKEN)
        threading.Thread(target=_send_quietly, args=(sock, request * 2000), daemon=True).start()
        assert reset_within(sock, PATIENCE_S) is not None, "a client that does not read was held"


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # the server hung up, as it should
        sock.sendall(data)


# ----------------------------------------------------------------------------- connection caps

CAPPED = process_config("max_connections = 6\nheader_timeout_s = 60", metrics=True)


def test_connections_past_max_connections_are_closed_as_they_arrive(tmp_path: Path) -> None:
    server = HttpServerProcess(tmp_path, CAPPED, name="capped").start()
    try:
        for listener, port in ports(server).items():
            held = [connect(port) for _ in range(6)]
            extra = [_refused_or_open(port) for _ in range(4)]
            try:
                # The four past the cap are closed while the first six are held (a head may take
                # a minute here, so nothing else closes them meanwhile).
                assert all(sock is None or closed_within(sock, PATIENCE_S) is not None for sock in extra), listener
                assert all(closed_within(sock, 0.2) is None for sock in held), listener
                # Once one goes, a new connection is taken and served.
                held.pop().close()
                if listener == "grpc":
                    with grpc.insecure_channel(server.address) as channel:
                        grpc.channel_ready_future(channel).result(timeout=PATIENCE_S)
                else:
                    with _accepted(port) as sock:
                        sock.sendall(http_request("/healthz"))
                        assert read_answer_head(sock).startswith(b"HTTP/1.1 200 "), listener
            finally:
                for sock in held + extra:
                    if sock is not None:
                        sock.close()
    finally:
        server.stop()


def _refused_or_open(port: int) -> socket.socket | None:
    """A new connection, or None when the server reset it before ``connect`` returned."""
    try:
        return connect(port)
    except ConnectionResetError:
        return None


@contextlib.contextmanager
def _accepted(port: int) -> Iterator[socket.socket]:
    """A connection the listener keeps (the freed place may take a moment to be seen)."""
    for _ in range(100):
        sock = _refused_or_open(port)
        if sock is None:
            continue
        if closed_within(sock, 0.3) is None:
            try:
                yield sock
            finally:
                sock.close()
            return
        sock.close()
    raise AssertionError(f"port {port} accepts no connection")


def read_answer_head(sock: socket.socket) -> bytes:
    sock.settimeout(PATIENCE_S)
    return sock.recv(65536)
