"""Queue bounds, overflow policies and autoscaling, driven through the engine.

Spec: book "Backpressure" (bounds, overflow policies, shedding rules), reference-facts.md
section 2 (OverflowPolicy, SubmitError Full/Overloaded), book "Pools and autoscaling".
"""

from __future__ import annotations

from itertools import pairwise

import pytest
from cronoq.engine import (
    AdmissionError,
    AutoscaleConfig,
    Bounds,
    Dep,
    EdgeCond,
    FixedStart,
    OverflowPolicy,
    PoolConfig,
    Priority,
    ResourceConfig,
    RetryPolicy,
    StepOutput,
    SubmitCode,
    Success,
    TaskSpec,
    UnknownDependencyPolicy,
)

from .sim import Sim, ns

LOW, NORMAL, HIGH, CRITICAL = Priority.LOW, Priority.NORMAL, Priority.HIGH, Priority.CRITICAL


def bounded(
    max_pending: int | None = None,
    per_class: tuple[int | None, int | None, int | None, int | None] = (None, None, None, None),
    overflow: OverflowPolicy = OverflowPolicy.WAIT,
    workers: int = 0,
    **config: object,
) -> Sim:
    pool = PoolConfig(
        "default",
        max_workers=10,
        initial_workers=workers,
        bounds=Bounds(max_pending, per_class),
        overflow=overflow,
        retry=RetryPolicy(jitter=False),
    )
    return Sim.make(pool, **config)


def code_of(sim: Sim, **spec: object) -> SubmitCode:
    with pytest.raises(AdmissionError) as err:
        sim.submit("refused", **spec)
    return err.value.code


def space_actions(output: StepOutput) -> list[str | None]:
    return output.space


# ---------------------------------------------------------------------------------------------
# Bounds


def test_library_queues_are_unbounded_by_default() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=0))
    for i in range(500):
        sim.submit(i)
    assert sim.core.snapshot(sim.now).pending == 500


def test_pool_max_pending_under_wait_is_full_then_space_available() -> None:
    sim = bounded(max_pending=2)
    sim.submit("a")
    sim.submit("b")
    assert code_of(sim) is SubmitCode.FULL
    # A task leaving the pending state (it starts running) makes room and says so.
    sim.core.set_capacity(sim.now, "default", 1)
    actions = sim.step()
    assert space_actions(actions) == ["default"]
    assert sim.status(sim.submit("c")) == "ready"


def test_space_available_is_sent_only_after_a_full_refusal() -> None:
    sim = bounded(max_pending=5, workers=1)
    tid = sim.submit("a")
    actions = sim.step()
    sim.complete(sim.lease_of(tid))
    assert space_actions(actions) == []
    assert space_actions(sim.step()) == []


def test_cancelling_a_pending_task_makes_space() -> None:
    sim = bounded(max_pending=1)
    first = sim.submit("a")
    assert code_of(sim) is SubmitCode.FULL
    sim.core.cancel(sim.now, first)
    assert space_actions(sim.step()) == ["default"]
    sim.submit("b")


def test_running_tasks_are_not_pending_but_retrying_ones_are() -> None:
    sim = bounded(max_pending=1, workers=1)
    running = sim.submit("runs")
    sim.submit("waits")
    assert code_of(sim) is SubmitCode.FULL
    snap = sim.core.snapshot(sim.now)
    assert (snap.pending, snap.running) == (1, 1)
    sim.fail(sim.lease_of(running))  # the other task starts; the failed one is retrying
    assert sim.status(running) == "retrying"
    assert sim.core.snapshot(sim.now).pending == 1
    assert code_of(sim) is SubmitCode.FULL


def test_blocked_tasks_count_as_pending() -> None:
    sim = bounded(max_pending=2, workers=1)
    parent = sim.submit("parent")
    sim.submit("child", deps=(Dep(parent),))
    sim.submit("other")
    assert code_of(sim) is SubmitCode.FULL


def test_per_class_bound_only_limits_its_class() -> None:
    sim = bounded(per_class=(None, None, None, 2))
    sim.submit("low", priority=LOW)
    sim.submit("low", priority=LOW)
    assert code_of(sim, priority=LOW) is SubmitCode.FULL
    for _ in range(5):
        sim.submit("normal", priority=NORMAL)
    sim.core.set_capacity(sim.now, "default", 6)
    assert space_actions(sim.step()) == ["default"]
    sim.submit("low again", priority=LOW)


