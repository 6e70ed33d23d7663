"""The lean HTTP/1.1 path for ``POST /v1/tasks`` (``cronoq.server.http1_lean``) against a real
in-process gateway over raw loopback sockets: it answers exactly what aiohttp's path answers,
hands anything less plain to aiohttp for the rest of the connection, keeps answers in request
order, and holds its connections to the same bounds (head size, idle time, unread answers).

Whether a request took the lean path is read from the listener's ``lean_requests`` count. No
assertion is about speed: each outcome gets a generous ``PATIENCE_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator

import pytest
from cronoq.config import Config

from cronoq.server.http_listen import Listener
from tests.server.harness import CLIENT_TOKEN, METRICS_TOKEN
from tests.server.http_support import Running, config_text, serve

PATIENCE_S = 30.0
"""How long an outcome may take before the test calls the server broken (never a pass criterion)."""

LIMITS = """
max_http_body_bytes = 4096
max_header_bytes = 2048
max_headers = 20
idle_timeout_s = 1
write_stall_timeout_s = 1
"""


@pytest.fixture
async def gw() -> AsyncIterator[Running]:
    async with serve(Config.parse(config_text(limits=LIMITS))) as running:
        yield running


def listener(gw: Running) -> Listener:
    return gw.gateway.listeners[0]


def submit(body: bytes, *, token: str | None = CLIENT_TOKEN, extra: bytes = b"",
           content_type: bytes = b"application/json") -> bytes:  # fmt: skip
    auth = b"Authorization: Bearer %b\r\n" % token.encode() if token else b""
    return (b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %b\r\n%b%bContent-Length: %d\r\n\r\n%b"
            % (content_type, auth, extra, len(body), body))  # fmt: skip


TWICE = b"X-Twice: 1\r\nX-Twice: 2\r\n"
"""A header field given twice: harmless to the gateway, but the lean path leaves it to aiohttp."""


async def read_answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, str], bytes]:
    """One HTTP/1.1 answer: its status line, header fields (lower-case names) and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), PATIENCE_S)
    status, *lines = head[:-4].split(b"\r\n")
    fields = {}
    for line in lines:
        name, _, value = line.decode().partition(":")
        fields[name.lower()] = value.strip()
    body = await asyncio.wait_for(reader.readexactly(int(fields["content-length"])), PATIENCE_S)
    return status, fields, body


@contextlib.asynccontextmanager
async def connection(gw: Running) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = gw.gateway.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def exchange(gw: Running, request: bytes) -> tuple[bytes, dict[str, str], bytes]:
    async with connection(gw) as (reader, writer):
        writer.write(request)
        return await read_answer(reader)


def comparable(body: bytes) -> bytes:
    """A body with its task id left out (each submission gets its own)."""
    return re.sub(rb'"id":"\d+"', b'"id":"-"', body)


