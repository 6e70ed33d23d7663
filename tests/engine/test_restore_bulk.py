"""The quiet restore path against the general one, on random histories.

Without transition events to publish, ``restore`` enters a simple live task (no dependencies, no
fixed start, not running or retrying) Ready at once and queues it, instead of entering it
Blocked, linking, resuming and releasing it. With ``emit_transitions`` it takes the general path
for every task. Both engines, restored from the same recovered state, must then be the same:
same task views, same snapshot, same mutations and resolutions, and the same dispatches, in the
same order, as time goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cronoq.engine import (
    Core,
    CoreConfig,
    Dep,
    EdgeCond,
    Failure,
    Fairness,
    FixedStart,
    Lease,
    PoolConfig,
    Priority,
    RetryPolicy,
    StepOutput,
    Success,
    TaskSpec,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .sim import START, Sim, ns
from .test_restore import recover

KEYS = (None, None, None, "k1", "k2")
TENANTS = (None, "a", "b")


def pools(workers: int = 0) -> tuple[PoolConfig, ...]:
    retry = RetryPolicy(max_attempts=3, initial_backoff=ns(1), max_backoff=ns(4), jitter=False)
    return (
        PoolConfig("main", max_workers=8, initial_workers=workers, retry=retry),
        PoolConfig("fair", max_workers=8, initial_workers=workers, retry=retry, fairness=Fairness({"a": 2.0})),
    )


@dataclass
class Submit:
    pool: str
    priority: Priority
    key: str | None
    tenant: str | None
    deadline_s: float | None
    start_s: float | None
    parents: list[int] = field(default_factory=list)  # indexes into the tasks submitted before


@dataclass
class Run:
    """Give the pools slots for one step, then end some of what runs (success or failure)."""

    slots: int
    outcomes: list[bool]


@dataclass
class Advance:
    seconds: float


submits = st.builds(
    Submit,
    pool=st.sampled_from(("main", "fair")),
    priority=st.sampled_from(list(Priority)),
    key=st.sampled_from(KEYS),
    tenant=st.sampled_from(TENANTS),
    deadline_s=st.one_of(st.none(), st.none(), st.floats(1, 30)),
    start_s=st.one_of(st.none(), st.none(), st.none(), st.floats(0.5, 20)),
    parents=st.lists(st.integers(0, 40), max_size=2),
)
runs = st.builds(Run, slots=st.integers(1, 3), outcomes=st.lists(st.booleans(), max_size=3))
advances = st.builds(Advance, seconds=st.floats(0.1, 6))
operations = st.lists(st.one_of(submits, submits, submits, runs, advances), min_size=1, max_size=40)


def play(ops: list[Submit | Run | Advance]) -> Sim:
    sim = Sim.make(*pools(), persist=True)
    ids: list[int] = []
    for op in ops:
        if isinstance(op, Submit):
            spec = TaskSpec(
                payload=len(ids),
                pool=op.pool,
                priority=op.priority,
                key=op.key,
                tenant=op.tenant,
                deadline=None if op.deadline_s is None else sim.now + ns(op.deadline_s),
                fixed_start=None if op.start_s is None else FixedStart(sim.now + ns(op.start_s), ns(2)),
                deps=tuple(Dep(ids[i], EdgeCond.ON_COMPLETE) for i in op.parents if i < len(ids)),
            )
            result = sim.core.submit(sim.now, spec)
            sim.step()
            if result.id:
                ids.append(result.id)
        elif isinstance(op, Run):
            for name in ("main", "fair"):
                sim.core.set_group_capacity(sim.now, name, {}, op.slots)
            sim.step()
            for name in ("main", "fair"):
                sim.core.set_group_capacity(sim.now, name, {}, 0)
            sim.step()
            for lease, success in zip(list(sim.running.values()), op.outcomes, strict=False):
                sim.complete(lease, Success(None) if success else Failure("boom"))
        else:
            sim.advance(op.seconds)
    return sim


def restored(old: Sim, transitions: bool) -> tuple[Sim, StepOutput]:
    lease_high = max((lease.id for lease in old.dispatched), default=0)
    now = old.now + ns(1)
    core = Core(CoreConfig(pools=pools(), persist=True, emit_transitions=transitions), now=now)
    core.restore(now, recover(old.persisted, lease_high))
    return Sim(core, now=now), core.drain()


def leases(dispatched: list[Lease]) -> list[tuple[int, int, str]]:
    return [(lease.task_id, lease.attempt, lease.pool) for lease in dispatched]


def assert_same(quiet: Sim, general: Sim) -> None:
    assert quiet.core.list_tasks(limit=10**6) == general.core.list_tasks(limit=10**6)
    assert quiet.core.snapshot(quiet.now) == general.core.snapshot(general.now)
    assert leases(quiet.dispatched) == leases(general.dispatched)
    assert quiet.resolved == general.resolved
    assert quiet.persisted == general.persisted


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.integers(1, 4))
def test_quiet_restore_leaves_the_engine_the_general_path_leaves(ops: list[Submit | Run | Advance], slots: int) -> None:
    old = play(ops)
    quiet, quiet_out = restored(old, transitions=False)
    general, general_out = restored(old, transitions=True)
    assert quiet_out.mutations == general_out.mutations
    assert quiet_out.resolves == general_out.resolves
    assert not quiet_out.events
    quiet.core.check_invariants()
    assert_same(quiet, general)
    # Then both run the backlog: same dispatches in the same order, step after step.
    for sim in (quiet, general):
        for name in ("main", "fair"):
            sim.core.set_group_capacity(sim.now, name, {}, slots)
        sim.step()
    assert_same(quiet, general)
    for _ in range(6):
        for sim in (quiet, general):
            for lease in list(sim.running.values())[:slots]:
                sim.complete(lease, Success(None) if lease.task_id % 3 else Failure("boom"))
            sim.advance(3)
        assert_same(quiet, general)


def test_a_large_plain_backlog_is_queued_in_submission_order() -> None:
    old = Sim.make(*pools(), persist=True)
    specs = [TaskSpec(payload=i, pool="main", priority=Priority.NORMAL) for i in range(500)]
    ids = old.submit_batch(specs)
    quiet, _ = restored(old, transitions=False)
    assert quiet.now > START
    quiet.core.set_group_capacity(quiet.now, "main", {}, 8)
    quiet.step()
    for _ in range(70):
        for lease in list(quiet.running.values()):
            quiet.complete(lease)
    assert [lease.task_id for lease in quiet.dispatched] == ids


def test_a_child_released_by_a_parent_that_restore_ends_is_queued_once() -> None:
    # The parent was running its last attempt when the leader died: restore ends it (the attempt
    # counts as used) and that end releases its child, which must then be Ready once, not twice.
    def submit(*parents: int) -> Submit:
        return Submit("main", Priority.CRITICAL, None, None, None, None, list(parents))

    ops: list[Submit | Run | Advance] = [
        submit(),
        Run(1, [True]),
        submit(),  # the parent: fails twice, then runs its third and last attempt
        Run(1, [False]),
        Advance(1.0),
        Run(1, [False]),
        Advance(2.0),
        submit(1),  # the child, waiting for the parent to end either way
        Run(1, []),
    ]
    old = play(ops)
    for transitions in (False, True):
        sim, _ = restored(old, transitions)
        sim.core.check_invariants()
        sim.core.set_group_capacity(sim.now, "main", {}, 4)
        sim.step()
        sim.core.check_invariants()
        assert [lease.task_id for lease in sim.dispatched] == [old.core.last_id]
