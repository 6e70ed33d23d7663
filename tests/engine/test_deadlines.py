"""Scenario tests for the spec chapter "Deadlines and urgency" (and the use case "Deadline-driven
work").

d     = duration estimate (hint, else learned median for (pool, kind), else the pool's learned
        median, else the pool's default_duration = 1 s)
LST   = deadline - d; slack = LST - now; H = max(d, 5 s)
urgency = 0 if slack >= H; 5000 x (1 - slack / H) if 0 <= slack < H;
          5000 + min(100 x overdue seconds, 3000) if slack < 0
"""

from __future__ import annotations

import pytest
from cronoq.engine import PoolConfig, Priority, Success

from .sim import Sim, ns

CRITICAL, HIGH, NORMAL, LOW = Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW


def busy_sim(**pool_options: object) -> Sim:
    """A one-worker pool whose only slot is taken by a task called "blocker"."""
    pool = PoolConfig("default", max_workers=1, initial_workers=1, **pool_options)  # type: ignore[arg-type]
    sim = Sim.make(pool)
    sim.submit("blocker", priority=CRITICAL, kind="blocker")
    assert sim.order() == ["blocker"]
    return sim


def finish_blocker_and_drain(sim: Sim) -> list[object]:
    while sim.running:
        sim.complete(min(sim.running))
    order = sim.order()
    return order[order.index("blocker") + 1 :]


def urgency_at(sim: Sim, task_id: int, now: int) -> float:
    """The urgency term of a task's score at ``now`` (reads the engine's own computation)."""
    return sim.core.urgency(task_id, now)


def pause(sim: Sim) -> None:
    sim.core.set_capacity(sim.now, "default", 0)
    sim.step()


def resume_and_drain(sim: Sim, capacity: int = 1) -> list[object]:
    """Give the pool its workers back and run whatever is queued, one at a time (no time passes)."""
    already = len(sim.dispatched)
    sim.core.set_capacity(sim.now, "default", capacity)
    sim.step()
    while sim.running:
        sim.complete(min(sim.running))
    return [lease.payload for lease in sim.dispatched[already:]]


def run_history(sim: Sim, kind: str, seconds: float, count: int) -> None:
    """Run ``count`` tasks of ``kind`` for ``seconds`` each, in parallel (count <= free workers)."""
    ids = [sim.submit(f"{kind}-history", kind=kind) for _ in range(count)]
    assert all(sim.status(i) == "running" for i in ids)
    sim.advance(seconds)
    for i in ids:
        sim.complete(sim.lease_of(i))


# ---------------------------------------------------------------------------------------------
# The urgency curve, exact values


def test_urgency_curve_with_the_default_estimate() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=0))
    deadline = sim.now + ns(100)
    task = sim.submit("t", deadline=deadline)
    lst = deadline - ns(1)  # default_duration 1 s; H = max(1 s, 5 s) = 5 s
    assert urgency_at(sim, task, lst - ns(60)) == 0.0
    assert urgency_at(sim, task, lst - ns(5)) == 0.0
    assert urgency_at(sim, task, lst - ns(4)) == pytest.approx(1000.0)
    assert urgency_at(sim, task, lst - ns(2.5)) == pytest.approx(2500.0)
    assert urgency_at(sim, task, lst - ns(1)) == pytest.approx(4000.0)
    assert urgency_at(sim, task, lst) == pytest.approx(5000.0)
    assert urgency_at(sim, task, lst + ns(1)) == pytest.approx(5100.0)
    assert urgency_at(sim, task, lst + ns(10)) == pytest.approx(6000.0)
    assert urgency_at(sim, task, lst + ns(30)) == pytest.approx(8000.0)
    assert urgency_at(sim, task, lst + ns(31)) == pytest.approx(8000.0)
    assert urgency_at(sim, task, lst + ns(3600)) == pytest.approx(8000.0)


