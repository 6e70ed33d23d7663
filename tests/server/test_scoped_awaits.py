"""A pool-scoped credential cannot wait for a key that no task holds yet: keys are one namespace
across pools, so the task that takes the key later may be in a pool outside the scope, and the
waiting child would learn of it (and of how it ended). Unscoped credentials still may."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from cronoq.config import Config

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from cronoq.server.app import Listening, ServerApp

ADMIN = "scoped-awaits-admin-token-0123456789"
ALPHA = "scoped-awaits-alpha-token-0123456789"


@pytest.fixture
async def stub() -> AsyncIterator[pbg.TasksStub]:
    config = Config.parse(f"""
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 0.5

[[auth.tokens]]
token = "{ADMIN}"
role = "admin"

[[auth.tokens]]
token = "{ALPHA}"
role = "client"
pools = ["alpha"]

[[pools]]
name = "alpha"
await_unknown_dependencies_s = 60

[[pools]]
name = "beta"
""")
    listening: asyncio.Queue[Listening] = asyncio.Queue()
    server = ServerApp(config, on_listening=listening.put_nowait)
    running = asyncio.ensure_future(server.run())
    while (event := await asyncio.wait_for(listening.get(), 10)).role != "leader":
        pass
    channel = grpc.aio.insecure_channel(event.grpc)
    try:
        yield pbg.TasksStub(channel)
    finally:
        await channel.close()
        server.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running, 10)


def _auth(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


def _child(awaits: str, key: str | None = None) -> pb.TaskSpec:
    return pb.TaskSpec(pool="alpha", key=key, deps=[pb.Dep(target=pb.TaskRef(key=awaits))])


async def test_a_scoped_credential_cannot_await_an_unknown_key(stub: pbg.TasksStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Submit(pb.SubmitRequest(task=_child("not-yet")), metadata=_auth(ALPHA))
    assert refused.value.code() is grpc.StatusCode.NOT_FOUND
    assert "not-yet" in (refused.value.details() or "")
    # Nothing was admitted: the key can still be taken, in another pool, and nobody waits for it.
    parent = await stub.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="beta", key="not-yet")), metadata=_auth(ADMIN))
    assert not parent.duplicate


async def test_a_batch_may_still_name_its_own_keys(stub: pbg.TasksStub) -> None:
    batch = [pb.TaskSpec(pool="alpha", key="batch-parent"), _child("batch-parent", key="batch-child")]
    response = await stub.SubmitBatch(pb.SubmitBatchRequest(tasks=batch), metadata=_auth(ALPHA))
    assert [task.duplicate for task in response.tasks] == [False, False]


async def test_an_unscoped_credential_still_awaits(stub: pbg.TasksStub) -> None:
    child = await stub.Submit(pb.SubmitRequest(task=_child("later")), metadata=_auth(ADMIN))
    info = await stub.Get(pb.GetRequest(task=pb.TaskRef(id=child.id)), metadata=_auth(ADMIN))
    assert info.status == pb.TASK_STATUS_BLOCKED
