"""The Workers.Work stream: protocol rules on a raw stream, and workers that die or freeze."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from cronoq.client import Client, Lease
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN, WORKER_TOKEN, ChildWorker, ServerProcess

WORKER_METADATA = (("authorization", f"Bearer {WORKER_TOKEN}"),)


class RawStream:
    """A hand-driven Work stream."""

    def __init__(self, channel: grpc.aio.Channel, token: str = WORKER_TOKEN) -> None:
        self.outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self.call = pbg.WorkersStub(channel).Work(self._requests(), metadata=(("authorization", f"Bearer {token}"),))

    async def _requests(self) -> AsyncIterator[pb.WorkerMessage]:
        while True:
            message = await self.outbox.get()
            if message is None:
                return
            yield message

    def send(self, **fields: Any) -> None:
        self.outbox.put_nowait(pb.WorkerMessage(**fields))

    async def recv(self, timeout: float = 10.0) -> pb.ServerMessage:
        message = await asyncio.wait_for(self.call.read(), timeout)
        assert message is not grpc.aio.EOF
        return message  # type: ignore[no-any-return]

    async def status(self, timeout: float = 15.0) -> grpc.StatusCode:
        """The call's final status. Messages still unread are drained first: a gRPC client gets
        the status only after every message before it has been read."""

        async def drain() -> grpc.StatusCode:
            with contextlib.suppress(grpc.aio.AioRpcError):
                while await self.call.read() is not grpc.aio.EOF:
                    pass
            return await self.call.code()  # type: ignore[no-any-return]

        return await asyncio.wait_for(drain(), timeout)


def register(pool: str = "default", slots: int = 1, protocol: int = 3, **labels: str) -> pb.Register:
    return pb.Register(pool=pool, slots=slots, worker_name="raw", protocol_version=protocol, labels=labels)


@pytest.fixture
async def channel(server: ServerProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(server.address) as ch:
        yield ch


async def test_registration_rules(channel: grpc.aio.Channel) -> None:
    first_not_register = RawStream(channel)
    first_not_register.send(heartbeat=pb.Heartbeat(lease=1))
    assert await first_not_register.status() == grpc.StatusCode.INVALID_ARGUMENT

    old = RawStream(channel)
    old.send(register=register(protocol=2))
    assert await old.status() == grpc.StatusCode.FAILED_PRECONDITION
    assert "3" in (await old.call.details() or "")

    unknown = RawStream(channel)
    unknown.send(register=register(pool="nope"))
    assert await unknown.status() == grpc.StatusCode.NOT_FOUND

    no_slots = RawStream(channel)
    no_slots.send(register=register(slots=0))
    assert await no_slots.status() == grpc.StatusCode.INVALID_ARGUMENT

    wrong_role = RawStream(channel, token=CLIENT_TOKEN)
    wrong_role.send(register=register())
    assert await wrong_role.status() == grpc.StatusCode.PERMISSION_DENIED

    twice = RawStream(channel)
    twice.send(register=register(pool="other"))
    registered = (await twice.recv()).registered
    # Slots are capped by limits.max_slots_per_worker (4 here); the TTL is the pool's.
    assert registered.worker_id > 0 and registered.protocol_version == 3
    assert registered.lease_ttl_s == 30 and registered.max_message_bytes == 16 * 1024 * 1024
    twice.send(register=register(pool="other"))
    assert await twice.status() == grpc.StatusCode.INVALID_ARGUMENT

    capped = RawStream(channel)
    capped.send(register=register(pool="other", slots=100))
    assert (await capped.recv()).registered.slots == 4
    capped.outbox.put_nowait(None)
    assert await capped.status() == grpc.StatusCode.OK


async def test_exactly_one_outcome_per_lease(server: ServerProcess, channel: grpc.aio.Channel) -> None:
    stream = RawStream(channel)
    stream.send(register=register(pool="crash", slots=1))
    assert (await stream.recv()).HasField("registered")
    async with Client(server.address, token=CLIENT_TOKEN) as client:
        submitted = await client.submit(b"payload", pool="crash", key="one-outcome")
        lease = (await stream.recv()).lease
        assert lease.task_id == submitted.id and lease.attempt == 1 and lease.payload == b"payload"
        assert lease.pool == "crash" and lease.lease_ttl_s == 1
        stream.send(heartbeat=pb.Heartbeat(lease=lease.lease))
        stream.send(complete=pb.Complete(lease=lease.lease, output=b"first", content_type="text/plain"))
        stream.send(fail=pb.Fail(lease=lease.lease, message="late", permanent=True))
        stream.send(complete=pb.Complete(lease=lease.lease, output=b"second"))
        stream.send(cancelled=pb.Cancelled(lease=lease.lease))
        stream.send(complete=pb.Complete(lease=999_999, output=b"unknown lease"))
        result = await client.wait(submitted.id, timeout=5)
        assert result.status == "succeeded" and result.output == b"first"
        # The stream ends only after the server handled every message sent on it before.
        stream.outbox.put_nowait(None)
        assert await stream.status() == grpc.StatusCode.OK
        again = await client.wait(submitted.id, timeout=5)
        assert again.output == b"first"


async def test_fail_cancelled_and_nack_over_a_raw_stream(server: ServerProcess, channel: grpc.aio.Channel) -> None:
    stream = RawStream(channel)
    stream.send(register=register(pool="crash", slots=1))
    await stream.recv()
    async with Client(server.address, token=CLIENT_TOKEN) as client:
        permanent = await client.submit(b"", pool="crash")
        lease = (await stream.recv()).lease
        stream.send(fail=pb.Fail(lease=lease.lease, message="bad\0input", permanent=True))
        result = await client.wait(permanent.id, timeout=5)
        assert result.status == "failed" and result.message == "bad\ufffdinput"

        cancelled = await client.submit(b"", pool="crash")
        lease = (await stream.recv()).lease
        stream.send(cancelled=pb.Cancelled(lease=lease.lease))
        assert (await client.wait(cancelled.id, timeout=5)).status == "cancelled"

        # A nack with no other worker to take it fails the attempt as retryable; the retry comes back.
        nacked = await client.submit(b"", pool="crash")
        lease = (await stream.recv()).lease
        stream.send(nack=pb.Nack(lease=lease.lease, reason="busy"))
        retry = (await stream.recv()).lease
        assert retry.task_id == nacked.id and retry.attempt == 2
        stream.send(complete=pb.Complete(lease=retry.lease, output=b"ok"))
        assert (await client.wait(nacked.id, timeout=5)).output == b"ok"
    stream.outbox.put_nowait(None)


async def test_cancel_sends_abort_to_the_worker(server: ServerProcess, channel: grpc.aio.Channel) -> None:
    stream = RawStream(channel)
    stream.send(register=register(pool="crash", slots=1))
    await stream.recv()
    async with Client(server.address, token=CLIENT_TOKEN) as client:
        submitted = await client.submit(b"", pool="crash")
        lease = (await stream.recv()).lease
        assert await client.cancel(submitted.id) is True
        abort = (await stream.recv()).abort
        assert abort.lease == lease.lease
        stream.send(complete=pb.Complete(lease=lease.lease, output=b"too late"))
        assert (await client.wait(submitted.id, timeout=5)).status == "cancelled"
    stream.outbox.put_nowait(None)


async def test_a_killed_worker_loses_its_lease_to_another_worker(server: ServerProcess, workers) -> None:
    child = ChildWorker(server.address, "crash", WORKER_TOKEN)
    try:
        child.wait_for("registered")
        async with Client(server.address, token=CLIENT_TOKEN) as client:
            submitted = await client.submit(b"work", pool="crash", key="killed-mid-lease")
            leased = await asyncio.to_thread(child.wait_for, "leased")
            assert leased.split()[1:] == [str(submitted.id), "1"]
            attempts: list[int] = []

            async def finish(lease: Lease) -> bytes:
                attempts.append(lease.attempt)
                return b"rescued"

            await workers("crash", finish)
            child.kill()
            result = await client.wait(submitted.id, timeout=10)
            assert result.status == "succeeded" and result.output == b"rescued" and attempts == [2]
    finally:
        child.kill()


async def test_a_frozen_worker_lease_expires_and_is_retried_elsewhere(server: ServerProcess, workers) -> None:
    child = ChildWorker(server.address, "crash", WORKER_TOKEN)
    try:
        child.wait_for("registered")
        async with Client(server.address, token=CLIENT_TOKEN) as client, \
                Client(server.address, token=ADMIN_TOKEN) as admin:  # fmt: skip
            before = (await admin.snapshot()).totals.lease_expiries
            submitted = await client.submit(b"work", pool="crash", key="frozen-mid-lease")
            await asyncio.to_thread(child.wait_for, "leased")
            # Frozen: the stream stays open but no heartbeat comes (lease_ttl_s = 1 in this pool).
            os.kill(child.proc.pid, signal.SIGSTOP)
            attempts: list[int] = []

            async def finish(lease: Lease) -> bytes:
                attempts.append(lease.attempt)
                return b"rescued"

            await workers("crash", finish)
            result = await client.wait(submitted.id, timeout=10)
            assert result.status == "succeeded" and attempts == [2]
            assert (await admin.snapshot()).totals.lease_expiries >= before + 1
    finally:
        child.kill()
