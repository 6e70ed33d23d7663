"""Bounded arithmetic: no number a caller (or a stored row) hands the engine can overflow, go NaN
or leave int64, and what is out of range is refused at admission with a message naming the field.

Spec: reference-facts.md ("client-supplied durations <= 100 years, else invalid duration";
RetryPolicy delay(n) = min(initial * multiplier^(n-2), max_backoff)); book "Configuration
reference" (durations finite, non-negative, within range); design.md "Trust boundaries" (every
number a caller sends is bounded before arithmetic uses it; a bad task fails itself, never its
shard). Persisted times are int64 nanoseconds (Postgres BIGINT, SQLite INTEGER).
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from cronoq.engine import (
    AdmissionError,
    AutoscaleConfig,
    ConfigError,
    Core,
    CoreConfig,
    Dep,
    EngineFault,
    Failure,
    Fairness,
    FixedStart,
    InvalidRequest,
    PoolConfig,
    Recovered,
    RecoveredRecurring,
    RecoveredTask,
    RecurringSpec,
    ResourceConfig,
    RetryPolicy,
    SubmitCode,
    TaskRecord,
    TaskSpec,
    TaskStatus,
)
from cronoq.engine.autoscale import Autoscaler, ceil_clean
from cronoq.engine.cron import CronSchedule
from cronoq.engine.limits import MAX_COUNT, MAX_DURATION, MAX_INSTANT
from cronoq.engine.types import NS_PER_S
from hypothesis import given, settings
from hypothesis import strategies as st

from .extremes import examples
from .sim import START, Sim, ns

HUGE_FLOATS = [1.0, 1.0000001, 2.0, 10.0, 1e6, 1e154, 1e308, math.inf, math.nan]


def exact_backoff(policy: RetryPolicy, attempt: int) -> int:
    """The spec's formula in exact rational arithmetic (usable while the power stays small)."""
    exponent = max(attempt - 2, 0)
    delay = Fraction(policy.initial_backoff) * Fraction(policy.multiplier) ** exponent
    return int(min(delay, Fraction(policy.max_backoff)))


# ---------------------------------------------------------------------------------------------
# Backoff


@settings(max_examples=examples(300), deadline=None)
@given(
    initial=st.integers(0, MAX_DURATION),
    ceiling=st.integers(0, MAX_DURATION),
    multiplier=st.one_of(st.sampled_from(HUGE_FLOATS), st.floats(1.0, 1e308)),
    attempt=st.one_of(st.integers(2, 70), st.integers(2, 2**64), st.sampled_from([311, 1026, 2**32 - 1])),
)
def test_backoff_never_overflows_and_follows_the_formula(initial: int, ceiling: int, multiplier: float,
                                                         attempt: int) -> None:  # fmt: skip
    policy = RetryPolicy(max_attempts=MAX_COUNT, initial_backoff=initial, multiplier=multiplier, max_backoff=ceiling)
    delay = policy.backoff(attempt)
    assert type(delay) is int
    assert 0 <= delay <= max(initial, ceiling) <= MAX_DURATION
    # Non-decreasing in the attempt number, and saturated from some attempt on.
    assert policy.backoff(attempt + 1) >= delay
    if math.isfinite(multiplier) and (attempt - 2) * math.log2(max(multiplier, 2.0)) < 200:
        exact = exact_backoff(policy, attempt)
        assert abs(delay - exact) <= max(1, exact // 10**12), (delay, exact)  # float rounding only


def test_backoff_at_the_attempts_that_used_to_overflow() -> None:
    ten = RetryPolicy(max_attempts=1000, initial_backoff=ns(1), multiplier=10.0, max_backoff=ns(60))
    two = RetryPolicy(max_attempts=2000, initial_backoff=ns(1), multiplier=2.0, max_backoff=ns(60))
    huge = RetryPolicy(max_attempts=10, initial_backoff=ns(1), multiplier=1e308, max_backoff=ns(60))
    assert ten.backoff(311) == ten.backoff(10**9) == ns(60)
    assert two.backoff(1026) == two.backoff(2**64) == ns(60)
    assert huge.backoff(2) == ns(1) and huge.backoff(3) == huge.backoff(4) == ns(60)


def test_a_task_with_a_huge_multiplier_retries_until_dead_lettered() -> None:
    """The reported defect: multiplier 10 overflowed at attempt ~311 and the task stayed running."""
    retry = RetryPolicy(max_attempts=320, initial_backoff=1, multiplier=10.0, max_backoff=ns(0.001), jitter=False)
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1, retry=retry))
    task = sim.submit("poison")
    for attempt in range(1, 321):
        lease = sim.lease_of(task)
        assert lease.attempt == attempt
        sim.fail(lease, "still broken")
        sim.advance(0.001)
    info = sim.info(task)
    assert (info.status, info.attempt, info.message) == (TaskStatus.DEAD_LETTERED, 320, "still broken")


