"""Scenario tests for the spec chapter "Priorities and aging" (and the use case "Interactive and
batch work on shared capacity"), driven through the virtual-time harness.

score = base[class] + min(aging_rate x seconds waiting, age_cap) + urgency, with the defaults
base = (10000, 1000, 100, 10), aging_rate = 2 /s and age_cap = 800 for every class. Ties go to
the more important class, then to the earlier submission.
"""

from __future__ import annotations

from cronoq.engine import (
    Dep,
    PoolConfig,
    Priority,
    PriorityConfig,
    ResourceConfig,
    RetryPolicy,
)

from .sim import Sim, ns

CRITICAL, HIGH, NORMAL, LOW = Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW


def single_worker(name: str = "default", **options: object) -> PoolConfig:
    return PoolConfig(name, max_workers=1, initial_workers=1, **options)  # type: ignore[arg-type]


def busy_sim(*pools: PoolConfig, **config: object) -> Sim:
    """A one-worker pool whose only slot is taken by a task called "blocker"."""
    sim = Sim.make(*(pools or (single_worker(),)), **config)
    sim.submit("blocker", priority=CRITICAL)
    assert sim.order() == ["blocker"]
    return sim


def finish_blocker_and_drain(sim: Sim) -> list[object]:
    """Complete the blocker, then every task dispatched after it, one at a time; return the
    payloads dispatched after the blocker, in order."""
    while sim.running:
        sim.complete(min(sim.running))
    order = sim.order()
    return order[order.index("blocker") + 1 :]


def adherence(sim: Sim, pool: str = "default") -> float:
    snap = sim.core.snapshot(sim.now).pool(pool)
    assert snap is not None
    return snap.priority_adherence


# ---------------------------------------------------------------------------------------------
# Class order and FIFO


def test_classes_dispatch_most_important_first() -> None:
    sim = busy_sim()
    for name, prio in [("low", LOW), ("normal", NORMAL), ("high", HIGH), ("critical", CRITICAL)]:
        sim.submit(name, priority=prio)
    assert finish_blocker_and_drain(sim) == ["critical", "high", "normal", "low"]


def test_default_priority_is_normal() -> None:
    sim = busy_sim()
    sim.submit("low", priority=LOW)
    sim.submit("unspecified")
    sim.submit("high", priority=HIGH)
    assert finish_blocker_and_drain(sim) == ["high", "unspecified", "low"]


def test_fifo_within_a_class() -> None:
    sim = busy_sim()
    names = [f"n{i}" for i in range(6)]
    for name in names:
        sim.submit(name, priority=NORMAL)
        sim.advance(0.5)
    assert finish_blocker_and_drain(sim) == names


def test_fifo_within_a_class_when_submitted_at_the_same_instant() -> None:
    sim = busy_sim()
    names = [f"low{i}" for i in range(5)]
    for name in names:
        sim.submit(name, priority=LOW)
    assert finish_blocker_and_drain(sim) == names


def test_classes_interleaved_keep_fifo_per_class() -> None:
    sim = busy_sim()
    submitted = [("a", NORMAL), ("b", HIGH), ("c", NORMAL), ("d", HIGH), ("e", LOW), ("f", NORMAL)]
    for name, prio in submitted:
        sim.submit(name, priority=prio)
    assert finish_blocker_and_drain(sim) == ["b", "d", "a", "c", "f", "e"]


def test_equal_scores_go_to_the_more_important_class() -> None:
    # After exactly 45 s a Low task scores 10 + 90 = 100, the score of fresh Normal work: the tie
    # goes to the class, so Normal first, even though the Low task was submitted earlier.
    sim = busy_sim()
    sim.submit("old-low", priority=LOW)
    sim.advance(45)
    sim.submit("fresh-normal", priority=NORMAL)
    assert finish_blocker_and_drain(sim) == ["fresh-normal", "old-low"]


def test_equal_scores_between_aged_tasks_go_to_the_more_important_class() -> None:
    # Low waited 50 s (10 + 100 = 110), Normal waited 5 s (100 + 10 = 110).
    sim = busy_sim()
    sim.submit("low", priority=LOW)
    sim.advance(45)
    sim.submit("normal", priority=NORMAL)
    sim.advance(5)
    assert finish_blocker_and_drain(sim) == ["normal", "low"]


