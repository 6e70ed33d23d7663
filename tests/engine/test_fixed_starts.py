"""Scenario tests for the spec chapter "Fixed starts and reservations" (and the use case "Scheduled
jobs with guaranteed capacity").

- Admission: the interval [start - tolerance, start + estimate + tolerance] is reserved; at most
  floor(max_workers x reservable_fraction) reservations (at least 1) may overlap at any instant,
  otherwise ReservationConflict.
- Holding: hold_lead = min(max(tolerance, p90 run time of regular tasks), max_hold) before the
  start, the next free slot is held (kept idle) for the task.
- Start on the held slot at the start time; fixed_start_hit_rate counts |actual - start| <= tol.
- Miss (not started by start + tolerance): RunLate (run as soon as possible, ahead of everything
  else), Skip (Missed) or Fail (Failed).
"""

from __future__ import annotations

import pytest
from cronoq.engine import (
    AdmissionError,
    Bounds,
    Dep,
    FixedStart,
    Lease,
    MissPolicy,
    Outcome,
    OverflowPolicy,
    PoolConfig,
    PoolSnapshot,
    Priority,
    ResourceConfig,
    RetryPolicy,
    SubmitCode,
    Success,
    TaskSpec,
)

from .sim import Sim, ns

CRITICAL, NORMAL = Priority.CRITICAL, Priority.NORMAL


def pool(max_workers: int, **options: object) -> PoolConfig:
    return PoolConfig("default", max_workers=max_workers, initial_workers=max_workers, **options)  # type: ignore[arg-type]


def at(sim: Sim, seconds: float, tolerance: float = 1.0, on_miss: MissPolicy = MissPolicy.RUN_LATE) -> FixedStart:
    """A fixed start ``seconds`` after the beginning of the test."""
    return FixedStart(sim.now - ns(sim.t) + ns(seconds), ns(tolerance), on_miss)


def advance_to(sim: Sim, seconds: float) -> None:
    """Move the clock to ``seconds`` after the beginning of the test."""
    assert seconds >= sim.t
    sim.advance(seconds - sim.t)


def snapshot(sim: Sim) -> PoolSnapshot:
    snap = sim.core.snapshot(sim.now).pool("default")
    assert snap is not None
    return snap


def run_regular_history(sim: Sim, seconds: float, count: int) -> None:
    """Run ``count`` regular tasks of ``seconds`` each, in parallel, to teach the pool its p90."""
    ids = [sim.submit("history") for _ in range(count)]
    assert all(sim.status(i) == "running" for i in ids)
    sim.advance(seconds)
    for i in ids:
        sim.complete(sim.lease_of(i))


def conflict(sim: Sim, **spec: object) -> AdmissionError:
    with pytest.raises(AdmissionError) as caught:
        sim.submit("conflicting", **spec)
    assert caught.value.code is SubmitCode.RESERVATION_CONFLICT
    return caught.value


# ---------------------------------------------------------------------------------------------
# Admission against the reservation limit


def test_limit_is_half_of_max_workers_by_default() -> None:
    sim = Sim.make(pool(4))  # floor(4 x 0.5) = 2
    sim.submit("a", fixed_start=at(sim, 60))
    sim.submit("b", fixed_start=at(sim, 60))
    conflict(sim, fixed_start=at(sim, 60))
    assert sim.core.totals["submitted"] == 2
    assert snapshot(sim).reservations == 2


def test_limit_rounds_down() -> None:
    sim = Sim.make(pool(5))  # floor(2.5) = 2
    sim.submit("a", fixed_start=at(sim, 60))
    sim.submit("b", fixed_start=at(sim, 60))
    conflict(sim, fixed_start=at(sim, 60))


def test_single_worker_pool_allows_one_reservation() -> None:
    sim = Sim.make(pool(1))  # floor(0.5) = 0, but at least 1
    sim.submit("a", fixed_start=at(sim, 60))
    conflict(sim, fixed_start=at(sim, 60))


def test_zero_fraction_still_allows_one_reservation() -> None:
    sim = Sim.make(pool(8, reservable_fraction=0.0))
    sim.submit("a", fixed_start=at(sim, 60))
    conflict(sim, fixed_start=at(sim, 60))


def test_full_fraction_allows_every_worker_to_be_reserved() -> None:
    sim = Sim.make(pool(3, reservable_fraction=1.0))
    for name in "abc":
        sim.submit(name, fixed_start=at(sim, 60))
    conflict(sim, fixed_start=at(sim, 60))


