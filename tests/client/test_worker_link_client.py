"""The worker's end of a worker link, against listeners that are not cronoq's: the worker's token
never leaves before the other side has answered with the link preface."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from cronoq._linkwire import WORKER_PREFACE
from cronoq._worker_link import WorkerLinkCall

TOKEN = "Bearer secret-token-0123456789abcdef"


async def listener(reply: bytes) -> tuple[asyncio.Server, int, bytearray]:
    received = bytearray()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.extend(await reader.read(1024))
        writer.write(reply)
        await writer.drain()
        with contextlib.suppress(TimeoutError, ConnectionError):  # anything the client would still send
            received.extend(await asyncio.wait_for(reader.read(4096), 1))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1]), received


@pytest.mark.parametrize("reply", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"CRONOQ-LINK/1 PEER\n", b""])
async def test_the_token_is_not_sent_to_something_else(reply: bytes) -> None:
    server, port, received = await listener(reply)
    async with server:
        with pytest.raises((ConnectionError, TimeoutError)):
            await WorkerLinkCall.open("127.0.0.1", port, authorization=TOKEN, ssl_context=None)
        await asyncio.sleep(0.1)
    assert bytes(received) == WORKER_PREFACE
    assert b"secret-token" not in received