def test_global_bound_spans_pools() -> None:
    sim = Sim.make(
        PoolConfig("a", max_workers=4, initial_workers=0),
        PoolConfig("b", max_workers=4, initial_workers=0),
        global_bounds=Bounds(max_pending=3),
    )
    sim.submit("x", pool="a")
    sim.submit("x", pool="a")
    sim.submit("x", pool="b")
    assert code_of(sim, pool="b") is SubmitCode.FULL
    assert code_of(sim, pool="a") is SubmitCode.FULL
    sim.core.set_capacity(sim.now, "a", 1)
    actions = sim.step()
    assert None in space_actions(actions)
    sim.submit("fits", pool="b")


def test_global_per_class_bound() -> None:
    sim = Sim.make(
        PoolConfig("a", max_workers=4, initial_workers=0),
        PoolConfig("b", max_workers=4, initial_workers=0),
        global_bounds=Bounds(per_class=(None, 1, None, None)),
    )
    sim.submit("x", pool="a", priority=HIGH)
    assert code_of(sim, pool="b", priority=HIGH) is SubmitCode.FULL
    sim.submit("y", pool="b", priority=NORMAL)


def test_batch_exceeding_a_bound_is_refused_whole() -> None:
    sim = bounded(max_pending=3)
    sim.submit("a")
    with pytest.raises(AdmissionError) as err:
        sim.submit_batch([TaskSpec(payload=i) for i in range(3)])
    assert err.value.code is SubmitCode.FULL
    assert err.value.index is not None
    assert len(sim.core.list_tasks()) == 1
    sim.submit_batch([TaskSpec(payload=i) for i in range(2)])


def test_duplicate_submission_is_answered_even_when_full() -> None:
    sim = bounded(max_pending=1)
    tid = sim.submit("a", key="k")
    result = sim.core.submit(sim.now, TaskSpec(payload="a", key="k"))
    assert result.duplicate and result.id == tid


# ---------------------------------------------------------------------------------------------
# Reject


def test_reject_policy_answers_overloaded() -> None:
    sim = bounded(max_pending=1, overflow=OverflowPolicy.REJECT)
    sim.submit("a")
    assert code_of(sim) is SubmitCode.OVERLOADED
    assert code_of(sim, priority=CRITICAL) is SubmitCode.OVERLOADED
    with pytest.raises(AdmissionError) as err:
        sim.submit_batch([TaskSpec()])
    assert err.value.code is SubmitCode.OVERLOADED


# ---------------------------------------------------------------------------------------------
# Shedding


def shed_sim(
    max_pending: int = 3,
    per_class: tuple[int | None, ...] = (None, None, None, None),
    policy: OverflowPolicy = OverflowPolicy.SHED_LOWEST,
    workers: int = 0,
    **config: object,
) -> Sim:
    return bounded(max_pending, per_class, policy, workers, **config)  # type: ignore[arg-type]


def test_shed_lowest_evicts_newest_of_lowest_class_below_incoming() -> None:
    sim = shed_sim(max_pending=4)
    old_low = sim.submit("old low", priority=LOW)
    new_low = sim.submit("new low", priority=LOW)
    normal = sim.submit("normal", priority=NORMAL)
    sim.submit("normal2", priority=NORMAL)
    high = sim.submit("high", priority=HIGH)
    assert sim.status(new_low) == "shed"
    assert sim.status(old_low) == "ready"
    assert sim.status(high) == "ready"
    # Next: the remaining low one.
    sim.submit("high2", priority=HIGH)
    assert sim.status(old_low) == "shed"
    # Nothing strictly below normal is left: a normal submission is refused.
    assert code_of(sim, priority=NORMAL) is SubmitCode.OVERLOADED
    assert sim.status(normal) == "ready"
    # A critical one evicts the newest normal.
    sim.submit("critical", priority=CRITICAL)
    statuses = [t.status.value for t in sim.core.list_tasks()]
    assert statuses.count("shed") == 3
    assert sim.core.snapshot(sim.now).totals["shed"] == 3
    shed_events = [r.event.id for r in sim.resolved if r.event.status.value == "shed"]
    assert shed_events[:2] == [new_low, old_low]


