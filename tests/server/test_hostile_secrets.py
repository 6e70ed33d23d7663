"""Secrets never leave the process (issue 14): a real ``cronoq-server`` process configured with
tokens, a Postgres DSN with a password, a webhook token and a TLS key gets hostile requests on
every listener — malformed ``authorization`` headers over HTTP/1.1 (control characters, NUL,
obs-fold, a space before the colon, bytes that are not UTF-8, heads past the size limit), the
same over HTTP/2 to the gateway and to the gRPC listener, and bad ``authorization`` metadata
from a gRPC client — while logging at debug level.
Then every log line, every answer and the metrics exposition are searched for every secret.
"""

from __future__ import annotations

import asyncio
import base64
import re
import socket
import ssl
import urllib.parse
from pathlib import Path

import grpc
import hpack

from cronoq.client import Client
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.server.harness import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    METRICS_TOKEN,
    SCOPED_CLIENT_TOKEN,
    SCOPED_METRICS_TOKEN,
    TENANT_TOKEN,
    TOKENS_TOML,
    WORKER_TOKEN,
)
from tests.server.hostile_clients import (
    DATA,
    END_HEADERS,
    END_STREAM,
    GOAWAY,
    HEADERS,
    RST_STREAM,
    RawH2,
    connect,
    frame,
    grpc_headers,
    http_headers,
)
from tests.server.http_support import HttpServerProcess
from tests.server.test_tls import make_certificates

PATIENCE_S = 30.0
DSN_PASSWORD = "pg-Pass-9f3c2a77e1d04b6b"
WEBHOOK_TOKEN = "webhook-token-5d1e8c0b9a7f4e21"
TOKENS = [
    CLIENT_TOKEN,
    WORKER_TOKEN,
    METRICS_TOKEN,
    ADMIN_TOKEN,
    SCOPED_CLIENT_TOKEN,
    SCOPED_METRICS_TOKEN,
    TENANT_TOKEN,
]


def with_password(dsn: str) -> str:
    """``dsn`` with ``DSN_PASSWORD`` as its password (the test cluster trusts local users, so any
    password connects)."""
    parts = urllib.parse.urlsplit(dsn)
    user = parts.username or "postgres"
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user}:{DSN_PASSWORD}@{host}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def tls_key_lines(key: Path) -> list[str]:
    """The base64 lines of a PEM private key: any one of them in a log would be a leak."""
    return [line for line in key.read_text().splitlines() if line and not line.startswith("-----")]


def tls(port: int, alpn: str) -> ssl.SSLSocket:
    sock = connect(port, tls=True, alpn=alpn)
    assert isinstance(sock, ssl.SSLSocket)
    return sock


def raw_http1(port: int, head: bytes) -> bytes:
    """One request head over TLS, HTTP/1.1: the answer."""
    with tls(port, "http/1.1") as sock:
        sock.sendall(head)
        return read_one_answer(sock)


def read_one_answer(sock: socket.socket) -> bytes:
    """One HTTP/1.1 answer (its head and ``content-length`` bytes of body), or what came before
    the server closed the connection."""
    sock.settimeout(PATIENCE_S)
    answer = b""
    try:
        while data := sock.recv(65536):
            answer += data
            head, found, body = answer.partition(b"\r\n\r\n")
            if found:
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if length is None or len(body) >= int(length.group(1)):
                    break
    except (TimeoutError, ConnectionError, ssl.SSLError):
        pass
    return answer


def hostile_http1_heads(token: str) -> list[bytes]:
    start = b"GET /v1/snapshot HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    value = b"Bearer " + token.encode()
    return [
        start + line + b"\r\n\r\n"
        for line in (
            b"Authorization: " + value + b"\x01",
            b"Authorization: " + value + b"\x00x",
            b"Authorization: Bearer\r\n " + token.encode(),
            b"Authorization : " + value,
            b"Authorization: " + value + b"\xff\xfe",
            b"Authorization: Bearer \xe9" + token.encode(),
            b"Authorization: " + value + b"\x7f",
            b"Authorization: Basic " + base64.b64encode(token.encode()),
            b"Authorization: " + value + b"\r\nAuthorization: " + value,
            b"Authorization: " + value + b"\r\nX-Pad: " + b"p" * 20000,
            b"Authorization: " + value * 300,
            b"Authorization\x00: " + value,
        )
    ]