def test_limit_uses_max_workers_not_current_capacity() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=4, initial_workers=1))
    sim.submit("a", fixed_start=at(sim, 60))
    sim.submit("b", fixed_start=at(sim, 60))
    conflict(sim, fixed_start=at(sim, 60))


def test_non_overlapping_intervals_fit() -> None:
    sim = Sim.make(pool(2))  # limit 1
    hint = ns(10)
    sim.submit("a", fixed_start=at(sim, 60), duration_hint=hint)  # [59, 71]
    sim.submit("b", fixed_start=at(sim, 73), duration_hint=hint)  # [72, 84]
    sim.submit("c", fixed_start=at(sim, 40), duration_hint=hint)  # [39, 51]
    conflict(sim, fixed_start=at(sim, 65), duration_hint=hint)  # [64, 76] overlaps a and b
    conflict(sim, fixed_start=at(sim, 50), duration_hint=ns(1))  # [49, 52] overlaps c
    assert snapshot(sim).reservations == 3


def test_interval_covers_start_minus_tolerance_to_start_plus_estimate_plus_tolerance() -> None:
    sim = Sim.make(pool(2))  # limit 1
    # Default estimate 1 s, tolerance 1 s: [59 s, 62 s].
    sim.submit("a", fixed_start=at(sim, 60))
    conflict(sim, fixed_start=at(sim, 63))  # [62, 65] shares the instant 62 s
    conflict(sim, fixed_start=at(sim, 57))  # [56, 59] shares the instant 59 s
    conflict(sim, fixed_start=at(sim, 63.5, tolerance=2))  # [61.5, 66.5]
    sim.submit("b", fixed_start=at(sim, 63.001))  # [62.001, 65.001]
    sim.submit("c", fixed_start=at(sim, 56.999))  # [55.999, 58.999]


def test_limit_applies_at_the_busiest_instant_only() -> None:
    sim = Sim.make(pool(4))  # limit 2
    hint = ns(10)
    sim.submit("a", fixed_start=at(sim, 60), duration_hint=hint)  # [59, 71]
    sim.submit("b", fixed_start=at(sim, 66), duration_hint=hint)  # [65, 77]: 2 at [65, 71]
    sim.submit("c", fixed_start=at(sim, 73), duration_hint=hint)  # [72, 84]: 2 at [72, 77]
    conflict(sim, fixed_start=at(sim, 70), duration_hint=ns(1))  # [69, 72]: 3 at 69..71
    conflict(sim, fixed_start=at(sim, 45), duration_hint=ns(40))  # spans all three


def test_cancelling_a_fixed_start_task_frees_its_reservation() -> None:
    sim = Sim.make(pool(2))
    first = sim.submit("a", fixed_start=at(sim, 60))
    conflict(sim, fixed_start=at(sim, 60))
    assert sim.core.cancel(sim.now, first)
    sim.step()
    sim.submit("b", fixed_start=at(sim, 60))


def test_batch_reservations_are_checked_together() -> None:
    sim = Sim.make(pool(2))
    specs = [TaskSpec(payload=name, fixed_start=at(sim, 60)) for name in ("a", "b")]
    with pytest.raises(AdmissionError) as caught:
        sim.submit_batch(specs)
    assert caught.value.code is SubmitCode.RESERVATION_CONFLICT
    assert caught.value.index == 1
    assert sim.core.totals["submitted"] == 0
    sim.submit("a", fixed_start=at(sim, 60))  # nothing was left behind


def test_pools_have_separate_reservation_limits() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1), PoolConfig("batch", max_workers=1))
    sim.submit("a", fixed_start=at(sim, 60))
    sim.submit("b", pool="batch", fixed_start=at(sim, 60))
    conflict(sim, pool="batch", fixed_start=at(sim, 60))


# ---------------------------------------------------------------------------------------------
# Start time and holding


def test_starts_at_its_start_time_not_before() -> None:
    sim = Sim.make(pool(2))
    task = sim.submit("fixed", fixed_start=at(sim, 30))
    sim.advance(29.999)
    assert sim.status(task) == "scheduled"
    assert sim.order() == []
    advance_to(sim, 30)
    assert sim.status(task) == "running"
    assert sim.lease_of(task).started_at == at(sim, 30).start
    assert sim.info(task).started_at == at(sim, 30).start
    assert sim.info(task).fixed_start == at(sim, 30).start
    assert snapshot(sim).fixed_start_hit_rate == 1.0