def test_shed_lowest_never_evicts_same_class() -> None:
    sim = shed_sim(max_pending=2)
    sim.submit("a", priority=LOW)
    sim.submit("b", priority=LOW)
    assert code_of(sim, priority=LOW) is SubmitCode.OVERLOADED
    assert [t.status.value for t in sim.core.list_tasks()] == ["ready", "ready"]


def test_running_tasks_are_never_shed() -> None:
    sim = shed_sim(max_pending=1, workers=2)
    running = [sim.submit("low running", priority=LOW) for _ in range(2)]
    queued = sim.submit("queued low", priority=LOW)
    sim.submit("high", priority=HIGH)
    assert sim.status(queued) == "shed"
    assert all(sim.status(t) == "running" for t in running)
    assert code_of(sim, priority=HIGH) is SubmitCode.OVERLOADED
    assert sim.aborts == []


def test_fixed_start_tasks_are_never_shed() -> None:
    sim = shed_sim(max_pending=2)
    fixed = sim.submit("fixed", priority=LOW, fixed_start=FixedStart(sim.now + ns(60)))
    plain = sim.submit("plain", priority=LOW)
    sim.submit("high", priority=HIGH)
    assert sim.status(plain) == "shed"
    assert sim.status(fixed) == "scheduled"
    assert code_of(sim, priority=HIGH) is SubmitCode.OVERLOADED
    assert sim.status(fixed) == "scheduled"


def test_tasks_parked_on_a_resource_can_be_shed() -> None:
    sim = shed_sim(max_pending=1, workers=4, resources=[ResourceConfig.semaphore("gpu", 1)])
    holder = sim.submit("holder", resources={"gpu": 1})
    parked = sim.submit("parked", priority=LOW, resources={"gpu": 1})
    sim.submit("high", priority=HIGH, resources={"gpu": 1})
    assert sim.status(parked) == "shed"
    sim.complete(sim.lease_of(holder))
    assert [lease.payload for lease in sim.dispatched] == ["holder", "high"]


def test_shedding_is_not_for_batches() -> None:
    sim = shed_sim(max_pending=2)
    lows = [sim.submit("low", priority=LOW) for _ in range(2)]
    with pytest.raises(AdmissionError) as err:
        sim.submit_batch([TaskSpec(priority=CRITICAL)])
    assert err.value.code is SubmitCode.OVERLOADED
    assert all(sim.status(t) == "ready" for t in lows)


def test_own_class_bound_is_not_relieved_by_shedding() -> None:
    sim = shed_sim(max_pending=10, per_class=(None, 1, None, None))
    lows = [sim.submit("low", priority=LOW) for _ in range(3)]
    sim.submit("high", priority=HIGH)
    assert code_of(sim, priority=HIGH) is SubmitCode.OVERLOADED
    assert all(sim.status(t) == "ready" for t in lows)


@pytest.mark.parametrize("policy", [OverflowPolicy.SHED_LOWEST, OverflowPolicy.SHED_OLDEST])
def test_inadmissible_submission_sheds_nothing(policy: OverflowPolicy) -> None:
    sim = shed_sim(max_pending=2, policy=policy, resources=[ResourceConfig.semaphore("gpu", 1)])
    lows = [sim.submit("low", key=f"low{i}", priority=LOW) for i in range(2)]
    refusals = [
        ({"deps": (Dep("unknown key"),)}, SubmitCode.UNKNOWN_DEPENDENCY),
        ({"deps": (Dep(10**15),)}, SubmitCode.UNKNOWN_DEPENDENCY),
        ({"key": "me", "deps": (Dep("me"),)}, SubmitCode.CYCLE),
        ({"resources": {"tpu": 1}}, SubmitCode.UNKNOWN_RESOURCE),
        ({"resources": {"gpu": 2}}, SubmitCode.RESOURCE_EXCEEDS_CAPACITY),
        ({"pool": "nope"}, SubmitCode.UNKNOWN_POOL),
    ]
    for spec, code in refusals:
        assert code_of(sim, priority=CRITICAL, **spec) is code
        assert all(sim.status(t) == "ready" for t in lows), spec