def test_retry_after_hints_are_capped_and_retry_times_stay_in_int64() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1,
                              retry=RetryPolicy(max_attempts=3, jitter=False)),
                   persist=True)  # fmt: skip
    task = sim.submit("slow")
    sim.complete(sim.lease_of(task), Failure("later", retry_after=2**80))
    retry_at = [m.retry_at for m in sim.persisted if getattr(m, "retry_at", None) is not None]
    assert retry_at == [sim.now + MAX_DURATION]
    assert sim.status(task) == "retrying"


# ---------------------------------------------------------------------------------------------
# Admission


def _refusal(**fields: object) -> str:
    sim = Sim.make()
    with pytest.raises(AdmissionError) as err:
        sim.core.submit(sim.now, TaskSpec(**fields))  # type: ignore[arg-type]
    assert err.value.code is SubmitCode.INVALID
    sim.core.check_invariants()
    assert sim.core.list_tasks() == []  # nothing half-admitted
    return err.value.message


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"deadline": -1}, "deadline"),
        ({"deadline": MAX_INSTANT + 1}, "deadline"),
        ({"deadline": 2**64}, "deadline"),
        ({"deadline": 1.5}, "deadline"),
        ({"fixed_start": FixedStart(-5)}, "start time"),
        ({"fixed_start": FixedStart(2**64)}, "start time"),
        ({"fixed_start": FixedStart(START, tolerance=-1)}, "tolerance"),
        ({"fixed_start": FixedStart(START, tolerance=MAX_DURATION + 1)}, "tolerance"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -ns(1)}, "timeout"),
        ({"timeout": 2**64}, "timeout"),
        ({"duration_hint": -1}, "duration_hint"),
        ({"duration_hint": 10**30}, "duration_hint"),
        ({"retry": RetryPolicy(max_attempts=0)}, "retry.max_attempts"),
        ({"retry": RetryPolicy(max_attempts=2**32)}, "retry.max_attempts"),
        ({"retry": RetryPolicy(multiplier=math.nan)}, "retry.multiplier"),
        ({"retry": RetryPolicy(multiplier=math.inf)}, "retry.multiplier"),
        ({"retry": RetryPolicy(multiplier=-math.inf)}, "retry.multiplier"),
        ({"retry": RetryPolicy(multiplier=0.5)}, "retry.multiplier"),
        ({"retry": RetryPolicy(initial_backoff=-1)}, "retry.initial_backoff"),
        ({"retry": RetryPolicy(max_backoff=2**63)}, "retry.max_backoff"),
        ({"deps": (Dep(0),)}, "dependency id"),
        ({"deps": (Dep(2**64),)}, "dependency id"),
        ({"key": "lone \ud800 surrogate"}, "key"),
        ({"kind": "nul\0"}, "kind"),
        ({"tags": {"t": "\udfff"}}, "tags"),
        ({"tenant": "\ud83d"}, "tenant"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_field(fields: dict[str, object], named: str) -> None:
    assert named in _refusal(**fields)


def test_the_edges_of_every_range_are_admitted() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=0))
    edges = [
        TaskSpec(deadline=0),
        TaskSpec(deadline=MAX_INSTANT, duration_hint=MAX_DURATION),
        TaskSpec(fixed_start=FixedStart(MAX_INSTANT, MAX_DURATION)),
        TaskSpec(timeout=MAX_DURATION),
        TaskSpec(
            retry=RetryPolicy(
                max_attempts=MAX_COUNT, initial_backoff=MAX_DURATION, multiplier=1e308, max_backoff=MAX_DURATION
            )
        ),
        TaskSpec(key="ünïcode ✓"),
    ]
    for spec in edges:
        sim.core.submit(sim.now, spec)
        sim.step()
    assert len(sim.core.list_tasks()) == len(edges)


