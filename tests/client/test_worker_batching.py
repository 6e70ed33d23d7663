"""The Worker's side of batching on the Work stream: it announces it, takes batched leases (and the
aborts after them), and reports what is ready at once in one message, only to a server that said
``batching``."""

from __future__ import annotations

import asyncio
from typing import Any

from cronoq.client import Lease
from cronoq.proto import cronoq_pb2 as pb
from tests.client.fake_server import FakeCronoq, eventually


def held_until(release: asyncio.Event, started: list[int]) -> Any:
    async def handler(lease: Lease) -> str:
        started.append(lease.id)
        await release.wait()
        return f"done {lease.id}"

    return handler


async def serve_batch(fake: FakeCronoq, start_worker: Any, leases: int) -> tuple[Any, list[int]]:
    """A Worker with ``leases`` slots, sent ``leases`` leases in one ServerMessage batch, all of
    them held by the handler until the test releases them; returns (stream, ids started)."""
    fake.auto_dispatch = False
    release = asyncio.Event()
    started: list[int] = []
    running = start_worker(fake.address, held_until(release, started), slots=leases)
    await running.worker.wait_registered(timeout=5)
    stream = fake.streams[0]
    batch = pb.ServerBatch(leases=[fake.lease_for(fake._admit(pb.TaskSpec()).id, "") for _ in range(leases)])
    stream.send(batch=batch)
    await eventually(lambda: len(started) == leases, what="every lease of the batch to start")
    release.set()
    await eventually(lambda: all(rec.done.is_set() for rec in fake.tasks.values()), what="every outcome")
    await running.stop()
    return stream, started


async def test_outcomes_ready_at_once_leave_in_one_message(fake: FakeCronoq, start_worker: Any) -> None:
    fake.batching = True
    fake.max_message_bytes = 1 << 20
    stream, started = await serve_batch(fake, start_worker, 20)
    assert stream.register.batch_bytes == 4 * 1024 * 1024
    assert sorted(started) == sorted(fake.leases)
    reported = [done.lease for batch in stream.batches for done in batch.completes]
    reported += [done.lease for done in stream.of_kind("complete")]
    assert sorted(reported) == sorted(started)  # each outcome exactly once
    assert max(len(batch.completes) for batch in stream.batches) > 1
    assert all(
        rec.output == f"done {lease}".encode() for lease, rec in zip(sorted(started), fake.tasks.values(), strict=True)
    )


async def test_batches_stay_within_the_servers_message_limit(fake: FakeCronoq, start_worker: Any) -> None:
    fake.batching = True
    fake.max_message_bytes = 4096 + 200  # room for about a dozen small outcomes per message
    stream, started = await serve_batch(fake, start_worker, 40)
    assert len(stream.batches) > 1
    assert all(pb.WorkerMessage(batch=batch).ByteSize() <= fake.max_message_bytes for batch in stream.batches)
    reported = [done.lease for batch in stream.batches for done in batch.completes]
    reported += [done.lease for done in stream.of_kind("complete")]
    assert sorted(reported) == sorted(started)


async def test_without_the_servers_word_every_outcome_is_a_message_of_its_own(
    fake: FakeCronoq, start_worker: Any
) -> None:
    stream, started = await serve_batch(fake, start_worker, 20)  # fake.batching stays off
    assert stream.batches == [] and "batch" not in stream.kinds()
    assert sorted(done.lease for done in stream.of_kind("complete")) == sorted(started)


async def test_an_abort_in_a_batch_stops_the_lease_it_came_with(fake: FakeCronoq, start_worker: Any) -> None:
    fake.batching = True
    fake.auto_dispatch = False
    started: list[int] = []
    cancelled: list[int] = []

    async def waits(lease: Lease) -> str:
        started.append(lease.id)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(lease.id)
            raise
        return "never"

    running = start_worker(fake.address, waits, slots=2)
    await running.worker.wait_registered(timeout=5)
    stream = fake.streams[0]
    kept, stopped = (fake.lease_for(fake._admit(pb.TaskSpec()).id, "") for _ in range(2))
    stream.send(batch=pb.ServerBatch(leases=[kept, stopped], aborts=[pb.Abort(lease=stopped.lease, reason="timeout")]))
    await eventually(lambda: kept.lease in started, what="the kept lease to start")
    assert running.worker.running == 1  # the stopped one was never started, or was cancelled
    assert stopped.lease not in started or stopped.lease in cancelled
    await running.stop(grace=0.1)
    assert all(done.lease != stopped.lease for batch in stream.batches for done in batch.completes)
    assert all(body.lease != stopped.lease for body in stream.of_kind("fail") + stream.of_kind("complete"))
