"""A pool-scoped caller never hears of shards that serve none of its pools: not in refusals, not
as "unavailable" in listings, lookups or watches, and a cancel by key is not refused for a shard
that could not hold its task. Unscoped callers still get every shard named (the control)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from cronoq.config import Config

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from cronoq.server.app import Listening, ServerApp

SCOPED_CLIENT = "privacy-scoped-client-0123456789"
SCOPED_METRICS = "privacy-scoped-metrics-0123456789"
CLIENT = "privacy-client-0123456789abcdef"
METRICS = "privacy-metrics-0123456789abcdef"

# The shard "far" can never be asked: a plain http:// peer on another host gets no tokens.
CONFIG = f"""
[server]
grpc_addr = "127.0.0.1:0"
http_addr = "127.0.0.1:0"
shard = "here"

[limits]
request_timeout_s = 1

[[auth.tokens]]
token = "{SCOPED_CLIENT}"
role = "client"
pools = ["local"]

[[auth.tokens]]
token = "{SCOPED_METRICS}"
role = "metrics"
pools = ["local"]

[[auth.tokens]]
token = "{CLIENT}"
role = "client"

[[auth.tokens]]
token = "{METRICS}"
role = "metrics"

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


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
async def stubs() -> AsyncIterator[tuple[pbg.TasksStub, pbg.AdminStub]]:
    listening: asyncio.Queue[Listening] = asyncio.Queue()
    app = ServerApp(Config.parse(CONFIG), on_listening=listening.put_nowait)
    running = asyncio.ensure_future(app.run())
    try:
        while (event := await asyncio.wait_for(listening.get(), 10)).role != "leader":
            pass
        async with grpc.aio.insecure_channel(event.grpc) as channel:
            yield pbg.TasksStub(channel), pbg.AdminStub(channel)
    finally:
        app.stop()
        await asyncio.wait_for(running, 10)


async def code_of(call: object) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value.code(), err.value.details() or "", dict(err.value.trailing_metadata() or ())


async def test_lookups_by_a_scoped_caller_do_not_reach_for_other_shards(
    stubs: tuple[pbg.TasksStub, pbg.AdminStub],
) -> None:
    tasks, _ = stubs
    far_task = pb.TaskRef(id=(2 << 56) | 1)
    code, details, metadata = await code_of(tasks.Get(pb.GetRequest(task=far_task), metadata=bearer(SCOPED_CLIENT)))
    assert code == grpc.StatusCode.NOT_FOUND and "far" not in details and not metadata
    missing = pb.TaskRef(key="nowhere")
    code, details, metadata = await code_of(tasks.Get(pb.GetRequest(task=missing), metadata=bearer(SCOPED_CLIENT)))
    assert code == grpc.StatusCode.NOT_FOUND and "far" not in details and not metadata
    # A task of its own pool can be cancelled by key: "far" could not hold it.
    mine = pb.SubmitRequest(task=pb.TaskSpec(pool="local", key="mine", start_in_s=3600))
    await tasks.Submit(mine, metadata=bearer(SCOPED_CLIENT))
    cancelled = await tasks.Cancel(pb.CancelRequest(task=pb.TaskRef(key="mine")), metadata=bearer(SCOPED_CLIENT))
    assert cancelled.cancelled

    # The control: an unscoped caller is told which shard could not be asked.
    code, details, _ = await code_of(tasks.Get(pb.GetRequest(task=missing), metadata=bearer(CLIENT)))
    assert code == grpc.StatusCode.UNAVAILABLE and "far" in details
    code, details, metadata = await code_of(tasks.Get(pb.GetRequest(task=far_task), metadata=bearer(CLIENT)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and metadata["cronoq-shard"] == "far"


async def test_reads_by_a_scoped_caller_name_no_other_shard(stubs: tuple[pbg.TasksStub, pbg.AdminStub]) -> None:
    tasks, admin = stubs
    for method in ("Snapshot", "ListWorkers", "ListRecurring"):
        scoped = await getattr(admin, method)(pb.Empty(), metadata=bearer(SCOPED_METRICS))
        assert list(scoped.unavailable_shards) == [], method
        unscoped = await getattr(admin, method)(pb.Empty(), metadata=bearer(METRICS))
        assert list(unscoped.unavailable_shards) == ["far"], method
    listing = await tasks.ListTasks(pb.ListTasksRequest(), metadata=bearer(SCOPED_CLIENT))
    assert list(listing.unavailable_shards) == []
    for token, named in ((SCOPED_CLIENT, ""), (CLIENT, "far")):
        call = tasks.Watch(pb.WatchRequest(), metadata=bearer(token))
        headers = dict(await call.initial_metadata() or ())
        call.cancel()
        assert headers.get("cronoq-unavailable-shards", "") == named
