"""Dispatch: the lanes tasks wait in, the choice of the next task for a free slot, and starting it.

A ready task waits in one lane of its pool and class: FIFO, fair-share (SFQ) or, with a deadline,
earliest-latest-start (EDF); fixed-start work that is due waits in the pool's due queue, ahead of
everything. A task that won a slot but lacks a worker group with its labels, or units of a
resource, is parked until a slot or the resource frees up. Only the heads of the lanes are
scored (base + aging + urgency); per-class ceilings usually stop the search after one head.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from .actions import Dispatch, SetStatus
from .config import CoreConfig
from .outbox import Outbox
from .registry import Registry
from .resources import ResourceTable
from .state import (
    IN_DUE,
    IN_EDF,
    IN_FIFO,
    IN_SFQ,
    NO_LABELS,
    NOWHERE,
    PARKED_LABELS,
    PARKED_RESOURCE,
    T_LEASE,
    T_REFILL,
    T_TIMEOUT,
    WAITING_HOLD,
    Group,
    LabelKey,
    Pool,
    Task,
)
from .timers import Timers
from .types import CLASSES, NS_PER_S, EngineFault, TaskStatus

if TYPE_CHECKING:
    from .holds import Holds
    from .outcomes import Outcomes

_READY: Final = TaskStatus.READY
_RUNNING: Final = TaskStatus.RUNNING
_SCHEDULED: Final = TaskStatus.SCHEDULED
_SKIPPED: Final = TaskStatus.SKIPPED

# How soon to look at token-bucket waiters again when one looked wakeable but was not woken.
_REFILL_RETRY: Final = 1_000_000

# A holding fixed-start task sorts ahead of every due task that still needs a free slot.
_HOLDING_KEY: Final = -1.0


class Dispatcher:
    def __init__(
        self,
        config: CoreConfig,
        registry: Registry,
        resources: ResourceTable,
        timers: Timers,
        outbox: Outbox,
    ) -> None:
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
        self._registry = registry
        self._totals = registry.totals
        self._resources = resources
        self._has_resources = bool(config.resources)
        self._timers = timers
        self._outbox = outbox
        self._dirty: set[Pool] = set()
        self._refill_timer_at: int | None = None
        self.enabled = True
        """Whether ``dispatch`` starts anything (a driver that lost its leadership stops it)."""
        self.withheld: set[Pool] = set()
        """Pools whose tasks start nowhere for now (a pool moving away drains: ``Core.withhold``)."""

    def bind(self, holds: Holds, outcomes: Outcomes) -> None:
        self._holds = holds
        self._outcomes = outcomes

    def drop_pool(self, pool: Pool) -> None:
        """``pool`` left the engine: nothing of it is dispatched any more."""
        self._dirty.discard(pool)
        self.withheld.discard(pool)

    # Lanes --------------------------------------------------------------------------------------

    def mark_dirty(self, pool: Pool) -> None:
        """Something changed in ``pool`` that may let a task start: look at it on the next pass."""
        self._dirty.add(pool)

    def mark_all_dirty(self, pools: Iterable[Pool]) -> None:
        self._dirty.update(pools)

    @property
    def has_work(self) -> bool:
        """Whether the next pass may start something now."""
        return bool(self._dirty) and self.enabled

    def release(self, task: Task, now: int, fresh: bool = False) -> None:
        """Dependencies are satisfied: the task waits for its start time or becomes ready.
        ``fresh``: a new task, whose start timers are armed already."""
        fixed = task.fixed
        if fixed is not None:
            if not task.fixed_done and fixed.start > now:
                self._registry.move(task, _SCHEDULED)
                if self._outbox.transitions:
                    self._outbox.publish(task, now)
                if not fresh:
                    self._holds.check_soon(task, now)
                return
            self.make_due(task, now)
            return
        self.enqueue_ready(task, now)

    def enqueue_ready(self, task: Task, now: int) -> None:
        pool = task.pool
        if task.status is not _READY:
            self._registry.move(task, _READY)
            if self._outbox.transitions:
                self._outbox.publish(task, now)
        elif self._outbox.transitions and task.attempt == 0 and task.where == NOWHERE:
            self._outbox.publish(task, now)
        task.ready_at = now
        cls = task.cls
        if task.deadline is not None:
            pool.edf[cls].push(task.lst, task.id, task)
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
            pool.sfq[cls].push(start, task.id, task)
            task.where = IN_SFQ
        else:
            pool.fifo[cls].push(task.id, task)
            task.where = IN_FIFO
        pool.ready[cls] += 1
        if pool.autoscaler is not None:
            pool.autoscaler.record_arrivals(1)
        self._dirty.add(pool)

    def make_due(self, task: Task, now: int) -> None:
        """A fixed-start task whose start has come (or a retried fixed-start attempt)."""
        guard = task.guard
        if guard is not None:
            task.guard = None
            previous = self._registry.get(guard)
            if previous is not None and not previous.status.terminal:
                self._outcomes.finish(task, _SKIPPED, now, f"previous occurrence {guard} is still running")
                return
        pool = task.pool
        if task.where == WAITING_HOLD:
            self.unqueue(task)
        self._registry.move(task, _READY)
        if self._outbox.transitions:
            self._outbox.publish(task, now)
        task.ready_at = now
        fixed = task.fixed
        start = fixed.start if fixed is not None else now
        pool.due.push(_HOLDING_KEY if task.holding else float(start), task.id, task)
        pool.due_live += 1
        task.where = IN_DUE
        if pool.autoscaler is not None:
            pool.autoscaler.record_arrivals(1)
        self._dirty.add(pool)

    def unqueue(self, task: Task) -> None:
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

    def _requeue(self, task: Task, now: int) -> None:
        """Put a parked task back where dispatch will see it."""
        if task.fixed is not None and (task.holding or task.fixed_done or task.fixed.start <= now):
            pool = task.pool
            pool.due.push(_HOLDING_KEY if task.holding else float(task.fixed.start), task.id, task)
            pool.due_live += 1
            task.where = IN_DUE
            self._dirty.add(pool)
            return
        ready_at = task.ready_at
        self.enqueue_ready(task, now)
        task.ready_at = ready_at

    # Freed capacity -----------------------------------------------------------------------------

    def slot_freed(self, pool: Pool, group: Group) -> None:
        if pool.hold_waiters.heap:
            self._holds.grant(pool)
        if pool.label_waiters:
            self.wake_label_waiters(pool, group)
        self._dirty.add(pool)

    def wake_label_waiters(self, pool: Pool, group: Group) -> None:
        free = group.capacity - group.busy
        while free > 0:
            best_lane = None
            best_task: Task | None = None
            for key, lane in pool.label_waiters.items():
                if not key <= group.key:
                    continue
                task = lane.peek()
                if task is not None and (best_task is None or task.id < best_task.id):
                    best_task, best_lane = task, lane
            if best_task is None or best_lane is None:
                return
            best_lane.pop()
            best_task.qgen += 1
            best_task.where = NOWHERE
            self._requeue(best_task, best_task.ready_at)
            free -= 1

    def wake_resources(self, now: int) -> None:
        resources = self._resources
        for task_id in resources.wake(now):
            task = self._registry.get(task_id)
            if task is not None and task.where == PARKED_RESOURCE:
                task.where = NOWHERE
                task.qgen += 1
                task.woken = True
                self._requeue(task, now)
            else:
                resources.unpark(task_id)

    def on_refill_timer(self, now: int) -> None:
        self._refill_timer_at = None
        self.wake_resources(now)
        self._arm_refill(now)

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
            self._timers.push(when, T_REFILL, None, 0)

    # The pass -----------------------------------------------------------------------------------

    def dispatch(self, now: int) -> None:
        """Wake resource waiters, then start what the changed pools can start."""
        if self._has_resources:
            self.wake_resources(now)
        if self._dirty and self.enabled:
            if self.withheld:
                self._dirty -= self.withheld
            dirty = sorted(self._dirty, key=_pool_index)
            self._dirty.clear()
            for pool in dirty:
                self._dispatch_pool(pool, now)
            if self.withheld:
                self._dirty -= self.withheld
            if self._dirty:
                # Dispatch can wake label waiters of the same pool; one more pass settles them.
                again = sorted(self._dirty, key=_pool_index)
                self._dirty.clear()
                for pool in again:
                    self._dispatch_pool(pool, now)
        if self._has_resources:
            self._arm_refill(now)

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
        # The head of each lane (FIFO or fair share at 2 * class, deadlines at 2 * class + 1) and its
        # score, looked up once per pass: ``now`` does not change within it, and a lane's head
        # changes only when this loop pops it (starting a task never adds one to a ready lane).
        seen = [False] * (2 * CLASSES)
        heads: list[Task | None] = [None] * (2 * CLASSES)
        scores = [0.0] * (2 * CLASSES)
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
                slot = cls + cls
                if seen[slot]:
                    task, score = heads[slot], scores[slot]
                else:
                    task = heads[slot] = lanes[cls].peek()
                    if task is not None:
                        score = scores[slot] = base[cls] + min(aging[cls] * (now - task.submitted_at), age_cap[cls])
                    seen[slot] = True
                if task is not None and (
                    score > best_score
                    or (score == best_score and best is not None and task.id < best.id and cls == best.cls)
                ):
                    best, best_score, best_lane = task, score, 0
                if edf_live[cls]:
                    slot += 1
                    if seen[slot]:
                        task, score = heads[slot], scores[slot]
                    else:
                        task = heads[slot] = edf[cls].peek()
                        if task is not None:
                            waited = now - task.submitted_at
                            score = base[cls] + min(aging[cls] * waited, age_cap[cls]) + self.urgency(task, now)
                            scores[slot] = score
                        seen[slot] = True
                    if task is not None and (
                        score > best_score
                        or (score == best_score and best is not None and cls == best.cls and task.id < best.id)
                    ):
                        best, best_score, best_lane = task, score, 1
            if best is None:
                return
            cls = best.cls
            seen[cls + cls + best_lane] = False  # the popped lane shows its next head
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

    def urgency(self, task: Task, now: int) -> float:
        """The deadline urgency term of a waiting task's score at ``now``."""
        slack = task.lst - now
        horizon = task.est if task.est > self._u_window else self._u_window
        if slack >= horizon:
            return 0.0
        if slack >= 0:
            return self._u_max * (1.0 - slack / horizon)
        return self._u_max + min(self._u_rate * -slack, self._u_cap)

    @staticmethod
    def _find_group(pool: Pool, labels: LabelKey) -> Group | None:
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
            waiters.push(float(task.id), task.id, task)
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
        # Start it.
        bucket = pool.window.integrate_current(now, pool.busy, pool.capacity)
        if task.holding:
            task.holding = False
            pool.held -= 1
        pool.busy += 1
        group.busy += 1
        task.attempt += 1
        config = pool.config
        lease = self._outcomes.open_lease(task, group, now)
        lease_id = lease.id
        task.started_at = now
        self._registry.start(task)
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
        self._totals["dispatched"] += 1
        pool.totals["dispatched"] += 1
        spec = task.spec
        assert spec is not None
        timeout = spec.timeout
        if timeout is not None:
            self._timers.push(now + timeout, T_TIMEOUT, lease, lease_id)
        if lease.expires_at is not None:
            self._timers.push(lease.expires_at, T_LEASE, lease, lease_id)
        outbox = self._outbox
        if outbox.persist:
            outbox.mutations.append(SetStatus(task.id, _RUNNING, task.attempt, now))
        if outbox.transitions:
            outbox.publish(task, now)
        outbox.dispatches.append(
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


def _pool_index(pool: Pool) -> int:
    return pool.index
