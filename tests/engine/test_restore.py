"""Recovery: re-creating engine state from persisted mutations (or a hand-built ``Recovered``).

Spec: durability-ha.txt ("Model", "Recovery"), tasks-lifecycle.txt / retries-timeouts-leases.txt
("Recovery after a crash", "Attempt numbers never repeat ... also across failovers"), book
"Dependencies and keys" (a parent no longer retained counts as satisfied), "Recurring" (downtime).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from cronoq.engine import (
    RECURRING_TAG,
    ConfigError,
    Core,
    CoreConfig,
    DeleteRecurring,
    Dep,
    EdgeCond,
    FixedStart,
    MissPolicy,
    OverlapPolicy,
    PoolConfig,
    Priority,
    PutRecurring,
    PutTask,
    Recovered,
    RecoveredRecurring,
    RecoveredTask,
    RecurringSpec,
    RetryPolicy,
    SetStatus,
    Success,
    TaskRecord,
    TaskSpec,
    TaskStatus,
)

from .sim import START, Sim, ns


def pool(workers: int = 4, **extra: object) -> PoolConfig:
    return PoolConfig(
        "default", max_workers=max(4, workers), initial_workers=workers, retry=RetryPolicy(jitter=False), **extra
    )  # type: ignore[arg-type]


def recover(mutations: Iterable[object], lease_high_water: int = 0) -> Recovered:
    """Fold a write-ahead log of mutations the way a store's recovery would."""
    tasks: dict[int, dict[str, object]] = {}
    schedules: dict[str, RecoveredRecurring] = {}
    high = 0
    for mutation in mutations:
        if isinstance(mutation, PutTask):
            record = mutation.task
            high = max(high, record.id)
            tasks[record.id] = {"record": record, "status": record.status, "attempt": 0}
        elif isinstance(mutation, SetStatus):
            row = tasks[mutation.id]
            row["status"] = mutation.status
            row["attempt"] = mutation.attempt
            row["message"] = mutation.message
            row["retry_at"] = mutation.retry_at
            if mutation.status is TaskStatus.RUNNING:
                row["started_at"] = mutation.at
            if mutation.status.terminal:
                row["finished_at"] = mutation.at
                row["has_output"] = mutation.has_output
        elif isinstance(mutation, PutRecurring):
            schedules[mutation.spec.name] = RecoveredRecurring(
                mutation.spec, mutation.next_at, mutation.last_task_id, mutation.paused
            )
        elif isinstance(mutation, DeleteRecurring):
            schedules.pop(mutation.name, None)
    return Recovered(
        tasks=[RecoveredTask(**row) for row in tasks.values()],  # type: ignore[arg-type]
        recurring=list(schedules.values()),
        id_high_water=high,
        lease_high_water=lease_high_water,
    )


def crash_and_restore(old: Sim, *pools: PoolConfig, at: float = 0.0, **config: object) -> Sim:
    """Start a fresh engine from what ``old`` persisted, ``at`` seconds after ``old.now``."""
    lease_high = max((lease.id for lease in old.dispatched), default=0)
    recovered = recover(old.persisted, lease_high)
    now = old.now + ns(at)
    core = Core(CoreConfig(pools=pools or (pool(),), **config), now=now)  # type: ignore[arg-type]
    core.restore(now, recovered)
    new = Sim(core, now=now)
    new.step()
    return new


def persisting(*pools: PoolConfig, **config: object) -> Sim:
    return Sim.make(*(pools or (pool(),)), persist=True, **config)


def record(
    task_id: int,
    spec: TaskSpec,
    status: TaskStatus = TaskStatus.READY,
    max_attempts: int = 3,
    submitted_at: int = START,
) -> TaskRecord:
    return TaskRecord(task_id, "default", spec, submitted_at, status, max_attempts)


# ---------------------------------------------------------------------------------------------


