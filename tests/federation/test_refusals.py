"""Calls the router refuses to forward, answered FAILED_PRECONDITION with the shard's endpoint:
callers authenticated by a client certificate, and plain http:// peers on other hosts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from cronoq.config import Config, Role
from cronoq.router import RouteError

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from cronoq.server.app import Listening, ServerApp
from cronoq.server.auth import Principal

CONFIG = """
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shard = "here"
{extra}

[limits]
request_timeout_s = 1

[[pools]]
name = "local"

[[pools]]
name = "remote"

[[shards]]
name = "here"
number = 1
pools = ["local"]
endpoint = "http://127.0.0.1:7999"

[[shards]]
name = "far"
number = 2
pools = ["remote"]
endpoint = "http://192.0.2.10:7070"
"""


async def serving(extra: str = "") -> tuple[ServerApp, asyncio.Future[None], str]:
    listening: asyncio.Queue[Listening] = asyncio.Queue()
    app = ServerApp(Config.parse(CONFIG.format(extra=extra)), on_listening=listening.put_nowait)
    running = asyncio.ensure_future(app.run())
    while (event := await asyncio.wait_for(listening.get(), 10)).role != "leader":
        pass
    return app, running, event.grpc


@pytest.fixture
async def server() -> AsyncIterator[tuple[ServerApp, str]]:
    app, running, address = await serving()
    try:
        yield app, address
    finally:
        app.stop()
        await asyncio.wait_for(running, 10)


async def test_a_plain_http_peer_on_another_host_is_not_sent_tokens(server: tuple[ServerApp, str]) -> None:
    _, address = server
    async with grpc.aio.insecure_channel(address) as channel:
        tasks, admin = pbg.TasksStub(channel), pbg.AdminStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="remote")))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        metadata = dict(err.value.trailing_metadata() or ())
        assert metadata["cronoq-shard"] == "far" and metadata["cronoq-shard-endpoint"] == "http://192.0.2.10:7070"
        assert "http://192.0.2.10:7070" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=(2 << 56) | 1)))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # Reads answer from this shard and name the other one.
        snapshot = await admin.Snapshot(pb.Empty())
        assert list(snapshot.unavailable_shards) == ["far"] and [p.name for p in snapshot.pools] == ["local"]


async def test_insecure_peer_http_allows_forwarding_there() -> None:
    app, running, address = await serving("insecure_peer_http = true")
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await pbg.TasksStub(channel).Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="remote")))
        # Forwarded this time: nobody answers at 192.0.2.10 (TEST-NET), so the shard is unavailable
        # after the bounded wait instead of refused.
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "'far'" in (err.value.details() or "")
    finally:
        app.stop()
        await asyncio.wait_for(running, 10)


async def test_certificate_callers_are_sent_to_the_shard_and_read_only_this_one(server: tuple[ServerApp, str]) -> None:
    app, _ = server
    by_certificate = Principal(Role.ADMIN, name="cert admin.internal", certificate=True)
    with pytest.raises(RouteError) as err:
        await app.router.submit(by_certificate, pb.SubmitRequest(task=pb.TaskSpec(pool="remote")))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert dict(err.value.metadata)["cronoq-shard"] == "far"
    assert "client certificate" in err.value.message
    local = await app.router.submit(by_certificate, pb.SubmitRequest(task=pb.TaskSpec(pool="local")))
    assert local.id >> 56 == 1
    listing = await app.router.list_tasks(by_certificate, pb.ListTasksRequest())
    assert [task.id for task in listing.tasks] == [local.id] and list(listing.unavailable_shards) == ["far"]
