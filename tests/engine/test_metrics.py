"""Scenario tests for the spec chapter "Metrics and quality signals".

Pool snapshots cover a sliding window (60 s, a ring of 12 buckets); wait and run percentiles come
from a log-linear histogram (about 9% resolution); utilization integrates busy and capacity over
time, so it is exact. Totals count since start; worker_seconds and cost accumulate since start.
"""

from __future__ import annotations

import pytest
from cronoq.engine import (
    AutoscaleConfig,
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
    RetryPolicy,
    Success,
)
from cronoq.engine.snapshot import TOTAL_NAMES

from .sim import START, Sim, ns

RESOLUTION = 0.09
NO_JITTER = RetryPolicy(max_attempts=3, initial_backoff=ns(1), jitter=False)


def pool(max_workers: int = 2, **options: object) -> PoolConfig:
    return PoolConfig("default", max_workers=max_workers, initial_workers=max_workers, **options)  # type: ignore[arg-type]


def snap(sim: Sim, name: str = "default") -> PoolSnapshot:
    result = sim.core.snapshot(sim.now).pool(name)
    assert result is not None
    return result


def advance_to(sim: Sim, seconds: float) -> None:
    assert seconds >= sim.t
    sim.advance(seconds - sim.t)


def within(value: float, exact: float) -> bool:
    return abs(value - exact) <= RESOLUTION * exact


# ---------------------------------------------------------------------------------------------
# Window counters


def test_counts_after_a_known_workload() -> None:
    sim = Sim.make(pool(4))
    ok1 = sim.submit("ok-1")
    ok2 = sim.submit("ok-2")
    flaky = sim.submit("flaky", retry=NO_JITTER)
    sim.advance(1)
    sim.complete(sim.lease_of(ok1))
    sim.complete(sim.lease_of(ok2))
    sim.fail(sim.lease_of(flaky))  # retried after 1 s
    sim.advance(1.5)
    sim.complete(sim.lease_of(flaky))
    s = snap(sim)
    assert s.dispatched == 4  # every attempt is a dispatch
    assert s.succeeded == 3
    assert s.retried == 1
    assert s.busy == 0 and s.pending == 0 and s.capacity == 4


def test_failed_counts_permanent_failures() -> None:
    sim = Sim.make(pool(4))
    bad = sim.submit("bad")
    good = sim.submit("good")
    sim.fail(sim.lease_of(bad), permanent=True)
    sim.complete(sim.lease_of(good))
    s = snap(sim)
    assert (s.dispatched, s.succeeded, s.failed, s.retried) == (2, 1, 1, 0)


def test_gauges_describe_the_pool_now() -> None:
    sim = Sim.make(pool(2))
    sim.submit("r1")
    sim.submit("r2")
    sim.submit("high", priority=Priority.HIGH)
    sim.submit("low-1", priority=Priority.LOW)
    sim.submit("low-2", priority=Priority.LOW)
    sim.submit("later", fixed_start=FixedStart(START + ns(600)))
    s = snap(sim)
    assert s.capacity == 2 and s.busy == 2 and s.held == 0
    assert s.pending == 4
    assert s.pending_by_class == [0, 1, 1, 2]  # the fixed-start task is Normal
    assert s.ready == 3
    assert s.reservations == 1
    totals = sim.core.snapshot(sim.now)
    assert (totals.running, totals.pending, totals.live_tasks) == (2, 4, 6)


def test_counts_drop_out_of_the_60s_window() -> None:
    sim = Sim.make(pool(4))
    sim.advance(1)
    for _ in range(3):
        sim.complete(sim.lease_of(sim.submit("early")))
    advance_to(sim, 31)
    sim.complete(sim.lease_of(sim.submit("middle")))
    advance_to(sim, 55)
    assert (snap(sim).dispatched, snap(sim).succeeded) == (4, 4)
    advance_to(sim, 66)  # more than 60 s (plus one 5 s bucket) after the first three
    assert (snap(sim).dispatched, snap(sim).succeeded) == (1, 1)
    advance_to(sim, 97)
    assert (snap(sim).dispatched, snap(sim).succeeded) == (0, 0)
    # Totals since start do not expire.
    assert sim.core.totals["dispatched"] == 4
    assert sim.core.totals["succeeded"] == 4


def test_window_length_is_sixty_seconds() -> None:
    sim = Sim.make(pool())
    sim.advance(30)
    assert snap(sim).window == pytest.approx(30.0)
    sim.advance(300)
    # A ring of 12 five-second buckets: the oldest bucket may be partly gone.
    assert 55.0 <= snap(sim).window <= 60.0


def test_window_follows_the_configured_metrics_window() -> None:
    sim = Sim.make(pool(4), metrics_window=ns(12))  # 12 buckets of 1 s
    sim.complete(sim.lease_of(sim.submit("early")))
    advance_to(sim, 10)
    assert snap(sim).dispatched == 1
    advance_to(sim, 13.5)
    assert snap(sim).dispatched == 0


# ---------------------------------------------------------------------------------------------
# Percentiles