def test_equal_scores_in_one_class_go_to_the_earlier_submission() -> None:
    # A deadline far away adds no urgency, so both tasks below score the same; the one submitted
    # first wins whichever of the class's lanes (plain or deadline) it sits in.
    far = ns(3600)
    sim = busy_sim()
    sim.submit("with-deadline", priority=NORMAL, deadline=sim.now + far)
    sim.submit("plain", priority=NORMAL)
    assert finish_blocker_and_drain(sim) == ["with-deadline", "plain"]

    sim = busy_sim()
    sim.submit("plain", priority=NORMAL)
    sim.submit("with-deadline", priority=NORMAL, deadline=sim.now + far)
    assert finish_blocker_and_drain(sim) == ["plain", "with-deadline"]


# ---------------------------------------------------------------------------------------------
# Aging


def test_low_task_waiting_40s_does_not_overtake_fresh_normal() -> None:
    sim = busy_sim()
    sim.submit("low", priority=LOW)
    sim.advance(40)  # 10 + 80 = 90 < 100
    sim.submit("normal", priority=NORMAL)
    assert finish_blocker_and_drain(sim) == ["normal", "low"]


def test_low_task_waiting_50s_overtakes_fresh_normal() -> None:
    sim = busy_sim()
    sim.submit("low", priority=LOW)
    sim.advance(50)  # 10 + 100 = 110 > 100
    sim.submit("normal", priority=NORMAL)
    assert finish_blocker_and_drain(sim) == ["low", "normal"]


def test_low_task_crosses_over_just_after_45s() -> None:
    sim = busy_sim()
    sim.submit("low", priority=LOW)
    sim.advance(45.5)  # 10 + 91 = 101 > 100
    sim.submit("normal", priority=NORMAL)
    assert finish_blocker_and_drain(sim) == ["low", "normal"]


def test_aged_low_task_still_behind_normal_work_that_also_waited() -> None:
    # Aging is relative: Normal work that waited as long as the Low task stays ahead of it.
    sim = busy_sim()
    sim.submit("low", priority=LOW)
    sim.submit("normal", priority=NORMAL)
    sim.advance(300)
    assert finish_blocker_and_drain(sim) == ["normal", "low"]


def test_aged_low_task_ahead_of_a_stream_of_fresh_normal_work() -> None:
    # Starvation protection: a stream of Normal work every second; once the Low task has waited
    # more than 45 s it is the next one dispatched.
    sim = busy_sim()
    low = sim.submit("low", priority=LOW)
    dispatched_at: float | None = None
    for i in range(80):
        sim.submit(f"normal{i}", priority=NORMAL)
        sim.complete(min(sim.running))  # one task per second gets the worker
        if sim.status(low) == "running":
            dispatched_at = sim.t
            break
        sim.advance(1)
    assert dispatched_at is not None
    assert 45 < dispatched_at <= 47


def test_normal_never_overtakes_fresh_high_however_long_it_waits() -> None:
    sim = busy_sim()
    sim.submit("normal", priority=NORMAL)
    sim.advance(10_000)  # capped: 100 + 800 = 900 < 1000
    sim.submit("high", priority=HIGH)
    assert finish_blocker_and_drain(sim) == ["high", "normal"]


def test_low_never_overtakes_fresh_high_however_long_it_waits() -> None:
    sim = busy_sim()
    sim.submit("low", priority=LOW)
    sim.advance(10_000)  # capped: 10 + 800 = 810 < 1000
    sim.submit("high", priority=HIGH)
    assert finish_blocker_and_drain(sim) == ["high", "low"]


def test_high_never_overtakes_fresh_critical_however_long_it_waits() -> None:
    sim = busy_sim()
    sim.submit("high", priority=HIGH)
    sim.advance(10_000)  # capped: 1000 + 800 = 1800 < 10000
    sim.submit("critical", priority=CRITICAL)
    assert finish_blocker_and_drain(sim) == ["critical", "high"]