def test_zero_tolerance_start_at_its_exact_time_is_a_hit() -> None:
    # "A tolerance of zero is allowed: the task must start exactly at its time (in practice, on
    # the first scheduling step at or after it), and anything later is a miss."
    sim = Sim.make(pool(2))
    task = sim.submit("fixed", fixed_start=at(sim, 10, tolerance=0))
    advance_to(sim, 10)
    assert sim.lease_of(task).started_at == at(sim, 10).start
    assert snapshot(sim).fixed_start_hit_rate == 1.0


def test_zero_tolerance_with_skip_runs_when_a_slot_is_free_at_its_time() -> None:
    sim = Sim.make(pool(2))
    task = sim.submit("fixed", fixed_start=at(sim, 10, tolerance=0, on_miss=MissPolicy.SKIP))
    advance_to(sim, 10)
    assert sim.status(task) == "running"
    assert sim.core.totals["missed"] == 0


def test_zero_tolerance_with_skip_misses_when_no_slot_is_free_at_its_time() -> None:
    sim = Sim.make(pool(1))
    long = sim.submit("long")
    task = sim.submit("fixed", fixed_start=at(sim, 10, tolerance=0, on_miss=MissPolicy.SKIP))
    advance_to(sim, 10.001)
    assert sim.status(task) == "missed"
    sim.complete(sim.lease_of(long))
    assert sim.status(task) == "missed"


def test_slot_freed_inside_the_hold_lead_stays_idle_until_the_start() -> None:
    sim = Sim.make(pool(2))
    run_regular_history(sim, 10, 2)  # regular p90 = 10 s: hold lead 10 s (t = 0..10)
    r1 = sim.submit("r1")
    sim.submit("r2")
    queued = sim.submit("queued", priority=CRITICAL)
    task = sim.submit("fixed", fixed_start=at(sim, 40))
    advance_to(sim, 33)  # 7 s before the start: inside the lead
    sim.complete(sim.lease_of(r1))
    assert sim.status(queued) == "ready"
    snap = snapshot(sim)
    assert snap.held == 1 and snap.busy == 1
    sim.advance(6.999)
    assert sim.status(queued) == "ready"
    assert sim.status(task) == "scheduled"
    advance_to(sim, 40)
    assert sim.status(task) == "running"
    assert sim.lease_of(task).started_at == at(sim, 40).start
    assert sim.status(queued) == "ready"  # r2 still holds the other worker
    snap = snapshot(sim)
    assert snap.held == 0 and snap.busy == 2
    assert snap.fixed_start_hit_rate == 1.0


def test_slot_freed_before_the_hold_lead_serves_regular_work() -> None:
    sim = Sim.make(pool(2))
    run_regular_history(sim, 10, 2)  # hold lead 10 s
    r1 = sim.submit("r1")
    sim.submit("r2")
    queued = sim.submit("queued")
    sim.submit("fixed", fixed_start=at(sim, 40))
    advance_to(sim, 25)  # 15 s before the start
    sim.complete(sim.lease_of(r1))
    assert sim.status(queued) == "running"
    assert snapshot(sim).held == 0


def test_hold_lead_is_at_least_the_tolerance() -> None:
    # No run history: p90 = 0, so the lead is the tolerance (4 s).
    for freed_at, held in ((25.0, False), (27.0, True)):
        sim = Sim.make(pool(2))
        r1 = sim.submit("r1")
        sim.submit("r2")
        queued = sim.submit("queued")
        sim.submit("fixed", fixed_start=at(sim, 30, tolerance=4))
        advance_to(sim, freed_at)
        sim.complete(sim.lease_of(r1))
        assert (sim.status(queued) == "ready") is held, freed_at
        assert snapshot(sim).held == (1 if held else 0)


def test_hold_lead_is_capped_by_max_hold() -> None:
    # Regular p90 is 20 s but max_hold is 5 s: the lead is 5 s.
    for freed_at, held in ((33.0, False), (36.0, True)):
        sim = Sim.make(pool(2, max_hold=ns(5)))
        run_regular_history(sim, 20, 2)  # t = 0..20
        r1 = sim.submit("r1")
        sim.submit("r2")
        queued = sim.submit("queued")
        sim.submit("fixed", fixed_start=at(sim, 40))
        advance_to(sim, freed_at)
        sim.complete(sim.lease_of(r1))
        assert (sim.status(queued) == "ready") is held, freed_at
        assert snapshot(sim).held == (1 if held else 0)


