"""Closing a worker session wakes whoever waits on its outbound queue."""

from __future__ import annotations

import asyncio

import pytest
from cronoq.engine import CoreConfig, PoolConfig, TaskSpec
from cronoq.engine.types import NS_PER_S
from cronoq.shard.blob import Blob, BlobCodec
from cronoq.shard.service import ShardService
from cronoq.shard.workers import ClosedOut, LeaseOut, WorkerGone, WorkerRegistry
from cronoq.stores import MemoryStore


async def test_unregistering_wakes_a_writer_waiting_on_an_empty_queue() -> None:
    config = CoreConfig(pools=(PoolConfig("default", lease_ttl=30 * NS_PER_S),))
    svc = ShardService(config, store=MemoryStore(codec=BlobCodec()))
    await svc.lead()
    session = svc.register_worker("default", 1, "w", {}, 3)
    waiting = asyncio.ensure_future(session.outbound.get())
    await asyncio.sleep(0)
    svc.unregister_worker(session)
    assert isinstance(await asyncio.wait_for(waiting, 5), ClosedOut)
    assert session.closed
    with pytest.raises(WorkerGone):
        session.send(ClosedOut())
    await svc.shutdown(0.1)


async def test_closing_leaves_queued_messages_first_and_adds_nothing() -> None:
    config = CoreConfig(pools=(PoolConfig("default", lease_ttl=30 * NS_PER_S),))
    svc = ShardService(config, store=MemoryStore(codec=BlobCodec()))
    await svc.lead()
    session = svc.register_worker("default", 1, "w", {}, 3)
    await svc.submit(TaskSpec(payload=Blob(b"x")))
    lease = await asyncio.wait_for(session.outbound.get(), 5)
    assert isinstance(lease, LeaseOut)
    session.outbound.put_nowait(lease)  # as if the writer had not taken it yet
    svc.unregister_worker(session)
    assert session.outbound.qsize() == 1 and isinstance(session.outbound.get_nowait(), LeaseOut)
    await svc.shutdown(0.1)


def test_close_is_idempotent() -> None:
    registry = WorkerRegistry()
    session = registry.add("default", 2, "w", {}, 0, 3)
    session.close()
    session.close()
    assert session.outbound.qsize() == 1
    assert registry.remove(session) == []
    assert session.outbound.qsize() == 1


async def test_a_report_frees_the_slot_of_its_own_session_only() -> None:
    config = CoreConfig(pools=(PoolConfig("default", lease_ttl=30 * NS_PER_S),))
    svc = ShardService(config, store=MemoryStore(codec=BlobCodec()))
    await svc.lead()
    first = svc.register_worker("default", 1, "a", {}, 3)
    second = svc.register_worker("default", 1, "b", {}, 3)
    await svc.submit(TaskSpec(payload=Blob(b"x")))
    await svc.submit(TaskSpec(payload=Blob(b"y")))
    leases = [await asyncio.wait_for(s.outbound.get(), 5) for s in (first, second)]
    assert all(isinstance(out, LeaseOut) for out in leases)
    held_by_first = next(iter(first.running))
    held_by_second = next(iter(second.running))
    # A report naming a lease another session holds leaves that session's slot and ownership
    # alone (the Work stream forwards only reports on leases its session holds) ...
    svc.worker_complete(first, held_by_second, Blob(b"stale"))
    assert svc.workers.lease_owner[held_by_second] is second and held_by_second in second.running
    assert first.free == 0
    # ... its own frees its slot and ends the lease's ownership.
    svc.worker_complete(first, held_by_first, Blob(b"done"))
    assert first.free == 1 and held_by_first not in svc.workers.lease_owner
    svc.worker_fail(second, held_by_second, "no", False, None)
    assert second.free == 1 and not svc.workers.lease_owner
    await svc.shutdown(0.1)
