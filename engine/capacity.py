"""Worker capacity: the slots each pool's worker groups report, and the autoscaler's decisions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from . import limits
from .actions import Scale
from .outbox import Outbox
from .state import T_SCALE, Group, LabelKey, Pool
from .timers import Timers
from .types import CLASSES, AdmissionError, InvalidRequest, SubmitCode

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .holds import Holds


class Capacity:
    def __init__(self, pools: Mapping[str, Pool], timers: Timers, outbox: Outbox) -> None:
        self._pools = pools
        self._timers = timers
        self._outbox = outbox

    def bind(self, dispatcher: Dispatcher, holds: Holds) -> None:
        self._dispatcher = dispatcher
        self._holds = holds

    def arm_autoscalers(self, pools: Sequence[Pool]) -> None:
        for pool in pools:
            if pool.autoscaler is not None:
                self._timers.push(pool.autoscaler.next_evaluation(), T_SCALE, pool, 0)

    def set_group_capacity(self, now: int, pool_name: str, labels: Mapping[str, str], capacity: int) -> None:
        pool = self._pools.get(pool_name)
        if pool is None:
            raise AdmissionError(SubmitCode.UNKNOWN_POOL, f"unknown pool {pool_name!r}")
        if not limits.is_int(capacity) or not 0 <= capacity <= limits.MAX_COUNT:
            raise InvalidRequest(f"capacity must be an integer between 0 and {limits.MAX_COUNT}, not {capacity!r}")
        key: LabelKey = frozenset(labels.items())
        group = pool.groups.get(key)
        if group is None:
            if capacity == 0:
                return
            group = pool.groups[key] = Group(key)
        pool.window.integrate(now, pool.busy, pool.capacity)
        pool.account_workers(now)
        pool.capacity += capacity - group.capacity
        group.capacity = capacity
        if group.capacity == 0 and group.busy == 0 and key:
            del pool.groups[key]
        if pool.autoscaler is None:
            pool.desired = pool.capacity
        if len(pool.hold_waiters):
            self._holds.grant(pool)
        if pool.label_waiters and group.capacity > group.busy:
            self._dispatcher.wake_label_waiters(pool, group)
        self._dispatcher.mark_dirty(pool)

    def on_scale_timer(self, pool: Pool, now: int) -> None:
        if self._pools.get(pool.name) is not pool:
            return  # the pool left this engine (handed to another shard): its evaluations end
        scaler = pool.autoscaler
        assert scaler is not None and pool.config.autoscale is not None
        counts = pool.counts
        backlog = [counts[2][cls] + counts[3][cls] for cls in range(CLASSES)]
        # Fixed-start tasks that are due count as critical backlog.
        for task in pool.due_tasks():
            if task.cls:
                backlog[task.cls] -= 1
                backlog[0] += 1
        horizon = pool.config.autoscale.reservation_horizon
        reserved = pool.reservations.peak(now, now + horizon) if len(pool.reservations) else 0
        before = pool.desired
        desired = scaler.evaluate(now, backlog, pool.busy, reserved)
        pool.desired = desired
        if desired != before:
            self._outbox.scales.append(Scale(pool.name, desired))
        self._timers.push(scaler.next_evaluation(), T_SCALE, pool, 0)