def test_hold_requested_while_all_busy_takes_the_first_slot_to_free() -> None:
    sim = Sim.make(pool(2))
    r1 = sim.submit("r1")
    r2 = sim.submit("r2")
    queued = [sim.submit(f"q{i}", priority=CRITICAL) for i in range(3)]
    task = sim.submit("fixed", fixed_start=at(sim, 30))
    advance_to(sim, 29.5)  # lead 1 s: the hold is pending, no slot free
    assert snapshot(sim).held == 0
    sim.complete(sim.lease_of(r1))
    assert snapshot(sim).held == 1
    assert all(sim.status(q) == "ready" for q in queued)
    advance_to(sim, 30)
    assert sim.status(task) == "running"
    sim.complete(sim.lease_of(r2))
    assert sim.status(queued[0]) == "running"


def test_hold_lead_ignores_run_times_of_fixed_start_tasks() -> None:
    # Only fixed-start tasks have run (20 s each): the regular p90 is still 0, the lead 1 s.
    sim = Sim.make(pool(2, reservable_fraction=1.0))
    first = [sim.submit(f"f{i}", fixed_start=at(sim, 1), duration_hint=ns(20)) for i in range(2)]
    advance_to(sim, 21)
    for task_id in first:
        sim.complete(sim.lease_of(task_id))
    r1 = sim.submit("r1")
    sim.submit("r2")
    queued = sim.submit("queued")
    sim.submit("fixed", fixed_start=at(sim, 40))
    advance_to(sim, 35)
    sim.complete(sim.lease_of(r1))
    assert sim.status(queued) == "running"
    assert snapshot(sim).held == 0


def test_cancelling_a_holding_task_releases_its_slot() -> None:
    sim = Sim.make(pool(2))
    r1 = sim.submit("r1")
    sim.submit("r2")
    queued = sim.submit("queued")
    task = sim.submit("fixed", fixed_start=at(sim, 30))
    advance_to(sim, 29.5)
    sim.complete(sim.lease_of(r1))
    assert snapshot(sim).held == 1
    assert sim.core.cancel(sim.now, task)
    sim.step()
    assert snapshot(sim).held == 0
    assert sim.status(queued) == "running"


def test_fixed_start_waiting_for_a_resource_keeps_its_slot() -> None:
    sim = Sim.make(pool(2), resources=(ResourceConfig.semaphore("gpu", 1),))
    gpu_user = sim.submit("gpu-user", resources={"gpu": 1})
    task = sim.submit("fixed", fixed_start=at(sim, 10), resources={"gpu": 1})
    advance_to(sim, 9.5)
    queued = sim.submit("queued", priority=CRITICAL)
    assert sim.status(queued) == "ready"  # the free worker is held
    advance_to(sim, 10.5)
    assert sim.status(task) == "ready"  # due, waiting for the gpu
    assert sim.status(queued) == "ready"  # its slot is still kept
    snap = snapshot(sim)
    assert snap.busy == 1 and snap.held == 1
    sim.complete(sim.lease_of(gpu_user))
    assert sim.status(task) == "running"
    assert sim.status(queued) == "running"


def test_reservation_uses_the_learned_duration() -> None:
    sim = Sim.make(pool(2))  # limit 1
    ids = [sim.submit("history", kind="slow") for _ in range(2)]
    advance_to(sim, 20)
    for task_id in ids:
        sim.complete(sim.lease_of(task_id))
    # Learned median of "slow" is 20 s: [99, ~121].
    sim.submit("slow-fixed", kind="slow", fixed_start=at(sim, 100))
    conflict(sim, kind="slow", fixed_start=at(sim, 115), duration_hint=ns(1))
    sim.submit("after", kind="slow", fixed_start=at(sim, 125), duration_hint=ns(1))


def test_fixed_start_tasks_are_never_shed() -> None:
    bounded = PoolConfig(
        "default", max_workers=2, initial_workers=2, bounds=Bounds(max_pending=1), overflow=OverflowPolicy.SHED_LOWEST
    )
    sim = Sim.make(bounded)
    task = sim.submit("fixed-low", priority=Priority.LOW, fixed_start=at(sim, 60))
    with pytest.raises(AdmissionError) as caught:
        sim.submit("high", priority=Priority.HIGH)
    assert caught.value.code is SubmitCode.OVERLOADED
    assert sim.status(task) == "scheduled"


