"""Task lifecycle through the engine: statuses, keys, retention and cancellation.

Spec: tasks-lifecycle.txt ("Lifecycle", status table, retention), book "Dependencies and keys"
(keys), retries-timeouts-leases.txt ("Cancellation").
"""

from __future__ import annotations

import pytest
from cronoq.engine import (
    AdmissionError,
    Dep,
    EdgeCond,
    FixedStart,
    PoolConfig,
    Priority,
    ResourceConfig,
    RetryPolicy,
    SubmitCode,
    TaskSpec,
    TaskStatus,
    UnknownTask,
)

from .sim import Sim, ns

HOUR = 3600.0


def idle_sim(**config: object) -> Sim:
    """A default pool with no capacity, so submitted tasks stay queued until we add some."""
    sim = Sim.make(PoolConfig("default", max_workers=4, initial_workers=0), **config)
    return sim


# ---------------------------------------------------------------------------------------------
# Statuses


def test_plain_task_walks_ready_running_succeeded() -> None:
    sim = idle_sim()
    tid = sim.submit("job")
    assert sim.status(tid) == "ready"
    assert sim.dispatched == []

    sim.set_capacity(1)
    assert sim.status(tid) == "running"
    lease = sim.lease_of(tid)
    assert (lease.task_id, lease.attempt) == (tid, 1)
    info = sim.info(tid)
    assert info.started_at == sim.now and info.finished_at is None

    sim.advance(2)
    sim.complete(lease)
    info = sim.info(tid)
    assert info.status is TaskStatus.SUCCEEDED
    assert info.finished_at == sim.now
    assert info.attempt == 1
    # One terminal event, carrying the final status and attempt.
    [resolve] = [r for r in sim.resolved if r.event.id == tid]
    assert resolve.event.status is TaskStatus.SUCCEEDED
    assert resolve.event.attempt == 1


def test_each_status_is_reachable() -> None:
    sim = Sim.make(
        PoolConfig("default", max_workers=4, initial_workers=1, retry=RetryPolicy(jitter=False)),
    )
    parent = sim.submit("parent", key="parent")  # runs (capacity 1)
    blocked = sim.submit("child", deps=(Dep("parent"),))
    queued = sim.submit("queued")
    scheduled = sim.submit("later", fixed_start=FixedStart(sim.now + ns(600)))
    assert sim.status(parent) == "running"
    assert sim.status(blocked) == "blocked"
    assert sim.status(queued) == "ready"
    assert sim.status(scheduled) == "scheduled"

    sim.fail(sim.lease_of(parent), "flaky")
    assert sim.status(parent) == "retrying"
    assert TaskStatus.RETRYING.terminal is False


def test_terminal_statuses_are_exactly_the_documented_ones() -> None:
    terminal = {s.value for s in TaskStatus if s.terminal}
    assert terminal == {"succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"}


def test_ids_increase_monotonically() -> None:
    sim = idle_sim()
    ids = [sim.submit(i) for i in range(20)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_emit_transitions_publishes_intermediate_statuses() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=2, initial_workers=0), emit_transitions=True)
    tid = sim.submit("x")
    sim.set_capacity(1)
    sim.complete(sim.lease_of(tid))
    seen = [e.status.value for e in sim.events if e.id == tid]
    assert seen == ["ready", "running", "succeeded"]


def test_without_emit_transitions_only_terminal_events_are_published() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=2, initial_workers=1))
    tid = sim.submit("x")
    sim.complete(sim.lease_of(tid))
    assert [e.status.value for e in sim.events if e.id == tid] == ["succeeded"]


# ---------------------------------------------------------------------------------------------
# Keys and deduplication


def test_key_of_live_task_deduplicates() -> None:
    sim = idle_sim()
    first = sim.core.submit(sim.now, TaskSpec(payload="a", key="k"))
    second = sim.core.submit(sim.now, TaskSpec(payload="b", key="k"))
    sim.step()
    assert first.duplicate is False
    assert second.duplicate is True and second.id == first.id
    assert len(sim.core.list_tasks()) == 1
    assert sim.core.snapshot(sim.now).totals["submitted"] == 1


def test_key_of_finished_task_deduplicates_within_retention() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    tid = sim.submit("a", key="k")
    sim.complete(sim.lease_of(tid))
    sim.advance(HOUR - 60)
    again = sim.core.submit(sim.now, TaskSpec(payload="b", key="k"))
    sim.step()
    assert again.duplicate and again.id == tid
    assert sim.status("k") == "succeeded"
    assert len(sim.dispatched) == 1  # it did not run again


