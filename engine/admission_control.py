"""Bounds on pending work: refusing (Full, Overloaded), choosing victims to shed, and telling
waiting submitters when a pool that was full has room again.

It keeps its own index of the tasks it may shed (pending, not fixed-start, per pool and class)
and learns of every task that starts or stops pending from the ``Registry``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .config import CoreConfig
from .outbox import Outbox
from .state import Pool, Task
from .types import CLASSES, AdmissionError, OverflowPolicy, SubmitCode, TaskSpec

if TYPE_CHECKING:
    from .registry import Registry


class AdmissionControl:
    """Pool and global bounds of one engine."""

    def __init__(self, config: CoreConfig, pools: Sequence[Pool], registry: Registry, outbox: Outbox) -> None:
        self._global = config.global_bounds
        self.global_bounded = config.global_bounds.bounded
        """Whether a bound spans the pools (without it, an unbounded pool admits without a check)."""
        self._pools = list(pools)
        self._registry = registry
        self._outbox = outbox
        self._full_pools: set[str] = set()
        self._full_global = False
        self._shed_index: dict[Pool, list[OrderedDict[int, Task]]] = {
            pool: [OrderedDict() for _ in range(CLASSES)]
            for pool in self._pools
            if pool.config.overflow in (OverflowPolicy.SHED_LOWEST, OverflowPolicy.SHED_OLDEST)
        }
        self.watching = bool(self._shed_index)
        """Whether the registry must report tasks that start or stop pending (a pool may shed,
        or a submitter waits for room): without either, admission needs no reports at all."""

    def add_pool(self, pool: Pool) -> None:
        """A pool joins the engine (handed over from another shard)."""
        self._pools.append(pool)
        if pool.config.overflow in (OverflowPolicy.SHED_LOWEST, OverflowPolicy.SHED_OLDEST):
            self._shed_index[pool] = [OrderedDict() for _ in range(CLASSES)]
        self.watching = bool(self._shed_index or self._full_pools)

    def drop_pool(self, pool: Pool) -> None:
        """A pool leaves the engine (handed over to another shard) with its pending tasks."""
        self._pools.remove(pool)
        self._shed_index.pop(pool, None)
        self._full_pools.discard(pool.name)
        self.watching = bool(self._shed_index or self._full_pools)

    # What the registry reports ------------------------------------------------------------------

    def entered_pending(self, task: Task) -> None:
        if self._shed_index and task.fixed is None:
            shed = self._shed_index.get(task.pool)
            if shed is not None:
                shed[task.cls][task.id] = task

    def left_pending(self, task: Task) -> None:
        if self._shed_index:
            shed = self._shed_index.get(task.pool)
            if shed is not None:
                shed[task.cls].pop(task.id, None)
        if self._full_pools or self._full_global:
            self._space_freed(task.pool)

    def _space_freed(self, pool: Pool) -> None:
        if pool.name in self._full_pools:
            self._full_pools.discard(pool.name)
            self._outbox.space.append(pool.name)
        if self._full_global:
            self._full_global = False
            self._outbox.space.append(None)
        self.watching = bool(self._shed_index or self._full_pools)

    def _mark_full(self, pool: Pool) -> None:
        self._full_pools.add(pool.name)
        if self.global_bounded:
            self._full_global = True
        self.watching = True

    # Admission ----------------------------------------------------------------------------------

    def admit(self, pool: Pool, spec: TaskSpec, spare: Iterable[int]) -> Task | None:
        """Check the bounds for one more task of ``spec`` in ``pool``: None when it fits, else a
        victim to shed first; raises Full or Overloaded. ``spare`` are the submission's parents."""
        if not pool.bounded and not self.global_bounded:
            return None
        cls = int(spec.priority)
        total, own_class = self._violated(pool, cls)
        gb_class = self._global.per_class[cls]
        if gb_class is not None and self._class_pending(cls) + 1 > gb_class:
            own_class = True
        if not total and not own_class:
            return None
        policy = pool.config.overflow
        if policy is OverflowPolicy.WAIT:
            self._mark_full(pool)
            raise AdmissionError(SubmitCode.FULL, f"pool {pool.name!r} is full; retry when space is available")
        if policy is OverflowPolicy.REJECT:
            raise AdmissionError(SubmitCode.OVERLOADED, f"pool {pool.name!r} is overloaded")
        victim = self._find_victim(pool, cls, policy, own_class, frozenset(spare))
        if victim is None:
            raise AdmissionError(SubmitCode.OVERLOADED, f"pool {pool.name!r} is overloaded and nothing can be shed")
        return victim

    def admit_batch(self, specs: Sequence[TaskSpec], pools: Sequence[Pool], duplicate_of: Sequence[int | None]) -> None:
        """Check the bounds for every new task of a batch at once (a batch never sheds)."""
        per_pool: dict[Pool, list[int]] = {}
        for index, spec in enumerate(specs):
            if duplicate_of[index] is None:
                per_pool.setdefault(pools[index], [0] * CLASSES)[int(spec.priority)] += 1
        new_total = sum(sum(counts) for counts in per_pool.values())
        gb = self._global
        engine_pending = self._registry.pending
        for pool, counts in per_pool.items():
            violated = False
            bounds = pool.config.bounds
            if bounds.max_pending is not None and pool.pending + sum(counts) > bounds.max_pending:
                violated = True
            for cls in range(CLASSES):
                bound = bounds.per_class[cls]
                if counts[cls] and bound is not None and pool.pending_by_class[cls] + counts[cls] > bound:
                    violated = True
                gbound = gb.per_class[cls]
                if counts[cls] and gbound is not None and self._class_pending(cls) + counts[cls] > gbound:
                    violated = True
            if gb.max_pending is not None and engine_pending + new_total > gb.max_pending:
                violated = True
            if violated:
                index = next(i for i, p in enumerate(pools) if p is pool and duplicate_of[i] is None)
                if pool.config.overflow is OverflowPolicy.WAIT:
                    self._mark_full(pool)
                    raise AdmissionError(
                        SubmitCode.FULL, f"pool {pool.name!r} is full; retry when space is available", index
                    )
                raise AdmissionError(SubmitCode.OVERLOADED, f"pool {pool.name!r} cannot take the batch", index)

    def _violated(self, pool: Pool, cls: int) -> tuple[bool, bool]:
        """(a total bound is exceeded, a bound on this class is exceeded) after adding one task."""
        total = False
        own_class = False
        bounds = pool.config.bounds
        if bounds.max_pending is not None and pool.pending + 1 > bounds.max_pending:
            total = True
        bound = bounds.per_class[cls]
        if bound is not None and pool.pending_by_class[cls] + 1 > bound:
            own_class = True
        gb = self._global
        if gb.max_pending is not None and self._registry.pending + 1 > gb.max_pending:
            total = True
        return total, own_class

    def _class_pending(self, cls: int) -> int:
        return sum(pool.pending_by_class[cls] for pool in self._pools)

    def _find_victim(
        self, pool: Pool, cls: int, policy: OverflowPolicy, own_class: bool, spare: frozenset[int]
    ) -> Task | None:
        """A pending task whose eviction makes room for a task of class ``cls``, or None.

        ShedLowest evicts the newest pending task of the lowest class strictly below ``cls``;
        ShedOldest evicts the oldest pending Low task. A bound on the incoming task's own class is
        only relieved by a victim of that class. ``spare`` are the submission's own parents.
        """
        index = self._shed_index.get(pool)
        if index is None:
            return None
        low = CLASSES - 1
        if policy is OverflowPolicy.SHED_LOWEST:
            if own_class:
                return None  # evicting another class never relieves a bound on this class
            for victim_cls in range(low, cls, -1):
                victim = _first(reversed(index[victim_cls].values()), spare)
                if victim is not None:
                    return victim
            return None
        if own_class and cls != low:
            return None
        return _first(iter(index[low].values()), spare)


def _first(tasks: Iterable[Task], spare: frozenset[int]) -> Task | None:
    for task in tasks:
        if task.id not in spare:
            return task
    return None
