"""The shard driver overlaps a busy step's commit with the next step, and still releases each
step's acknowledgements only once its own commit is durable, commits staying in step order.

(Tested here beside the other driver-and-store tests: what is at stake is what the store holds
when an acknowledgement goes out.) The store is the memory store with a gate in front of its
commit, so a test decides when a commit completes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from cronoq.engine import Core, CoreConfig, Mutation, PoolConfig, PutTask, TaskSpec
from cronoq.shard.driver import PIPELINE_MIN_MUTATIONS, Driver, NotLeader, Role
from cronoq.stores.base import Fenced
from cronoq.stores.memory import MemoryStore

from .support import WAIT_S, Sink, eventually


class GatedStore(MemoryStore):
    """A memory store whose commits wait for ``gate`` while it is closed; ``log`` records, in
    order, each commit entering (``("enter", task ids)``) and finishing (``("done", ...)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.log: list[tuple[str, tuple[int, ...]]] = []

    async def commit(self, epoch: int, mutations: Sequence[Mutation]) -> None:
        ids = tuple(m.task.id for m in mutations if isinstance(m, PutTask))
        self.log.append(("enter", ids))
        await self.gate.wait()
        await super().commit(epoch, mutations)
        self.log.append(("done", ids))


async def leading_driver(store: GatedStore) -> Driver:
    pool = PoolConfig("default", min_workers=0, max_workers=0, initial_workers=0)
    driver = Driver(CoreConfig(pools=(pool,)), Sink(), store=store)
    await driver.lead()
    return driver


def submit(count: int, ran: list[str], name: str) -> Any:
    def command(core: Core, now: int) -> list[int]:
        ran.append(name)
        return [s.id for s in core.submit_batch(now, [TaskSpec(payload=i) for i in range(count)])]

    return command


async def test_a_busy_steps_commit_overlaps_the_next_step_whose_ack_waits_for_its_own_commit() -> None:
    store = GatedStore()
    driver = await leading_driver(store)
    try:
        ran: list[str] = []
        store.gate.clear()
        first = driver.call(submit(PIPELINE_MIN_MUTATIONS, ran, "first"))
        await eventually(lambda: len(store.log) == 1, "the first commit to start")
        second = driver.call(submit(1, ran, "second"))
        # The second step runs while the first commit is held...
        await eventually(lambda: ran == ["first", "second"], "the second step to run meanwhile")
        for _ in range(50):
            await asyncio.sleep(0)
        # ...but neither acknowledgement goes out, and the second commit has not started.
        assert not first.done() and not second.done()
        assert [entry[0] for entry in store.log] == ["enter"]
        store.gate.set()
        first_ids = await asyncio.wait_for(first, WAIT_S)
        second_ids = await asyncio.wait_for(second, WAIT_S)
        assert store.log == [
            ("enter", tuple(first_ids)),
            ("done", tuple(first_ids)),
            ("enter", tuple(second_ids)),
            ("done", tuple(second_ids)),
        ]
        stored = set(store.state.tasks)
        assert set(first_ids) | set(second_ids) <= stored
    finally:
        store.gate.set()
        await driver.shutdown(0.0)


async def test_after_a_small_step_commands_wait_for_its_commit_and_travel_together() -> None:
    store = GatedStore()
    driver = await leading_driver(store)
    try:
        ran: list[str] = []
        store.gate.clear()
        first = driver.call(submit(1, ran, "first"))
        await eventually(lambda: len(store.log) == 1, "the first commit to start")
        later = [driver.call(submit(1, ran, f"later{i}")) for i in range(3)]
        for _ in range(50):
            await asyncio.sleep(0)
        assert ran == ["first"], "a step ran while a small commit was in flight"
        store.gate.set()
        await asyncio.wait_for(first, WAIT_S)
        ids = [(await asyncio.wait_for(f, WAIT_S))[0] for f in later]
        # The three commands that waited went into one step, hence one commit.
        assert store.log[2:] == [("enter", tuple(ids)), ("done", tuple(ids))]
    finally:
        store.gate.set()
        await driver.shutdown(0.0)


async def test_a_fenced_commit_fails_the_step_computed_on_top_of_it_too() -> None:
    """Found by the leader-pause drill: a leader woken from a freeze finds its busy commit fenced
    while the next step is already computed. Both steps' callers must hear NotLeader at once
    (UNAVAILABLE on the wire, retried elsewhere), not wait until the listener is stopped and their
    calls are cancelled."""
    store = GatedStore()
    driver = await leading_driver(store)
    fenced = Fenced("epoch 1 is stale: another instance leads")

    async def fenced_commit(epoch: int, mutations: Sequence[Mutation]) -> None:
        store.log.append(("enter", ()))
        await store.gate.wait()
        raise fenced

    try:
        ran: list[str] = []
        store.gate.clear()
        store.commit = fenced_commit  # type: ignore[method-assign]
        first = driver.call(submit(PIPELINE_MIN_MUTATIONS, ran, "first"))
        await eventually(lambda: len(store.log) == 1, "the first commit to start")
        second = driver.call(submit(1, ran, "second"))
        await eventually(lambda: ran == ["first", "second"], "the second step to run meanwhile")
        store.gate.set()
        for future in (first, second):
            with pytest.raises(NotLeader):
                await asyncio.wait_for(future, WAIT_S)
        assert driver.role is Role.STOPPED
    finally:
        store.gate.set()
        await driver.shutdown(0.0)


async def test_a_leader_whose_lease_ran_out_under_a_hung_commit_steps_down_at_once() -> None:
    """Found by the partition-replicas drill: a leader cut off from Postgres by a blackhole lost its
    lease (a standby took over) while its commit hung, and kept leading, /readyz 200, until the
    commit gave up. It must step down when the store says leadership is lost, commit or not."""
    store = GatedStore()
    driver = await leading_driver(store)
    try:
        ran: list[str] = []
        store.gate.clear()  # the commit never finishes on its own: the network holds it
        first = driver.call(submit(PIPELINE_MIN_MUTATIONS, ran, "first"))
        await eventually(lambda: len(store.log) == 1, "the first commit to start")
        store.lost.set()  # the lease keeper gave up: another instance may lead by now
        with pytest.raises(NotLeader):
            await asyncio.wait_for(first, WAIT_S)
        await eventually(lambda: driver.role is Role.STOPPED, "the driver to step down")
        assert store.log == [("enter", store.log[0][1])]  # the hung commit never completed
    finally:
        store.gate.set()
        await driver.shutdown(0.0)