CASES = {
    "created": submit(b'{"pool":"default","key":"new","payload":1}'),
    "duplicate key": submit(b'{"pool":"default","key":"same","payload":1}'),
    "no credentials": submit(b'{"payload":1}', token=None),
    "wrong role": submit(b'{"payload":1}', token=METRICS_TOKEN),
    "unknown pool": submit(b'{"pool":"nowhere","payload":1}'),
    "unknown field": submit(b'{"payload":1,"colour":"red"}'),
    "not JSON": submit(b'{"payload":'),
    "not UTF-8": submit(b'{"payload":"\xff"}'),
    "media type": submit(b'{"payload":1}', content_type=b"text/plain"),
    "charset": submit(b'{"payload":1}', content_type=b"application/json; charset=latin-1"),
    "empty body": submit(b""),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_lean_path_answers_what_aiohttp_answers(gw: Running, case: str) -> None:
    template = CASES[case]
    if case == "duplicate key":
        await exchange(gw, template)  # both answers below are then about a duplicate
    lean_before = listener(gw).lean_requests
    # Each submission of a new task gets a key of its own (of the same length).
    lean = await exchange(gw, template.replace(b'"new"', b'"nw1"'))
    assert listener(gw).lean_requests == lean_before + 1
    # The same request with a header field given twice goes to aiohttp.
    head, _, body = template.replace(b'"new"', b'"nw2"').partition(b"\r\n\r\n")
    plain = await exchange(gw, head + b"\r\n" + TWICE + b"\r\n" + body)
    assert listener(gw).lean_requests == lean_before + 1
    assert lean[0] == plain[0], (lean[0], plain[0])
    assert list(lean[1]) == list(plain[1])  # the same fields, in the same order
    assert {name: value for name, value in lean[1].items() if name != "date"} == {
        name: value for name, value in plain[1].items() if name != "date"
    }
    assert comparable(lean[2]) == comparable(plain[2])
    if case == "created":
        assert lean[0] == b"HTTP/1.1 200 OK" and json.loads(lean[2])["duplicate"] is False
    if case == "duplicate key":
        assert json.loads(lean[2])["duplicate"] is True


async def test_requests_on_one_connection_are_answered_in_order_across_both_paths(gw: Running) -> None:
    health = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    async with connection(gw) as (reader, writer):
        writer.write(submit(b'{"key":"first"}'))
        first = await read_answer(reader)
        served = listener(gw).lean_requests
        # Pipelined in one write: a lean one, one for aiohttp, and a lean one that aiohttp now serves.
        writer.write(submit(b'{"key":"second"}') + health + submit(b'{"key":"third"}'))
        answers = [await read_answer(reader) for _ in range(3)]
    assert first[0] == b"HTTP/1.1 200 OK"
    assert [status for status, _, _ in answers] == [b"HTTP/1.1 200 OK"] * 3
    assert json.loads(answers[1][2]) == {"status": "ok"}
    ids = [json.loads(body)["id"] for body in (first[2], answers[0][2], answers[2][2])]
    assert len(set(ids)) == 3 and ids == sorted(ids, key=int)
    assert listener(gw).lean_requests == served + 1  # the second; the third went to aiohttp


async def test_a_body_that_arrives_after_its_head_is_served_by_aiohttp(gw: Running) -> None:
    request = submit(b'{"key":"split"}')
    head_end = request.index(b"\r\n\r\n") + 4
    served = listener(gw).lean_requests
    async with connection(gw) as (reader, writer):
        writer.write(request[:head_end])
        await writer.drain()
        await asyncio.sleep(0.2)  # not a pass criterion: the body most likely arrives separately
        writer.write(request[head_end:])
        status, _, body = await read_answer(reader)
    assert status == b"HTTP/1.1 200 OK" and json.loads(body)["duplicate"] is False
    assert listener(gw).lean_requests == served


async def test_a_lean_request_head_past_max_header_bytes_is_refused_431(gw: Running) -> None:
    filler = b"".join(b"X-Filler-%d: %b\r\n" % (index, b"v" * 200) for index in range(12))
    async with connection(gw) as (reader, writer):
        writer.write(submit(b"{}", extra=filler))
        answer = await asyncio.wait_for(reader.read(), PATIENCE_S)  # until the server hangs up
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert b"request_header_fields_too_large" in answer


async def test_an_idle_connection_on_the_lean_path_is_closed(gw: Running) -> None:
    async with connection(gw) as (reader, writer):
        writer.write(submit(b'{"key":"idle"}'))
        status, _, _ = await read_answer(reader)
        assert status == b"HTTP/1.1 200 OK"
        assert await asyncio.wait_for(reader.read(), PATIENCE_S) == b""  # closed by the server


async def test_a_client_that_never_reads_its_lean_answers_is_cut_off(gw: Running) -> None:
    # Pipelined requests (refused for want of credentials: no task is created) whose answers are
    # never read: the server stops reading (its buffer is bounded), and once its answers have
    # waited write_stall_timeout_s the connection is reset.
    request = submit(b"{}", token=None) * 100
    async with connection(gw) as (_, writer):
        writer.transport.pause_reading()  # its answers stay in the sockets' buffers

        async def flood() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                for _ in range(100_000):  # far more answers than socket buffers hold
                    writer.write(request)
                    await writer.drain()

        sender = asyncio.ensure_future(flood())
        try:
            await asyncio.wait_for(sender, PATIENCE_S)
        finally:
            sender.cancel()
    assert listener(gw).stalled >= 1


async def test_a_body_past_the_lean_bound_is_left_to_aiohttp(gw: Running) -> None:
    # The lean path holds a body before authentication, so it takes none larger than the bound
    # (here max_http_body_bytes, 4096): aiohttp answers this one 413 after authenticating it.
    served = listener(gw).lean_requests
    status, _, body = await exchange(gw, submit(b'{"payload":"%b"}' % (b"x" * 5000)))
    assert status.startswith(b"HTTP/1.1 413 ")
    assert json.loads(body)["code"] == "payload_too_large"
    assert listener(gw).lean_requests == served