def test_urgency_horizon_is_the_estimate_when_longer_than_the_window() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=0))
    deadline = sim.now + ns(1000)
    task = sim.submit("t", deadline=deadline, duration_hint=ns(20))
    lst = deadline - ns(20)  # H = 20 s
    assert urgency_at(sim, task, lst - ns(20)) == 0.0
    assert urgency_at(sim, task, lst - ns(19)) == pytest.approx(250.0)
    assert urgency_at(sim, task, lst - ns(10)) == pytest.approx(2500.0)
    assert urgency_at(sim, task, lst - ns(5)) == pytest.approx(3750.0)
    assert urgency_at(sim, task, lst) == pytest.approx(5000.0)
    assert urgency_at(sim, task, lst + ns(5)) == pytest.approx(5500.0)


def test_urgency_horizon_is_the_window_when_the_estimate_is_short() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=0))
    deadline = sim.now + ns(1000)
    task = sim.submit("t", deadline=deadline, duration_hint=ns(3))
    lst = deadline - ns(3)  # H = max(3 s, 5 s) = 5 s
    assert urgency_at(sim, task, lst - ns(5)) == 0.0
    assert urgency_at(sim, task, lst - ns(2.5)) == pytest.approx(2500.0)


def test_urgency_is_monotonic_in_lateness() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=0))
    deadline = sim.now + ns(1000)
    task = sim.submit("t", deadline=deadline, duration_hint=ns(8))
    lst = deadline - ns(8)
    previous = -1.0
    for tenth in range(-200, 600):
        value = urgency_at(sim, task, lst + tenth * ns(0.1))
        assert value >= previous
        previous = value
    assert previous == pytest.approx(8000.0)


# ---------------------------------------------------------------------------------------------
# Urgency through dispatch order (all tasks submitted at the instant the worker frees: no aging)


def test_low_task_at_its_latest_start_overtakes_fresh_high_but_not_critical() -> None:
    sim = busy_sim()
    sim.submit("high", priority=HIGH)
    sim.submit("critical", priority=CRITICAL)
    sim.submit("low-due", priority=LOW, deadline=sim.now + ns(1))  # slack 0: 10 + 5000
    assert finish_blocker_and_drain(sim) == ["critical", "low-due", "high"]


def test_low_task_with_a_distant_deadline_stays_behind_high() -> None:
    sim = busy_sim()
    sim.submit("low-later", priority=LOW, deadline=sim.now + ns(600))
    sim.submit("high", priority=HIGH)
    assert finish_blocker_and_drain(sim) == ["high", "low-later"]


def test_normal_task_overtakes_high_once_urgency_exceeds_900() -> None:
    # 100 + 5000 x (1 - slack / 5) > 1000  <=>  slack < 4.1 s
    sim = busy_sim()
    sim.submit("high", priority=HIGH)
    sim.submit("normal", priority=NORMAL, deadline=sim.now + ns(1 + 4.0))  # 100 + 1000
    assert finish_blocker_and_drain(sim) == ["normal", "high"]

    sim = busy_sim()
    sim.submit("high", priority=HIGH)
    sim.submit("normal", priority=NORMAL, deadline=sim.now + ns(1 + 4.2))  # 100 + 800
    assert finish_blocker_and_drain(sim) == ["high", "normal"]


def test_urgency_grows_while_the_task_waits() -> None:
    # Submitted 10 s before its latest start; worker frees 7 s later (slack 3 s: urgency 2000).
    sim = busy_sim()
    sim.submit("normal", priority=NORMAL, deadline=sim.now + ns(11))
    sim.advance(7)
    sim.submit("high", priority=HIGH)
    assert finish_blocker_and_drain(sim) == ["normal", "high"]


def test_overdue_urgency_is_capped_below_critical() -> None:
    # Overdue by 1000 s: without the cap the Low task would score far above 10000.
    sim = busy_sim()
    sim.submit("critical", priority=CRITICAL)
    sim.submit("low-overdue", priority=LOW, deadline=sim.now - ns(1000))  # 10 + 8000
    sim.submit("high", priority=HIGH)
    assert finish_blocker_and_drain(sim) == ["critical", "low-overdue", "high"]