def test_reservation_conflict_sheds_nothing() -> None:
    # max_workers 2 with the default reservable fraction allows a single reservation at a time.
    pool = PoolConfig(
        "default", max_workers=2, initial_workers=0, bounds=Bounds(max_pending=2), overflow=OverflowPolicy.SHED_LOWEST
    )
    sim = Sim.make(pool)
    start = sim.now + ns(300)
    sim.submit("fixed", fixed_start=FixedStart(start))
    low = sim.submit("low", priority=LOW)
    assert code_of(sim, priority=CRITICAL, fixed_start=FixedStart(start)) is SubmitCode.RESERVATION_CONFLICT
    assert sim.status(low) == "ready"


def test_shedding_never_evicts_the_incoming_tasks_own_parent() -> None:
    """Shedding happens only when it helps: evicting the parent a submission depends on would
    admit a task that is Skipped on arrival. Either another victim is chosen or the submission
    is refused; the admitted child must not be dead on arrival."""
    sim = shed_sim(max_pending=2)
    other = sim.submit("other", priority=LOW)
    parent = sim.submit("parent", priority=LOW)
    try:
        child = sim.submit("child", priority=HIGH, deps=(Dep(parent),))
    except AdmissionError as err:
        assert err.code is SubmitCode.OVERLOADED
        assert sim.status(parent) == "ready" and sim.status(other) == "ready"
        return
    assert sim.status(parent) == "ready"
    assert sim.status(child) == "blocked"
    assert sim.status(other) == "shed"


def test_awaited_unknown_key_is_admissible_and_may_shed() -> None:
    pool = PoolConfig(
        "default",
        max_workers=2,
        initial_workers=0,
        bounds=Bounds(max_pending=1),
        overflow=OverflowPolicy.SHED_LOWEST,
        unknown_dependency=UnknownDependencyPolicy.AWAIT,
    )
    sim = Sim.make(pool)
    low = sim.submit("low", priority=LOW)
    child = sim.submit("child", priority=HIGH, deps=(Dep("later"),))
    assert sim.status(low) == "shed"
    assert sim.status(child) == "blocked"


@pytest.mark.parametrize(
    ("cond", "expected"),
    [(EdgeCond.ON_SUCCESS, "skipped"), (EdgeCond.ON_FAILURE, "skipped"), (EdgeCond.ON_COMPLETE, "running")],
)
def test_shed_task_resolves_its_dependents(cond: EdgeCond, expected: str) -> None:
    pool = PoolConfig(
        "default", max_workers=4, initial_workers=0, bounds=Bounds(max_pending=2), overflow=OverflowPolicy.SHED_LOWEST
    )
    sim = Sim.make(pool)
    victim = sim.submit("victim", priority=LOW)
    child = sim.submit("child", priority=NORMAL, deps=(Dep(victim, cond),))
    sim.submit("high", priority=HIGH)
    assert sim.status(victim) == "shed"
    sim.set_capacity(4)
    assert sim.status(child) == expected


def test_shed_oldest_evicts_the_oldest_low_task() -> None:
    sim = shed_sim(max_pending=3, policy=OverflowPolicy.SHED_OLDEST)
    first = sim.submit("first low", priority=LOW)
    second = sim.submit("second low", priority=LOW)
    normal = sim.submit("normal", priority=NORMAL)
    sim.submit("incoming", priority=HIGH)
    assert sim.status(first) == "shed"
    assert sim.status(second) == "ready" and sim.status(normal) == "ready"
    sim.submit("incoming low", priority=LOW)
    assert sim.status(second) == "shed"


def test_shed_oldest_only_evicts_low_tasks() -> None:
    """ShedOldest evicts the oldest pending *Low* task (reference-facts.md section 2); with no Low
    task pending there is no victim, so the submission is Overloaded and nothing is shed."""
    sim = shed_sim(max_pending=2, policy=OverflowPolicy.SHED_OLDEST)
    normals = [sim.submit("normal", priority=NORMAL) for _ in range(2)]
    assert code_of(sim, priority=HIGH) is SubmitCode.OVERLOADED
    assert code_of(sim, priority=NORMAL) is SubmitCode.OVERLOADED
    assert all(sim.status(t) == "ready" for t in normals)