def test_a_batch_with_one_bad_value_admits_nothing() -> None:
    sim = Sim.make()
    with pytest.raises(AdmissionError) as err:
        sim.core.submit_batch(sim.now, [TaskSpec(key="a"), TaskSpec(retry=RetryPolicy(multiplier=math.nan))])
    assert err.value.index == 1 and "retry.multiplier" in str(err.value)
    assert sim.core.list_tasks() == []


def test_capacity_out_of_range_is_refused_before_anything_changes() -> None:
    sim = Sim.make()
    for bad in (-1, 2**32, 2**64):
        with pytest.raises(InvalidRequest):
            sim.core.set_capacity(sim.now, "default", bad)
        assert isinstance(InvalidRequest("x"), ValueError)  # callers catching ValueError still do
    assert sim.core.snapshot(sim.now).pool("default").capacity == 4  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------
# Configuration


@pytest.mark.parametrize(
    "pool",
    [
        PoolConfig("p", retry=RetryPolicy(multiplier=math.nan)),
        PoolConfig("p", retry=RetryPolicy(multiplier=math.inf)),
        PoolConfig("p", retry=RetryPolicy(max_backoff=-1)),
        PoolConfig("p", retry=RetryPolicy(max_attempts=2**40)),
        PoolConfig("p", max_workers=2**40),
        PoolConfig("p", reservable_fraction=math.nan),
        PoolConfig("p", default_duration=2**64),
        PoolConfig("p", lease_ttl=MAX_DURATION + 1),
        PoolConfig("p", autoscale=AutoscaleConfig(target_utilization=math.nan)),
        PoolConfig("p", autoscale=AutoscaleConfig(max_step_up_ratio=math.inf)),
        PoolConfig("p", autoscale=AutoscaleConfig(cost_per_worker_second=math.nan)),
        PoolConfig("p", fairness=Fairness({"a": math.inf})),
    ],
)
def test_pool_settings_out_of_range_are_refused(pool: PoolConfig) -> None:
    with pytest.raises(ConfigError):
        Core(CoreConfig(pools=(pool,)))


@pytest.mark.parametrize(
    "resource",
    [
        ResourceConfig.token_bucket("r", math.nan, 1),
        ResourceConfig.token_bucket("r", math.inf, 1),
        ResourceConfig.token_bucket("r", 1.0, 2**40),
        ResourceConfig.semaphore("r", 2**40),
    ],
)
def test_resource_settings_out_of_range_are_refused(resource: ResourceConfig) -> None:
    with pytest.raises(ConfigError):
        Core(CoreConfig(resources=(resource,)))