def test_overdue_task_ranks_above_one_merely_at_its_latest_start() -> None:
    # High at slack 0 scores 1000 + 5000 = 6000; Low overdue by 10 s scores 10 + 6000 = 6010.
    sim = busy_sim()
    sim.submit("high-due", priority=HIGH, deadline=sim.now + ns(1))
    sim.submit("low-late", priority=LOW, deadline=sim.now - ns(9))
    assert finish_blocker_and_drain(sim) == ["low-late", "high-due"]


def test_deadline_task_competes_with_the_fifo_lane_by_full_score() -> None:
    # An older plain Normal task (waited 10 s: 120) beats a fresh one with a distant deadline
    # (100), but not a fresh one close to its deadline (100 + 5000 at slack 0).
    sim = busy_sim()
    sim.submit("plain-old", priority=NORMAL)
    sim.advance(10)
    sim.submit("deadline-far", priority=NORMAL, deadline=sim.now + ns(600))
    sim.submit("deadline-near", priority=NORMAL, deadline=sim.now + ns(1))
    assert finish_blocker_and_drain(sim) == ["deadline-near", "plain-old", "deadline-far"]


# ---------------------------------------------------------------------------------------------
# Earliest latest-start-time first within a class


def test_deadline_tasks_of_one_class_run_by_latest_start_time() -> None:
    sim = busy_sim()
    for seconds in (300, 100, 500, 200):
        sim.submit(f"d{seconds}", priority=NORMAL, deadline=sim.now + ns(seconds))
    assert finish_blocker_and_drain(sim) == ["d100", "d200", "d300", "d500"]


def test_latest_start_time_not_deadline_decides() -> None:
    # "long" is due later but must start earlier: LST 110 s - 90 s = 20 s vs 50 s - 1 s = 49 s.
    sim = busy_sim()
    sim.submit("short", priority=NORMAL, deadline=sim.now + ns(50), duration_hint=ns(1))
    sim.submit("long", priority=NORMAL, deadline=sim.now + ns(110), duration_hint=ns(90))
    assert finish_blocker_and_drain(sim) == ["long", "short"]


def test_edf_order_does_not_depend_on_submission_order() -> None:
    sim = busy_sim()
    sim.submit("late", priority=LOW, deadline=sim.now + ns(400))
    sim.advance(30)  # the earlier submission has more age, but both have the same class
    sim.submit("early", priority=LOW, deadline=sim.now + ns(100))
    assert finish_blocker_and_drain(sim) == ["early", "late"]


# ---------------------------------------------------------------------------------------------
# The duration estimate chain, seen through latest-start-time order


def test_estimate_defaults_to_one_second() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    pause(sim)
    # Nothing has completed: "guess" is estimated at 1 s, so its LST is 99 s (< 99.3 s).
    sim.submit("guess", deadline=sim.now + ns(100))
    sim.submit("hinted", deadline=sim.now + ns(99.5), duration_hint=ns(0.2))
    sim.submit("hinted-earlier", deadline=sim.now + ns(98.9), duration_hint=0)
    assert resume_and_drain(sim) == ["hinted-earlier", "guess", "hinted"]


def test_estimate_uses_the_pool_default_duration() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1, default_duration=ns(10)))
    pause(sim)
    sim.submit("guess", deadline=sim.now + ns(100))  # LST 90 s
    sim.submit("hinted-91", deadline=sim.now + ns(91), duration_hint=0)
    sim.submit("hinted-89", deadline=sim.now + ns(89), duration_hint=0)
    assert resume_and_drain(sim) == ["hinted-89", "guess", "hinted-91"]