def test_wait_and_run_percentiles() -> None:
    # One worker, 100 tasks queued at once, 0.1 s each: waits 0, 0.1, ..., 9.9 s.
    sim = Sim.make(pool(1))

    def runner(lease: Lease) -> tuple[float, Outcome]:
        return 0.1, Success(None)

    sim.runner = runner
    for i in range(100):
        sim.submit(f"t{i}")
    sim.advance(11)
    s = snap(sim)
    assert s.dispatched == 100 and s.succeeded == 100
    assert within(s.wait_p50, 4.9)
    assert within(s.wait_p90, 8.9)
    assert within(s.wait_p99, 9.8)
    assert s.wait_mean == pytest.approx(4.95, rel=1e-6)
    assert within(s.run_p50, 0.1)
    assert within(s.run_p99, 0.1)


def test_wait_is_measured_from_ready_not_from_submission() -> None:
    # A child blocked for 10 s on its parent, then dispatched at once, waited 0 s.
    sim = Sim.make(pool(2))
    parent = sim.submit("parent")
    sim.submit("child", deps=(Dep(parent),))
    sim.advance(10)
    sim.complete(sim.lease_of(parent))
    s = snap(sim)
    assert s.dispatched == 2
    assert s.wait_p99 == 0.0


def test_run_percentiles_reflect_long_and_short_runs() -> None:
    sim = Sim.make(pool(4))
    fast = [sim.submit(f"fast{i}") for i in range(3)]
    slow = sim.submit("slow")
    sim.advance(2)
    for task_id in fast:
        sim.complete(sim.lease_of(task_id))
    sim.advance(18)
    sim.complete(sim.lease_of(slow))
    s = snap(sim)
    assert within(s.run_p50, 2.0)
    assert within(s.run_p99, 20.0)


def test_empty_pool_has_zero_percentiles() -> None:
    sim = Sim.make(pool())
    s = snap(sim)
    assert (s.wait_p50, s.wait_p90, s.wait_p99, s.run_p50, s.run_p99, s.wait_mean) == (0, 0, 0, 0, 0, 0)
    assert s.dispatched == 0 and s.priority_adherence == 1.0


# ---------------------------------------------------------------------------------------------
# Utilization


def test_utilization_is_busy_over_capacity() -> None:
    sim = Sim.make(pool(2))
    task = sim.submit("one")
    advance_to(sim, 20)
    sim.complete(sim.lease_of(task))
    advance_to(sim, 30)
    # 1 slot x 20 s busy out of 2 slots x 30 s.
    assert snap(sim).utilization == pytest.approx(20 / 60, rel=1e-12)


def test_utilization_integrates_capacity_changes() -> None:
    sim = Sim.make(pool(4, min_workers=0))
    sim.core.set_capacity(sim.now, "default", 2)
    sim.step()
    advance_to(sim, 5)
    a, b = sim.submit("a"), sim.submit("b")
    advance_to(sim, 10)
    sim.core.set_capacity(sim.now, "default", 4)
    sim.step()
    advance_to(sim, 25)
    sim.complete(sim.lease_of(a))
    sim.complete(sim.lease_of(b))
    advance_to(sim, 30)
    # capacity: 2 x 10 s + 4 x 20 s = 100 slot-s; busy: 2 x 20 s = 40 slot-s.
    assert snap(sim).utilization == pytest.approx(0.4, rel=1e-12)


def test_utilization_covers_the_window_only() -> None:
    sim = Sim.make(pool(2))
    task = sim.submit("one")
    advance_to(sim, 100)
    sim.complete(sim.lease_of(task))
    advance_to(sim, 170)
    assert snap(sim).utilization == 0.0
    steady = sim.submit("steady")
    advance_to(sim, 300)
    assert snap(sim).utilization == pytest.approx(0.5, rel=1e-12)
    sim.complete(sim.lease_of(steady))


def test_utilization_without_capacity_is_zero() -> None:
    sim = Sim.make(PoolConfig("default", min_workers=0, max_workers=2, initial_workers=0))
    sim.advance(10)
    assert snap(sim).utilization == 0.0


# ---------------------------------------------------------------------------------------------
# Worker seconds and cost


def test_worker_seconds_accumulate_since_start() -> None:
    sim = Sim.make(PoolConfig("default", min_workers=0, max_workers=4, initial_workers=2))
    advance_to(sim, 10)
    assert snap(sim).worker_seconds == pytest.approx(20.0)
    sim.core.set_capacity(sim.now, "default", 4)
    sim.step()
    advance_to(sim, 15)
    assert snap(sim).worker_seconds == pytest.approx(40.0)
    advance_to(sim, 115)  # well past the metrics window: not windowed
    assert snap(sim).worker_seconds == pytest.approx(440.0)
    assert snap(sim).cost == 0.0  # no cost rate configured


