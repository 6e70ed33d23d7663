"""The status machine: the table of allowed moves, and the registry refusing any other move."""

from __future__ import annotations

import pytest
from cronoq.engine import CoreConfig, Dep, EngineFault, PoolConfig, TaskSpec, TaskStatus
from cronoq.engine.admission_control import AdmissionControl
from cronoq.engine.outbox import Outbox
from cronoq.engine.registry import Registry
from cronoq.engine.state import Pool, Task
from cronoq.engine.transitions import ALLOWED, allowed

from .sim import START, Sim

LIVE = [status for status in TaskStatus if not status.terminal]
TERMINAL = [status for status in TaskStatus if status.terminal]


def test_every_status_has_a_row_and_terminal_statuses_are_final() -> None:
    assert set(ALLOWED) == set(TaskStatus)
    for status in TERMINAL:
        assert ALLOWED[status] == frozenset()
    for status in LIVE:
        assert status not in ALLOWED[status], "staying put is not a move"


def test_only_an_attempt_succeeds_and_nothing_starts_but_a_ready_task() -> None:
    assert [s for s in LIVE if allowed(s, TaskStatus.SUCCEEDED)] == [TaskStatus.RUNNING]
    assert [s for s in LIVE if allowed(s, TaskStatus.RUNNING)] == [TaskStatus.READY]
    for end in (TaskStatus.SHED, TaskStatus.SKIPPED, TaskStatus.MISSED):
        assert not allowed(TaskStatus.RUNNING, end)


def _registry() -> tuple[Registry, Pool]:
    config = CoreConfig(pools=(PoolConfig("default", max_workers=1),))
    pool = Pool(config.pools[0], 0, config.metrics_window, START)
    registry = Registry(config)
    registry.bind(AdmissionControl(config, [pool], registry, Outbox(False, False)))
    return registry, pool


def _task(registry: Registry, pool: Pool, status: TaskStatus) -> Task:
    task = Task(registry.allocate_id(), pool, TaskSpec(), START, pool.config.retry)
    registry.add(task)
    registry.enter(task, status)
    return task


@pytest.mark.parametrize("old", LIVE)
@pytest.mark.parametrize("new", list(TaskStatus))
def test_the_registry_makes_exactly_the_allowed_moves(old: TaskStatus, new: TaskStatus) -> None:
    registry, pool = _registry()
    if old is TaskStatus.RUNNING:
        task = _task(registry, pool, TaskStatus.READY)
        registry.start(task)
    else:
        task = _task(registry, pool, old)
    if new is old:
        registry.move(task, new)  # no move at all
        assert task.status is old
        return
    change = registry.end if new.terminal else registry.move
    if allowed(old, new):
        change(task, new)
        assert task.status is new
        return
    with pytest.raises(EngineFault) as fault:
        change(task, new)
    assert fault.value.task_id == task.id and old.value in str(fault.value) and new.value in str(fault.value)
    assert task.status is old, "a refused move changes nothing"


def test_an_ended_task_stays_ended() -> None:
    registry, pool = _registry()
    task = _task(registry, pool, TaskStatus.READY)
    assert registry.end(task, TaskStatus.CANCELLED)
    assert not registry.end(task, TaskStatus.SHED)
    assert task.status is TaskStatus.CANCELLED
    with pytest.raises(EngineFault):
        registry.move(task, TaskStatus.READY)


def test_every_status_a_busy_engine_shows_was_reached_by_allowed_moves() -> None:
    # The engine checks each move as it makes it (an illegal one would raise here): a mixed run.
    sim = Sim.make(PoolConfig("default", max_workers=2, initial_workers=2))
    parent = sim.submit("parent", key="p")
    child = sim.submit("child", deps=(Dep("p"),))
    later = sim.submit("later")
    sim.fail(sim.lease_of(parent))
    sim.advance(60)  # the retry's backoff
    while sim.running:
        for lease in list(sim.running.values()):
            sim.complete(lease)
    assert sim.status(parent) == "succeeded" and sim.status(child) == "succeeded"
    assert sim.status(later) == "succeeded"
