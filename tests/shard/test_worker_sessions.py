"""Closing a worker session wakes whoever waits on its outbound queue."""

from __future__ import annotations

import asyncio

import pytest
from cronoq.engine import CoreConfig, PoolConfig, TaskSpec
from cronoq.engine.types import NS_PER_S
from cronoq.shard.blob import Blob
from cronoq.shard.service import ShardService
from cronoq.shard.workers import ClosedOut, LeaseOut, WorkerGone, WorkerRegistry
from cronoq.stores import MemoryStore


async def test_unregistering_wakes_a_writer_waiting_on_an_empty_queue() -> None:
    config = CoreConfig(pools=(PoolConfig("default", lease_ttl=30 * NS_PER_S),))
    svc = ShardService(config, store=MemoryStore())
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
    svc = ShardService(config, store=MemoryStore())
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
