"""The shard driver's garbage collector settings: applied while it leads a store, undone after.

(The driver is tested here rather than under tests/shard because these settings exist for the
stores' sake: the recovered state they freeze is what a store hands back at takeover.)
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from cronoq.shard.driver import DriverOptions
from cronoq.shard.gc_tuning import GcTuning
from cronoq.stores.memory import MemoryState, MemoryStore

import cronoq


async def noop(ctx: cronoq.TaskContext, payload: object) -> None:
    return None


@pytest.fixture(autouse=True)
def default_collector() -> Iterator[None]:
    """Every test starts from the interpreter's defaults and leaves them behind."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    gc.unfreeze()
    # Drivers of earlier tests in this process may still be counted (a scheduler a test never
    # shut down); these tests count only their own.
    GcTuning.leaders, GcTuning.applied_threshold, GcTuning.saved_threshold = 0, None, None
    yield
    leaders = GcTuning.leaders
    GcTuning.leaders, GcTuning.applied_threshold, GcTuning.saved_threshold = 0, None, None
    gc.set_threshold(*saved)
    assert leaders == 0, "a driver that stopped still counts as leading"


def idle_pool() -> cronoq.Pool:
    # No slot ever frees up for queued work, so the tasks stay live across the restart.
    return cronoq.Pool("default", noop, min=0, max=1, initial=0, autoscale=False)


async def test_threshold_raised_while_leading_and_restored_after() -> None:
    young = DriverOptions().gc_young_threshold
    assert young is not None and young > 700
    async with cronoq.Scheduler([idle_pool()], store=MemoryStore()):
        assert gc.get_threshold() == (young, 10, 10)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0  # nothing was recovered, nothing frozen


async def test_recovered_state_is_frozen_until_leadership_ends() -> None:
    state = MemoryState()
    async with cronoq.Scheduler([idle_pool()], store=MemoryStore(state=state)) as first:
        await first.submit_batch([cronoq.Task(i) for i in range(200)])
    assert gc.get_freeze_count() == 0
    async with cronoq.Scheduler([idle_pool()], store=MemoryStore(state=state)) as second:
        snapshot = await second.snapshot()
        assert snapshot.live_tasks == 200  # recovered, still waiting
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == (700, 10, 10)


async def test_the_last_leader_restores_and_a_later_change_is_kept() -> None:
    young = DriverOptions().gc_young_threshold
    first = cronoq.Scheduler([idle_pool()], store=MemoryStore())
    second = cronoq.Scheduler([idle_pool()], store=MemoryStore())
    await first.start()
    await second.start()
    await first.shutdown()
    assert gc.get_threshold() == (young, 10, 10)  # the second still leads
    gc.set_threshold(5000, 10, 10)  # the application's own choice, made meanwhile
    await second.shutdown()
    assert gc.get_threshold() == (5000, 10, 10)


async def test_a_less_eager_setting_is_left_alone() -> None:
    gc.set_threshold(1_000_000, 10, 10)
    async with cronoq.Scheduler([idle_pool()], store=MemoryStore()):
        assert gc.get_threshold() == (1_000_000, 10, 10)
    assert gc.get_threshold() == (1_000_000, 10, 10)