def test_extreme_but_valid_settings_never_raise() -> None:
    """Tiny rates and weights, huge costs and an almost-zero utilization target: the engine keeps
    working (no float overflow into ``ceil``, no endless refill search)."""
    pool = PoolConfig(
        "default", min_workers=0, max_workers=MAX_COUNT, initial_workers=1,
        autoscale=AutoscaleConfig(interval=NS_PER_S, target_utilization=5e-324, drain_time=1, max_step_up_ratio=1e308,
                                  max_step_up_abs=MAX_COUNT, cost_per_worker_second=1e308),
        fairness=Fairness({"tiny": 5e-324, "huge": 1e308}),
    )  # fmt: skip
    bucket = ResourceConfig.token_bucket("slow", 5e-324, 1)
    sim = Sim.make(pool, resources=(bucket,))
    ids = [sim.submit(i, tenant=tenant, resources={"slow": 1})
           for i, tenant in enumerate(["tiny", "huge", None, "tiny"])]  # fmt: skip
    for _ in range(3):
        sim.advance(1)
        for lease in list(sim.running.values()):
            sim.complete(lease)
    snap = sim.core.snapshot(sim.now)
    pool_snap = snap.pool("default")
    assert pool_snap is not None and 0 <= pool_snap.desired <= MAX_COUNT
    statuses = [sim.status(i) for i in ids]
    assert statuses.count("succeeded") == 1  # the bucket never refills in any span that matters
    wake = sim.core.next_wakeup()
    assert wake is None or wake > sim.now


def test_ceil_saturates() -> None:
    assert ceil_clean(4.000000000000001) == 4
    assert ceil_clean(math.inf) == ceil_clean(1e300) == 2**32
    assert ceil_clean(math.nan) == 0
    scaler = Autoscaler(AutoscaleConfig(target_utilization=5e-324, drain_time=1), 0, 10, MAX_DURATION, 1, 0)
    for when in range(1, 5):
        scaler.record_arrivals(10**9)
        scaler.record_run(MAX_DURATION)
        assert 0 <= scaler.evaluate(when, [10**9] * 4, 1, 0) <= 10


# ---------------------------------------------------------------------------------------------
# Cron horizons


def test_cron_occurrences_past_int64_are_refused() -> None:
    cron = CronSchedule.parse("0 0 1 1 *")
    assert cron.next_after(START) > START
    with pytest.raises(ConfigError):
        cron.next_after(MAX_INSTANT - NS_PER_S)


def test_a_schedule_that_runs_out_of_range_becomes_invalid_instead_of_raising() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    spec = RecurringSpec("late", "0 0 1 1 *", TaskSpec(key="late"), deadline_after=MAX_DURATION)
    base = MAX_INSTANT - 400 * 86400 * NS_PER_S  # the last New Year's Day before 2262
    sim.now = base
    sim.core.add_recurring(sim.now, spec)
    sim.step()
    sim.advance(400 * 86400)  # fires once, then no further occurrence fits in int64
    info = sim.core.list_recurring()[0]
    assert (info.next_at, info.armed) == (None, False)
    created = [t for t in sim.core.list_tasks() if t.key is not None and t.key.startswith("late@")]
    assert len(created) == 1 and created[0].deadline == MAX_INSTANT  # start + 100 years, saturated


# ---------------------------------------------------------------------------------------------
# Restoring rows with values out of range


def _recovered_task(task_id: int, spec: TaskSpec, status: TaskStatus, attempt: int, max_attempts: int,
                    **extra: object) -> RecoveredTask:  # fmt: skip
    record = TaskRecord(task_id, "default", spec, START, TaskStatus.READY, max_attempts)
    return RecoveredTask(record, status, attempt, **extra)  # type: ignore[arg-type]


def test_restore_after_the_overflowing_attempt_keeps_going() -> None:
    """The shard that never led again: a running task at attempt 1025 of 2000 with multiplier 2."""
    core = Core(CoreConfig(pools=(PoolConfig("default", max_workers=1, initial_workers=1),), persist=True))
    retry = RetryPolicy(max_attempts=2000, initial_backoff=ns(1), multiplier=2.0, max_backoff=ns(60), jitter=False)
    running = _recovered_task(1 << 48 | 1, TaskSpec(retry=retry), TaskStatus.RUNNING, 1025, 2000, started_at=START)
    core.restore(START, Recovered(tasks=[running]))
    core.check_invariants()
    info = core.get(running.record.id)
    assert info is not None and (info.status, info.attempt) == (TaskStatus.RETRYING, 1025)
    assert core.next_wakeup() == START + ns(60)


