"""Every task the engine knows, by id and key, and the counters of their statuses.

The registry is the one place a task's status changes (``enter``, ``move``, ``end``): each change
is checked against the status machine (``transitions``) and keeps the pool's and the engine's
counters right. Admission control hears of every task that starts or stops pending.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Final

from . import transitions
from .config import CoreConfig
from .ids import IdAllocator
from .listing import IdIndex
from .snapshot import TOTAL_NAMES
from .state import STATUS_INDEX, Pool, Task
from .types import TERMINAL_VALUES, TaskRef, TaskStatus

if TYPE_CHECKING:
    from .admission_control import AdmissionControl

_READY: Final = TaskStatus.READY
_RUNNING: Final = TaskStatus.RUNNING
_ALLOWED: Final = transitions.BY_VALUE
_READY_ROW: Final = STATUS_INDEX[TaskStatus.READY.value]
_RUNNING_ROW: Final = STATUS_INDEX[TaskStatus.RUNNING.value]


class Registry:
    """Tasks by id and key, ids in order per pool (for listings), and status counters."""

    def __init__(self, config: CoreConfig) -> None:
        self.totals: dict[str, int] = dict.fromkeys(TOTAL_NAMES, 0)
        """Engine-wide counters (each pool keeps its share in ``Pool.totals``)."""
        self.departed: dict[str, int] = dict.fromkeys(TOTAL_NAMES, 0)
        """The shares of pools that left this engine for another shard (the engine-wide counters
        never go back, so they keep what those pools counted here)."""
        self._ids = IdAllocator(config.id_epoch, config.id_shard)
        self.allocate_id: Callable[[], int] = self._ids.allocate
        """A new task id (ids only grow)."""
        self._tasks: dict[int, Task] = {}
        self._keys: dict[str, int] = {}
        self._by_pool: dict[str, IdIndex] = {}
        self._pending = 0
        self._running = 0
        self._admission: AdmissionControl | None = None

    def bind(self, admission: AdmissionControl) -> None:
        self._admission = admission

    # Ids and lookups ----------------------------------------------------------------------------

    @property
    def last_id(self) -> int:
        """The latest task id handed out."""
        return self._ids.high_water

    def raise_id_floor(self, high_water: int) -> None:
        self._ids.raise_floor(high_water)

    def get(self, task_id: int) -> Task | None:
        return self._tasks.get(task_id)

    def lookup(self, ref: TaskRef) -> Task | None:
        """The task of an id or a key (None if unknown)."""
        if isinstance(ref, str):
            task_id = self._keys.get(ref)
            return None if task_id is None else self._tasks.get(task_id)
        return self._tasks.get(ref)

    def key_owner(self, key: str) -> int | None:
        return self._keys.get(key)

    def key_owners(self) -> Iterable[tuple[str, int]]:
        return self._keys.items()

    def tasks(self) -> Collection[Task]:
        return self._tasks.values()

    @property
    def empty(self) -> bool:
        return not self._tasks

    def pool_indexes(self, names: Iterable[str] | None) -> list[IdIndex]:
        """The id indexes of the pools named (None: every pool that ever had a task)."""
        by_pool = self._by_pool
        if names is None:
            return list(by_pool.values())
        return [by_pool[name] for name in names if name in by_pool]

    def walk(self, ids: Iterator[int]) -> Iterator[Task]:
        """The known tasks of ``ids``, skipping ids of tasks no longer kept."""
        tasks = self._tasks
        for task_id in ids:
            task = tasks.get(task_id)
            if task is not None:
                yield task

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def running(self) -> int:
        return self._running

    # Membership ---------------------------------------------------------------------------------

    def add(self, task: Task) -> None:
        """Make ``task`` known by id and key (its status is accounted by ``enter``, if live)."""
        task_id = task.id
        self._tasks[task_id] = task
        name = task.pool.name
        index = self._by_pool.get(name)
        if index is None:
            index = self._by_pool[name] = IdIndex()
        ids = index.ids
        if ids and task_id < ids[-1]:
            index.add(task_id)  # out of order: inserted in place
        else:
            ids.append(task_id)
        if task.key is not None:
            self._keys[task.key] = task.id

    def forget(self, task: Task) -> None:
        """A terminal task leaves the retention window: its id and key are free again."""
        if self._tasks.pop(task.id, None) is not None:
            self._by_pool[task.pool.name].removed(self._tasks)
        if task.key is not None and self._keys.get(task.key) == task.id:
            del self._keys[task.key]

    def drop_pool(self, pool: Pool) -> list[Task]:
        """Let go of every task of ``pool`` (the pool leaves this engine for another shard, which
        now holds its rows): their ids and keys are unknown here afterwards, and the live ones no
        longer count as pending. None may be running (the pool was drained first)."""
        for name, count in pool.totals.items():
            self.departed[name] = self.departed.get(name, 0) + count
        index = self._by_pool.pop(pool.name, None)
        if index is None:
            return []
        dropped = [task for task in self.walk(iter(index.ids)) if task.pool is pool]
        for task in dropped:
            if task.status is _RUNNING:
                raise ValueError(f"task {task.id} of pool {pool.name!r} is running")
            del self._tasks[task.id]
            if task.key is not None and self._keys.get(task.key) == task.id:
                del self._keys[task.key]
            if task.status._value_ not in TERMINAL_VALUES:
                self._pending -= 1
        return dropped

    def claim_key(self, key: str, task_id: int) -> None:
        """Make ``key`` name the known task ``task_id`` again (after an adopted task took it)."""
        if task_id in self._tasks:
            self._keys[key] = task_id

    def count(self, name: str, pool: Pool) -> None:
        """One more of the event ``name`` for the engine and for ``pool``."""
        self.totals[name] += 1
        pool.totals[name] += 1

    # Statuses -----------------------------------------------------------------------------------

    def enter(self, task: Task, status: TaskStatus) -> None:
        """A new (or recovered) live task takes its first status, pending."""
        task.status = status
        pool = task.pool
        cls = task.cls
        pool.counts[STATUS_INDEX[status._value_]][cls] += 1
        pool.pending += 1
        pool.pending_by_class[cls] += 1
        self._pending += 1
        admission = self._admission
        assert admission is not None
        if admission.watching:
            admission.entered_pending(task)

    def move(self, task: Task, status: TaskStatus) -> None:
        """Change between live statuses (to the same status: nothing)."""
        old = task.status
        if old is status:
            return
        transitions.check(task.id, old, status)
        pool = task.pool
        cls = task.cls
        counts = pool.counts
        counts[STATUS_INDEX[old._value_]][cls] -= 1
        counts[STATUS_INDEX[status._value_]][cls] += 1
        task.status = status
        admission = self._admission
        assert admission is not None
        if old is _RUNNING:
            pool.pending += 1
            pool.pending_by_class[cls] += 1
            self._pending += 1
            self._running -= 1
            if admission.watching:
                admission.entered_pending(task)
        elif status is _RUNNING:
            pool.pending -= 1
            pool.pending_by_class[cls] -= 1
            self._pending -= 1
            self._running += 1
            if admission.watching:
                admission.left_pending(task)

    def start(self, task: Task) -> None:
        """A ready task starts running (the one move dispatch makes, so it has its own path)."""
        old = task.status
        if old is not _READY:
            transitions.check(task.id, old, _RUNNING)  # only Ready may start: this raises
        pool = task.pool
        cls = task.cls
        counts = pool.counts
        counts[_READY_ROW][cls] -= 1
        counts[_RUNNING_ROW][cls] += 1
        task.status = _RUNNING
        pool.pending -= 1
        pool.pending_by_class[cls] -= 1
        self._pending -= 1
        self._running += 1
        admission = self._admission
        assert admission is not None
        if admission.watching:
            admission.left_pending(task)

    def end(self, task: Task, status: TaskStatus) -> bool:
        """A live task takes a terminal status; False (and nothing changes) if it had one."""
        old = task.status
        if old._value_ in TERMINAL_VALUES:
            return False
        if status._value_ not in _ALLOWED[old._value_]:
            transitions.check(task.id, old, status)  # raises
        pool = task.pool
        cls = task.cls
        pool.counts[STATUS_INDEX[old._value_]][cls] -= 1
        if old is _RUNNING:
            self._running -= 1
        else:
            pool.pending -= 1
            pool.pending_by_class[cls] -= 1
            self._pending -= 1
            admission = self._admission
            assert admission is not None
            if admission.watching:
                admission.left_pending(task)
        task.status = status
        name = status._value_
        self.totals[name] += 1
        pool.totals[name] += 1
        return True