def test_estimate_uses_the_learned_median_of_the_kind() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=4, initial_workers=4))
    run_history(sim, "slow", 20, 3)
    run_history(sim, "fast", 2, 4)
    run_history(sim, "fast", 2, 1)
    pause(sim)
    # "slow" has a median of 20 s: LST about 80 s. The pool's median (2 s) would give 98 s and
    # the default (1 s) 99 s, both after "hinted" (LST 90 s).
    sim.submit("slow-task", kind="slow", deadline=sim.now + ns(100))
    sim.submit("hinted", kind="slow", deadline=sim.now + ns(90), duration_hint=0)
    assert resume_and_drain(sim) == ["slow-task", "hinted"]


def test_hint_takes_precedence_over_the_learned_median() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=4, initial_workers=4))
    run_history(sim, "slow", 20, 3)
    pause(sim)
    sim.submit("slow-hinted", kind="slow", deadline=sim.now + ns(100), duration_hint=ns(1))  # 99 s
    sim.submit("other", kind="slow", deadline=sim.now + ns(95), duration_hint=0)  # 95 s
    assert resume_and_drain(sim) == ["other", "slow-hinted"]


def test_estimate_of_an_unseen_kind_uses_the_pool_median() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=4, initial_workers=4))
    run_history(sim, "slow", 20, 3)
    run_history(sim, "fast", 2, 4)
    run_history(sim, "fast", 2, 1)
    pause(sim)
    # The pool's median run time is 2 s (5 of 8 runs took 2 s): "new-kind" gets LST ~88 s, before
    # "hinted" at 88.5 s. With the default 1 s it would be 89 s, after it; with the median of
    # "slow" (20 s) it would be 70 s, before "hinted-70.5".
    sim.submit("hinted-88.5", kind="x", deadline=sim.now + ns(88.5), duration_hint=0)
    sim.submit("new-kind", kind="never-seen", deadline=sim.now + ns(90))
    sim.submit("hinted-70.5", kind="x", deadline=sim.now + ns(70.5), duration_hint=0)
    assert resume_and_drain(sim) == ["hinted-70.5", "new-kind", "hinted-88.5"]


def test_learned_median_is_per_pool() -> None:
    sim = Sim.make(
        PoolConfig("default", max_workers=4, initial_workers=4),
        PoolConfig("other", max_workers=1, initial_workers=1),
    )
    run_history(sim, "slow", 20, 3)  # in "default" only
    sim.core.set_capacity(sim.now, "other", 0)
    sim.step()
    # In "other" nothing completed: the estimate is 1 s (LST 99 s), not 20 s (LST 80 s).
    sim.submit("slow-elsewhere", pool="other", kind="slow", deadline=sim.now + ns(100))
    sim.submit("hinted", pool="other", kind="slow", deadline=sim.now + ns(90), duration_hint=0)
    already = len(sim.dispatched)
    sim.core.set_capacity(sim.now, "other", 1)
    sim.step()
    while sim.running:
        sim.complete(min(sim.running))
    assert [lease.payload for lease in sim.dispatched[already:]] == ["hinted", "slow-elsewhere"]


# ---------------------------------------------------------------------------------------------
# A deadline is soft


def test_passed_deadline_does_not_cancel_a_waiting_task() -> None:
    sim = busy_sim()
    task = sim.submit("late", deadline=sim.now + ns(2))
    sim.advance(100)
    assert sim.status(task) == "ready"
    assert sim.core.totals["cancelled"] == 0
    finish_blocker_and_drain(sim)
    assert sim.status(task) == "succeeded"


def test_passed_deadline_does_not_abort_a_running_task() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    deadline = sim.now + ns(5)
    task = sim.submit("slow", deadline=deadline)
    lease = sim.lease_of(task)
    assert lease.deadline == deadline  # executors can see the deadline
    sim.advance(60)
    assert sim.aborts == []
    assert sim.status(task) == "running"
    assert sim.complete(lease, Success("done"))
    assert sim.status(task) == "succeeded"
    info = sim.info(task)
    assert info.deadline == deadline
