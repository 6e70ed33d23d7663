"""A pool-scoped caller never hears of shards that serve none of its pools: not in refusals, not
as "unavailable" in listings, lookups or watches, and a cancel by key is not refused for a shard
that could not hold its task. Unscoped callers still get every shard named (the control)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.federation.test_refusals import serving

SCOPED_CLIENT = "privacy-scoped-client-0123456789"
SCOPED_METRICS = "privacy-scoped-metrics-0123456789"
CLIENT = "privacy-client-0123456789abcdef"
METRICS = "privacy-metrics-0123456789abcdef"

# Credentials, in the [server] table's place of the configuration of ``test_refusals``, where the
# shard "far" can never be asked: a plain http:// peer on another host gets no tokens.
CREDENTIALS = "\n".join(
    f'[[auth.tokens]]\ntoken = "{token}"\nrole = "{role}"\n{scope}'
    for token, role, scope in (
        (SCOPED_CLIENT, "client", 'pools = ["local"]'),
        (SCOPED_METRICS, "metrics", 'pools = ["local"]'),
        (CLIENT, "client", ""),
        (METRICS, "metrics", ""),
    )
)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
async def stubs() -> AsyncIterator[tuple[pbg.TasksStub, pbg.AdminStub]]:
    app, running, address = await serving(CREDENTIALS)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
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