@pytest.mark.parametrize(
    ("spec", "attempt", "max_attempts", "extra", "why"),
    [
        (TaskSpec(retry=RetryPolicy(multiplier=math.nan)), 1, 3, {}, "retry.multiplier"),
        (TaskSpec(deadline=2**70), 0, 3, {}, "deadline"),
        (TaskSpec(timeout=-5), 0, 3, {}, "timeout"),
        (TaskSpec(), 7, 3, {}, "attempt"),
        (TaskSpec(), -1, 3, {}, "attempt"),
        (TaskSpec(), 0, 0, {}, "max_attempts"),
        (TaskSpec(), 1, 3, {"retry_at": 2**64}, "retry_at"),
    ],
)
def test_restore_dead_letters_rows_it_cannot_run(spec: TaskSpec, attempt: int, max_attempts: int,
                                                 extra: dict[str, object], why: str) -> None:  # fmt: skip
    core = Core(CoreConfig(pools=(PoolConfig("default", max_workers=1, initial_workers=1),), persist=True))
    status = TaskStatus.RETRYING if "retry_at" in extra else TaskStatus.READY
    bad = _recovered_task(1 << 48 | 1, spec, status, attempt, max_attempts, **extra)
    good = _recovered_task(1 << 48 | 2, TaskSpec(), TaskStatus.READY, 0, 3)
    core.restore(START, Recovered(tasks=[bad, good]))
    core.check_invariants()
    info = core.get(bad.record.id)
    assert info is not None and info.status is TaskStatus.DEAD_LETTERED
    assert info.message is not None and info.message.startswith("cannot be restored") and why in info.message
    core.tick(START)
    output = core.drain()
    persisted = output.mutations
    assert any(getattr(m, "id", None) == bad.record.id and m.status is TaskStatus.DEAD_LETTERED for m in persisted)  # type: ignore[union-attr]
    assert any(dispatch.task_id == good.record.id for dispatch in output.dispatches)


class _ExplodingDeps(tuple):  # type: ignore[type-arg]
    """Dependencies whose iteration raises: a stand-in for a bug met while one task is restored."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")


def test_a_task_that_faults_while_restored_is_named_and_can_be_left_out() -> None:
    config = CoreConfig(pools=(PoolConfig("default", max_workers=1, initial_workers=1),), persist=True)
    poison = _recovered_task(1 << 48 | 1, TaskSpec(deps=_ExplodingDeps((Dep(5),))), TaskStatus.BLOCKED, 0, 3)
    good = _recovered_task(1 << 48 | 2, TaskSpec(), TaskStatus.READY, 0, 3)
    recovered = Recovered(tasks=[poison, good])
    with pytest.raises(EngineFault) as fault:
        Core(config).restore(START, recovered)
    assert fault.value.task_id == poison.record.id and isinstance(fault.value.__cause__, RuntimeError)
    core = Core(config)
    core.restore(START, recovered, dead={poison.record.id: "left out"})
    core.check_invariants()
    assert core.ended(poison.record.id) == (TaskStatus.DEAD_LETTERED, "left out")
    assert core.get(good.record.id).status is TaskStatus.READY  # type: ignore[union-attr]


def test_restored_schedules_with_values_out_of_range_come_back_invalid() -> None:
    core = Core(CoreConfig(pools=(PoolConfig("default", max_workers=1, initial_workers=1),)))
    good = RecurringSpec("good", "* * * * *", TaskSpec())
    recovered = Recovered(recurring=[
        RecoveredRecurring(RecurringSpec("tolerance", "* * * * *", TaskSpec(), tolerance=-1), START, None),
        RecoveredRecurring(RecurringSpec("next", "* * * * *", TaskSpec()), 2**64, None),
        RecoveredRecurring(RecurringSpec("suspended", "* * * * *", TaskSpec()), START, None),
        RecoveredRecurring(good, START + ns(60), None),
    ])  # fmt: skip
    core.restore(START, recovered, suspended={"suspended"})
    armed = {info.name: info.armed for info in core.list_recurring()}
    assert armed == {"good": True, "next": False, "suspended": False, "tolerance": False}
