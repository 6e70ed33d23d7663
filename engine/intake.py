"""Submissions: checking a task (or an atomic batch) against every rule, then creating it.

Checks run in the spec's order — values and resources, keys, dependencies and cycles,
reservations, bounds — and nothing changes until all of them pass, except the task a bound
sheds to make room (a submission that would be refused anyway never sheds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from . import admission
from .actions import PutTask, TaskRecord
from .admission_control import AdmissionControl
from .dependencies import BatchDep, Dependencies, ResolvedDep
from .outbox import Outbox
from .registry import Registry
from .resources import ResourceTable
from .state import T_AWAIT, Pool, Task
from .stats import LogLinearHistogram
from .timers import Timers
from .types import AdmissionError, FixedStart, SubmitCode, TaskSpec, TaskStatus, caused_by
from .views import Submitted

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .holds import Holds
    from .outcomes import Outcomes

_READY: Final = TaskStatus.READY
_BLOCKED: Final = TaskStatus.BLOCKED
_SKIPPED: Final = TaskStatus.SKIPPED
_SHED: Final = TaskStatus.SHED


class Intake:
    def __init__(
        self,
        pools: Mapping[str, Pool],
        default_pool: Pool,
        registry: Registry,
        resources: ResourceTable,
        admission_control: AdmissionControl,
        dependencies: Dependencies,
        timers: Timers,
        outbox: Outbox,
    ) -> None:
        self._pools = pools
        self._default_pool = default_pool
        self._registry = registry
        self._totals = registry.totals
        self._resources = resources
        self._admission = admission_control
        self._dependencies = dependencies
        self._timers = timers
        self._outbox = outbox

    def bind(self, dispatcher: Dispatcher, holds: Holds, outcomes: Outcomes) -> None:
        self._dispatcher = dispatcher
        self._holds = holds
        self._outcomes = outcomes

    def set_default_pool(self, pool: Pool) -> None:
        """Where specs naming no pool go from now on (the default pool left the engine)."""
        self._default_pool = pool

    def pool_for(self, spec: TaskSpec) -> Pool:
        """The pool ``spec`` names (the default pool if none); AdmissionError if unknown."""
        name = spec.pool
        if name is None:
            return self._default_pool
        pool = self._pools.get(name)
        if pool is None:
            raise AdmissionError(SubmitCode.UNKNOWN_POOL, f"unknown pool {name!r}")
        return pool

    def check_spec(self, spec: TaskSpec) -> None:
        """The checks of the spec's own values and resource requests."""
        admission.check_spec(spec, self._resources)

    # One task -----------------------------------------------------------------------------------

    def submit(self, now: int, spec: TaskSpec) -> Submitted:
        """Admit one task, or raise AdmissionError. A known key returns the existing task."""
        pool = self._default_pool if spec.pool is None else self.pool_for(spec)
        key = spec.key
        if key is not None:
            existing = self._registry.key_owner(key)
            if existing is not None:
                admission.check_spec(spec, self._resources)
                return Submitted(existing, True)
        if spec.resources:
            admission.check_spec(spec, self._resources)
        else:
            admission.check_values(spec)  # the part of check_spec a task without resources needs
        resolved = self._dependencies.resolve(pool, spec) if spec.deps else None
        if key is not None and resolved is not None:
            self._dependencies.check_cycle(key, resolved)
        fixed = spec.fixed_start
        interval = None
        if fixed is not None:
            interval = self.reservation_interval(pool, spec, fixed)
            if not pool.reservations.fits(*interval):
                raise AdmissionError(
                    SubmitCode.RESERVATION_CONFLICT,
                    f"pool {pool.name!r} has no reservable capacity left for that start time",
                )
        if pool.bounded or self._admission.global_bounded:
            spare = [parent.id for parent, _, _ in resolved if parent is not None] if resolved else ()
            victim = self._admission.admit(pool, spec, spare)
            if victim is not None:
                self._outcomes.finish(victim, _SHED, now, f"shed to admit a {spec.priority.label} task")
        task = self.create(now, pool, spec, resolved, interval)
        return Submitted(task.id, False)

    def submit_many(self, now: int, specs: Iterable[TaskSpec]) -> list[Submitted | AdmissionError]:
        """Admit each task on its own, in order, exactly as one ``submit`` call per task would: a
        refused task does not stop the others, its AdmissionError (naming its index) takes its
        place in the answer. One call per batch instead of one per task."""
        results: list[Submitted | AdmissionError] = []
        append = results.append
        submit = self.submit
        for index, spec in enumerate(specs):
            try:
                append(submit(now, spec))
            except AdmissionError as error:
                append(error.at(index))
        return results

    # Batches ------------------------------------------------------------------------------------

    def submit_batch(self, now: int, specs: Sequence[TaskSpec]) -> list[Submitted]:
        """Admit every task or none; errors name the offending index."""
        count = len(specs)
        pools: list[Pool] = []
        batch_keys: dict[str, int] = {}
        duplicate_of: list[int | None] = [None] * count
        # Whether any spec has dependencies or a fixed start: a batch without either (the bulk of
        # submissions) skips the passes that resolve, order and reserve for them.
        linked = fixed_any = False
        key_owner = self._registry.key_owner
        for index, spec in enumerate(specs):
            try:
                pools.append(self.pool_for(spec))
                admission.check_spec(spec, self._resources)
            except AdmissionError as err:
                raise caused_by(err.at(index), None) from None
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
                existing = key_owner(key)
                if existing is not None:
                    duplicate_of[index] = existing
        if not linked and not fixed_any:
            return self._submit_plain_batch(now, specs, pools, duplicate_of)
        resolved = self._resolve_batch(specs, pools, batch_keys, duplicate_of)
        self._dependencies.check_batch_cycles(count, batch_keys, duplicate_of, resolved)
        intervals = self._reserve_batch(specs, pools, duplicate_of)
        self._admission.admit_batch(specs, pools, duplicate_of)
        # Everything checked: create the tasks in order, parents before the children that name them.
        created: list[Task | None] = [None] * count
        for index in self._dependencies.batch_order(count, resolved):
            if duplicate_of[index] is not None:
                continue
            deps: list[ResolvedDep] | None = None
            batch_deps = resolved[index]
            if batch_deps is not None:
                deps = [
                    (created[source] if source is not None else known, awaited, cond)
                    for known, source, awaited, cond in batch_deps
                ]
            created[index] = self.create(now, pools[index], specs[index], deps, intervals[index])
        results: list[Submitted] = []
        for index in range(count):
            dup = duplicate_of[index]
            if dup is not None:
                results.append(Submitted(dup, True))
            else:
                task = created[index]
                assert task is not None
                results.append(Submitted(task.id, False))
        return results

    def _resolve_batch(
        self,
        specs: Sequence[TaskSpec],
        pools: Sequence[Pool],
        batch_keys: Mapping[str, int],
        duplicate_of: Sequence[int | None],
    ) -> list[list[BatchDep] | None]:
        """Every new task's dependencies; references to keys the batch defines become indexes."""
        resolved: list[list[BatchDep] | None] = [None] * len(specs)
        for index, spec in enumerate(specs):
            if duplicate_of[index] is not None or not spec.deps:
                continue
            entries: list[BatchDep] = []
            for dep in spec.deps:
                target = dep.target
                if isinstance(target, str) and target in batch_keys:
                    parent_index = batch_keys[target]
                    if parent_index == index:
                        raise AdmissionError(SubmitCode.CYCLE, f"task depends on its own key {target!r}", index)
                    dup = duplicate_of[parent_index]
                    if dup is not None:
                        entries.append((self._registry.get(dup), None, None, dep.cond))
                    else:
                        entries.append((None, parent_index, None, dep.cond))
                    continue
                try:
                    parent, awaited = self._dependencies.resolve_one(pools[index], target, spec.key)
                except AdmissionError as err:
                    raise caused_by(err.at(index), None) from None
                entries.append((parent, None, awaited, dep.cond))
            resolved[index] = entries
        return resolved

    def _reserve_batch(
        self, specs: Sequence[TaskSpec], pools: Sequence[Pool], duplicate_of: Sequence[int | None]
    ) -> list[tuple[int, int] | None]:
        """The reservation interval of every new fixed-start task, checked cumulatively (the
        trial reservations are rolled back; ``create`` makes the real ones)."""
        intervals: list[tuple[int, int] | None] = [None] * len(specs)
        added: list[tuple[Pool, int]] = []
        try:
            for index, spec in enumerate(specs):
                fixed = spec.fixed_start
                if fixed is None or duplicate_of[index] is not None:
                    continue
                pool = pools[index]
                interval = self.reservation_interval(pool, spec, fixed)
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
        return intervals

    def _submit_plain_batch(
        self, now: int, specs: Sequence[TaskSpec], pools: list[Pool], duplicate_of: list[int | None]
    ) -> list[Submitted]:
        """The rest of ``submit_batch`` for a checked batch without dependencies or fixed starts:
        no cycle to look for, no reservation to make, and the tasks are created in batch order."""
        self._admission.admit_batch(specs, pools, duplicate_of)
        create = self.create
        results: list[Submitted] = []
        append = results.append
        for index, spec in enumerate(specs):
            dup = duplicate_of[index]
            if dup is not None:
                append(Submitted(dup, True))
            else:
                append(Submitted(create(now, pools[index], spec, None, None).id, False))
        return results

    # Estimates ----------------------------------------------------------------------------------

    def reservation_interval(self, pool: Pool, spec: TaskSpec, fixed: FixedStart) -> tuple[int, int]:
        """The span of ``pool``'s capacity a fixed-start task of ``spec`` reserves."""
        estimate = self._estimate(pool, spec.kind, spec.duration_hint)
        return fixed.start - fixed.tolerance, fixed.start + estimate + fixed.tolerance + 1

    def set_estimate(self, task: Task, spec: TaskSpec) -> None:
        """A task with a deadline: its estimated run time and latest start."""
        task.est = self._estimate(task.pool, spec.kind, spec.duration_hint)
        assert task.deadline is not None
        task.lst = task.deadline - task.est

    @staticmethod
    def _estimate(pool: Pool, kind: str, hint: int | None) -> int:
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

    # Creation -----------------------------------------------------------------------------------

    def create(
        self,
        now: int,
        pool: Pool,
        spec: TaskSpec,
        deps: Sequence[ResolvedDep] | None,
        interval: tuple[int, int] | None,
    ) -> Task:
        """Create an admitted task: register it, link it, and queue it (or let it wait)."""
        registry = self._registry
        retry = spec.retry if spec.retry is not None else pool.config.retry
        task = Task(registry.allocate_id(), pool, spec, now, retry)
        registry.add(task)
        if spec.deadline is not None:
            self.set_estimate(task, spec)
        self._totals["submitted"] += 1
        pool.totals["submitted"] += 1
        if interval is not None:
            pool.reservations.add(task.id, *interval)
        outbox = self._outbox
        if not deps and (task.key is None or not self._dependencies.is_awaited(task.key)):
            # Nothing to wait for but (perhaps) a start time: the common, fast path.
            registry.enter(task, _READY)
            if outbox.persist:
                outbox.mutations.append(PutTask(TaskRecord(task.id, pool.name, spec, now, _READY, task.max_attempts)))
            if task.fixed is not None:
                self._holds.arm(task, now)
                self._dispatcher.release(task, now, fresh=True)
            else:
                self._dispatcher.enqueue_ready(task, now)
            return task
        doomed = self._dependencies.link(task, deps)
        blocked = task.unmet > 0 or task.awaiting is not None
        status = _BLOCKED if blocked else _READY
        registry.enter(task, status)
        if outbox.persist:
            outbox.mutations.append(PutTask(TaskRecord(task.id, pool.name, spec, now, status, task.max_attempts)))
        if task.fixed is not None:
            self._holds.arm(task, now)
        if task.awaiting is not None and pool.config.await_timeout is not None:
            self._timers.push(now + pool.config.await_timeout, T_AWAIT, task, 0)
        if doomed is not None:
            message = f"dependency {doomed.id} ended as {doomed.status.value}"
            self._outcomes.finish(task, _SKIPPED, now, message)
        elif not blocked:
            self._dispatcher.release(task, now, fresh=True)
        elif outbox.transitions:
            outbox.publish(task, now)
        return task
