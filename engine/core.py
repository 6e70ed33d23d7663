"""The scheduling core: a deterministic state machine with no I/O and no clock.

Every call takes ``now`` (int ns since the Unix epoch). Mutating calls only change state and mark
work to do; ``tick(now)`` fires due timers and dispatches. ``drain()`` hands the driver what to do
next as one ``StepOutput``: the step's mutations to commit (when persisting), then dispatches,
aborts, events, resolutions and scale requests.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Final

from . import admission, invariants, limits, metrics, recovery, recurring
from .actions import (
    Abort,
    AbortReason,
    Dispatch,
    PutTask,
    Recovered,
    Resolve,
    Scale,
    SetStatus,
    StatusEvent,
    StepOutput,
    TaskRecord,
)
from .config import CoreConfig, PoolConfig, UnknownDependencyPolicy
from .ids import IdAllocator
from .limits import MAX_DURATION, add_ns
from .listing import IdIndex, merged
from .resources import ResourceTable
from .snapshot import TOTAL_NAMES, Snapshot
from .state import (
    IN_DUE,
    IN_EDF,
    IN_FIFO,
    IN_SFQ,
    NO_LABELS,
    NOWHERE,
    PARKED_LABELS,
    PARKED_RESOURCE,
    STATUS_INDEX,
    WAITING_HOLD,
    Group,
    LabelKey,
    LeaseState,
    Pool,
    Schedule,
    Task,
)
from .state import (
    T_AWAIT as _T_AWAIT,
)
from .state import (
    T_HOLD as _T_HOLD,
)
from .state import (
    T_LEASE as _T_LEASE,
)
from .state import (
    T_MISS as _T_MISS,
)
from .state import (
    T_RECUR as _T_RECUR,
)
from .state import (
    T_REFILL as _T_REFILL,
)
from .state import (
    T_RETRY as _T_RETRY,
)
from .state import (
    T_SCALE as _T_SCALE,
)
from .state import (
    T_START as _T_START,
)
from .state import (
    T_TIMEOUT as _T_TIMEOUT,
)
from .state import (
    edge_satisfied as _edge_satisfied,
)
from .stats import LogLinearHistogram, WindowBucket
from .types import (
    CLASSES,
    NS_PER_S,
    TERMINAL_VALUES,
    AdmissionError,
    CancelledByExecutor,
    EdgeCond,
    EngineFault,
    Failure,
    FixedStart,
    InvalidRequest,
    MissPolicy,
    Outcome,
    OverflowPolicy,
    RecurringSpec,
    SubmitCode,
    Success,
    TaskRef,
    TaskSpec,
    TaskStatus,
    UnknownTask,
)
from .views import RecurringInfo, Submitted, TaskInfo, TaskQuery

_SUCCEEDED: Final = TaskStatus.SUCCEEDED
_FAILED: Final = TaskStatus.FAILED
_DEAD: Final = TaskStatus.DEAD_LETTERED
_CANCELLED: Final = TaskStatus.CANCELLED
_SKIPPED: Final = TaskStatus.SKIPPED
_MISSED: Final = TaskStatus.MISSED
_SHED: Final = TaskStatus.SHED
_READY: Final = TaskStatus.READY
_RUNNING: Final = TaskStatus.RUNNING
_RETRYING: Final = TaskStatus.RETRYING
_BLOCKED: Final = TaskStatus.BLOCKED
_SCHEDULED: Final = TaskStatus.SCHEDULED

# How soon to look at token-bucket waiters again when one looked wakeable but was not woken.
_REFILL_RETRY: Final = 1_000_000

# A holding fixed-start task sorts ahead of every due task that still needs a free slot.
_HOLDING_KEY: Final = -1.0

_ResolvedDep = tuple["Task | None", str | None, EdgeCond]


class Core:
    """One shard's (or one embedded scheduler's) engine."""

    def __init__(self, config: CoreConfig, *, now: int = 0) -> None:
        config.validate()
        self.config = config
        self._persist = config.persist
        self._emit_transitions = config.emit_transitions
        pc = config.priority
        self._base = pc.base
        self._aging = tuple(rate / NS_PER_S for rate in pc.aging_rate)
        self._age_cap = pc.age_cap
        uc = config.urgency
        self._u_max = uc.max
        self._u_window = uc.window
        self._u_rate = uc.overdue_rate / NS_PER_S
        self._u_cap = uc.overdue_cap
        # The highest score a task of each class can reach, without and with deadline urgency.
        self._plain_max = tuple(pc.base[c] + pc.age_cap[c] for c in range(CLASSES))
        self._urgent_max = uc.max + uc.overdue_cap
        self._pools: dict[str, Pool] = {}
        for index, pool_config in enumerate(config.pools):
            self._pools[pool_config.name] = Pool(pool_config, index, config.metrics_window, now)
        self._pool_list = list(self._pools.values())
        default = self._pools.get("default")
        self._default_pool = default if default is not None else self._pool_list[0]
        self._resources = ResourceTable(config.resources, now)
        self._has_resources = bool(config.resources)
        self._ids = IdAllocator(config.id_epoch, config.id_shard)
        self._lease_ids = IdAllocator(config.id_epoch, config.id_shard)
        self._rng = random.Random(config.seed)
        self._tasks: dict[int, Task] = {}
        self._keys: dict[str, int] = {}
        self._retained: deque[Task] = deque()
        self._by_pool: dict[str, IdIndex] = {}  # listings walk these (see listing.py)
        self._awaiting: dict[str, list[tuple[Task, EdgeCond]]] = {}
        self._leases: dict[int, LeaseState] = {}
        self._schedules: dict[str, Schedule] = {}
        self._timers: list[tuple[int, int, int, object, int]] = []
        self._timer_seq = 0
        self._out = StepOutput()
        self._dirty: set[Pool] = set()
        self._propagation: list[Task] = []
        self._propagating = False
        self._pending = 0
        self._running = 0
        self._full_pools: set[str] = set()
        self._full_global = False
        self._shed_index: dict[Pool, list[OrderedDict[int, Task]]] = {
            pool: [OrderedDict() for _ in range(CLASSES)]
            for pool in self._pool_list
            if pool.config.overflow in (OverflowPolicy.SHED_LOWEST, OverflowPolicy.SHED_OLDEST)
        }
        self.totals: dict[str, int] = dict.fromkeys(TOTAL_NAMES, 0)
        self.dispatch_enabled = True
        self._global_bounded = config.global_bounds.bounded
        self._refill_timer_at: int | None = None
        for pool in self._pool_list:
            if pool.autoscaler is not None:
                self._push_timer(pool.autoscaler.next_evaluation(), _T_SCALE, pool, 0)

    # ------------------------------------------------------------------------------------------
    # Properties

    @property
    def pools(self) -> list[str]:
        return [pool.name for pool in self._pool_list]

    @property
    def default_pool(self) -> str:
        return self._default_pool.name

    def pool_config(self, name: str) -> PoolConfig:
        return self._pools[name].config

    @property
    def live_tasks(self) -> int:
        return self._pending + self._running

    @property
    def emit_transitions(self) -> bool:
        """Publish every intermediate transition (terminal ones are always resolved)."""
        return self._emit_transitions

    @emit_transitions.setter
    def emit_transitions(self, enabled: bool) -> None:
        self._emit_transitions = enabled

    @property
    def running(self) -> int:
        return self._running

    @property
    def last_id(self) -> int:
        """The latest task id handed out (ids only grow): the tasks a call created have the ids
        above the value read before it."""
        return self._ids.high_water

    def active_leases(self) -> list[tuple[int, int]]:
        """(lease id, task id) of every running attempt."""
        return [(lease_id, state.task.id) for lease_id, state in self._leases.items()]

    # ------------------------------------------------------------------------------------------
    # Submission

    def submit(self, now: int, spec: TaskSpec) -> Submitted:
        """Admit one task, or raise AdmissionError. A known key returns the existing task."""
        pool = self._pool_for(spec)
        key = spec.key
        if key is not None:
            existing = self._keys.get(key)
            if existing is not None:
                admission.check_spec(spec, self._resources)
                return Submitted(existing, True)
        admission.check_spec(spec, self._resources)
        resolved = self._resolve_deps(pool, spec) if spec.deps else None
        if key is not None and resolved is not None:
            self._check_cycle_single(key, resolved)
        fixed = spec.fixed_start
        interval = None
        if fixed is not None:
            interval = self._reservation_interval(pool, spec, fixed)
            if not pool.reservations.fits(*interval):
                raise AdmissionError(
                    SubmitCode.RESERVATION_CONFLICT,
                    f"pool {pool.name!r} has no reservable capacity left for that start time",
                )
        self._admit_bounds(pool, spec, now, resolved)
        task = self._create(now, pool, spec, resolved, interval)
        return Submitted(task.id, False)

    def submit_batch(self, now: int, specs: Sequence[TaskSpec]) -> list[Submitted]:
        """Admit every task or none; errors name the offending index."""
        count = len(specs)
        pools: list[Pool] = []
        batch_keys: dict[str, int] = {}
        duplicate_of: list[int | None] = [None] * count
        # Whether any spec has dependencies or a fixed start: a batch without either (the bulk of
        # submissions) skips the passes that resolve, order and reserve for them.
        linked = fixed_any = False
        for index, spec in enumerate(specs):
            try:
                pools.append(self._pool_for(spec))
                admission.check_spec(spec, self._resources)
            except AdmissionError as err:
                raise err.at(index) from None
            if spec.deps:
                linked = True
            if spec.fixed_start is not None:
                fixed_any = True
            key = spec.key
            if key is not None:
                if key in batch_keys:
                    raise AdmissionError(
                        SubmitCode.DUPLICATE_KEY_IN_BATCH, f"key {key!r} appears twice in the batch", index
                    )
                batch_keys[key] = index
                existing = self._keys.get(key)
                if existing is not None:
                    duplicate_of[index] = existing
        if not linked and not fixed_any:
            return self._submit_plain_batch(now, specs, pools, duplicate_of)
        # Resolve dependencies; references to keys defined in the batch point at batch indexes.
        resolved: list[list[tuple[Task | None, int | None, str | None, EdgeCond]] | None] = [None] * count
        for index, spec in enumerate(specs):
            if duplicate_of[index] is not None or not spec.deps:
                continue
            entries: list[tuple[Task | None, int | None, str | None, EdgeCond]] = []
            for dep in spec.deps:
                target = dep.target
                if isinstance(target, str) and target in batch_keys:
                    parent_index = batch_keys[target]
                    if parent_index == index:
                        raise AdmissionError(SubmitCode.CYCLE, f"task depends on its own key {target!r}", index)
                    dup = duplicate_of[parent_index]
                    if dup is not None:
                        entries.append((self._tasks.get(dup), None, None, dep.cond))
                    else:
                        entries.append((None, parent_index, None, dep.cond))
                    continue
                try:
                    parent, awaited = self._resolve_one(pools[index], target, spec.key)
                except AdmissionError as err:
                    raise err.at(index) from None
                entries.append((parent, None, awaited, dep.cond))
            resolved[index] = entries
        self._check_cycle_batch(specs, batch_keys, duplicate_of, resolved)
        # Reservations, checked cumulatively and rolled back on failure.
        intervals: list[tuple[int, int] | None] = [None] * count
        added: list[tuple[Pool, int]] = []
        try:
            for index, spec in enumerate(specs):
                fixed = spec.fixed_start
                if fixed is None or duplicate_of[index] is not None:
                    continue
                pool = pools[index]
                interval = self._reservation_interval(pool, spec, fixed)
                if not pool.reservations.fits(*interval):
                    raise AdmissionError(
                        SubmitCode.RESERVATION_CONFLICT,
                        f"pool {pool.name!r} has no reservable capacity left for that start time",
                        index,
                    )
                placeholder = -(index + 1)
                pool.reservations.add(placeholder, *interval)
                added.append((pool, placeholder))
                intervals[index] = interval
        finally:
            for pool, placeholder in added:
                pool.reservations.remove(placeholder)
        self._admit_batch_bounds(specs, pools, duplicate_of, now)
        # Everything checked: create the tasks in order, parents before the children that name them.
        created: list[Task | None] = [None] * count
        results: list[Submitted] = []
        for index in self._batch_order(count, resolved):
            dup = duplicate_of[index]
            if dup is not None:
                continue
            deps: list[_ResolvedDep] | None = None
            batch_deps = resolved[index]
            if batch_deps is not None:
                deps = []
                for known, source, awaited, cond in batch_deps:
                    deps.append((created[source] if source is not None else known, awaited, cond))
            created[index] = self._create(now, pools[index], specs[index], deps, intervals[index])
        for index in range(count):
            dup = duplicate_of[index]
            if dup is not None:
                results.append(Submitted(dup, True))
            else:
                task = created[index]
                assert task is not None
                results.append(Submitted(task.id, False))
        return results

    def _submit_plain_batch(
        self, now: int, specs: Sequence[TaskSpec], pools: list[Pool], duplicate_of: list[int | None]
    ) -> list[Submitted]:
        """The rest of ``submit_batch`` for a checked batch without dependencies or fixed starts:
        no cycle to look for, no reservation to make, and the tasks are created in batch order."""
        self._admit_batch_bounds(specs, pools, duplicate_of, now)
        create = self._create
        results: list[Submitted] = []
        append = results.append
        for index, spec in enumerate(specs):
            dup = duplicate_of[index]
            if dup is not None:
                append(Submitted(dup, True))
            else:
                append(Submitted(create(now, pools[index], spec, None, None).id, False))
        return results

    def _batch_order(
        self, count: int, resolved: Sequence[Sequence[tuple[Task | None, int | None, str | None, EdgeCond]] | None]
    ) -> list[int]:
        """Indexes with in-batch parents after those parents (the batch is known to be acyclic)."""
        order: list[int] = []
        state = [0] * count
        for root in range(count):
            if state[root]:
                continue
            stack: list[tuple[int, int]] = [(root, 0)]
            state[root] = 1
            while stack:
                node, position = stack[-1]
                entries = resolved[node] or ()
                if position < len(entries):
                    stack[-1] = (node, position + 1)
                    parent_index = entries[position][1]
                    if parent_index is not None and not state[parent_index]:
                        state[parent_index] = 1
                        stack.append((parent_index, 0))
                    continue
                stack.pop()
                order.append(node)
        return order

    def _pool_for(self, spec: TaskSpec) -> Pool:
        name = spec.pool
        if name is None:
            return self._default_pool
        pool = self._pools.get(name)
        if pool is None:
            raise AdmissionError(SubmitCode.UNKNOWN_POOL, f"unknown pool {name!r}")
        return pool

    def _resolve_deps(self, pool: Pool, spec: TaskSpec) -> list[_ResolvedDep]:
        resolved: list[_ResolvedDep] = []
        for dep in spec.deps:
            parent, awaited = self._resolve_one(pool, dep.target, spec.key)
            resolved.append((parent, awaited, dep.cond))
        return resolved

    def _resolve_one(self, pool: Pool, target: TaskRef, own_key: str | None) -> tuple[Task | None, str | None]:
        if isinstance(target, str):
            if target == own_key:
                raise AdmissionError(SubmitCode.CYCLE, f"task depends on its own key {target!r}")
            parent_id = self._keys.get(target)
            if parent_id is not None:
                return self._tasks[parent_id], None
            if pool.config.unknown_dependency is UnknownDependencyPolicy.AWAIT:
                return None, target
            raise AdmissionError(SubmitCode.UNKNOWN_DEPENDENCY, f"unknown dependency key {target!r}")
        parent = self._tasks.get(target)
        if parent is None:
            raise AdmissionError(SubmitCode.UNKNOWN_DEPENDENCY, f"unknown dependency id {target}")
        return parent, None

    # Cycles --------------------------------------------------------------------------------------

    def _awaiting_closure(self, key: str) -> set[int]:
        """Ids of live tasks awaiting ``key``, and of everything downstream of them."""
        seen: set[int] = set()
        stack = [child for child, _ in self._awaiting.get(key, ())]
        while stack:
            task = stack.pop()
            if task.id in seen or task.status.terminal:
                continue
            seen.add(task.id)
            if task.children:
                stack.extend(child for child, _ in task.children)
        return seen

    def _check_cycle_single(self, key: str, resolved: Sequence[_ResolvedDep]) -> None:
        if key not in self._awaiting:
            return
        downstream = self._awaiting_closure(key)
        for parent, _, _ in resolved:
            if parent is not None and parent.id in downstream:
                raise AdmissionError(
                    SubmitCode.CYCLE, f"the dependencies of {key!r} lead back to a task awaiting {key!r}"
                )

    def _check_cycle_batch(
        self,
        specs: Sequence[TaskSpec],
        batch_keys: Mapping[str, int],
        duplicate_of: Sequence[int | None],
        resolved: Sequence[Sequence[tuple[Task | None, int | None, str | None, EdgeCond]] | None],
    ) -> None:
        count = len(specs)
        children: list[list[int]] = [[] for _ in range(count)]
        for index, entries in enumerate(resolved):
            for _, parent_index, _, _ in entries or ():
                if parent_index is not None:
                    children[parent_index].append(index)
        # Tasks already waiting for a key the batch defines become children of that batch task.
        outside: dict[int, set[int]] = {}
        for key, index in batch_keys.items():
            if duplicate_of[index] is None and key in self._awaiting:
                outside[index] = self._awaiting_closure(key)
        if outside:
            for index, entries in enumerate(resolved):
                for parent, _, _, _ in entries or ():
                    if parent is None:
                        continue
                    for source, downstream in outside.items():
                        if parent.id in downstream:
                            children[source].append(index)
        colour = [0] * count
        for root in range(count):
            if colour[root]:
                continue
            stack: list[tuple[int, int]] = [(root, 0)]
            colour[root] = 1
            while stack:
                node, position = stack[-1]
                if position < len(children[node]):
                    stack[-1] = (node, position + 1)
                    child = children[node][position]
                    if colour[child] == 1:
                        raise AdmissionError(SubmitCode.CYCLE, "dependencies in the batch form a cycle", child)
                    if colour[child] == 0:
                        colour[child] = 1
                        stack.append((child, 0))
                    continue
                colour[node] = 2
                stack.pop()

    # Reservations and bounds -----------------------------------------------------------------------

    def _reservation_interval(self, pool: Pool, spec: TaskSpec, fixed: FixedStart) -> tuple[int, int]:
        estimate = self._estimate(pool, spec.kind, spec.duration_hint)
        return fixed.start - fixed.tolerance, fixed.start + estimate + fixed.tolerance + 1

    def _violated(self, pool: Pool, cls: int, extra_pool: int = 1, extra_class: int = 1) -> tuple[bool, bool]:
        """(a total bound is exceeded, a bound on this class is exceeded) after adding tasks."""
        total = False
        own_class = False
        bounds = pool.config.bounds
        if bounds.max_pending is not None and pool.pending + extra_pool > bounds.max_pending:
            total = True
        bound = bounds.per_class[cls]
        if bound is not None and pool.pending_by_class[cls] + extra_class > bound:
            own_class = True
        gb = self.config.global_bounds
        if gb.max_pending is not None and self._pending + extra_pool > gb.max_pending:
            total = True
        return total, own_class

    def _admit_bounds(self, pool: Pool, spec: TaskSpec, now: int, resolved: Sequence[_ResolvedDep] | None) -> None:
        if not pool.bounded and not self._global_bounded:
            return
        cls = int(spec.priority)
        total, own_class = self._violated(pool, cls)
        gb_class = self.config.global_bounds.per_class[cls]
        if gb_class is not None and self._class_pending(cls) + 1 > gb_class:
            own_class = True
        if not total and not own_class:
            return
        policy = pool.config.overflow
        if policy is OverflowPolicy.WAIT:
            self._mark_full(pool)
            raise AdmissionError(SubmitCode.FULL, f"pool {pool.name!r} is full; retry when space is available")
        if policy is OverflowPolicy.REJECT:
            raise AdmissionError(SubmitCode.OVERLOADED, f"pool {pool.name!r} is overloaded")
        spare = frozenset(parent.id for parent, _, _ in resolved if parent is not None) if resolved else frozenset()
        victim = self._find_victim(pool, cls, policy, own_class, spare)
        if victim is None:
            raise AdmissionError(SubmitCode.OVERLOADED, f"pool {pool.name!r} is overloaded and nothing can be shed")
        self._finish(victim, _SHED, now, f"shed to admit a {spec.priority.label} task")

    def _class_pending(self, cls: int) -> int:
        return sum(pool.pending_by_class[cls] for pool in self._pool_list)

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

    def _admit_batch_bounds(
        self, specs: Sequence[TaskSpec], pools: Sequence[Pool], duplicate_of: Sequence[int | None], now: int
    ) -> None:
        per_pool: dict[Pool, list[int]] = {}
        for index, spec in enumerate(specs):
            if duplicate_of[index] is None:
                per_pool.setdefault(pools[index], [0] * CLASSES)[int(spec.priority)] += 1
        new_total = sum(sum(counts) for counts in per_pool.values())
        gb = self.config.global_bounds
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
            if gb.max_pending is not None and self._pending + new_total > gb.max_pending:
                violated = True
            if violated:
                index = next(i for i, p in enumerate(pools) if p is pool and duplicate_of[i] is None)
                if pool.config.overflow is OverflowPolicy.WAIT:
                    self._mark_full(pool)
                    raise AdmissionError(
                        SubmitCode.FULL, f"pool {pool.name!r} is full; retry when space is available", index
                    )
                raise AdmissionError(SubmitCode.OVERLOADED, f"pool {pool.name!r} cannot take the batch", index)

    def _mark_full(self, pool: Pool) -> None:
        self._full_pools.add(pool.name)
        if self.config.global_bounds.bounded:
            self._full_global = True

    def _space_freed(self, pool: Pool) -> None:
        if pool.name in self._full_pools:
            self._full_pools.discard(pool.name)
            self._out.space.append(pool.name)
        if self._full_global:
            self._full_global = False
            self._out.space.append(None)

    # Creation ------------------------------------------------------------------------------------

    def _create(
        self,
        now: int,
        pool: Pool,
        spec: TaskSpec,
        deps: Sequence[_ResolvedDep] | None,
        interval: tuple[int, int] | None,
        task_id: int | None = None,
    ) -> Task:
        retry = spec.retry if spec.retry is not None else pool.config.retry
        task = Task(task_id if task_id is not None else self._ids.allocate(), pool, spec, now, retry)
        self._tasks[task.id] = task
        self._index(task)
        if task.key is not None:
            self._keys[task.key] = task.id
        if spec.deadline is not None:
            self._set_estimate(task, spec)
        self.totals["submitted"] += 1
        pool.totals["submitted"] += 1
        if interval is not None:
            pool.reservations.add(task.id, *interval)
        # Account as pending (the status setters below move it between pending statuses).
        cls = task.cls
        pool.pending += 1
        pool.pending_by_class[cls] += 1
        self._pending += 1
        if self._shed_index:
            shed = self._shed_index.get(pool)
            if shed is not None and task.fixed is None:
                shed[cls][task.id] = task
        if not deps and (task.key is None or task.key not in self._awaiting):
            # Nothing to wait for but (perhaps) a start time: the common, fast path.
            pool.counts[2][cls] += 1
            if self._persist:
                record = TaskRecord(task.id, pool.name, spec, now, _READY, task.max_attempts)
                self._out.mutations.append(PutTask(record))
            if task.fixed is not None:
                self._arm_fixed(task, now)
                self._release(task, now, fresh=True)
            else:
                self._enqueue_ready(task, now)
            return task
        doomed: tuple[Task, EdgeCond] | None = None
        if deps:
            for parent, awaited, cond in deps:
                if awaited is not None:
                    if task.awaiting is None:
                        task.awaiting = set()
                    task.awaiting.add(awaited)
                    self._awaiting.setdefault(awaited, []).append((task, cond))
                    continue
                assert parent is not None
                if parent.status.terminal:
                    if not _edge_satisfied(cond, parent.status) and doomed is None:
                        doomed = (parent, cond)
                    continue
                if parent.children is None:
                    parent.children = []
                parent.children.append((task, cond))
                task.unmet += 1
        # Tasks that were waiting for this key now depend on it.
        if task.key is not None:
            waiters = self._awaiting.pop(task.key, None)
            if waiters:
                children = task.children if task.children is not None else []
                for child, cond in waiters:
                    if child.status.terminal:
                        continue
                    if child.awaiting is not None:
                        child.awaiting.discard(task.key)
                        if not child.awaiting:
                            child.awaiting = None
                    children.append((child, cond))  # every edge counts, also a second one on this key
                    child.unmet += 1
                task.children = children
        blocked = task.unmet > 0 or task.awaiting is not None
        task.status = _BLOCKED if blocked else _READY
        pool.counts[STATUS_INDEX[task.status._value_]][cls] += 1
        if self._persist:
            record = TaskRecord(task.id, pool.name, spec, now, task.status, task.max_attempts)
            self._out.mutations.append(PutTask(record))
        if task.fixed is not None:
            self._arm_fixed(task, now)
        if task.awaiting is not None and pool.config.await_timeout is not None:
            self._push_timer(now + pool.config.await_timeout, _T_AWAIT, task, 0)
        if doomed is not None:
            parent, cond = doomed
            self._finish(task, _SKIPPED, now, f"dependency {parent.id} ended as {parent.status.value}")
        elif not blocked:
            self._release(task, now, fresh=True)
        elif self._emit_transitions:
            self._publish(task, now)
        return task

    def _arm_fixed(self, task: Task, now: int) -> None:
        """Timers of a fixed start: the miss deadline, the first hold check and the start."""
        fixed = task.fixed
        assert fixed is not None
        # A start at exactly start + tolerance is still on time: the miss is one tick later.
        self._push_timer(fixed.start + fixed.tolerance + 1, _T_MISS, task, 0)
        if fixed.start > now:
            self._push_timer(max(now, fixed.start - task.pool.config.max_hold), _T_HOLD, task, 0)
            self._push_timer(fixed.start, _T_START, task, 0)

    def _set_estimate(self, task: Task, spec: TaskSpec) -> None:
        task.est = self._estimate(task.pool, spec.kind, spec.duration_hint)
        assert task.deadline is not None
        task.lst = task.deadline - task.est

    def _estimate(self, pool: Pool, kind: str, hint: int | None) -> int:
        if hint is not None:
            return hint
        hist = pool.kind_durations.get(kind)
        if hist is not None and hist.count:
            cached = pool.kind_medians.get(kind)
            if cached is not None and hist.count - cached[0] < max(1, cached[0] // 16):
                return cached[1]
            median = hist.quantile(0.5)
            pool.kind_medians[kind] = (hist.count, median)
            return median
        if pool.completed:
            if pool.completed - pool.run_median_count >= max(1, pool.run_median_count // 16):
                merged = LogLinearHistogram()
                for kind_hist in pool.kind_durations.values():
                    merged.merge(kind_hist)
                pool.run_median = merged.quantile(0.5)
                pool.run_median_count = pool.completed
            return pool.run_median
        return pool.config.default_duration

    # ------------------------------------------------------------------------------------------
    # Status bookkeeping

    def _move(self, task: Task, status: TaskStatus) -> None:
        """Change between non-terminal statuses, keeping the pool's counters right."""
        old = task.status
        if old is status:
            return
        pool = task.pool
        cls = task.cls
        counts = pool.counts
        counts[STATUS_INDEX[old._value_]][cls] -= 1
        counts[STATUS_INDEX[status._value_]][cls] += 1
        task.status = status
        if old is _RUNNING:
            pool.pending += 1
            pool.pending_by_class[cls] += 1
            self._pending += 1
            self._running -= 1
            shed = self._shed_index.get(pool)
            if shed is not None and task.fixed is None:
                shed[cls][task.id] = task
        elif status is _RUNNING:
            pool.pending -= 1
            pool.pending_by_class[cls] -= 1
            self._pending -= 1
            self._running += 1
            shed = self._shed_index.get(pool)
            if shed is not None:
                shed[cls].pop(task.id, None)
            if self._full_pools or self._full_global:
                self._space_freed(pool)

    def _publish(self, task: Task, now: int, message: str | None = None) -> None:
        self._out.events.append(StatusEvent(task.id, task.pool.name, task.key, task.status, task.attempt, now, message))

    def _unqueue(self, task: Task) -> None:
        """Take a waiting task out of whatever queue holds it."""
        where = task.where
        if where == NOWHERE:
            return
        task.qgen += 1
        if where in (IN_FIFO, IN_SFQ):
            task.pool.ready[task.cls] -= 1
        elif where == IN_EDF:
            task.pool.ready[task.cls] -= 1
            task.pool.edf_live[task.cls] -= 1
        elif where == IN_DUE:
            task.pool.due_live -= 1
        elif where == PARKED_RESOURCE:
            self._resources.unpark(task.id)
        task.where = NOWHERE

    def _release(self, task: Task, now: int, fresh: bool = False) -> None:
        """Dependencies are satisfied: the task waits for its start time or becomes ready."""
        fixed = task.fixed
        if fixed is not None:
            if not task.fixed_done and fixed.start > now:
                self._move(task, _SCHEDULED)
                if self._emit_transitions:
                    self._publish(task, now)
                if not fresh:
                    self._push_timer(now, _T_HOLD, task, 0)
                return
            self._make_due(task, now)
            return
        self._enqueue_ready(task, now)

    def _enqueue_ready(self, task: Task, now: int) -> None:
        pool = task.pool
        if task.status is not _READY:
            self._move(task, _READY)
            if self._emit_transitions:
                self._publish(task, now)
        elif self._emit_transitions and task.attempt == 0 and task.where == NOWHERE:
            self._publish(task, now)
        task.ready_at = now
        cls = task.cls
        if task.deadline is not None:
            pool.edf[cls].push(task.lst, task.seq, task)
            pool.edf_live[cls] += 1
            task.where = IN_EDF
        elif pool.sfq is not None:
            fairness = pool.config.fairness
            assert fairness is not None
            start = task.sfq_tag
            if start < 0:
                # First time in the lane: a start tag after the tenant's previous finish tag.
                # A retried or woken task keeps the tag it got, so it keeps its place.
                tags = pool.finish_tags[cls]
                start = max(pool.virtual_time[cls], tags.get(task.tenant, 0.0))
                tags[task.tenant] = start + 1.0 / fairness.weight(task.tenant)
                task.sfq_tag = start
            pool.sfq[cls].push(start, task.seq, task)
            task.where = IN_SFQ
        else:
            pool.fifo[cls].push(task.seq, task)
            task.where = IN_FIFO
        pool.ready[cls] += 1
        if pool.autoscaler is not None:
            pool.autoscaler.record_arrivals(1)
        self._dirty.add(pool)

    def _make_due(self, task: Task, now: int) -> None:
        """A fixed-start task whose start has come (or a retried fixed-start attempt)."""
        guard = task.guard
        if guard is not None:
            task.guard = None
            previous = self._tasks.get(guard)
            if previous is not None and not previous.status.terminal:
                self._finish(task, _SKIPPED, now, f"previous occurrence {guard} is still running")
                return
        pool = task.pool
        if task.where == WAITING_HOLD:
            self._unqueue(task)
        self._move(task, _READY)
        if self._emit_transitions:
            self._publish(task, now)
        task.ready_at = now
        fixed = task.fixed
        start = fixed.start if fixed is not None else now
        pool.due.push(_HOLDING_KEY if task.holding else float(start), task.seq, task)
        pool.due_live += 1
        task.where = IN_DUE
        if pool.autoscaler is not None:
            pool.autoscaler.record_arrivals(1)
        self._dirty.add(pool)

    # ------------------------------------------------------------------------------------------
    # Holds for fixed starts

    def _hold_lead(self, pool: Pool, task: Task, now: int) -> int:
        fixed = task.fixed
        assert fixed is not None
        totals = pool.window.totals(now, pool.busy, pool.capacity)
        regular = totals.run.copy()
        regular.subtract(totals.fixed_run)
        p90 = regular.quantile(0.9)
        return min(max(fixed.tolerance, p90), pool.config.max_hold)

    def _request_hold(self, task: Task) -> None:
        if task.holding or task.where == WAITING_HOLD:
            return
        pool = task.pool
        if pool.free > 0:
            pool.held += 1
            task.holding = True
            return
        fixed = task.fixed
        assert fixed is not None
        pool.hold_waiters.push(float(fixed.start), task.seq, task)
        task.where = WAITING_HOLD

    def _drop_hold(self, task: Task) -> None:
        if task.holding:
            task.holding = False
            task.pool.held -= 1
            self._dirty.add(task.pool)
        elif task.where == WAITING_HOLD:
            self._unqueue(task)

    def _grant_holds(self, pool: Pool) -> None:
        waiters = pool.hold_waiters
        while pool.free > 0:
            task = waiters.peek()
            if task is None:
                return
            waiters.pop()
            task.qgen += 1
            task.where = NOWHERE
            task.holding = True
            pool.held += 1

    # ------------------------------------------------------------------------------------------
    # Dispatch

    def tick(self, now: int) -> None:
        """Fire every timer due at ``now`` and start whatever can start."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, kind, obj, gen = heapq.heappop(timers)
            try:
                self._fire(kind, obj, gen, now)
            except Exception as error:
                raise _fault(error, obj) from error
        if self._retained:
            self._expire_retained(now)
        if self._has_resources:
            self._wake_resources(now)
        if self._dirty and self.dispatch_enabled:
            dirty = sorted(self._dirty, key=lambda pool: pool.index)
            self._dirty.clear()
            for pool in dirty:
                self._dispatch_pool(pool, now)
            if self._dirty:
                # Dispatch can wake label waiters of the same pool; one more pass settles them.
                again = sorted(self._dirty, key=lambda pool: pool.index)
                self._dirty.clear()
                for pool in again:
                    self._dispatch_pool(pool, now)
        if self._has_resources:
            self._arm_refill(now)

    def next_wakeup(self) -> int | None:
        """The earliest time ``tick`` has something to do (None: nothing until the next call)."""
        if self._dirty and self.dispatch_enabled:
            return 0
        timers = self._timers
        while timers:
            when, _, kind, obj, gen = timers[0]
            if self._timer_live(kind, obj, gen):
                return when
            heapq.heappop(timers)
        return None

    def _dispatch_pool(self, pool: Pool, now: int) -> None:
        due = pool.due
        base = self._base
        aging = self._aging
        age_cap = self._age_cap
        fifo = pool.fifo
        edf = pool.edf
        lanes = pool.sfq if pool.sfq is not None else fifo
        ready = pool.ready
        edf_live = pool.edf_live
        ceilings = self._ceilings(edf_live)
        groups = pool.groups
        while True:
            idle = pool.capacity - pool.busy if len(groups) == 1 else pool.open_slots()
            if idle <= 0:
                return
            # Fixed-start work that is due goes first: onto its held slot, else the next free slot.
            if pool.due_live:
                head = due.peek()
                if head is not None and (head.holding or pool.free > 0):
                    due.pop()
                    head.qgen += 1
                    head.where = NOWHERE
                    pool.due_live -= 1
                    try:
                        self._try_start(pool, head, now)
                    except Exception as error:
                        raise EngineFault.wrap(error, task_id=head.id) from error
                    continue
            if idle - pool.held <= 0:
                return
            best: Task | None = None
            best_lane: int = 0
            best_score = -math.inf
            for cls in range(CLASSES):
                if best is not None and best_score > ceilings[cls]:
                    break  # no task of this class or below can reach the best score
                if not ready[cls]:
                    continue
                task = lanes[cls].peek()
                if task is not None:
                    waited = now - task.submitted_at
                    score = base[cls] + min(aging[cls] * waited, age_cap[cls])
                    if score > best_score or (
                        score == best_score and best is not None and task.seq < best.seq and cls == best.cls
                    ):
                        best, best_score, best_lane = task, score, 0
                if edf_live[cls]:
                    task = edf[cls].peek()
                    if task is not None:
                        waited = now - task.submitted_at
                        score = base[cls] + min(aging[cls] * waited, age_cap[cls]) + self._urgency(task, now)
                        if score > best_score or (
                            score == best_score and best is not None and cls == best.cls and task.seq < best.seq
                        ):
                            best, best_score, best_lane = task, score, 1
            if best is None:
                return
            cls = best.cls
            if best_lane == 0:
                lane = lanes[cls]
                if pool.sfq is not None:
                    sfq_lane = pool.sfq[cls]
                    pool.virtual_time[cls] = max(pool.virtual_time[cls], sfq_lane.peek_key())
                lane.pop()
            else:
                edf[cls].pop()
                edf_live[cls] -= 1
            best.qgen += 1
            best.where = NOWHERE
            ready[cls] -= 1
            try:
                self._try_start(pool, best, now)
            except Exception as error:
                raise EngineFault.wrap(error, task_id=best.id) from error

    def _ceilings(self, edf_live: list[int]) -> list[float]:
        """For each class, the best score any task of that class or a lower one can reach."""
        out = [0.0] * CLASSES
        best = -math.inf
        for cls in range(CLASSES - 1, -1, -1):
            top = self._plain_max[cls] + (self._urgent_max if edf_live[cls] else 0.0)
            if top > best:
                best = top
            out[cls] = best
        return out

    def _urgency(self, task: Task, now: int) -> float:
        slack = task.lst - now
        horizon = task.est if task.est > self._u_window else self._u_window
        if slack >= horizon:
            return 0.0
        if slack >= 0:
            return self._u_max * (1.0 - slack / horizon)
        return self._u_max + min(self._u_rate * -slack, self._u_cap)

    def _find_group(self, pool: Pool, labels: LabelKey) -> Group | None:
        groups = pool.groups
        if len(groups) == 1 and not labels:
            group = groups[NO_LABELS]
            return group if group.capacity > group.busy else None
        best: Group | None = None
        for group in groups.values():
            if group.capacity > group.busy and labels <= group.key and (best is None or len(group.key) < len(best.key)):
                best = group
        return best

    def _try_start(self, pool: Pool, task: Task, now: int) -> None:
        """The task won a slot: check labels and resources, then start it or park it."""
        groups = pool.groups
        if len(groups) == 1 and not task.labels:
            group: Group | None = groups[NO_LABELS]  # the only group, and it has a free slot
        else:
            group = self._find_group(pool, task.labels)
        if group is None:
            waiters = pool.label_waiters.get(task.labels)
            if waiters is None:
                waiters = pool.label_waiters[task.labels] = type(pool.due)()
            waiters.push(float(task.seq), task.seq, task)
            task.where = PARKED_LABELS
            return
        spec = task.spec
        assert spec is not None
        if spec.resources:
            short = self._resources.try_acquire(spec.resources, now, task.id)
            woken = task.woken
            task.woken = False
            if short is not None:
                self._resources.park(short, task.id, spec.resources[short], front=woken)
                task.where = PARKED_RESOURCE
                self._arm_refill(now)
                return
        cls = task.cls
        ready = pool.ready
        inversion = cls > 0 and (ready[0] > 0 or (cls > 1 and (ready[1] > 0 or (cls > 2 and ready[2] > 0))))
        self._start(pool, task, group, now, inversion)

    def _start(self, pool: Pool, task: Task, group: Group, now: int, inversion: bool) -> None:
        window = pool.window
        window.integrate(now, pool.busy, pool.capacity)
        bucket = window.current(now)
        if task.holding:
            task.holding = False
            pool.held -= 1
        pool.busy += 1
        group.busy += 1
        task.attempt += 1
        lease_id = self._lease_ids.allocate()
        config = pool.config
        lease = LeaseState(lease_id, task, group, now, config.lease_ttl)
        self._leases[lease_id] = lease
        task.lease = lease
        task.started_at = now
        # Inline of _move(task, RUNNING): the task leaves the pending counts.
        cls = task.cls
        counts = pool.counts
        counts[STATUS_INDEX[task.status._value_]][cls] -= 1
        counts[4][cls] += 1
        task.status = _RUNNING
        pool.pending -= 1
        pool.pending_by_class[cls] -= 1
        self._pending -= 1
        self._running += 1
        if self._shed_index:
            shed = self._shed_index.get(pool)
            if shed is not None:
                shed[cls].pop(task.id, None)
        if self._full_pools or self._full_global:
            self._space_freed(pool)
        bucket.dispatched += 1
        bucket.wait.record(now - task.ready_at if now > task.ready_at else 0)
        if inversion:
            bucket.inversions += 1
        fixed = task.fixed
        if fixed is not None and not task.fixed_done:
            task.fixed_done = True
            bucket.fixed_total += 1
            if abs(now - fixed.start) <= fixed.tolerance:
                bucket.fixed_hits += 1
        self.totals["dispatched"] += 1
        pool.totals["dispatched"] += 1
        spec = task.spec
        assert spec is not None
        timeout = spec.timeout
        if timeout is not None:
            self._push_timer(now + timeout, _T_TIMEOUT, lease, lease_id)
        if lease.expires_at is not None:
            self._push_timer(lease.expires_at, _T_LEASE, lease, lease_id)
        if self._persist:
            self._out.mutations.append(SetStatus(task.id, _RUNNING, task.attempt, now))
        if self._emit_transitions:
            self._publish(task, now)
        self._out.dispatches.append(
            Dispatch(
                lease_id,
                task.id,
                task.attempt,
                pool.name,
                group.labels,
                spec.payload,
                spec.kind,
                task.key,
                spec.priority,
                spec.tags,
                timeout,
                task.deadline,
                config.lease_ttl,
                now,
            )
        )

    # ------------------------------------------------------------------------------------------
    # Attempts ending

    def complete(self, now: int, lease_id: int, outcome: Outcome) -> bool:
        """Report the outcome of an attempt. Stale reports change nothing and return False."""
        lease = self._leases.get(lease_id)
        if lease is None or not lease.active:
            self.totals["stale_completions"] += 1
            if lease is not None:
                lease.task.pool.totals["stale_completions"] += 1
            return False
        task = lease.task
        try:
            bucket = self._end_lease(lease, now, ran=True)
            if type(outcome) is Success:
                bucket.succeeded += 1
                self._finish(task, _SUCCEEDED, now, None, outcome.output, True)
            elif isinstance(outcome, Failure):
                bucket.failed += 1
                if outcome.permanent:
                    self._finish(task, _FAILED, now, outcome.message)
                else:
                    self._fail_attempt(task, now, outcome.message, outcome.retry_after)
            elif isinstance(outcome, CancelledByExecutor):
                self._finish(task, _CANCELLED, now, outcome.message or "cancelled by the executor")
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
        return True

    def heartbeat(self, now: int, lease_id: int) -> bool:
        lease = self._leases.get(lease_id)
        if lease is None or not lease.active:
            return False
        ttl = lease.task.pool.config.lease_ttl
        if ttl is not None:
            lease.expires_at = now + ttl
        return True

    def _end_lease(self, lease: LeaseState, now: int, ran: bool) -> WindowBucket:
        """Free the attempt's slot and resources; record its run time. Returns the metrics
        bucket of ``now``."""
        lease.active = False
        del self._leases[lease.id]
        task = lease.task
        task.lease = None
        pool = task.pool
        pool.window.integrate(now, pool.busy, pool.capacity)
        pool.busy -= 1
        group = lease.group
        group.busy -= 1
        spec = task.spec
        if spec is not None and spec.resources:
            self._resources.release(spec.resources, now)
            self._wake_resources(now)
        bucket = pool.window.current(now)
        if ran:
            duration = now - lease.started_at
            bucket.run.record(duration)
            if task.fixed is not None:
                bucket.fixed_run.record(duration)
            hist = pool.kind_durations.get(task.kind)
            if hist is None:
                hist = pool.kind_durations[task.kind] = LogLinearHistogram()
            hist.record(duration)
            pool.completed += 1
            if pool.autoscaler is not None:
                pool.autoscaler.record_run(duration)
        self._slot_freed(pool, group)
        return bucket

    def _slot_freed(self, pool: Pool, group: Group) -> None:
        if pool.hold_waiters.heap:
            self._grant_holds(pool)
        if pool.label_waiters:
            self._wake_label_waiters(pool, group)
        self._dirty.add(pool)

    def _wake_label_waiters(self, pool: Pool, group: Group) -> None:
        free = group.capacity - group.busy
        while free > 0:
            best_lane = None
            best_task: Task | None = None
            for key, lane in pool.label_waiters.items():
                if not key <= group.key:
                    continue
                task = lane.peek()
                if task is not None and (best_task is None or task.seq < best_task.seq):
                    best_task, best_lane = task, lane
            if best_task is None or best_lane is None:
                return
            best_lane.pop()
            best_task.qgen += 1
            best_task.where = NOWHERE
            self._requeue(best_task, best_task.ready_at)
            free -= 1

    def _requeue(self, task: Task, now: int) -> None:
        """Put a parked task back where dispatch will see it."""
        if task.fixed is not None and (task.holding or task.fixed_done or task.fixed.start <= now):
            pool = task.pool
            pool.due.push(_HOLDING_KEY if task.holding else float(task.fixed.start), task.seq, task)
            pool.due_live += 1
            task.where = IN_DUE
            self._dirty.add(pool)
            return
        ready_at = task.ready_at
        self._enqueue_ready(task, now)
        task.ready_at = ready_at

    def _wake_resources(self, now: int) -> None:
        for task_id in self._resources.wake(now):
            task = self._tasks.get(task_id)
            if task is not None and task.where == PARKED_RESOURCE:
                task.where = NOWHERE
                task.qgen += 1
                task.woken = True
                self._requeue(task, now)
            else:
                self._resources.unpark(task_id)

    def _arm_refill(self, now: int) -> None:
        when = self._resources.next_refill(now)
        if when is None:
            return
        if when <= now:
            # Someone could be woken already: this step's wake-up pass missed it (it was waiting
            # for a slot, or its claim settled after the pass). Look again shortly, never "now",
            # so that a waiter that cannot start yet does not keep the driver busy.
            when = now + _REFILL_RETRY
        if self._refill_timer_at is None or when < self._refill_timer_at or self._refill_timer_at < now:
            self._refill_timer_at = when
            self._push_timer(when, _T_REFILL, None, 0)

    def _fail_attempt(self, task: Task, now: int, message: str, retry_after: int | None) -> None:
        if task.attempt < task.max_attempts:
            policy = task.retry
            delay = policy.backoff(task.attempt + 1)
            if policy.jitter and delay > 0:
                delay = int(self._rng.random() * delay)
            if retry_after is not None and retry_after > delay:
                delay = retry_after if retry_after < MAX_DURATION else MAX_DURATION
            task.retry_at = add_ns(now, delay)
            task.message = message
            self._move(task, _RETRYING)
            self.totals["retries"] += 1
            task.pool.totals["retries"] += 1
            task.pool.window.current(now).retried += 1
            if self._persist:
                self._out.mutations.append(SetStatus(task.id, _RETRYING, task.attempt, now, message, task.retry_at))
            if self._emit_transitions:
                self._publish(task, now, message)
            self._push_timer(task.retry_at, _T_RETRY, task, task.retry_at)
        else:
            self._finish(task, _DEAD, now, message)

    # ------------------------------------------------------------------------------------------
    # Terminal transitions

    def _finish(
        self,
        task: Task,
        status: TaskStatus,
        now: int,
        message: str | None,
        output: object = None,
        has_output: bool = False,
    ) -> None:
        pool = task.pool
        old = task.status
        if old._value_ in TERMINAL_VALUES:
            return
        if task.lease is not None:
            lease = task.lease
            self._out.aborts.append(Abort(lease.id, task.id, message or status.value))
            self._end_lease(lease, now, ran=False)
        if task.where:
            self._unqueue(task)
        if task.holding:
            self._drop_hold(task)
        spec = task.spec
        if spec is not None and spec.resources:
            self._resources.unpark(task.id)  # also ends a claim on units it was woken for
        if task.fixed is not None:
            pool.reservations.remove(task.id)
            if not task.fixed_done and status in (_MISSED, _FAILED) and task.started_at is None:
                task.fixed_done = True
        cls = task.cls
        pool.counts[STATUS_INDEX[old._value_]][cls] -= 1
        if old is _RUNNING:
            self._running -= 1
        else:
            pool.pending -= 1
            pool.pending_by_class[cls] -= 1
            self._pending -= 1
            if self._shed_index:
                shed = self._shed_index.get(pool)
                if shed is not None:
                    shed[cls].pop(task.id, None)
            if self._full_pools or self._full_global:
                self._space_freed(pool)
        task.status = status
        task.finished_at = now
        task.message = message
        task.has_output = has_output
        self.totals[status._value_] += 1
        pool.totals[status._value_] += 1
        if task.deadline is not None and status is _SUCCEEDED:
            bucket = pool.window.current(now)
            bucket.objective_total += 1
            if now <= task.deadline:
                bucket.objective_met += 1
        if task.awaiting is not None:
            self._forget_awaits(task)
        if self._persist:
            self._out.mutations.append(SetStatus(task.id, status, task.attempt, now, message, None, output, has_output))
        self._out.resolves.append(
            Resolve(task.id, pool.name, task.key, status, task.attempt, now, message, output, has_output)
        )
        task.spec = None  # drop the payload; the record stays for lookups and dependents
        self._retained.append(task)
        if task.children:
            self._propagation.append(task)
            if not self._propagating:
                self._propagate(now)

    def _forget_awaits(self, task: Task) -> None:
        assert task.awaiting is not None
        for key in task.awaiting:
            waiters = self._awaiting.get(key)
            if waiters is None:
                continue
            remaining = [(child, cond) for child, cond in waiters if child is not task]
            if remaining:
                self._awaiting[key] = remaining
            else:
                del self._awaiting[key]
        task.awaiting = None

    def _propagate(self, now: int) -> None:
        self._propagating = True
        try:
            while self._propagation:
                parent = self._propagation.pop()
                children = parent.children
                parent.children = None
                if not children:
                    continue
                status = parent.status
                for child, cond in children:
                    if child.status.terminal:
                        continue
                    if _edge_satisfied(cond, status):
                        child.unmet -= 1
                        if child.unmet == 0 and child.awaiting is None:
                            self._release(child, now)
                    else:
                        self._finish(child, _SKIPPED, now, f"dependency {parent.id} ended as {status.value}")
        finally:
            self._propagating = False

    def _expire_retained(self, now: int) -> None:
        retained = self._retained
        horizon = now - self.config.retention
        limit = self.config.retention_max
        while retained:
            task = retained[0]
            finished = task.finished_at
            assert finished is not None
            if finished > horizon and len(retained) <= limit:
                return
            retained.popleft()
            if self._tasks.pop(task.id, None) is not None:
                self._by_pool[task.pool.name].removed(self._tasks)
            if task.key is not None and self._keys.get(task.key) == task.id:
                del self._keys[task.key]

    # ------------------------------------------------------------------------------------------
    # Cancellation

    def cancel(self, now: int, ref: TaskRef) -> bool:
        """End a task as Cancelled. False when it had already finished."""
        task = self._lookup(ref)
        if task is None:
            raise UnknownTask(f"unknown task {ref!r}")
        if task.status.terminal:
            return False
        try:
            self._finish(task, _CANCELLED, now, "cancelled")
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
        return True

    def dead_letter(self, now: int, task_id: int, message: str) -> bool:
        """End a live task as DeadLettered with ``message`` (its attempt, if any, is aborted).

        How a driver contains a task whose handling raised (see ``EngineFault``); every pool is
        dispatched again on the next tick, since the step that raised may have stopped half-way.
        False when the task is unknown or already finished.
        """
        self._dirty.update(self._pool_list)
        task = self._tasks.get(task_id)
        if task is None or task.status.terminal:
            return False
        self._finish(task, _DEAD, now, message)
        return True

    def _lookup(self, ref: TaskRef) -> Task | None:
        if isinstance(ref, str):
            task_id = self._keys.get(ref)
            if task_id is None:
                return None
            return self._tasks.get(task_id)
        return self._tasks.get(ref)

    # ------------------------------------------------------------------------------------------
    # Capacity

    def set_capacity(self, now: int, pool_name: str, capacity: int) -> None:
        self.set_group_capacity(now, pool_name, {}, capacity)

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
        self._account_workers(pool, now)
        pool.capacity += capacity - group.capacity
        group.capacity = capacity
        if group.capacity == 0 and group.busy == 0 and key:
            del pool.groups[key]
        if pool.autoscaler is None:
            pool.desired = pool.capacity
        if len(pool.hold_waiters):
            self._grant_holds(pool)
        if pool.label_waiters and group.capacity > group.busy:
            self._wake_label_waiters(pool, group)
        self._dirty.add(pool)

    def _account_workers(self, pool: Pool, now: int) -> None:
        elapsed = now - pool.last_worker_change
        if elapsed > 0:
            pool.worker_ns += elapsed * pool.capacity
            pool.last_worker_change = now

    # ------------------------------------------------------------------------------------------
    # Timers

    def _push_timer(self, when: int, kind: int, obj: object, gen: int) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (when, self._timer_seq, kind, obj, gen))

    def _timer_live(self, kind: int, obj: object, gen: int) -> bool:
        if kind == _T_RETRY:
            assert isinstance(obj, Task)
            return obj.status is _RETRYING and obj.retry_at == gen
        if kind in (_T_TIMEOUT, _T_LEASE):
            assert isinstance(obj, LeaseState)
            return obj.active
        if kind in (_T_START, _T_HOLD, _T_MISS, _T_AWAIT):
            assert isinstance(obj, Task)
            return not obj.status.terminal
        if kind == _T_RECUR:
            assert isinstance(obj, Schedule)
            return obj.timer_gen == gen and self._schedules.get(obj.spec.name) is obj
        return True

    def _fire(self, kind: int, obj: object, gen: int, now: int) -> None:
        if not self._timer_live(kind, obj, gen):
            return
        if kind == _T_RETRY:
            assert isinstance(obj, Task)
            obj.retry_at = None
            if obj.fixed is not None:
                self._make_due(obj, now)
            else:
                self._enqueue_ready(obj, now)
        elif kind == _T_TIMEOUT:
            assert isinstance(obj, LeaseState)
            task = obj.task
            self.totals["timeouts"] += 1
            task.pool.totals["timeouts"] += 1
            spec = task.spec
            timeout = spec.timeout if spec is not None and spec.timeout is not None else 0
            self._out.aborts.append(Abort(obj.id, task.id, AbortReason.TIMEOUT))
            self._end_lease(obj, now, ran=True)
            task.pool.window.current(now).failed += 1
            self._fail_attempt(task, now, f"attempt timed out after {timeout / NS_PER_S:g}s", None)
        elif kind == _T_LEASE:
            assert isinstance(obj, LeaseState)
            expires = obj.expires_at
            if expires is not None and expires > now:
                self._push_timer(expires, _T_LEASE, obj, gen)
                return
            task = obj.task
            self.totals["lease_expiries"] += 1
            task.pool.totals["lease_expiries"] += 1
            self._out.aborts.append(Abort(obj.id, task.id, AbortReason.LEASE_EXPIRED))
            self._end_lease(obj, now, ran=True)
            task.pool.window.current(now).failed += 1
            self._fail_attempt(task, now, "lease expired: no heartbeat within the lease TTL", None)
        elif kind == _T_START:
            assert isinstance(obj, Task)
            if obj.status is _SCHEDULED:
                self._make_due(obj, now)
        elif kind == _T_HOLD:
            assert isinstance(obj, Task)
            if obj.status is not _SCHEDULED or obj.fixed_done or obj.holding:
                return
            fixed = obj.fixed
            assert fixed is not None
            hold_at = fixed.start - self._hold_lead(obj.pool, obj, now)
            if hold_at <= now:
                self._request_hold(obj)
            else:
                # Look again before then: the pool's run times (and so the lead) may grow.
                recheck = now + max((hold_at - now) // 2, NS_PER_S)
                self._push_timer(min(hold_at, recheck), _T_HOLD, obj, 0)
        elif kind == _T_MISS:
            assert isinstance(obj, Task)
            self._apply_miss(obj, now)
        elif kind == _T_AWAIT:
            assert isinstance(obj, Task)
            if obj.awaiting:
                keys = ", ".join(sorted(obj.awaiting))
                self._finish(obj, _SKIPPED, now, f"awaited dependency never appeared: {keys}")
        elif kind == _T_REFILL:
            self._refill_timer_at = None
            self._wake_resources(now)
            self._arm_refill(now)
        elif kind == _T_SCALE:
            assert isinstance(obj, Pool)
            self._autoscale(obj, now)
        elif kind == _T_RECUR:
            assert isinstance(obj, Schedule)
            recurring.create_occurrence(self, obj, now)

    def _apply_miss(self, task: Task, now: int) -> None:
        if task.fixed_done or task.status is _RUNNING or task.started_at is not None:
            return
        fixed = task.fixed
        assert fixed is not None
        policy = fixed.on_miss
        if policy is MissPolicy.RUN_LATE:
            task.fixed_done = True
            task.pool.window.current(now).fixed_total += 1
            if task.status is _BLOCKED:
                self._drop_hold(task)
            return
        task.pool.window.current(now).fixed_total += 1
        late = f"missed its fixed start by more than {fixed.tolerance / NS_PER_S:g}s"
        if policy is MissPolicy.SKIP:
            self._finish(task, _MISSED, now, late)
        else:
            self._finish(task, _FAILED, now, late)

    # ------------------------------------------------------------------------------------------
    # Autoscaling

    def _autoscale(self, pool: Pool, now: int) -> None:
        scaler = pool.autoscaler
        assert scaler is not None and pool.config.autoscale is not None
        counts = pool.counts
        backlog = [counts[2][cls] + counts[3][cls] for cls in range(CLASSES)]
        self._move_due_to_critical(pool, backlog)
        horizon = pool.config.autoscale.reservation_horizon
        reserved = pool.reservations.peak(now, now + horizon) if len(pool.reservations) else 0
        before = pool.desired
        desired = scaler.evaluate(now, backlog, pool.busy, reserved)
        pool.desired = desired
        if desired != before:
            self._out.scales.append(Scale(pool.name, desired))
        self._push_timer(scaler.next_evaluation(), _T_SCALE, pool, 0)

    @staticmethod
    def _move_due_to_critical(pool: Pool, backlog: list[int]) -> None:
        """Fixed-start tasks that are due count as critical backlog."""
        for task in pool.due_tasks():
            if task.cls:
                backlog[task.cls] -= 1
                backlog[0] += 1

    # ------------------------------------------------------------------------------------------
    # Recurring schedules

    def add_recurring(self, now: int, spec: RecurringSpec) -> None:
        """Add or replace a schedule; its next occurrence is created ahead of its start."""
        recurring.add(self, now, spec)

    def remove_recurring(self, now: int, name: str) -> bool:
        """Stop a schedule (an occurrence already created stays). False if there was none."""
        return recurring.remove(self, now, name)

    def pause_recurring(self, now: int, name: str, paused: bool = True) -> bool:
        """Pause (or, with ``paused=False``, resume) a schedule. False if there is none."""
        return recurring.set_paused(self, now, name, paused)

    def list_recurring(self) -> list[RecurringInfo]:
        return recurring.infos(self)

    def suspend_recurring(self, name: str) -> bool:
        """Stop creating occurrences of a schedule whose handling raised; it is listed as invalid
        until it is added again. False when there is no such (valid) schedule."""
        return recurring.suspend(self, name)

    # ------------------------------------------------------------------------------------------
    # Reads

    def get(self, ref: TaskRef) -> TaskInfo | None:
        task = self._lookup(ref)
        return None if task is None else self._info(task)

    def ended(self, task_id: int) -> tuple[TaskStatus, str | None] | None:
        """(status, message) of a task that reached a terminal status; None if live or unknown."""
        task = self._tasks.get(task_id)
        if task is None or task.status._value_ not in TERMINAL_VALUES:
            return None
        return task.status, task.message

    def _info(self, task: Task) -> TaskInfo:
        fixed = task.fixed
        return TaskInfo(
            task.id,
            task.pool.name,
            task.key,
            task.kind,
            task.status,
            task.attempt,
            task.max_attempts,
            _priority_of(task.cls),
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

    def _index(self, task: Task) -> None:
        index = self._by_pool.get(task.pool.name)
        if index is None:
            index = self._by_pool[task.pool.name] = IdIndex()
        index.add(task.id)

    def list_tasks(
        self,
        pools: Iterable[str] | None = None,
        statuses: Iterable[TaskStatus] | None = None,
        after: int = 0,
        limit: int = 100,
        *,
        query: TaskQuery | None = None,
        descending: bool = False,
    ) -> list[TaskInfo]:
        """Live and retained tasks in id order after ``after`` (exclusive), or, ``descending``,
        newest first below ``after`` (0: from the newest). ``query`` filters further; ``pools``
        and ``statuses`` narrow it. A page walks only the ids of the pools asked for, from the
        cursor on, so it costs the page plus the tasks the other filters skip."""
        query = query or TaskQuery()
        if pools:
            wanted = frozenset(pools)
            query = replace(query, pools=query.pools & wanted if query.pools else wanted)
        if statuses:
            query = replace(query, statuses=frozenset(statuses))
        names = query.pools if query.pools else self._by_pool.keys()
        indexes = [self._by_pool[name] for name in names if name in self._by_pool]
        out: list[TaskInfo] = []
        if limit <= 0:
            return out
        tasks = self._tasks
        for task_id in merged(indexes, after, descending):
            task = tasks.get(task_id)
            if task is None:
                continue
            if not query.matches(task.pool.name, task.status, task.kind, task.tenant, task.key, task.submitted_at):
                continue
            out.append(self._info(task))
            if len(out) >= limit:
                break
        return out

    # ------------------------------------------------------------------------------------------
    # Snapshots

    def snapshot(self, now: int) -> Snapshot:
        pools = []
        for pool in self._pool_list:
            pools.append(metrics.pool_snapshot(self, pool, now))
        return Snapshot(pools, self.live_tasks, self._running, self._pending, dict(self.totals))

    # ------------------------------------------------------------------------------------------
    # Recovery

    # ------------------------------------------------------------------------------------------
    # Invariants (for tests and debugging; O(tasks))

    def restore(self, now: int, recovered: Recovered, *, dead: Mapping[int, str] | None = None,
                suspended: Iterable[str] = ()) -> list[tuple[int, str]]:  # fmt: skip
        """Re-create what a durable store recovered (see ``recovery.restore``); fresh engines only.

        Tasks in ``dead`` (id -> message) come back dead-lettered and schedules in ``suspended``
        come back invalid: how a driver leaves out what made an earlier engine fault. A task or
        schedule that faults while it is restored raises ``EngineFault`` naming it. Returns the
        tasks restore dead-lettered because their values are out of range: ``(id, message)``.
        """
        return recovery.restore(self, now, recovered, dead or {}, frozenset(suspended))

    def adopt(self, old: Core, now: int) -> None:
        """Take over the run-time state of ``old``, the engine this freshly restored one replaces:
        worker capacities, the id floors (no task or lease id is handed out twice), the totals and
        the dispatch and transition switches."""
        self._ids.raise_floor(old._ids.high_water)
        self._lease_ids.raise_floor(old._lease_ids.high_water)
        for name, count in old.totals.items():
            self.totals[name] = self.totals.get(name, 0) + count
        for old_pool in old._pool_list:
            if old_pool.name not in self._pools:
                continue
            pool_totals = self._pools[old_pool.name].totals
            for name, count in old_pool.totals.items():
                pool_totals[name] = pool_totals.get(name, 0) + count
            for group in list(old_pool.groups.values()):
                self.set_group_capacity(now, old_pool.name, dict(group.key), group.capacity)
        self.dispatch_enabled = old.dispatch_enabled
        self._emit_transitions = old._emit_transitions

    def note_engine_errors(self, count: int) -> None:
        """Count internal errors its driver contained (they belong to no pool)."""
        self.totals["engine_errors"] += count

    def check_invariants(self) -> None:
        """Raise AssertionError if the engine's bookkeeping is inconsistent (tests, debugging)."""
        invariants.check_invariants(self)

    # ------------------------------------------------------------------------------------------
    # Actions

    def drain(self) -> StepOutput:
        """Everything the driver must do since the last drain (mutations to commit first)."""
        out = self._out
        self._out = StepOutput()
        return out


def _fault(error: Exception, obj: object) -> EngineFault:
    """A fault for an exception raised while a timer of ``obj`` fired, naming its task or schedule."""
    if isinstance(obj, Task):
        return EngineFault.wrap(error, task_id=obj.id)
    if isinstance(obj, LeaseState):
        return EngineFault.wrap(error, task_id=obj.task.id)
    if isinstance(obj, Schedule):
        return EngineFault.wrap(error, schedule=obj.spec.name)
    return EngineFault.wrap(error)


def _first(tasks: Iterable[Task], spare: frozenset[int]) -> Task | None:
    for task in tasks:
        if task.id not in spare:
            return task
    return None


def _priority_of(cls: int) -> Priority:
    return _PRIORITIES[cls]


from .types import Priority  # noqa: E402

_PRIORITIES: Final = (Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW)