def test_hold_lead_follows_the_pool_getting_slower() -> None:
    """The lead is re-evaluated as the start approaches: a pool whose regular tasks got slower
    after the first check (at start - max_hold) holds earlier."""
    sim = Sim.make(pool(2))

    def runner(lease: Lease) -> tuple[float, Outcome]:
        return (5.0 if lease.payload == "fixed" else 30.0), Success(None)

    sim.runner = runner
    task = sim.submit("fixed", fixed_start=at(sim, 400))  # first check at 100 s: lead 1 s
    advance_to(sim, 300)
    # Regular work from 300 s on, 30 s per task; the two workers free at 330, 345, 360, 375, ...
    sim.submit("r0")
    advance_to(sim, 315)
    for i in range(1, 12):
        sim.submit(f"r{i}")
    advance_to(sim, 410)
    # By 370 s the regular p90 is 30 s, so the hold starts by then and takes the slot freed at
    # 375 s: the task starts on time.
    assert sim.info(task).started_at == at(sim, 400).start
    assert snapshot(sim).fixed_start_hit_rate == 1.0


# ---------------------------------------------------------------------------------------------
# Missing the start


def busy_single_worker(on_miss: MissPolicy) -> tuple[Sim, int, int, int]:
    """One worker busy with "long" from 0 s; a Critical regular task queued at 0.5 s; a fixed
    start at 10 s (tolerance 1 s) that cannot get the worker in time."""
    sim = Sim.make(pool(1))
    long = sim.submit("long")
    sim.advance(0.5)
    queued = sim.submit("queued", priority=CRITICAL)
    task = sim.submit("fixed", fixed_start=at(sim, 10, on_miss=on_miss))
    return sim, long, queued, task


def test_run_late_runs_as_soon_as_possible_ahead_of_queued_work() -> None:
    sim, long, queued, task = busy_single_worker(MissPolicy.RUN_LATE)
    advance_to(sim, 15)
    assert sim.status(task) == "ready"
    assert sim.core.totals["missed"] == 0
    advance_to(sim, 20)
    sim.complete(sim.lease_of(long))
    assert sim.status(task) == "running"
    assert sim.status(queued) == "ready"
    assert sim.info(task).started_at == at(sim, 20).start  # the actual dispatch time
    sim.complete(sim.lease_of(task))
    assert sim.status(task) == "succeeded"
    assert sim.status(queued) == "running"
    assert snapshot(sim).fixed_start_hit_rate == 0.0


def test_skip_ends_the_task_as_missed_after_start_plus_tolerance() -> None:
    sim, long, queued, task = busy_single_worker(MissPolicy.SKIP)
    advance_to(sim, 10.999)
    assert not sim.info(task).status.terminal
    advance_to(sim, 11.001)
    assert sim.status(task) == "missed"
    assert sim.core.totals["missed"] == 1
    assert [e.status.value for e in sim.events if e.id == task] == ["missed"]
    assert snapshot(sim).reservations == 0
    sim.complete(sim.lease_of(long))
    assert sim.status(queued) == "running"
    assert sim.info(task).started_at is None
    assert snapshot(sim).fixed_start_hit_rate == 0.0


def test_fail_ends_the_task_as_failed_after_start_plus_tolerance() -> None:
    sim, long, queued, task = busy_single_worker(MissPolicy.FAIL)
    advance_to(sim, 10.999)
    assert not sim.info(task).status.terminal
    advance_to(sim, 11.001)
    assert sim.status(task) == "failed"
    assert sim.core.totals["failed"] == 1
    assert sim.core.totals["missed"] == 0
    sim.complete(sim.lease_of(long))
    assert sim.status(queued) == "running"


def test_start_within_tolerance_is_a_hit_and_not_a_miss() -> None:
    sim = Sim.make(pool(1))
    long = sim.submit("long")
    task = sim.submit("fixed", fixed_start=at(sim, 10, tolerance=2, on_miss=MissPolicy.SKIP))
    advance_to(sim, 11.5)
    sim.complete(sim.lease_of(long))
    assert sim.status(task) == "running"
    assert sim.info(task).started_at == at(sim, 11.5).start
    advance_to(sim, 20)
    assert sim.status(task) == "running"
    assert snapshot(sim).fixed_start_hit_rate == 1.0