def test_cost_is_worker_seconds_times_cost_per_worker_second() -> None:
    scaling = AutoscaleConfig(cost_per_worker_second=0.25)
    sim = Sim.make(PoolConfig("default", min_workers=2, max_workers=8, initial_workers=2, autoscale=scaling))
    advance_to(sim, 10)
    s = snap(sim)
    assert s.worker_seconds == pytest.approx(20.0)
    assert s.cost == pytest.approx(5.0)
    sim.core.set_capacity(sim.now, "default", 6)
    sim.step()
    advance_to(sim, 100)
    s = snap(sim)
    assert s.worker_seconds == pytest.approx(20.0 + 6 * 90)
    assert s.cost == pytest.approx(0.25 * (20.0 + 6 * 90))


def test_worker_seconds_are_per_pool() -> None:
    sim = Sim.make(pool(2), PoolConfig("batch", max_workers=3, initial_workers=3))
    advance_to(sim, 10)
    assert snap(sim).worker_seconds == pytest.approx(20.0)
    assert snap(sim, "batch").worker_seconds == pytest.approx(30.0)


# ---------------------------------------------------------------------------------------------
# Totals since start


def test_totals_have_every_documented_counter() -> None:
    sim = Sim.make(pool())
    totals = sim.core.snapshot(sim.now).totals
    documented = {
        "submitted",
        "dispatched",
        "succeeded",
        "failed",
        "dead_lettered",
        "cancelled",
        "skipped",
        "missed",
        "shed",
        "retries",
        "timeouts",
        "lease_expiries",
        "stale_completions",
        "recurring_conflicts",
        "recurring_invalid",
    }
    assert documented <= set(totals)
    assert set(TOTAL_NAMES) >= documented
    assert all(totals[name] == 0 for name in documented)


def test_totals_for_outcomes_and_retries() -> None:
    sim = Sim.make(pool(4))
    ok = sim.submit("ok")
    bad = sim.submit("bad")
    flaky = sim.submit("flaky", retry=RetryPolicy(max_attempts=2, initial_backoff=ns(1), jitter=False))
    sim.complete(sim.lease_of(ok))
    sim.fail(sim.lease_of(bad), permanent=True)
    sim.fail(sim.lease_of(flaky))
    sim.advance(1)
    sim.fail(sim.lease_of(flaky))  # out of attempts
    totals = sim.core.snapshot(sim.now).totals
    assert totals["submitted"] == 3
    assert totals["dispatched"] == 4
    assert totals["succeeded"] == 1
    assert totals["failed"] == 1
    assert totals["dead_lettered"] == 1
    assert totals["retries"] == 1
    assert sim.status(flaky) == "dead_lettered"


def test_totals_for_cancelled_skipped_and_missed() -> None:
    sim = Sim.make(pool(1))
    long = sim.submit("long")
    queued = sim.submit("queued")
    child = sim.submit("child", deps=(Dep(long),))
    sim.submit("fixed", fixed_start=FixedStart(START + ns(5), on_miss=MissPolicy.SKIP))
    assert sim.core.cancel(sim.now, queued)
    sim.step()
    sim.advance(10)  # the fixed start misses: the only worker is busy
    sim.fail(sim.lease_of(long), permanent=True)  # the child can no longer run
    assert sim.status(child) == "skipped"
    totals = sim.core.snapshot(sim.now).totals
    assert totals["cancelled"] == 1
    assert totals["missed"] == 1
    assert totals["skipped"] == 1
    assert totals["failed"] == 1
    assert totals["submitted"] == 4
    assert totals["dispatched"] == 1


def test_totals_count_shed_tasks() -> None:
    bounded = PoolConfig(
        "default", max_workers=1, initial_workers=1, bounds=Bounds(max_pending=1), overflow=OverflowPolicy.SHED_LOWEST
    )
    sim = Sim.make(bounded)
    sim.submit("running")
    low = sim.submit("low", priority=Priority.LOW)
    sim.submit("high", priority=Priority.HIGH)
    assert sim.status(low) == "shed"
    assert sim.core.snapshot(sim.now).totals["shed"] == 1


def test_totals_for_timeouts_and_stale_completions() -> None:
    sim = Sim.make(pool(2))
    task = sim.submit("slow", timeout=ns(1), retry=RetryPolicy.none())
    lease = sim.lease_of(task)
    sim.advance(2)
    assert sim.status(task) == "dead_lettered"
    assert sim.complete(lease) is False  # the attempt was already aborted
    totals = sim.core.snapshot(sim.now).totals
    assert totals["timeouts"] == 1
    assert totals["stale_completions"] == 1
    assert totals["dead_lettered"] == 1
    assert totals["succeeded"] == 0


def test_totals_count_lease_expiries() -> None:
    sim = Sim.make(pool(2, lease_ttl=ns(2)))
    task = sim.submit("silent", retry=NO_JITTER)
    lease = sim.lease_of(task)
    sim.advance(1)
    assert sim.core.heartbeat(sim.now, lease.id)
    sim.advance(1.5)  # heartbeat extended the lease to 3 s
    assert sim.status(task) == "running"
    sim.advance(1)
    assert sim.status(task) in ("retrying", "running")
    totals = sim.core.snapshot(sim.now).totals
    assert totals["lease_expiries"] == 1
    assert totals["retries"] == 1
