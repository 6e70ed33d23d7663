"""A Worker or a Client leaves a server that froze (SIGSTOP: the kernel still answers TCP, nothing
else does).

Without keepalive pings a stream or a call without deadline would wait forever on a leader that a
standby has replaced; with the default pings it ends once a ping goes unanswered, and the caller
can reconnect or retry elsewhere."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from cronoq._client.channel import KEEPALIVE
from cronoq.client import Client, ClientError, Lease, Worker
from tests.server.harness import CLIENT_TOKEN, TOKENS_TOML, WORKER_TOKEN, ServerProcess

CONFIG = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
shutdown_grace_s = 1
{TOKENS_TOML}
[[pools]]
name = "default"

[[pools]]
name = "other"
"""


async def idle(lease: Lease) -> str:
    return "ok"


async def test_a_worker_leaves_a_frozen_server(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, CONFIG, name="frozen").start()
    try:
        worker = Worker(server.address, "default", idle, token=WORKER_TOKEN, reconnect=False)
        running = asyncio.ensure_future(worker.run())
        await worker.wait_registered(timeout=30)
        server.signal(signal.SIGSTOP)
        # The bound is generous (the default pings every 10 s and waits 5 s for the answer); without
        # pings the stream never ends and this times out.
        try:
            await asyncio.wait_for(running, 120)
        except ClientError as error:
            assert error.code == "unavailable", error
        assert worker.connections == 1
    finally:
        server.signal(signal.SIGCONT)
        server.kill()


_PINGS = dict(KEEPALIVE)
KEEPALIVE_BOUND_S = 3 * (_PINGS["grpc.keepalive_time_ms"] + _PINGS["grpc.http2.ping_timeout_ms"]) / 1000


async def test_a_client_call_without_deadline_ends_on_a_frozen_server(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, CONFIG, name="frozen-client").start()
    try:
        async with Client(server.address, token=CLIENT_TOKEN) as client:
            submitted = await client.submit({"n": 1})  # the channel is connected before the freeze
            server.signal(signal.SIGSTOP)
            # The default pings end the call within about 15 s (a ping every 10 s, 5 s for its
            # answer). Without them grpcio gives up on the ping it sent with the request only after
            # its own ping timeout of 60 s (measured): the bound lies between the two, generously.
            with pytest.raises(ClientError) as caught:
                await asyncio.wait_for(client.get(submitted.id), KEEPALIVE_BOUND_S)
            assert caught.value.code == "unavailable", caught.value
    finally:
        server.signal(signal.SIGCONT)
        server.kill()
