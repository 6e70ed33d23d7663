"""Consistency checks of the engine's bookkeeping, for tests and debugging (O(tasks))."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .state import IN_EDF, IN_FIFO, IN_SFQ, NOWHERE, STATUS_INDEX, Pool
from .types import CLASSES, TaskStatus

if TYPE_CHECKING:
    from .parts import Parts

_RUNNING = TaskStatus.RUNNING
_READY = TaskStatus.READY
_BLOCKED = TaskStatus.BLOCKED


def check_invariants(parts: Parts) -> None:
    """Raise AssertionError if the engine's bookkeeping is inconsistent."""
    registry = parts.registry
    outcomes = parts.outcomes
    pool_list = parts.pool_list
    pending = 0
    running = 0
    per_pool: dict[Pool, list[list[int]]] = {p: [[0] * CLASSES for _ in range(5)] for p in pool_list}
    ready: dict[Pool, list[int]] = {p: [0] * CLASSES for p in pool_list}
    holding: dict[Pool, int] = dict.fromkeys(pool_list, 0)
    busy: dict[Pool, int] = dict.fromkeys(pool_list, 0)
    for task in registry.tasks():
        status = task.status
        if task.key is not None and not status.terminal:
            assert registry.key_owner(task.key) == task.id, f"key of {task} not indexed"
        if status.terminal:
            assert task.lease is None and task.where == NOWHERE and not task.holding, f"{task} still queued"
            continue
        per_pool[task.pool][STATUS_INDEX[status._value_]][task.cls] += 1
        if task.holding:
            holding[task.pool] += 1
        if status is _RUNNING:
            running += 1
            lease = task.lease
            assert lease is not None and lease.active and outcomes.lease(lease.id) is lease, task
            assert task.attempt >= 1 and task.attempt <= task.max_attempts, task
            busy[task.pool] += 1
        else:
            pending += 1
            assert task.lease is None, task
        if task.where in (IN_FIFO, IN_EDF, IN_SFQ):
            ready[task.pool][task.cls] += 1
            assert status is _READY, task
        if status is _BLOCKED:
            assert task.unmet > 0 or task.awaiting, f"{task} blocked on nothing"
        else:
            assert task.unmet == 0 and not task.awaiting, f"{task} has unmet dependencies"
        if task.children:
            for child, _ in task.children:
                assert child.status is _BLOCKED or child.status.terminal, (
                    f"child {child} of unfinished {task} is not blocked"
                )
    assert pending == registry.pending, (pending, registry.pending)
    assert running == registry.running == outcomes.lease_count, (running, registry.running, outcomes.lease_count)
    for pool in pool_list:
        assert per_pool[pool] == pool.counts, (pool.name, per_pool[pool], pool.counts)
        assert ready[pool] == pool.ready, (pool.name, ready[pool], pool.ready)
        assert holding[pool] == pool.held >= 0, (pool.name, holding[pool], pool.held)
        assert busy[pool] == pool.busy, (pool.name, busy[pool], pool.busy)
        assert pool.pending == sum(pool.pending_by_class) == sum(sum(row) for row in pool.counts[:4])
        assert pool.capacity == sum(g.capacity for g in pool.groups.values())
        assert pool.busy == sum(g.busy for g in pool.groups.values())
    for name, total in registry.totals.items():
        share = sum(pool.totals[name] for pool in pool_list) + registry.departed.get(name, 0)
        # Stale reports for unknown leases, schedules of a vanished pool and the engine's own faults
        # (which the driver counts) belong to no pool.
        unattributed = name in ("stale_completions", "recurring_invalid", "engine_errors")
        assert share == total or (unattributed and share <= total), (name, share, total)
    for key, task_id in registry.key_owners():
        owner = registry.get(task_id)
        assert owner is not None and owner.key == key, key
    parts.resources.check_invariants()