def test_persist_emits_mutations_only_when_enabled() -> None:
    quiet = Sim.make(pool())
    quiet.submit("x")
    assert quiet.persisted == []
    loud = persisting()
    tid = loud.submit("x")
    assert any(isinstance(m, PutTask) and m.task.id == tid for m in loud.persisted)
    assert any(isinstance(m, SetStatus) and m.id == tid and m.status is TaskStatus.RUNNING for m in loud.persisted)


def test_a_step_hands_over_its_mutations_with_its_dispatches() -> None:
    sim = persisting()
    task_id = sim.core.submit(sim.now, TaskSpec(payload="x")).id
    sim.core.tick(sim.now)
    output = sim.core.drain()
    assert [type(m).__name__ for m in output.mutations] == ["PutTask", "SetStatus"]
    assert [d.task_id for d in output.dispatches] == [task_id]
    assert not sim.core.drain()  # drained: the next step starts empty


def test_restore_keeps_ids_and_submission_order() -> None:
    old = persisting(pool(workers=0))
    ids = [old.submit(f"t{i}", key=f"k{i}") for i in range(6)]
    new = crash_and_restore(old, pool(workers=0), at=5)
    assert [t.id for t in new.core.list_tasks()] == ids
    assert [new.info(f"k{i}").id for i in range(6)] == ids
    assert all(new.status(t) == "ready" for t in ids)
    assert new.info(ids[0]).created_at == old.info(ids[0]).created_at
    new.set_capacity(1)
    while new.running:
        new.complete(next(iter(new.running.values())))
    assert [lease.task_id for lease in new.dispatched] == ids


def test_restore_needs_a_fresh_engine() -> None:
    sim = Sim.make(pool())
    sim.submit("x")
    with pytest.raises(ConfigError):
        sim.core.restore(sim.now, Recovered())


def test_running_attempt_counts_as_used_and_is_retried() -> None:
    old = persisting()
    tid = old.submit("interrupted")
    assert old.lease_of(tid).attempt == 1
    new = crash_and_restore(old, at=2)
    info = new.info(tid)
    assert info.status is TaskStatus.RETRYING
    assert info.attempt == 1
    new.advance(1)
    lease = new.lease_of(tid)
    assert lease.attempt == 2  # never repeats the interrupted attempt's number
    new.complete(lease)
    assert new.status(tid) == "succeeded"


def test_running_last_attempt_is_dead_lettered() -> None:
    old = persisting()
    tid = old.submit("last chance", retry=RetryPolicy(max_attempts=2, jitter=False))
    old.fail(old.lease_of(tid))
    old.advance(1)
    assert old.lease_of(tid).attempt == 2
    new = crash_and_restore(old, at=1)
    info = new.info(tid)
    assert info.status is TaskStatus.DEAD_LETTERED
    assert info.attempt == 2
    assert info.message
    assert any(r.event.id == tid and r.event.status is TaskStatus.DEAD_LETTERED for r in new.resolved)


def test_retrying_task_resumes_its_backoff() -> None:
    old = persisting()
    tid = old.submit("x", retry=RetryPolicy(max_attempts=3, initial_backoff=ns(10), jitter=False))
    old.fail(old.lease_of(tid), "first")
    new = crash_and_restore(old, at=4)
    assert new.status(tid) == "retrying"
    new.advance(5.9)
    assert new.status(tid) == "retrying"
    new.advance(0.1)  # 10 s after the failure, as recorded
    assert new.lease_of(tid).attempt == 2


def test_new_ids_and_lease_ids_are_above_the_high_water_marks() -> None:
    old = persisting()
    ids = [old.submit(i) for i in range(3)]
    old_leases = [lease.id for lease in old.dispatched]
    new = crash_and_restore(old, at=1)
    fresh = new.submit("fresh")
    assert fresh > max(ids)
    assert all(lease.id > max(old_leases) for lease in new.dispatched)


def test_ids_are_not_reused_even_after_pruning() -> None:
    recovered = Recovered(id_high_water=(1 << 48) + 500, lease_high_water=(1 << 48) + 900)
    core = Core(CoreConfig(pools=(pool(),)), now=START)
    core.restore(START, recovered)
    sim = Sim(core)
    tid = sim.submit("x")
    assert tid > (1 << 48) + 500
    assert sim.lease_of(tid).id > (1 << 48) + 900


