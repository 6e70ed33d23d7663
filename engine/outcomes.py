"""Attempts and ends: leases, outcomes, heartbeats, retries, terminal statuses and retention.

An attempt holds a lease from its start until its outcome, a timeout, a lease expiry or the end
of its task. Every terminal status goes through ``finish``: the task leaves its queue, lease,
hold and reservation, its end is persisted and resolved, its children learn of it, and it stays
retained (for lookups, keys and late dependents) until the retention window lets it go.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from .actions import Abort, AbortReason, Resolve, SetStatus
from .config import CoreConfig
from .ids import IdAllocator
from .limits import MAX_DURATION, add_ns
from .outbox import Outbox
from .registry import Registry
from .resources import ResourceTable
from .state import T_LEASE, T_RETRY, Group, LeaseState, Pool, Task
from .stats import LogLinearHistogram, WindowBucket
from .timers import Timers
from .types import (
    NS_PER_S,
    CancelledByExecutor,
    EngineFault,
    Failure,
    Outcome,
    Success,
    TaskStatus,
)

if TYPE_CHECKING:
    from .dependencies import Dependencies
    from .dispatch import Dispatcher
    from .holds import Holds

_SUCCEEDED: Final = TaskStatus.SUCCEEDED
_FAILED: Final = TaskStatus.FAILED
_DEAD: Final = TaskStatus.DEAD_LETTERED
_CANCELLED: Final = TaskStatus.CANCELLED
_MISSED: Final = TaskStatus.MISSED
_RETRYING: Final = TaskStatus.RETRYING


class Outcomes:
    def __init__(
        self, config: CoreConfig, registry: Registry, resources: ResourceTable, timers: Timers, outbox: Outbox
    ) -> None:
        self._lease_ids = IdAllocator(config.id_epoch, config.id_shard)
        self._leases: dict[int, LeaseState] = {}
        self._rng = random.Random(config.seed)
        self._retained: deque[Task] = deque()
        self._retention = config.retention
        self._retention_max = config.retention_max
        self._registry = registry
        self._resources = resources
        self._timers = timers
        self._outbox = outbox

    def bind(self, dispatcher: Dispatcher, holds: Holds, dependencies: Dependencies) -> None:
        self._dispatcher = dispatcher
        self._holds = holds
        self._dependencies = dependencies

    # Leases -------------------------------------------------------------------------------------

    def open_lease(self, task: Task, group: Group, now: int) -> LeaseState:
        """A new attempt of ``task`` on a slot of ``group``."""
        lease = LeaseState(self._lease_ids.allocate(), task, group, now, task.pool.config.lease_ttl)
        self._leases[lease.id] = lease
        task.lease = lease
        return lease

    def lease(self, lease_id: int) -> LeaseState | None:
        return self._leases.get(lease_id)

    @property
    def lease_count(self) -> int:
        return len(self._leases)

    def active_leases(self) -> list[tuple[int, int]]:
        """(lease id, task id) of every running attempt."""
        return [(lease_id, state.task.id) for lease_id, state in self._leases.items()]

    @property
    def last_lease_id(self) -> int:
        return self._lease_ids.high_water

    def raise_lease_floor(self, high_water: int) -> None:
        self._lease_ids.raise_floor(high_water)

    def heartbeat(self, now: int, lease_id: int) -> bool:
        lease = self._leases.get(lease_id)
        if lease is None or not lease.active:
            return False
        ttl = lease.task.pool.config.lease_ttl
        if ttl is not None:
            lease.expires_at = now + ttl
        return True

    # Outcomes -----------------------------------------------------------------------------------

    def complete(self, now: int, lease_id: int, outcome: Outcome) -> bool:
        """Report the outcome of an attempt. Stale reports change nothing and return False."""
        lease = self._leases.get(lease_id)
        if lease is None or not lease.active:
            self._registry.totals["stale_completions"] += 1
            if lease is not None:
                lease.task.pool.totals["stale_completions"] += 1
            return False
        task = lease.task
        try:
            bucket = self._end_lease(lease, now, ran=True)
            if type(outcome) is Success:
                bucket.succeeded += 1
                self.finish(task, _SUCCEEDED, now, None, outcome.output, True)
            elif isinstance(outcome, Failure):
                bucket.failed += 1
                if outcome.permanent:
                    self.finish(task, _FAILED, now, outcome.message)
                else:
                    self.fail_attempt(task, now, outcome.message, outcome.retry_after)
            elif isinstance(outcome, CancelledByExecutor):
                self.finish(task, _CANCELLED, now, outcome.message or "cancelled by the executor")
        except Exception as error:
            raise EngineFault.wrap(error, task_id=task.id) from error
        return True

    def complete_many(self, now: int, reports: Iterable[tuple[int, Outcome]]) -> list[bool]:
        """``complete`` for each (lease id, outcome) in order, in one call."""
        complete = self.complete
        return [complete(now, lease_id, outcome) for lease_id, outcome in reports]

    def on_timeout(self, lease: LeaseState, now: int) -> None:
        """The attempt ran past its task's timeout: stop it and fail the attempt."""
        task = lease.task
        self._registry.count("timeouts", task.pool)
        spec = task.spec
        timeout = spec.timeout if spec is not None and spec.timeout is not None else 0
        self._outbox.aborts.append(Abort(lease.id, task.id, AbortReason.TIMEOUT))
        self._end_lease(lease, now, ran=True)
        task.pool.window.current(now).failed += 1
        self.fail_attempt(task, now, f"attempt timed out after {timeout / NS_PER_S:g}s", None)

    def on_lease_timer(self, lease: LeaseState, generation: int, now: int) -> None:
        """The lease's TTL may have run out: stop the attempt unless a heartbeat renewed it."""
        expires = lease.expires_at
        if expires is not None and expires > now:
            self._timers.push(expires, T_LEASE, lease, generation)
            return
        task = lease.task
        self._registry.count("lease_expiries", task.pool)
        self._outbox.aborts.append(Abort(lease.id, task.id, AbortReason.LEASE_EXPIRED))
        self._end_lease(lease, now, ran=True)
        task.pool.window.current(now).failed += 1
        self.fail_attempt(task, now, "lease expired: no heartbeat within the lease TTL", None)

    def on_retry_timer(self, task: Task, now: int) -> None:
        task.retry_at = None
        if task.fixed is not None:
            self._dispatcher.make_due(task, now)
        else:
            self._dispatcher.enqueue_ready(task, now)

    def _end_lease(self, lease: LeaseState, now: int, ran: bool) -> WindowBucket:
        """Free the attempt's slot and resources; record its run time. Returns the metrics
        bucket of ``now``."""
        lease.active = False
        del self._leases[lease.id]
        task = lease.task
        task.lease = None
        pool = task.pool
        bucket = pool.window.integrate_current(now, pool.busy, pool.capacity)
        pool.busy -= 1
        group = lease.group
        group.busy -= 1
        spec = task.spec
        if spec is not None and spec.resources:
            self._resources.release(spec.resources, now)
            self._dispatcher.wake_resources(now)
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
        self._dispatcher.slot_freed(pool, group)
        return bucket

    def fail_attempt(self, task: Task, now: int, message: str, retry_after: int | None) -> None:
        """An attempt failed: retry after the backoff, or dead-letter when none is left."""
        if task.attempt >= task.max_attempts:
            self.finish(task, _DEAD, now, message)
            return
        policy = task.retry
        delay = policy.backoff(task.attempt + 1)
        if policy.jitter and delay > 0:
            delay = int(self._rng.random() * delay)
        if retry_after is not None and retry_after > delay:
            delay = retry_after if retry_after < MAX_DURATION else MAX_DURATION
        task.retry_at = add_ns(now, delay)
        task.message = message
        self._registry.move(task, _RETRYING)
        self._registry.count("retries", task.pool)
        task.pool.window.current(now).retried += 1
        outbox = self._outbox
        if outbox.persist:
            outbox.mutations.append(SetStatus(task.id, _RETRYING, task.attempt, now, message, task.retry_at))
        if outbox.transitions:
            outbox.publish(task, now, message)
        self._timers.push(task.retry_at, T_RETRY, task, task.retry_at)

    def wait_retry(self, task: Task, retry_at: int) -> None:
        """A recovered task that was waiting for a retry waits again."""
        task.retry_at = retry_at
        self._registry.move(task, _RETRYING)
        self._timers.push(retry_at, T_RETRY, task, retry_at)

    # Ends ---------------------------------------------------------------------------------------

    def finish(
        self,
        task: Task,
        status: TaskStatus,
        now: int,
        message: str | None,
        output: object = None,
        has_output: bool = False,
    ) -> None:
        """End a live task with a terminal ``status`` (a task that ended already stays as it is)."""
        # The status changes first (checked against the status machine), then the task lets go
        # of its lease, queue, hold, resources and reservation.
        if not self._registry.end(task, status):
            return
        pool = task.pool
        lease = task.lease
        if lease is not None:
            self._outbox.aborts.append(Abort(lease.id, task.id, message or status.value))
            self._end_lease(lease, now, ran=False)
        if task.where:
            self._dispatcher.unqueue(task)
        if task.holding:
            self._holds.drop(task)
        spec = task.spec
        if spec is not None and spec.resources:
            self._resources.unpark(task.id)  # also ends a claim on units it was woken for
        if task.fixed is not None:
            pool.reservations.remove(task.id)
            if not task.fixed_done and status in (_MISSED, _FAILED) and task.started_at is None:
                task.fixed_done = True
        task.finished_at = now
        task.message = message
        task.has_output = has_output
        if task.deadline is not None and status is _SUCCEEDED:
            bucket = pool.window.current(now)
            bucket.objective_total += 1
            if now <= task.deadline:
                bucket.objective_met += 1
        if task.awaiting is not None:
            self._dependencies.forget(task)
        outbox = self._outbox
        if outbox.persist:
            outbox.mutations.append(SetStatus(task.id, status, task.attempt, now, message, None, output, has_output))
        outbox.resolves.append(
            Resolve(task.id, pool.name, task.key, status, task.attempt, now, message, output, has_output)
        )
        task.spec = None  # drop the payload; the record stays for lookups and dependents
        self._retained.append(task)
        if task.children:
            self._dependencies.parent_ended(task, now)

    def retain(self, tasks: Iterable[Task]) -> None:
        """Recovered terminal tasks, oldest end first, join the retained ones."""
        self._retained.extend(tasks)

    def retain_more(self, tasks: Iterable[Task]) -> None:
        """Terminal tasks handed over from another shard (oldest end first) join the retained
        ones, which stay in the order they ended (``expire_retained`` stops at the first kept)."""
        merged = heapq.merge(self._retained, tasks, key=_finished_at)
        self._retained = deque(merged)

    def drop_retained(self, pool: Pool) -> None:
        """Let go of the retained tasks of ``pool`` (it left the engine; the registry forgot them)."""
        self._retained = deque(task for task in self._retained if task.pool is not pool)

    @property
    def has_retained(self) -> bool:
        return bool(self._retained)

    def expire_retained(self, now: int) -> None:
        """Let go of terminal tasks past the retention window (or beyond its size limit)."""
        retained = self._retained
        horizon = now - self._retention
        limit = self._retention_max
        forget = self._registry.forget
        while retained:
            task = retained[0]
            finished = task.finished_at
            assert finished is not None
            if finished > horizon and len(retained) <= limit:
                return
            retained.popleft()
            forget(task)


def _finished_at(task: Task) -> int:
    return task.finished_at or 0