def hostile_http2(port: int, token: str, *, grpc_port: bool = False) -> list[bytes]:
    """Requests over TLS with ALPN h2 carrying bad authorization values (to the gateway, or as
    gRPC calls to the gRPC listener): every frame that came back."""
    values = [
        f"Bearer {token}\x01",
        f"Bearer {token}\x00",
        f" Bearer {token}",
        f"Bearer {token}\r\nx: y",
        f"Bearer {token}\udcff",
        f"Bearer {token}\t",
        f"Bearer {token}" * 200,
    ]
    authority = f"127.0.0.1:{port}"
    base = (
        grpc_headers("/cronoq.v1.Admin/Snapshot", authority) if grpc_port else http_headers("/v1/snapshot", authority)
    )
    answers: list[bytes] = []
    for value in values:
        client = RawH2(tls(port, "h2"))
        try:
            headers = [(name.encode(), text.encode()) for name, text in base]
            block = hpack.Encoder().encode([*headers, (b"authorization", value.encode("utf-8", "surrogateescape"))])
            if grpc_port:  # one empty request message follows the headers
                client.send(frame(HEADERS, END_HEADERS, 1, block) + frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"))
            else:
                client.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
            for got in client.frames(PATIENCE_S):
                answers.append(got.payload)
                if got.kind == GOAWAY or (got.stream == 1 and (got.kind == RST_STREAM or got.flags & END_STREAM)):
                    break
        finally:
            client.close()
    return answers


async def hostile_grpc(address: str, root: bytes, token: str) -> list[str]:
    """gRPC calls with bad authorization metadata: the status details they got."""
    credentials = grpc.ssl_channel_credentials(root_certificates=root)
    values: list[tuple[str, str | bytes]] = [
        ("authorization", value)
        for value in (
            f"Bearer {token}x",
            f"Bearer {token}" * 400,
            f"Basic {token}",
            f"bearer  {token} extra",
            token,
            f"bearer {token.upper()}",
        )
    ]
    values += [("authorization-bin", token.encode() + b"\x00"), ("authorization-bin", b"\xff" + token.encode())]
    details: list[str] = []
    async with grpc.aio.secure_channel(address, credentials) as channel:
        stub = pbg.TasksStub(channel)
        for key, value in values:
            try:
                await stub.Submit(
                    pb.SubmitRequest(task=pb.TaskSpec(payload=b"x")), metadata=((key, value),), timeout=PATIENCE_S
                )
            except grpc.aio.AioRpcError as error:
                details.append(error.details() or "")
            except Exception:  # the client itself refused to send it: nothing reached the server
                continue
    return details


async def test_no_secret_reaches_a_log_line_an_answer_or_a_metric(
    tmp_path: Path, postgres_dsn: str, pg_schema: str
) -> None:
    make_certificates(tmp_path)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    hook_port = closed.getsockname()[1]
    closed.close()  # nothing listens there: every scale request fails and is logged
    config = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
http_addr = "127.0.0.1:{{http_port}}"
metrics_addr = "127.0.0.1:{{metrics_port}}"
shutdown_grace_s = 0.5

[server.tls]
cert = "{tmp_path / "server.pem"}"
key = "{tmp_path / "server.key"}"

[store]
kind = "postgres"
url_env = "HOSTILE_PG_URL"
schema = "{pg_schema}"

{TOKENS_TOML}
[[pools]]
name = "default"

[[pools]]
name = "other"

[[pools]]
name = "scaled"
min = 0
autoscale = true
scaler = {{ kind = "webhook", url = "http://127.0.0.1:{hook_port}/scale", token_env = "HOSTILE_HOOK_TOKEN" }}
"""
    env = {"HOSTILE_PG_URL": with_password(postgres_dsn), "HOSTILE_HOOK_TOKEN": WEBHOOK_TOKEN, "CRONOQ_LOG": "debug"}
    server = HttpServerProcess(tmp_path, config, name="secrets", env=env).start()
    secrets = [*TOKENS, DSN_PASSWORD, WEBHOOK_TOKEN, *tls_key_lines(tmp_path / "server.key")]
    root = (tmp_path / "ca.pem").read_bytes()
    answers: list[bytes] = []
    try:
        for token in (CLIENT_TOKEN, ADMIN_TOKEN):
            for head in hostile_http1_heads(token):
                answers.append(raw_http1(server.http_port, head))
                answers.append(_plain(server.metrics_port, head))
            answers.extend(hostile_http2(server.http_port, token))
            answers.extend(hostile_http2(server.port, token, grpc_port=True))
            answers.extend(detail.encode() for detail in await hostile_grpc(server.address, root, token))
        # The webhook fires (and fails) once the scaled pool has work; /metrics is then read.
        credentials = grpc.ssl_channel_credentials(root)
        async with Client(server.address, token=CLIENT_TOKEN, credentials=credentials) as client:
            for _ in range(3):
                await client.submit(b"x", pool="scaled")
        metrics = raw_http1(
            server.http_port,
            b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + METRICS_TOKEN.encode()
            + b"\r\nConnection: close\r\n\r\n",
        )
        assert b"cronoq_" in metrics
        answers.append(metrics)
        await _logged(server, "scale request for pool scaled failed")
    finally:
        server.stop()
    logs = server.stderr()
    errors = [line for line in logs.splitlines() if " ERROR " in line]
    assert errors == [], "\n".join(errors)
    leaks = [(secret[:6], line[:200]) for line in logs.splitlines() for secret in secrets if secret in line]
    assert leaks == []
    echoed = [(secret[:6], answer[:200]) for answer in answers for secret in secrets if secret.encode() in answer]
    assert echoed == []


async def _logged(server: HttpServerProcess, text: str) -> None:
    for _ in range(int(PATIENCE_S * 10)):
        if text in server.stderr():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the server never logged {text!r}")


def _plain(port: int, head: bytes) -> bytes:
    """The same request head on the metrics listener (no TLS)."""
    with connect(port) as sock:
        sock.sendall(head)
        return read_one_answer(sock)