def test_passed_fixed_start_applies_its_miss_policy() -> None:
    old = persisting(PoolConfig("default", max_workers=10, initial_workers=4))
    start = old.now + ns(10)
    skip = old.submit("skip", fixed_start=FixedStart(start, ns(1), MissPolicy.SKIP))
    fail = old.submit("fail", fixed_start=FixedStart(start, ns(1), MissPolicy.FAIL))
    late = old.submit("late", fixed_start=FixedStart(start, ns(1), MissPolicy.RUN_LATE))
    future = old.submit("future", fixed_start=FixedStart(start + ns(600), ns(1), MissPolicy.SKIP))
    old.advance(3)
    new = crash_and_restore(old, PoolConfig("default", max_workers=10, initial_workers=4), at=60)
    # (back 63 s after submission: the start passed)
    assert new.status(skip) == "missed"
    assert new.status(fail) == "failed"
    assert new.status(late) == "running"
    assert new.status(future) == "scheduled"
    new.advance(600 - 63 + 10)
    assert new.status(future) == "running"


def test_fixed_start_within_tolerance_after_restart_still_runs() -> None:
    old = persisting(pool(workers=4))
    start = old.now + ns(10)
    tid = old.submit("on time", fixed_start=FixedStart(start, ns(5), MissPolicy.SKIP))
    new = crash_and_restore(old, at=12)
    assert new.status(tid) == "running"


def test_dependency_on_a_parent_no_longer_known_counts_as_satisfied() -> None:
    gone_id = 12345
    child_by_id = RecoveredTask(record(20_000, TaskSpec(payload="by id", deps=(Dep(gone_id),))), TaskStatus.BLOCKED, 0)
    child_by_key = RecoveredTask(
        record(20_001, TaskSpec(payload="by key", deps=(Dep("gone-key"),))), TaskStatus.BLOCKED, 0
    )
    core = Core(CoreConfig(pools=(pool(),)), now=START)
    core.restore(START, Recovered([child_by_id, child_by_key], id_high_water=20_001))
    sim = Sim(core)
    sim.step()
    assert sim.status(20_000) == "running"
    assert sim.status(20_001) == "running"


def test_dependencies_on_recovered_parents_are_relinked() -> None:
    old = persisting(pool(workers=1))
    parent = old.submit("parent", key="p")
    waits = old.submit("waits", deps=(Dep("p"),))
    alert = old.submit("alert", deps=(Dep(parent, EdgeCond.ON_FAILURE),))
    assert old.status(waits) == "blocked"
    new = crash_and_restore(old, pool(workers=1), at=1)
    # The interrupted parent retries; its children still wait for it.
    assert new.status(parent) == "retrying"
    assert new.status(waits) == "blocked" and new.status(alert) == "blocked"
    new.advance(1)
    new.complete(new.lease_of(parent))
    assert new.status(alert) == "skipped"
    assert new.status(waits) == "running"


def test_child_of_a_retained_terminal_parent() -> None:
    failed_parent = RecoveredTask(
        record(100, TaskSpec(payload="p", key="p")), TaskStatus.FAILED, 1, message="broken", finished_at=START - ns(5)
    )
    ok_child = RecoveredTask(record(101, TaskSpec(payload="ok", deps=(Dep("p"),))), TaskStatus.BLOCKED, 0)
    alert = RecoveredTask(
        record(102, TaskSpec(payload="alert", deps=(Dep(100, EdgeCond.ON_FAILURE),))), TaskStatus.BLOCKED, 0
    )
    core = Core(CoreConfig(pools=(pool(),)), now=START)
    core.restore(START, Recovered([failed_parent, ok_child, alert], id_high_water=102))
    sim = Sim(core)
    sim.step()
    assert sim.status(100) == "failed"
    assert sim.info(100).message == "broken"
    assert sim.status(101) == "skipped"
    assert sim.status(102) == "running"


