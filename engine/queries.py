"""Reads: a task's view, listings in id order, and snapshots of the pools."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Final

from . import metrics
from .listing import merged
from .registry import Registry
from .snapshot import Snapshot
from .state import Pool, Task
from .types import TERMINAL_VALUES, Priority, TaskRef, TaskStatus
from .views import TaskInfo, TaskQuery

_PRIORITIES: Final = (Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW)


class Queries:
    def __init__(self, pools: Sequence[Pool], registry: Registry) -> None:
        self._pools = pools
        self._registry = registry

    def get(self, ref: TaskRef) -> TaskInfo | None:
        task = self._registry.lookup(ref)
        return None if task is None else info(task)

    def ended(self, task_id: int) -> tuple[TaskStatus, str | None] | None:
        """(status, message) of a task that reached a terminal status; None if live or unknown."""
        task = self._registry.get(task_id)
        if task is None or task.status._value_ not in TERMINAL_VALUES:
            return None
        return task.status, task.message

    def list_tasks(
        self,
        pools: Iterable[str] | None,
        statuses: Iterable[TaskStatus] | None,
        after: int,
        limit: int,
        query: TaskQuery | None,
        descending: bool,
    ) -> list[TaskInfo]:
        """See ``Core.list_tasks``."""
        query = query or TaskQuery()
        if pools:
            wanted = frozenset(pools)
            query = replace(query, pools=query.pools & wanted if query.pools else wanted)
        if statuses:
            query = replace(query, statuses=frozenset(statuses))
        out: list[TaskInfo] = []
        if limit <= 0:
            return out
        indexes = self._registry.pool_indexes(query.pools if query.pools else None)
        for task in self._registry.walk(merged(indexes, after, descending)):
            if not query.matches(task.pool.name, task.status, task.kind, task.tenant, task.key, task.submitted_at):
                continue
            out.append(info(task))
            if len(out) >= limit:
                break
        return out

    def snapshot(self, now: int) -> Snapshot:
        registry = self._registry
        pools = [metrics.pool_snapshot(pool, now) for pool in self._pools]
        return Snapshot(pools, registry.pending + registry.running, registry.running, registry.pending,
                        dict(registry.totals))  # fmt: skip


def info(task: Task) -> TaskInfo:
    """The public view of a task."""
    fixed = task.fixed
    return TaskInfo(
        task.id,
        task.pool.name,
        task.key,
        task.kind,
        task.status,
        task.attempt,
        task.max_attempts,
        _PRIORITIES[task.cls],
        task.tenant,
        task.submitted_at,
        task.started_at,
        task.finished_at,
        task.message,
        task.has_output,
        task.tags,
        task.deadline,
        fixed.start if fixed is not None else None,
    )