def test_key_is_forgotten_after_retention() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    tid = sim.submit("a", key="k")
    sim.complete(sim.lease_of(tid))
    sim.advance(HOUR + 1)
    assert sim.core.get(tid) is None
    assert sim.core.get("k") is None
    fresh = sim.core.submit(sim.now, TaskSpec(payload="b", key="k"))
    sim.step()
    assert fresh.duplicate is False
    assert fresh.id > tid
    assert sim.status("k") == "running"


def test_retention_is_configurable() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1), retention=ns(10))
    tid = sim.submit("a", key="k")
    sim.complete(sim.lease_of(tid))
    sim.advance(5)
    assert sim.status(tid) == "succeeded"
    sim.advance(6)
    assert sim.core.get(tid) is None


def test_failed_keyed_task_also_keeps_its_key_reserved() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    tid = sim.submit("a", key="k")
    sim.fail(sim.lease_of(tid), "bad input", permanent=True)
    again = sim.core.submit(sim.now, TaskSpec(payload="a", key="k"))
    assert again.duplicate and again.id == tid


def test_retention_max_bounds_retained_entries() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1), retention_max=2)
    ids = []
    for i in range(3):
        tid = sim.submit(i, key=f"k{i}")
        sim.advance(1)
        sim.complete(sim.lease_of(tid))
        ids.append(tid)
    sim.step()
    # The oldest finished entry was dropped; the two newest are still known.
    assert sim.core.get(ids[0]) is None
    assert sim.core.get("k0") is None
    assert sim.status(ids[1]) == "succeeded"
    assert sim.status(ids[2]) == "succeeded"
    # The dropped key can be used again.
    assert sim.core.submit(sim.now, TaskSpec(key="k0")).duplicate is False


def test_live_tasks_are_never_dropped_by_retention() -> None:
    sim = idle_sim(retention=ns(1), retention_max=0)
    tid = sim.submit("waits", key="w")
    sim.advance(HOUR)
    assert sim.status("w") == "ready"
    assert sim.core.get(tid) is not None


def test_lookup_by_key_and_by_id_agree() -> None:
    sim = idle_sim()
    tid = sim.submit("x", key="name")
    assert sim.info("name") == sim.info(tid)
    assert sim.core.get("nope") is None
    assert sim.core.get(tid + 1000) is None


# ---------------------------------------------------------------------------------------------
# Cancellation


def test_cancel_queued_task_removes_it() -> None:
    sim = idle_sim()
    victim = sim.submit("victim")
    other = sim.submit("other")
    assert sim.core.cancel(sim.now, victim) is True
    sim.step()
    assert sim.status(victim) == "cancelled"
    sim.set_capacity(2)
    assert [lease.task_id for lease in sim.dispatched] == [other]
    [resolve] = [r for r in sim.resolved if r.event.id == victim]
    assert resolve.event.status is TaskStatus.CANCELLED


def test_cancel_twice_and_cancel_finished_return_false() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    done = sim.submit("done")
    sim.complete(sim.lease_of(done))
    assert sim.core.cancel(sim.now, done) is False
    assert sim.status(done) == "succeeded"

    queued = sim.submit("q")
    sim.core.set_capacity(sim.now, "default", 0)
    assert sim.core.cancel(sim.now, queued) is True
    assert sim.core.cancel(sim.now, queued) is False
    sim.step()


def test_cancel_unknown_reference_raises() -> None:
    sim = idle_sim()
    with pytest.raises(UnknownTask):
        sim.core.cancel(sim.now, 123456)
    with pytest.raises(UnknownTask):
        sim.core.cancel(sim.now, "no-such-key")


def test_cancel_by_key() -> None:
    sim = idle_sim()
    tid = sim.submit("x", key="by-key")
    assert sim.core.cancel(sim.now, "by-key") is True
    sim.step()
    assert sim.status(tid) == "cancelled"


def test_cancel_running_task_aborts_its_attempt_and_frees_the_slot() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    running = sim.submit("running")
    waiting = sim.submit("waiting")
    lease = sim.lease_of(running)
    assert sim.core.cancel(sim.now, running) is True
    sim.step()
    assert [a.lease_id for a in sim.aborts] == [lease.id]
    assert sim.aborts[0].task_id == running
    assert sim.status(running) == "cancelled"
    # The freed slot goes to the next task.
    assert sim.status(waiting) == "running"
    # The aborted attempt's late report changes nothing and is counted as stale.
    stale_before = sim.core.snapshot(sim.now).totals["stale_completions"]
    assert sim.complete(lease) is False
    assert sim.status(running) == "cancelled"
    assert sim.core.snapshot(sim.now).totals["stale_completions"] == stale_before + 1


