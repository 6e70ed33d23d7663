"""The engine's mutable records: tasks, pools, worker groups, leases and schedules.

These are internal to the engine; the public views are built in ``views.py`` and ``snapshot.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from .autoscale import Autoscaler
from .config import PoolConfig
from .cron import CronSchedule
from .lanes import FifoLane, KeyedLane
from .reservations import ReservationBook
from .snapshot import TOTAL_NAMES
from .stats import LogLinearHistogram, MetricsWindow
from .types import CLASSES, EdgeCond, FixedStart, RecurringSpec, RetryPolicy, TaskSpec, TaskStatus

# Read once: an enum member looked up on its class runs Python code (and every task starts ready).
_READY: Final = TaskStatus.READY

# Where a non-running task currently sits (for removal and invariant checks).
NOWHERE: Final = 0
IN_FIFO: Final = 1
IN_EDF: Final = 2
IN_SFQ: Final = 3
IN_DUE: Final = 4
PARKED_RESOURCE: Final = 5
PARKED_LABELS: Final = 6
WAITING_HOLD: Final = 7

# Timer kinds of the engine's single timer heap.
T_START: Final = 0
T_HOLD: Final = 1
T_MISS: Final = 2
T_RETRY: Final = 3
T_TIMEOUT: Final = 4
T_LEASE: Final = 5
T_AWAIT: Final = 6
T_REFILL: Final = 7
T_SCALE: Final = 8
T_RECUR: Final = 9


def edge_satisfied(cond: EdgeCond, status: TaskStatus) -> bool:
    if cond is EdgeCond.ON_SUCCESS:
        return status is TaskStatus.SUCCEEDED
    if cond is EdgeCond.ON_FAILURE:
        return status is TaskStatus.FAILED or status is TaskStatus.DEAD_LETTERED
    return True


LabelKey = frozenset[tuple[str, str]]
NO_LABELS: Final[LabelKey] = frozenset()


class Task:
    """One task. Its id also orders submissions (ids grow in submission order): the lanes break
    ties by it."""

    __slots__ = (
        "attempt",
        "awaiting",
        "children",
        "cls",
        "deadline",
        "est",
        "finished_at",
        "fixed",
        "fixed_done",
        "guard",
        "has_output",
        "holding",
        "id",
        "key",
        "kind",
        "labels",
        "lease",
        "lst",
        "max_attempts",
        "message",
        "pool",
        "qgen",
        "ready_at",
        "retry",
        "retry_at",
        "sfq_tag",
        "spec",
        "started_at",
        "status",
        "submitted_at",
        "tags",
        "tenant",
        "unmet",
        "where",
        "woken",
    )

    def __init__(self, task_id: int, pool: Pool, spec: TaskSpec, now: int, retry: RetryPolicy) -> None:
        self.id = task_id
        self.pool = pool
        self.spec: TaskSpec | None = spec
        self.cls: int = int(spec.priority)
        self.key = spec.key
        self.kind = spec.kind
        self.tenant = spec.tenant
        self.tags = spec.tags
        self.status = _READY
        self.attempt = 0
        self.retry = retry
        self.max_attempts = retry.max_attempts
        self.submitted_at = now
        self.ready_at = now
        self.deadline = spec.deadline
        self.est = 0
        self.lst = 0
        self.fixed: FixedStart | None = spec.fixed_start
        self.fixed_done = False  # the fixed start was met, missed or no longer applies
        self.holding = False
        self.guard: int | None = None  # recurring Skip: skipped at its start if this task still runs
        self.unmet = 0
        self.awaiting: set[str] | None = None
        self.children: list[tuple[Task, EdgeCond]] | None = None
        self.labels: LabelKey = frozenset(spec.labels.items()) if spec.labels else NO_LABELS
        self.lease: LeaseState | None = None
        self.retry_at: int | None = None
        self.started_at: int | None = None
        self.finished_at: int | None = None
        self.message: str | None = None
        self.has_output = False
        self.qgen = 0
        self.sfq_tag = -1.0  # fair-share start tag, kept across retries and wake-ups
        self.where = NOWHERE
        self.woken = False  # re-queued by a resource wake-up: keeps its place if it parks again

    def __repr__(self) -> str:
        return f"<Task {self.id} {self.status.value} pool={self.pool.name} cls={self.cls}>"


class LeaseState:
    __slots__ = ("active", "expires_at", "group", "id", "started_at", "task")

    def __init__(self, lease_id: int, task: Task, group: Group, now: int, ttl: int | None) -> None:
        self.id = lease_id
        self.task = task
        self.group = group
        self.started_at = now
        self.expires_at = now + ttl if ttl is not None else None
        self.active = True


class Group:
    """Workers of a pool that carry exactly the same labels."""

    __slots__ = ("busy", "capacity", "key", "labels")

    def __init__(self, key: LabelKey) -> None:
        self.key = key
        self.labels: Mapping[str, str] = dict(key)
        self.capacity = 0
        self.busy = 0


class Pool:
    __slots__ = (
        "autoscaler",
        "bounded",
        "busy",
        "capacity",
        "completed",
        "config",
        "counts",
        "desired",
        "due",
        "due_live",
        "edf",
        "edf_live",
        "fifo",
        "finish_tags",
        "groups",
        "held",
        "hold_waiters",
        "index",
        "kind_durations",
        "kind_medians",
        "label_waiters",
        "last_worker_change",
        "name",
        "pending",
        "pending_by_class",
        "ready",
        "reservations",
        "run_median",
        "run_median_count",
        "sfq",
        "totals",
        "virtual_time",
        "window",
        "worker_ns",
    )

    def __init__(self, config: PoolConfig, index: int, window: int, now: int) -> None:
        self.config = config
        self.name = config.name
        self.index = index
        self.fifo: list[FifoLane[Task]] = [FifoLane() for _ in range(CLASSES)]
        self.edf: list[KeyedLane[Task]] = [KeyedLane() for _ in range(CLASSES)]
        self.sfq: list[KeyedLane[Task]] | None = (
            [KeyedLane() for _ in range(CLASSES)] if config.fairness is not None else None
        )
        self.virtual_time = [0.0] * CLASSES
        self.finish_tags: list[dict[str | None, float]] = [{} for _ in range(CLASSES)]
        self.due: KeyedLane[Task] = KeyedLane()
        self.due_live = 0
        self.edf_live = [0] * CLASSES
        self.label_waiters: dict[LabelKey, KeyedLane[Task]] = {}
        self.hold_waiters: KeyedLane[Task] = KeyedLane()
        # Tasks in the lanes (live entries), by class: the ones dispatch can see.
        self.ready = [0] * CLASSES
        self.pending_by_class = [0] * CLASSES
        self.pending = 0
        # counts[status_index][class] of non-terminal tasks, for snapshots and the autoscaler.
        self.counts = [[0] * CLASSES for _ in range(5)]
        unlabeled = Group(NO_LABELS)
        self.groups: dict[LabelKey, Group] = {NO_LABELS: unlabeled}
        initial = config.initial_workers
        if initial is None:
            initial = config.min_workers if config.autoscale is not None else config.max_workers
        unlabeled.capacity = initial
        self.capacity = initial
        self.busy = 0
        self.held = 0
        self.desired = initial
        self.reservations = ReservationBook(config.reservation_limit)
        self.window = MetricsWindow(window, 12, now)
        self.autoscaler: Autoscaler | None = (
            Autoscaler(config.autoscale, config.min_workers, config.max_workers, config.default_duration, initial, now)
            if config.autoscale is not None
            else None
        )
        self.kind_durations: dict[str, LogLinearHistogram] = {}
        self.kind_medians: dict[str, tuple[int, int]] = {}
        self.completed = 0  # attempts whose run time was recorded (sum over kind_durations)
        self.run_median = 0
        self.run_median_count = 0
        self.bounded = config.bounds.bounded
        self.worker_ns = 0
        self.last_worker_change = now
        # The pool's share of the engine's totals, so a pool-scoped reader sees only its own.
        self.totals: dict[str, int] = dict.fromkeys(TOTAL_NAMES, 0)

    def account_workers(self, now: int) -> None:
        """Add the worker time since the last change of capacity (for cost and worker-seconds)."""
        elapsed = now - self.last_worker_change
        if elapsed > 0:
            self.worker_ns += elapsed * self.capacity
            self.last_worker_change = now

    def due_tasks(self) -> list[Task]:
        """Live entries of the due queue (few: fixed-start work whose time has come)."""
        return self.due.live()

    def open_slots(self) -> int:
        """Idle slots, group by group: a group over its capacity (shrinking while its attempts
        finish) does not hide another group's idle slots."""
        groups = self.groups
        if len(groups) == 1:
            return self.capacity - self.busy
        return sum(g.capacity - g.busy for g in groups.values() if g.capacity > g.busy)

    @property
    def free(self) -> int:
        """Slots regular work may take now."""
        return self.open_slots() - self.held


# Row of Pool.counts per non-terminal status, keyed by the enum's value (a str: hashing an enum
# member goes through Python code, hashing its value does not).
STATUS_INDEX: Final[dict[str, int]] = {
    TaskStatus.BLOCKED.value: 0,
    TaskStatus.SCHEDULED.value: 1,
    TaskStatus.READY.value: 2,
    TaskStatus.RETRYING.value: 3,
    TaskStatus.RUNNING.value: 4,
}


class Schedule:
    __slots__ = ("cron", "invalid", "last_start", "last_task_id", "next_at", "paused", "retired", "spec", "timer_gen")

    def __init__(self, spec: RecurringSpec, cron: CronSchedule) -> None:
        self.spec = spec
        self.cron = cron
        self.next_at: int | None = None
        self.last_task_id: int | None = None
        self.last_start: int | None = None
        self.invalid = False
        self.paused = False
        self.retired = False  # removed or replaced: its timers no longer fire
        self.timer_gen = 0
