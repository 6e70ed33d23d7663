"""``limits.max_streams_per_caller`` against a real ``cronoq-server`` process: one credential may
hold that many streams open (Watch and Work here; Forward streams are counted the same way), the
next is RESOURCE_EXHAUSTED with a message naming the key, other credentials are not affected, and
closing a stream gives its slot back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN, WORKER_TOKEN
from tests.server.http_support import HttpServerProcess, process_config

PATIENCE_S = 30.0
"""How long a test waits for an outcome before it is declared broken (never a pass criterion)."""

LIMIT = 2


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    proc = HttpServerProcess(
        tmp_path_factory.mktemp("streams"), process_config(f"max_streams_per_caller = {LIMIT}"), name="streams"
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.asynccontextmanager
async def channel(server: HttpServerProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(server.address) as chan:
        yield chan


async def open_watch(chan: grpc.aio.Channel, token: str) -> Any:
    """A Watch stream, once the server has taken it (its headers arrived), or the error ending it."""
    call = pbg.TasksStub(chan).Watch(pb.WatchRequest(pools=["default"], all_transitions=True), metadata=bearer(token))
    await asyncio.wait_for(call.initial_metadata(), PATIENCE_S)
    return call


async def refusal(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async with asyncio.timeout(PATIENCE_S):
            async for _ in call:
                pass
    return caught.value


async def test_a_credential_holds_at_most_max_streams_per_caller_watches(server: HttpServerProcess) -> None:
    async with channel(server) as chan:
        held = [await open_watch(chan, CLIENT_TOKEN) for _ in range(LIMIT)]
        error = await refusal(await open_watch(chan, CLIENT_TOKEN))
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error
        assert "max_streams_per_caller" in (error.details() or "")
        # Another credential has slots of its own.
        other = await open_watch(chan, ADMIN_TOKEN)
        assert not other.done()
        # Closing one stream gives its slot back: a new Watch of the same credential is served
        # (it sees the event of a task submitted after it opened).
        held.pop().cancel()
        tasks = pbg.TasksStub(chan)
        for _ in range(100):  # the server sees the cancellation a moment after the client sends it
            again = await open_watch(chan, CLIENT_TOKEN)
            await tasks.Submit(
                pb.SubmitRequest(task=pb.TaskSpec(pool="default", payload=b"{}")),
                metadata=bearer(CLIENT_TOKEN),
                timeout=PATIENCE_S,
            )
            try:
                event = await asyncio.wait_for(again.read(), PATIENCE_S)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                continue
            assert isinstance(event, pb.StatusEvent), event
            break
        else:
            pytest.fail("the slot of a closed Watch was never given back")
        again.cancel()
        for call in (*held, other):
            call.cancel()


async def test_work_streams_count_against_the_same_limit(server: HttpServerProcess) -> None:
    async with channel(server) as chan:
        workers = pbg.WorkersStub(chan)
        streams = []
        for number in range(LIMIT):
            stream = workers.Work(metadata=bearer(WORKER_TOKEN))
            register = pb.Register(pool="default", slots=1, worker_name=f"w{number}", protocol_version=3)
            await stream.write(pb.WorkerMessage(register=register))
            reply = await asyncio.wait_for(stream.read(), PATIENCE_S)
            assert reply.WhichOneof("msg") == "registered", reply
            streams.append(stream)
        extra = workers.Work(metadata=bearer(WORKER_TOKEN))
        register = pb.Register(pool="default", slots=1, worker_name="one-too-many", protocol_version=3)
        await extra.write(pb.WorkerMessage(register=register))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(extra.read(), PATIENCE_S)
        assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value
        assert "max_streams_per_caller" in (caught.value.details() or "")
        # The refused worker was never registered: the pool lists exactly the two that were.
        listed = await pbg.AdminStub(chan).ListWorkers(pb.Empty(), metadata=bearer(ADMIN_TOKEN), timeout=PATIENCE_S)
        names = sorted(worker.name for worker in listed.workers)
        assert names == ["w0", "w1"], listed
        for stream in streams:
            stream.cancel()
