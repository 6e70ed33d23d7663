"""One transport: the server listens on its gRPC, HTTP and metrics ports and nothing else, and a
worker that announces batching gets several leases per message on the Work stream (published
workers still get exactly one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from cronoq.client import Client, Lease, Worker
from cronoq.proto import cronoq_pb2 as pb
from tests.server.harness import CLIENT_TOKEN, TOKENS_TOML, WORKER_TOKEN, ServerProcess, tcp_sockets
from tests.server.test_workers import RawStream

CONFIG = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
metrics_addr = "127.0.0.1:{{metrics_port}}"
shutdown_grace_s = 1

[limits]
max_slots_per_worker = 64

{TOKENS_TOML}
[[pools]]
name = "batched"
max = 64

[[pools]]
name = "published"
max = 64

[[pools]]
name = "sized"
max = 64

[[pools]]
name = "large"
max = 64

[[pools]]
name = "client"
max = 64

[[pools]]
name = "claims"
max = 64

[[pools]]
name = "other"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("transport"), CONFIG, name="transport").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[Client]:
    async with Client(server.address, token=CLIENT_TOKEN) as c:
        yield c


# ------------------------------------------------------------------------------ listening sockets


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets in LISTEN state, IPv4 and IPv6)."""
    return {local for state, local, _ in tcp_sockets(pid) if state == "0A"}


async def test_the_server_listens_on_its_grpc_http_and_metrics_ports_only(
    server: ServerProcess, client: Client
) -> None:
    # Traffic of every kind first: a worker's stream, calls, so nothing opens a port lazily unseen.
    async def handler(lease: Lease) -> str:
        return "ok"

    worker = Worker(server.address, "client", handler, token=WORKER_TOKEN, slots=4)
    running = asyncio.ensure_future(worker.run())
    try:
        submitted = await client.submit(None, pool="client", wait=True, wait_timeout=10)
        assert submitted.result is not None and submitted.result.ok
    finally:
        await worker.stop(1)
        await running
    expected = {server.port, server.http_port, server.metrics_port}  # as bound (port 0 in the file)
    assert len(expected) == 3 and 0 not in expected, expected
    assert server.proc is not None
    assert listening_ports(server.proc.pid) == expected


# ------------------------------------------------------------------------------ batching


async def fill(client: Client, pool: str, count: int, payload: bytes = b"") -> list[int]:
    return [submitted.id for submitted in await client.submit_batch([_task(pool, payload) for _ in range(count)])]


def _task(pool: str, payload: bytes) -> pb.TaskSpec:
    return pb.TaskSpec(pool=pool, payload=payload, content_type="application/octet-stream")


async def leases_until(stream: RawStream, count: int) -> list[pb.ServerMessage]:
    """ServerMessages read until they carried ``count`` leases."""
    messages: list[pb.ServerMessage] = []
    seen = 0
    while seen < count:
        message = await stream.recv()
        messages.append(message)
        seen += len(message.batch.leases) if message.WhichOneof("msg") == "batch" else message.HasField("lease")
    return messages


def register(pool: str, slots: int, batch_bytes: int = 0) -> pb.Register:
    return pb.Register(pool=pool, slots=slots, worker_name="raw", protocol_version=3, batch_bytes=batch_bytes)


async def test_a_worker_that_announces_batching_gets_leases_together(server: ServerProcess, client: Client) -> None:
    ids = await fill(client, "batched", 30)  # queued before any worker: ready at once
    async with grpc.aio.insecure_channel(server.address) as channel:
        stream = RawStream(channel)
        stream.send(register=register("batched", 30, batch_bytes=1 << 20))
        registered = (await stream.recv()).registered
        assert registered.batching
        messages = await leases_until(stream, 30)
        assert {message.WhichOneof("msg") for message in messages} == {"batch"}
        assert max(len(message.batch.leases) for message in messages) > 1
        leases = [lease for message in messages for lease in message.batch.leases]
        assert sorted(lease.task_id for lease in leases) == sorted(ids)
        # The outcomes go back together too: each counts as if sent alone.
        batch = pb.WorkerBatch(
            heartbeats=[pb.Heartbeat(lease=leases[0].lease)],
            completes=[pb.Complete(lease=lease.lease, output=b"ok") for lease in leases[1:]],
            fails=[pb.Fail(lease=leases[0].lease, message="no", permanent=True)],
        )
        stream.send(batch=batch)
        results = [await client.wait(task_id, timeout=10) for task_id in ids]
        failed = [result.id for result in results if result.status == "failed"]
        assert failed == [leases[0].task_id]
        assert all(result.output == b"ok" for result in results if result.id != leases[0].task_id)
        stream.outbox.put_nowait(None)
        stream.call.cancel()


