"""A shard driver owns its tasks: they end before it has stopped.

Its helpers (one watching the store's lease, one pruning finished rows) are cancelled and then
awaited, on shutdown before ``shutdown`` returns, on a step-down before the step loop ends (the
step-down itself is reported at once): a helper in the middle of a store call may need several
turns of the loop to unwind (a database connection rolls back), and a task left pending when the
loop closes is destroyed half-way ("Task was destroyed but it is pending")."""

from __future__ import annotations

import asyncio

from cronoq.engine import CoreConfig, PoolConfig
from cronoq.shard.driver import Driver, DriverOptions
from cronoq.stores.memory import MemoryStore

from .support import WAIT_S, Sink

UNWIND_TURNS = 20


class SlowToUnwindPrune(MemoryStore):
    """A memory store whose prune never finishes, and once cancelled takes a few turns of the loop
    and, while ``release`` is clear, waits for it to clean up."""

    def __init__(self) -> None:
        super().__init__()
        self.pruning = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()
        self.unwound = False

    async def prune(self, before: int) -> int:
        self.pruning.set()
        try:
            await asyncio.Event().wait()
        finally:
            for _ in range(UNWIND_TURNS):
                await asyncio.sleep(0)
            await self.release.wait()
            self.unwound = True
        return 0


async def pruning_driver(store: SlowToUnwindPrune) -> Driver:
    pool = PoolConfig("default", min_workers=0, max_workers=0, initial_workers=0)
    options = DriverOptions(keep_finished_s=0.0, prune_interval_s=0.0)
    driver = Driver(CoreConfig(pools=(pool,)), Sink(), store=store, options=options)
    await driver.lead()
    await asyncio.wait_for(store.pruning.wait(), WAIT_S)
    return driver


async def test_shutdown_waits_for_the_helpers_to_end() -> None:
    store = SlowToUnwindPrune()
    driver = await pruning_driver(store)
    await driver.shutdown(0.0)
    assert store.unwound


def step_loop() -> list[asyncio.Task[object]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == "cronoq-driver"]


async def test_the_step_loop_ends_after_its_helpers_on_a_step_down() -> None:
    store = SlowToUnwindPrune()
    driver = await pruning_driver(store)
    loop_task = step_loop()
    assert len(loop_task) == 1
    try:
        store.release.clear()
        store.lost.set()  # the lease keeper gave up: the driver steps down
        assert await asyncio.wait_for(driver.wait_stepped_down(), WAIT_S) == "leadership lost"
        assert not loop_task[0].done(), "the step loop ended while its pruning helper was still running"
        store.release.set()
        await asyncio.wait_for(loop_task[0], WAIT_S)
        assert store.unwound
    finally:
        store.release.set()
        await driver.shutdown(0.0)