def test_hit_rate_counts_on_time_starts_among_fixed_starts() -> None:
    sim = Sim.make(pool(2))
    on_time = sim.submit("on-time", fixed_start=at(sim, 5))
    advance_to(sim, 5)
    sim.complete(sim.lease_of(on_time))
    blockers = [sim.submit("b1"), sim.submit("b2")]
    late = sim.submit("late", fixed_start=at(sim, 20))
    advance_to(sim, 25)
    sim.complete(sim.lease_of(blockers[0]))
    assert sim.status(late) == "running"
    assert snapshot(sim).fixed_start_hit_rate == pytest.approx(0.5)


def test_hit_rate_is_one_without_fixed_starts() -> None:
    sim = Sim.make(pool(2))
    sim.submit("regular")
    assert snapshot(sim).fixed_start_hit_rate == 1.0


# ---------------------------------------------------------------------------------------------
# Retries and dependencies


def test_retried_fixed_start_attempt_takes_the_next_slot_ahead_of_regular_work() -> None:
    retry = RetryPolicy(max_attempts=3, initial_backoff=ns(1), jitter=False)
    sim = Sim.make(pool(1))
    task = sim.submit("fixed", fixed_start=at(sim, 5, on_miss=MissPolicy.SKIP), retry=retry)
    advance_to(sim, 5)
    assert sim.status(task) == "running"
    sim.advance(0.2)
    q1 = sim.submit("q1", priority=CRITICAL)
    sim.advance(0.3)
    sim.fail(sim.lease_of(task))  # retry at 6.5 s
    assert sim.status(q1) == "running"
    q2 = sim.submit("q2", priority=CRITICAL)
    advance_to(sim, 9)  # the retry has waited past start + tolerance: no miss policy applies
    assert sim.status(task) == "ready"
    assert snapshot(sim).held == 0  # a retried attempt has no held slot
    sim.complete(sim.lease_of(q1))
    assert sim.status(task) == "running"
    assert sim.lease_of(task).attempt == 2
    assert sim.status(q2) == "ready"
    sim.complete(sim.lease_of(task))
    assert sim.status(task) == "succeeded"
    assert sim.core.totals["missed"] == 0


def test_dependency_met_early_still_waits_for_the_start() -> None:
    sim = Sim.make(pool(2))
    parent = sim.submit("parent")
    task = sim.submit("fixed", fixed_start=at(sim, 10), deps=(Dep(parent),))
    assert sim.status(task) == "blocked"
    advance_to(sim, 3)
    sim.complete(sim.lease_of(parent))
    assert sim.status(task) == "scheduled"
    advance_to(sim, 9.999)
    assert sim.status(task) == "scheduled"
    advance_to(sim, 10)
    assert sim.lease_of(task).started_at == at(sim, 10).start


def test_start_time_passed_still_waits_for_the_dependency() -> None:
    sim = Sim.make(pool(2))
    parent = sim.submit("parent")
    task = sim.submit("fixed", fixed_start=at(sim, 10), deps=(Dep(parent),))
    advance_to(sim, 15)
    assert sim.status(task) == "blocked"  # RunLate: still waiting, not missed
    advance_to(sim, 20)
    sim.complete(sim.lease_of(parent))
    assert sim.status(task) == "running"
    assert sim.info(task).started_at == at(sim, 20).start
    assert snapshot(sim).fixed_start_hit_rate == 0.0


def test_dependency_met_within_tolerance_starts_on_time() -> None:
    sim = Sim.make(pool(2))
    parent = sim.submit("parent")
    task = sim.submit("fixed", fixed_start=at(sim, 10, tolerance=2), deps=(Dep(parent),))
    advance_to(sim, 11)
    sim.complete(sim.lease_of(parent))
    assert sim.status(task) == "running"
    assert snapshot(sim).fixed_start_hit_rate == 1.0


def test_late_dependency_with_skip_policy_misses() -> None:
    sim = Sim.make(pool(2))
    parent = sim.submit("parent")
    task = sim.submit("fixed", fixed_start=at(sim, 10, on_miss=MissPolicy.SKIP), deps=(Dep(parent),))
    advance_to(sim, 11.5)
    assert sim.status(task) == "missed"
    sim.complete(sim.lease_of(parent))
    assert sim.status(task) == "missed"
    assert sim.core.totals["missed"] == 1


def test_fixed_start_tasks_are_recorded_with_normal_priority_by_default() -> None:
    sim = Sim.make(pool(2))
    task = sim.submit("fixed", fixed_start=at(sim, 10))
    info = sim.info(task)
    assert info.priority is NORMAL
    assert info.fixed_start == at(sim, 10).start