async def test_a_batch_counts_each_lease_once_and_only_the_streams_own(server: ServerProcess, client: Client) -> None:
    """The outcomes of one batch reach the shard together, yet each is judged as if sent alone:
    the first report of a lease counts, a repeat changes nothing, and a report on a lease another
    stream holds is ignored (that stream's own report counts)."""
    ids = await fill(client, "claims", 3)
    async with grpc.aio.insecure_channel(server.address) as channel:
        mine, other = RawStream(channel), RawStream(channel)
        mine.send(register=register("claims", 2, batch_bytes=1 << 20))
        assert (await mine.recv()).registered.batching
        own = [lease for message in await leases_until(mine, 2) for lease in message.batch.leases]
        other.send(register=register("claims", 1, batch_bytes=1 << 20))
        assert (await other.recv()).registered.batching
        (theirs,) = [lease for message in await leases_until(other, 1) for lease in message.batch.leases]
        assert sorted(lease.task_id for lease in [*own, theirs]) == sorted(ids)
        batch = pb.WorkerBatch(
            completes=[
                pb.Complete(lease=own[0].lease, output=b"first"),
                pb.Complete(lease=own[0].lease, output=b"repeat"),
                pb.Complete(lease=theirs.lease, output=b"not ours"),
            ],
            fails=[pb.Fail(lease=own[1].lease, message="gave up", permanent=True)],
            cancelled=[pb.Cancelled(lease=own[1].lease)],  # after its Fail in the batch: too late
        )
        mine.send(batch=batch)
        first = await client.wait(own[0].task_id, timeout=10)
        assert (first.status, first.output) == ("succeeded", b"first")
        assert (await client.wait(own[1].task_id, timeout=10)).status == "failed"
        assert (await client.get(theirs.task_id)).status == "running"  # same step as the two above
        other.send(batch=pb.WorkerBatch(completes=[pb.Complete(lease=theirs.lease, output=b"theirs")]))
        last = await client.wait(theirs.task_id, timeout=10)
        assert (last.status, last.output) == ("succeeded", b"theirs")
        for stream in (mine, other):
            stream.outbox.put_nowait(None)
            stream.call.cancel()


async def test_a_published_worker_gets_one_lease_per_message(server: ServerProcess, client: Client) -> None:
    ids = await fill(client, "published", 30)
    async with grpc.aio.insecure_channel(server.address) as channel:
        stream = RawStream(channel)
        stream.send(register=register("published", 30))
        registered = (await stream.recv()).registered
        assert not registered.batching
        messages = await leases_until(stream, 30)
        assert [message.WhichOneof("msg") for message in messages] == ["lease"] * 30
        assert sorted(message.lease.task_id for message in messages) == sorted(ids)
        for message in messages:
            stream.send(complete=pb.Complete(lease=message.lease.lease))
        assert {(await client.wait(task_id, timeout=10)).status for task_id in ids} == {"succeeded"}
        stream.outbox.put_nowait(None)
        stream.call.cancel()


async def test_batches_stay_within_the_size_the_worker_takes(server: ServerProcess, client: Client) -> None:
    await fill(client, "sized", 20, payload=b"x" * 1000)
    limit = 4096 + 2500  # the server keeps 4096 bytes of headroom: about two such leases per batch
    async with grpc.aio.insecure_channel(server.address) as channel:
        stream = RawStream(channel)
        stream.send(register=register("sized", 20, batch_bytes=limit))
        assert (await stream.recv()).registered.batching
        messages = await leases_until(stream, 20)
        assert len(messages) > 5
        assert all(message.ByteSize() <= limit for message in messages)
        stream.outbox.put_nowait(None)
        stream.call.cancel()


async def test_a_lease_larger_than_the_headroom_waits_for_the_next_batch(server: ServerProcess, client: Client) -> None:
    """Leases bigger than the server's headroom: a batch never takes one past what the worker
    announced (its receive limit), it goes first in the next message instead."""
    await fill(client, "large", 10, payload=b"x" * 6000)
    limit = 4096 + 7000  # one such lease fits under the batch size, two would pass the limit
    async with grpc.aio.insecure_channel(server.address) as channel:
        stream = RawStream(channel)
        stream.send(register=register("large", 10, batch_bytes=limit))
        assert (await stream.recv()).registered.batching
        messages = await leases_until(stream, 10)
        assert [len(message.batch.leases) for message in messages] == [1] * 10
        assert all(message.ByteSize() <= limit for message in messages)
        stream.outbox.put_nowait(None)
        stream.call.cancel()


async def test_the_client_worker_batches(server: ServerProcess, client: Client) -> None:
    done: list[int] = []

    async def handler(lease: Lease) -> bytes:
        done.append(lease.task_id)
        return b"ok"

    ids = await fill(client, "batched", 200)
    worker = Worker(server.address, "batched", handler, token=WORKER_TOKEN, slots=32)
    running = asyncio.ensure_future(worker.run())
    try:
        results = [await client.wait(task_id, timeout=20) for task_id in ids]
        assert {result.status for result in results} == {"succeeded"}
    finally:
        await worker.stop(1)
        await running
    assert sorted(done) == sorted(ids)
    log = server.stderr()
    assert "registered for pool batched: 32 slots granted of 32 requested, batching" in log
