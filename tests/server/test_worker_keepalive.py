"""A Worker leaves a server that froze (SIGSTOP: the kernel still answers TCP, nothing else does).

Without keepalive pings the stream would wait forever on a leader that a standby has replaced; with
the Worker's default pings it ends once a ping goes unanswered, and the Worker can reconnect."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from cronoq.client import ClientError, Lease, Worker
from tests.server.harness import TOKENS_TOML, WORKER_TOKEN, ServerProcess

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