def test_capped_low_overtakes_fresh_normal_but_capped_normal_beats_capped_low() -> None:
    sim = busy_sim()
    sim.submit("low", priority=LOW)
    sim.submit("normal-old", priority=NORMAL)
    sim.advance(1_000)  # both capped: low 810, normal 900
    sim.submit("normal-fresh", priority=NORMAL)  # 100
    assert finish_blocker_and_drain(sim) == ["normal-old", "low", "normal-fresh"]


def test_aging_follows_a_custom_priority_config() -> None:
    # A higher age cap for Low lets it overtake fresh High after a long wait (the spec's example
    # of a different aging policy).
    config = PriorityConfig(age_cap=(800.0, 800.0, 800.0, 2000.0))
    sim = busy_sim(priority=config)
    sim.submit("low", priority=LOW)
    sim.advance(500)  # 10 + 1000 = 1010 > 1000
    sim.submit("high", priority=HIGH)
    assert finish_blocker_and_drain(sim) == ["low", "high"]


# ---------------------------------------------------------------------------------------------
# Place in the class after a retry or after waiting for dependencies


def test_retried_task_keeps_its_submission_place_in_its_class() -> None:
    retry = RetryPolicy(max_attempts=3, initial_backoff=1_000_000_000, jitter=False)
    sim = Sim.make(single_worker())
    a = sim.submit("a", retry=retry)
    sim.submit("b")
    sim.submit("c")
    sim.fail(sim.lease_of(a))  # a retries at +1 s; b takes the worker meanwhile
    assert sim.status(a) == "retrying"
    assert sim.order() == ["a", "b"]
    sim.advance(2)
    assert sim.status(a) == "ready"
    while sim.running:
        sim.complete(min(sim.running))
    assert sim.order() == ["a", "b", "a", "c"]


def test_retried_task_ages_from_its_submission() -> None:
    # A Low task submitted at 0 s that fails at 60 s and is ready again at 61 s has waited
    # 62 s by 62 s (10 + 124 = 134): it beats Normal work submitted at 62 s.
    retry = RetryPolicy(max_attempts=3, initial_backoff=1_000_000_000, jitter=False)
    sim = Sim.make(single_worker())
    low = sim.submit("low", priority=LOW, retry=retry)
    sim.advance(59)
    sim.submit("normal-1", priority=NORMAL)
    sim.advance(1)
    sim.fail(sim.lease_of(low))
    assert sim.order() == ["low", "normal-1"]
    sim.advance(2)
    sim.submit("normal-2", priority=NORMAL)
    while sim.running:
        sim.complete(min(sim.running))
    assert sim.order() == ["low", "normal-1", "low", "normal-2"]


def test_task_released_by_dependencies_ages_from_its_submission() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    parent = sim.submit("parent", priority=CRITICAL)
    child = sim.submit("child", priority=LOW, deps=(Dep(parent),))
    sim.advance(50)
    sim.submit("normal", priority=NORMAL)
    assert sim.status(parent) == "running"
    assert sim.status(child) == "blocked"
    sim.complete(sim.lease_of(parent))  # child released at 50 s with 50 s of age: 110 > 100
    while sim.running:
        sim.complete(min(sim.running))
    assert sim.order() == ["parent", "child", "normal"]


def test_task_released_by_dependencies_goes_ahead_of_later_submissions() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    parent = sim.submit("parent", priority=CRITICAL)
    sim.submit("child", priority=NORMAL, deps=(Dep(parent),))
    sim.advance(1)
    for i in range(3):
        sim.submit(f"later{i}", priority=NORMAL)
    sim.advance(1)
    while sim.running:
        sim.complete(min(sim.running))
    assert sim.order() == ["parent", "child", "later0", "later1", "later2"]