def test_cancel_blocked_task_stays_cancelled_when_parent_finishes() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=2, initial_workers=1))
    parent = sim.submit("parent")
    child = sim.submit("child", deps=(Dep(parent),))
    assert sim.status(child) == "blocked"
    assert sim.core.cancel(sim.now, child)
    sim.step()
    sim.complete(sim.lease_of(parent))
    assert sim.status(child) == "cancelled"
    assert [lease.task_id for lease in sim.dispatched] == [parent]


def test_cancel_retrying_task_prevents_the_retry() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1, retry=RetryPolicy(jitter=False)))
    tid = sim.submit("flaky")
    sim.fail(sim.lease_of(tid))
    assert sim.status(tid) == "retrying"
    assert sim.core.cancel(sim.now, tid)
    sim.step()
    sim.advance(120)
    assert sim.status(tid) == "cancelled"
    assert len(sim.dispatched) == 1
    assert sim.info(tid).attempt == 1


def test_cancel_scheduled_fixed_start_releases_its_reservation() -> None:
    # max_workers=2 with the default reservable fraction 0.5 allows one reservation at a time.
    sim = Sim.make(PoolConfig("default", max_workers=2, initial_workers=2))
    start = sim.now + ns(600)
    first = sim.submit("first", fixed_start=FixedStart(start))
    with pytest.raises(AdmissionError) as err:
        sim.submit("second", fixed_start=FixedStart(start))
    assert err.value.code is SubmitCode.RESERVATION_CONFLICT
    assert sim.core.cancel(sim.now, first)
    sim.step()
    second = sim.submit("second", fixed_start=FixedStart(start))
    assert sim.status(second) == "scheduled"
    sim.advance(600)
    assert sim.status(second) == "running"
    assert sim.status(first) == "cancelled"


def test_cancel_task_parked_on_resource_lets_the_next_waiter_through() -> None:
    sim = Sim.make(
        PoolConfig("default", max_workers=4, initial_workers=4), resources=[ResourceConfig.semaphore("gpu", 1)]
    )
    holder = sim.submit("holder", resources={"gpu": 1})
    parked = sim.submit("parked", resources={"gpu": 1})
    after = sim.submit("after", resources={"gpu": 1})
    assert sim.status(parked) == "ready" and sim.status(after) == "ready"
    assert sim.core.cancel(sim.now, parked)
    sim.step()
    sim.complete(sim.lease_of(holder))
    assert sim.status(parked) == "cancelled"
    assert sim.status(after) == "running"


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        (EdgeCond.ON_SUCCESS, "skipped"),
        (EdgeCond.ON_FAILURE, "skipped"),
        (EdgeCond.ON_COMPLETE, "running"),
    ],
)
def test_cancellation_effect_on_dependents(cond: EdgeCond, expected: str) -> None:
    sim = Sim.make(PoolConfig("default", max_workers=2, initial_workers=0))
    parent = sim.submit("parent")
    child = sim.submit("child", deps=(Dep(parent, cond),))
    grandchild = sim.submit("grandchild", deps=(Dep(child),))
    sim.core.cancel(sim.now, parent)
    sim.step()
    sim.set_capacity(2)
    assert sim.status(parent) == "cancelled"
    assert sim.status(child) == expected
    if expected == "skipped":
        # Skipped propagates down on_success edges.
        assert sim.status(grandchild) == "skipped"
    else:
        assert sim.status(grandchild) == "blocked"


def test_cancel_running_parent_skips_on_success_dependents() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=2, initial_workers=1))
    parent = sim.submit("parent", key="p")
    ok = sim.submit("ok", deps=(Dep("p"),))
    always = sim.submit("always", deps=(Dep("p", EdgeCond.ON_COMPLETE),))
    sim.core.cancel(sim.now, "p")
    sim.step()
    assert len(sim.aborts) == 1
    assert sim.status(ok) == "skipped"
    assert sim.status(always) == "running"
    assert sim.status(parent) == "cancelled"


def test_cancelled_by_executor_ends_cancelled() -> None:
    from cronoq.engine import CancelledByExecutor

    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    tid = sim.submit("x")
    assert sim.complete(sim.lease_of(tid), CancelledByExecutor("stop"))
    assert sim.status(tid) == "cancelled"
    assert sim.info(tid).message == "stop"


def test_terminal_message_and_priority_kept_in_info() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    tid = sim.submit("x", priority=Priority.HIGH, kind="report", tenant="acme", tags={"a": "b"})
    sim.fail(sim.lease_of(tid), "no such customer", permanent=True)
    info = sim.info(tid)
    assert info.status is TaskStatus.FAILED
    assert info.message == "no such customer"
    assert info.priority is Priority.HIGH
    assert info.kind == "report" and info.tenant == "acme" and dict(info.tags) == {"a": "b"}
