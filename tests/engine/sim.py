"""A virtual-time harness for driving the engine in tests.

``Sim`` owns a ``Core`` and a clock. Every call advances nothing by itself; ``advance(seconds)``
moves the clock, firing timers at their exact times (``tick`` at each wakeup on the way). Dispatches
are collected in ``running`` (lease id -> Lease) so tests can complete them explicitly, or
``auto_complete`` them after a per-task run time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cronoq.engine import (
    Abort,
    Core,
    CoreConfig,
    Failure,
    Lease,
    Outcome,
    PoolConfig,
    Resolve,
    Scale,
    StatusEvent,
    StepOutput,
    Success,
    TaskInfo,
    TaskSpec,
)
from cronoq.engine.types import NS_PER_S

START = 1_700_000_000 * NS_PER_S  # a fixed, realistic epoch for every test


def ns(seconds: float) -> int:
    return round(seconds * NS_PER_S)


@dataclass
class Sim:
    core: Core
    now: int = START
    running: dict[int, Lease] = field(default_factory=dict)
    dispatched: list[Lease] = field(default_factory=list)
    resolved: list[Resolve] = field(default_factory=list)
    events: list[StatusEvent] = field(default_factory=list)
    aborts: list[Abort] = field(default_factory=list)
    scales: list[Scale] = field(default_factory=list)
    persisted: list[object] = field(default_factory=list)
    check: bool = True
    # When set, called for each dispatch to decide (run seconds, outcome); completed automatically.
    runner: Callable[[Lease], tuple[float, Outcome]] | None = None
    _scheduled: list[tuple[int, int, Outcome]] = field(default_factory=list)

    @classmethod
    def make(cls, *pools: PoolConfig, check: bool = True, **config: object) -> Sim:
        if not pools:
            pools = (PoolConfig("default", max_workers=4, initial_workers=4),)
        core = Core(CoreConfig(pools=pools, **config), now=START)  # type: ignore[arg-type]
        return cls(core, check=check)

    @property
    def t(self) -> float:
        """Seconds since the start of the test."""
        return (self.now - START) / NS_PER_S

    def submit(self, payload: object = None, **spec: object) -> int:
        result = self.core.submit(self.now, TaskSpec(payload=payload, **spec))  # type: ignore[arg-type]
        self.step()
        return result.id

    def submit_batch(self, specs: Sequence[TaskSpec]) -> list[int]:
        results = self.core.submit_batch(self.now, specs)
        self.step()
        return [r.id for r in results]

    def complete(self, lease: Lease | int, outcome: Outcome | None = None) -> bool:
        lease_id = lease if isinstance(lease, int) else lease.id
        ok = self.core.complete(self.now, lease_id, outcome if outcome is not None else Success(None))
        self.running.pop(lease_id, None)
        self.step()
        return ok

    def fail(self, lease: Lease | int, message: str = "boom", permanent: bool = False) -> bool:
        return self.complete(lease, Failure(message, permanent))

    def step(self) -> StepOutput:
        self.core.tick(self.now)
        output = self.core.drain()
        self.persisted.extend(output.mutations)
        # A task's intermediate events all precede its terminal one, as they did in the step.
        self.events.extend(output.events)
        for resolved in output.resolves:
            self.resolved.append(resolved)
            self.events.append(resolved.event)
        aborted = set()
        for abort in output.aborts:
            self.aborts.append(abort)
            self.running.pop(abort.lease_id, None)
            aborted.add(abort.lease_id)
        for dispatch in output.dispatches:
            lease = dispatch.lease
            self.dispatched.append(lease)
            if lease.id in aborted:
                continue  # dispatched and stopped again within the step
            self.running[lease.id] = lease
            if self.runner is not None:
                seconds, outcome = self.runner(lease)
                self._scheduled.append((self.now + ns(seconds), lease.id, outcome))
                self._scheduled.sort(key=lambda item: (item[0], item[1]))
        self.scales.extend(output.scales)
        if self.check:
            self.core.check_invariants()
        return output

    def advance(self, seconds: float) -> None:
        """Move the clock forward, stopping at every timer and scheduled completion on the way."""
        target = self.now + ns(seconds)
        while True:
            wake = self.core.next_wakeup()
            done_at = self._scheduled[0][0] if self._scheduled else None
            candidates = [w for w in (wake, done_at) if w is not None and w <= target]
            if not candidates:
                break
            self.now = max(self.now, min(candidates))
            while self._scheduled and self._scheduled[0][0] <= self.now:
                _, lease_id, outcome = self._scheduled.pop(0)
                if lease_id in self.running:
                    self.core.complete(self.now, lease_id, outcome)
                    self.running.pop(lease_id, None)
            self.step()
        self.now = target
        self.step()

    def set_capacity(self, capacity: int, pool: str = "default", labels: dict[str, str] | None = None) -> None:
        """Report a pool's (or one worker group's) capacity, then step."""
        self.core.set_group_capacity(self.now, pool, labels or {}, capacity)
        self.step()

    def info(self, ref: int | str) -> TaskInfo:
        info = self.core.get(ref)
        assert info is not None, f"no task {ref!r}"
        return info

    def status(self, ref: int | str) -> str:
        info = self.core.get(ref)
        assert info is not None, f"no task {ref!r}"
        return info.status.value

    def lease_of(self, task_id: int) -> Lease:
        for lease in self.running.values():
            if lease.task_id == task_id:
                return lease
        raise AssertionError(f"task {task_id} is not running")

    def order(self) -> list[object]:
        """Payloads in dispatch order."""
        return [lease.payload for lease in self.dispatched]