def test_task_woken_from_a_resource_goes_back_to_its_place() -> None:
    sim = Sim.make(
        PoolConfig("default", max_workers=2, initial_workers=2),
        resources=(ResourceConfig.semaphore("gpu", 1),),
    )
    holder = sim.submit("holder", priority=CRITICAL, resources={"gpu": 1})
    sim.submit("filler", priority=CRITICAL)
    sim.submit("waiter", priority=NORMAL, resources={"gpu": 1})
    sim.submit("n1", priority=NORMAL)
    sim.submit("n2", priority=NORMAL)
    sim.complete(sim.dispatched[1])  # filler done: waiter wins the slot but parks on the gpu
    assert sim.order() == ["holder", "filler", "n1"]
    sim.complete(sim.lease_of(holder))  # gpu free: waiter back ahead of n2
    assert sim.order() == ["holder", "filler", "n1", "waiter"]
    while sim.running:
        sim.complete(min(sim.running))
    assert sim.order() == ["holder", "filler", "n1", "waiter", "n2"]


# ---------------------------------------------------------------------------------------------
# priority_adherence


def test_adherence_is_one_when_priorities_are_followed() -> None:
    sim = busy_sim()
    for name, prio in [("low", LOW), ("high", HIGH), ("normal", NORMAL)]:
        sim.submit(name, priority=prio)
    finish_blocker_and_drain(sim)
    snap = sim.core.snapshot(sim.now).pool("default")
    assert snap is not None and snap.dispatched == 4
    assert snap.priority_adherence == 1.0


def test_aging_overtake_counts_as_an_inversion() -> None:
    sim = busy_sim()
    sim.submit("low", priority=LOW)
    sim.advance(50)
    sim.submit("normal", priority=NORMAL)
    assert finish_blocker_and_drain(sim) == ["low", "normal"]
    # blocker (none waiting), low (normal was ready: inversion), normal (nothing higher).
    assert adherence(sim) == 1.0 - 1 / 3


def test_dispatch_with_only_lower_classes_waiting_is_no_inversion() -> None:
    sim = busy_sim()
    sim.submit("critical", priority=CRITICAL)
    sim.submit("low", priority=LOW)
    finish_blocker_and_drain(sim)
    assert adherence(sim) == 1.0


def test_task_parked_on_a_resource_is_not_counted_as_waiting() -> None:
    sim = Sim.make(
        PoolConfig("default", max_workers=2, initial_workers=2),
        resources=(ResourceConfig.semaphore("gpu", 1),),
    )
    sim.submit("gpu-1", priority=NORMAL, resources={"gpu": 1})
    gpu_2 = sim.submit("gpu-2", priority=HIGH, resources={"gpu": 1})  # parked: the gpu is taken
    sim.submit("low", priority=LOW)  # gets the second worker
    assert sim.order() == ["gpu-1", "low"]
    assert sim.status(gpu_2) == "ready"
    assert adherence(sim) == 1.0
    sim.complete(sim.dispatched[0])
    assert sim.order() == ["gpu-1", "low", "gpu-2"]
    assert adherence(sim) == 1.0


def test_blocked_task_is_not_counted_as_waiting() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=2, initial_workers=2))
    parent = sim.submit("parent", priority=LOW)
    sim.submit("child", priority=CRITICAL, deps=(Dep(parent),))
    sim.submit("low", priority=LOW)
    assert sim.order() == ["parent", "low"]
    assert adherence(sim) == 1.0


def test_higher_class_waiting_in_another_pool_is_no_inversion() -> None:
    sim = Sim.make(single_worker("a"), single_worker("b"))
    sim.submit("a-blocker", pool="a", priority=CRITICAL)
    sim.submit("a-high", pool="a", priority=HIGH)  # waits: pool a is busy
    sim.submit("b-low", pool="b", priority=LOW)  # pool b is free
    assert sim.order() == ["a-blocker", "b-low"]
    snap_a = sim.core.snapshot(sim.now).pool("a")
    snap_b = sim.core.snapshot(sim.now).pool("b")
    assert snap_a is not None and snap_b is not None
    assert snap_b.dispatched == 1 and snap_b.priority_adherence == 1.0
    assert snap_a.priority_adherence == 1.0


def test_adherence_is_one_with_no_dispatches() -> None:
    sim = Sim.make(single_worker())
    assert adherence(sim) == 1.0
