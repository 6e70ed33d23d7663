"""Helpers for the HTTP gateway tests: an in-process server (gRPC on port 0 plus the gateway on
port 0), HTTP sessions with a token, and workers that serve its pools."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from cronoq.config import Config

from cronoq.client import Client, ClientError, Lease, Worker
from cronoq.server.app import Listening, ServerApp
from cronoq.server.http import HttpGateway, start_http
from tests.server.harness import (
    CLIENT_TOKEN,
    TOKENS_TOML,
    WORKER_TOKEN,
    ServerProcess,
)

FAST_RETRY = "retry = { max_attempts = 2, initial_backoff_s = 0.02, max_backoff_s = 0.05 }"


POOLS_TOML = f"""
[[pools]]
name = "default"
{FAST_RETRY}

[[pools]]
name = "other"

[[pools]]
name = "dag"
{FAST_RETRY}

[[pools]]
name = "tiny"
max_pending = 1
overflow = "reject"

[[pools]]
name = "fixed"
max = 2
"""


def config_text(
    *, server: str = "", limits: str = "", auth: bool = True, pools: str = POOLS_TOML, max_wait_s: float = 5
) -> str:
    """A configuration with both listeners on port 0. ``server``/``limits`` add keys to those
    sections; ``auth=False`` leaves authentication off."""
    return f"""
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 0.5
{server}

[limits]
max_wait_s = {max_wait_s}
max_list = 50
max_key_len = 64
{limits}

{TOKENS_TOML if auth else ""}
{pools}
"""


@dataclass
class Running:
    app: ServerApp
    gateway: HttpGateway
    grpc_address: str
    workers: list[tuple[Worker, asyncio.Task[None]]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.gateway.url

    def session(self, token: str | None = CLIENT_TOKEN, **kwargs: Any) -> aiohttp.ClientSession:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return aiohttp.ClientSession(self.url, headers=headers, **kwargs)

    async def worker(self, pool: str, handler: Callable[[Lease], Awaitable[Any]], **kwargs: Any) -> Worker:
        """A ``cronoq.client.Worker`` serving ``pool`` over gRPC until the server stops."""
        kwargs.setdefault("token", WORKER_TOKEN)
        kwargs.setdefault("backoff", (0.05, 0.2))
        worker = Worker(self.grpc_address, pool, handler, **kwargs)
        task = asyncio.ensure_future(worker.run())
        self.workers.append((worker, task))
        await worker.wait_registered(10)
        return worker


@contextlib.asynccontextmanager
async def serve(config: Config) -> AsyncIterator[Running]:
    """A leading ``ServerApp`` and its HTTP gateway, both in this process."""
    listening: asyncio.Queue[Listening] = asyncio.Queue()
    app = ServerApp(config, on_listening=listening.put_nowait)
    running = asyncio.ensure_future(app.run())
    gateway: HttpGateway | None = None
    state: Running | None = None
    try:
        while (event := await asyncio.wait_for(listening.get(), 10)).role != "leader":
            pass
        gateway = await start_http(app.api, config, authenticator=app.authenticator, unary=app.unary)
        state = Running(app, gateway, event.grpc)
        yield state
    finally:
        if state is not None:
            for worker, task in state.workers:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(worker.stop(1), 10)
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 10)
        if gateway is not None:
            await gateway.close()
        app.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 15)


async def request(session: aiohttp.ClientSession, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    """``(status, JSON body)`` of one request (the body is text when it is not JSON)."""
    async with session.request(method, path, **kwargs) as response:
        text = await response.text()
        if response.content_type == "application/json":
            return response.status, json.loads(text)
        return response.status, text


def process_config(limits: str = "", *, metrics: bool = False, extra: str = "") -> str:
    """A configuration for an ``HttpServerProcess``: both listeners (and the metrics one when
    ``metrics``) on fresh ports, every kind of token, pools ``default`` and ``other``; ``limits``
    goes into ``[limits]``, ``extra`` at the end (more pools, resources, a store)."""
    metrics_addr = 'metrics_addr = "127.0.0.1:{metrics_port}"' if metrics else ""
    return f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
http_addr = "127.0.0.1:{{http_port}}"
{metrics_addr}
shutdown_grace_s = 0.5

[limits]
{limits}

{TOKENS_TOML}
[[pools]]
name = "default"

[[pools]]
name = "other"
{extra}
"""


class HttpServerProcess(ServerProcess):
    """A ``cronoq-server`` process whose configuration may also name ``{http_port}`` and
    ``{metrics_port}``: port 0 like ``{port}`` for gRPC, the bound ports read back from the
    server's listening line (``ServerProcess``)."""

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


async def until_forgotten(client: Client, key: str, timeout: float = 15.0) -> None:
    """Until the engine no longer knows ``key`` (past ``limits.key_retention_s``): a lookup by key
    answers NOT_FOUND. There is no event for it, so the lookup is repeated."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            await client.get(key)
        except ClientError as err:
            assert err.code == "not_found", err
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"key {key!r} was still retained after {timeout} s")