def test_retained_keys_still_deduplicate_after_restore() -> None:
    old = persisting()
    tid = old.submit("x", key="once")
    old.complete(old.lease_of(tid), Success("out"))
    new = crash_and_restore(old, at=10)
    result = new.core.submit(new.now, TaskSpec(payload="again", key="once"))
    assert result.duplicate and result.id == tid
    assert new.status("once") == "succeeded"
    assert new.info(tid).has_output


def test_restored_priorities_and_attempts() -> None:
    old = persisting(pool(workers=0))
    low = old.submit("low", priority=Priority.LOW)
    critical = old.submit("critical", priority=Priority.CRITICAL)
    new = crash_and_restore(old, pool(workers=0), at=1)
    new.set_capacity(1)
    assert new.status(critical) == "running" and new.status(low) == "ready"
    assert new.info(critical).priority is Priority.CRITICAL


def test_recurring_overlap_guard_survives_a_restart() -> None:
    old = persisting()
    old.core.add_recurring(
        old.now, RecurringSpec("minutely", "* * * * *", TaskSpec(payload="job"), overlap=OverlapPolicy.SKIP)
    )
    old.step()
    old.advance(60)  # one occurrence started and is still running
    occurrences = [t for t in old.core.list_tasks() if t.tags.get(RECURRING_TAG) == "minutely"]
    assert [t.status for t in occurrences] == [TaskStatus.RUNNING]
    first = occurrences[0].id
    new = crash_and_restore(old, at=1)
    assert new.status(first) == "retrying"  # its interrupted attempt counts as used
    new.advance(2)
    assert new.status(first) == "running"
    new.advance(60)  # the next occurrence comes due while the first still runs
    occurrences = [t for t in new.core.list_tasks() if t.tags.get(RECURRING_TAG) == "minutely"]
    assert len(occurrences) == 2
    assert occurrences[1].status is TaskStatus.SKIPPED
    assert new.status(first) == "running"


def test_recurring_queue_overlap_survives_a_restart() -> None:
    old = persisting()
    old.core.add_recurring(
        old.now, RecurringSpec("minutely", "* * * * *", TaskSpec(payload="job"), overlap=OverlapPolicy.QUEUE)
    )
    old.step()
    old.advance(60)
    [first] = [t.id for t in old.core.list_tasks() if t.tags.get(RECURRING_TAG) == "minutely"]
    new = crash_and_restore(old, at=1)
    new.advance(62)
    occurrences = [t for t in new.core.list_tasks() if t.tags.get(RECURRING_TAG) == "minutely"]
    assert len(occurrences) == 2
    second = occurrences[1].id
    assert new.status(second) == "blocked"
    new.complete(new.lease_of(first))
    assert new.status(second) == "running"


def test_reports_from_the_previous_leader_are_stale() -> None:
    old = persisting()
    tid = old.submit("x")
    old_lease = old.lease_of(tid)
    new = crash_and_restore(old, at=1)
    assert new.core.complete(new.now, old_lease.id, Success("late")) is False
    assert new.core.heartbeat(new.now, old_lease.id) is False
    new.step()
    assert new.status(tid) == "retrying"
    assert new.core.snapshot(new.now).totals["stale_completions"] == 1


def test_restored_terminal_statuses_and_messages_are_kept() -> None:
    old = persisting(pool(workers=3))
    ok = old.submit("ok", key="ok")
    bad = old.submit("bad", key="bad")
    gone = old.submit("gone", key="gone")
    old.complete(old.lease_of(ok), Success(1))
    old.fail(old.lease_of(bad), "invalid input", permanent=True)
    old.core.cancel(old.now, gone)
    old.step()
    new = crash_and_restore(old, pool(workers=3), at=30)
    assert new.status("ok") == "succeeded"
    assert new.status("bad") == "failed" and new.info("bad").message == "invalid input"
    assert new.status("gone") == "cancelled"
    assert new.dispatched == []