def test_shed_oldest_never_evicts_running_or_fixed_start() -> None:
    sim = shed_sim(max_pending=1, policy=OverflowPolicy.SHED_OLDEST, workers=1)
    running = sim.submit("running", priority=LOW)
    fixed = sim.submit("fixed", priority=LOW, fixed_start=FixedStart(sim.now + ns(60)))
    assert code_of(sim, priority=HIGH) is SubmitCode.OVERLOADED
    assert sim.status(running) == "running" and sim.status(fixed) == "scheduled"


# ---------------------------------------------------------------------------------------------
# Autoscaling through the engine


def autoscaled(min_workers: int = 1, max_workers: int = 8, initial: int = 1, **scale: object) -> Sim:
    pool = PoolConfig(
        "default",
        min_workers=min_workers,
        max_workers=max_workers,
        initial_workers=initial,
        autoscale=AutoscaleConfig(**scale),
    )  # type: ignore[arg-type]
    sim = Sim.make(pool)
    return sim


def follow_scale(sim: Sim, seconds: int) -> list[int]:
    """Advance second by second, applying each Scale request as the library's slot scaler does."""
    desired = []
    for _ in range(seconds):
        before = len(sim.scales)
        sim.advance(1)
        for scale in sim.scales[before:]:
            sim.core.set_capacity(sim.now, scale.pool, scale.desired)
            sim.step()
        desired.append(sim.core.snapshot(sim.now).pools[0].desired)
    return desired


def test_backlog_raises_desired_and_scale_actions_follow() -> None:
    sim = autoscaled(max_workers=8)
    sim.runner = lambda lease: (5.0, Success(None))
    for i in range(200):
        sim.submit(i)
    desired = follow_scale(sim, 5)
    assert sim.scales, "a backlog must produce Scale actions"
    assert all(scale.pool == "default" for scale in sim.scales)
    assert desired[-1] == 8
    assert all(d <= 8 for d in desired)
    # Step-up limit: at most max(ceil(current * 1.0), 4) per evaluation.
    values = [1] + [s.desired for s in sim.scales]
    for before, after in pairwise(values):
        if after > before:
            assert after - before <= max(before, 4)


def test_desired_never_leaves_min_and_max() -> None:
    sim = autoscaled(min_workers=2, max_workers=5, initial=3, cooldown=ns(1), stabilization_window=ns(1))
    sim.runner = lambda lease: (0.5, Success(None))
    desired = follow_scale(sim, 10)  # idle: shrinks, but not below min
    assert min(desired) >= 2
    assert desired[-1] == 2
    for i in range(300):
        sim.submit(i)
    desired += follow_scale(sim, 10)
    assert max(desired) == 5
    assert all(2 <= s.desired <= 5 for s in sim.scales)


def test_scale_down_waits_for_stabilization_and_steps_by_one() -> None:
    sim = autoscaled(min_workers=1, max_workers=8, initial=8)
    desired = follow_scale(sim, 150)
    drops = [(i, b - a) for i, (a, b) in enumerate(pairwise(desired), start=1) if b < a]
    assert drops, "an idle pool scales down"
    assert all(step == -1 for _, step in drops)  # max_step_down = 1
    when = [i for i, _ in drops]
    assert all(b - a >= 30 for a, b in pairwise(when))  # one step per 30 s cooldown
    assert when[0] >= 29  # the first step also waits for the cooldown
    assert desired[-1] >= 1


def test_running_tasks_are_never_interrupted_when_capacity_shrinks() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=4, initial_workers=4))
    ids = [sim.submit(i) for i in range(6)]
    assert len(sim.running) == 4
    sim.set_capacity(1)
    assert sim.aborts == []
    assert len(sim.running) == 4
    # Slots retire as attempts finish: no new dispatch until busy drops below capacity.
    for tid in ids[:3]:
        sim.complete(sim.lease_of(tid))
        assert len(sim.dispatched) == 4
    sim.complete(sim.lease_of(ids[3]))
    assert len(sim.dispatched) == 5 and len(sim.running) == 1


def test_autoscaled_pool_keeps_running_work_when_desired_drops() -> None:
    sim = autoscaled(min_workers=1, max_workers=4, initial=4, cooldown=ns(1), stabilization_window=ns(1))
    ids = [sim.submit(i) for i in range(4)]
    follow_scale(sim, 20)
    assert sim.core.snapshot(sim.now).pools[0].desired >= 4  # busy counts toward desired
    assert sim.aborts == []
    assert all(sim.status(t) == "running" for t in ids)
