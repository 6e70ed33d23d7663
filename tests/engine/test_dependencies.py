"""Dependencies, keys in dependencies, cycles and atomic batches, driven through the engine.

Spec: book "Dependencies and keys" (edges, unknown parents, cycles, batches) and "Pipelines and
DAGs" (edge semantics, skipped propagation, late dependents).
"""

from __future__ import annotations

import pytest
from cronoq.engine import (
    AdmissionError,
    Dep,
    EdgeCond,
    Failure,
    PoolConfig,
    ResourceConfig,
    RetryPolicy,
    SubmitCode,
    Success,
    TaskSpec,
    UnknownDependencyPolicy,
)

from .sim import Sim, ns

ON_SUCCESS = EdgeCond.ON_SUCCESS
ON_FAILURE = EdgeCond.ON_FAILURE
ON_COMPLETE = EdgeCond.ON_COMPLETE


def make(workers: int = 4, **pool: object) -> Sim:
    return Sim.make(
        PoolConfig(
            "default", max_workers=max(workers, 1), initial_workers=workers, retry=RetryPolicy(jitter=False), **pool
        ),  # type: ignore[arg-type]
    )


def awaiting_sim(timeout: float | None = None, workers: int = 4) -> Sim:
    return make(
        workers,
        unknown_dependency=UnknownDependencyPolicy.AWAIT,
        await_timeout=ns(timeout) if timeout is not None else None,
    )


def dispatched_ids(sim: Sim) -> list[int]:
    return [lease.task_id for lease in sim.dispatched]


# ---------------------------------------------------------------------------------------------
# Edges


@pytest.mark.parametrize("by_key", [False, True])
def test_on_success_child_waits_for_parent(by_key: bool) -> None:
    sim = make()
    parent = sim.submit("parent", key="p")
    child = sim.submit("child", deps=(Dep("p" if by_key else parent),))
    assert sim.status(child) == "blocked"
    assert dispatched_ids(sim) == [parent]  # blocked tasks occupy no worker
    sim.advance(3)
    assert sim.status(child) == "blocked"
    sim.complete(sim.lease_of(parent))
    assert sim.status(child) == "running"


def test_blocked_task_does_not_take_a_slot_from_other_work() -> None:
    sim = make(workers=1)
    parent = sim.submit("parent")
    child = sim.submit("child", deps=(Dep(parent),))
    free = sim.submit("free")
    sim.complete(sim.lease_of(parent))
    # The child became ready after the free task was queued, but it was submitted first.
    assert dispatched_ids(sim) == [parent, child]
    sim.complete(sim.lease_of(child))
    assert dispatched_ids(sim) == [parent, child, free]


@pytest.mark.parametrize(
    ("outcome", "cond", "expected"),
    [
        ("success", ON_SUCCESS, "running"),
        ("success", ON_FAILURE, "skipped"),
        ("success", ON_COMPLETE, "running"),
        ("permanent", ON_SUCCESS, "skipped"),
        ("permanent", ON_FAILURE, "running"),
        ("permanent", ON_COMPLETE, "running"),
        ("dead", ON_SUCCESS, "skipped"),
        ("dead", ON_FAILURE, "running"),
        ("dead", ON_COMPLETE, "running"),
    ],
)
def test_edge_conditions(outcome: str, cond: EdgeCond, expected: str) -> None:
    sim = make()
    parent = sim.submit("parent", key="p", retry=RetryPolicy.none())
    child = sim.submit("child", deps=(Dep("p", cond),))
    lease = sim.lease_of(parent)
    if outcome == "success":
        sim.complete(lease)
    else:
        sim.fail(lease, "boom", permanent=outcome == "permanent")
    assert sim.status(parent) == {"success": "succeeded", "permanent": "failed", "dead": "dead_lettered"}[outcome]
    assert sim.status(child) == expected


def test_retrying_parent_does_not_release_or_skip_children() -> None:
    sim = make()
    parent = sim.submit("parent")
    on_fail = sim.submit("on_fail", deps=(Dep(parent, ON_FAILURE),))
    on_ok = sim.submit("on_ok", deps=(Dep(parent),))
    sim.fail(sim.lease_of(parent), "transient")
    assert sim.status(parent) == "retrying"
    assert sim.status(on_fail) == "blocked" and sim.status(on_ok) == "blocked"
    sim.advance(1)
    sim.complete(sim.lease_of(parent))
    assert sim.status(on_ok) == "running" and sim.status(on_fail) == "skipped"


def test_fan_in_waits_for_every_parent() -> None:
    sim = make()
    parents = [sim.submit(f"p{i}", key=f"p{i}") for i in range(3)]
    load = sim.submit("load", deps=tuple(Dep(f"p{i}") for i in range(3)))
    for pid in parents[:2]:
        sim.complete(sim.lease_of(pid))
        assert sim.status(load) == "blocked"
    sim.complete(sim.lease_of(parents[2]))
    assert sim.status(load) == "running"


def test_one_unsatisfiable_edge_skips_despite_other_parents() -> None:
    sim = make()
    a = sim.submit("a")
    b = sim.submit("b")
    child = sim.submit("child", deps=(Dep(a), Dep(b)))
    sim.fail(sim.lease_of(a), "no", permanent=True)
    assert sim.status(child) == "skipped"
    sim.complete(sim.lease_of(b))
    assert sim.status(child) == "skipped"
    assert child not in dispatched_ids(sim)


def test_skipped_propagates_except_through_on_complete() -> None:
    sim = make()
    root = sim.submit("root", key="root")
    mid = sim.submit("mid", key="mid", deps=(Dep("root"),))
    down_success = sim.submit("down_success", key="ds", deps=(Dep("mid"),))
    down_failure = sim.submit("down_failure", deps=(Dep("mid", ON_FAILURE),))
    down_complete = sim.submit("down_complete", key="dc", deps=(Dep("mid", ON_COMPLETE),))
    deeper = sim.submit("deeper", deps=(Dep("ds"),))
    after_complete = sim.submit("after_complete", deps=(Dep("dc"),))
    sim.fail(sim.lease_of(root), "broken", permanent=True)
    assert sim.status(mid) == "skipped"
    assert sim.status(down_success) == "skipped"
    assert sim.status(down_failure) == "skipped"
    assert sim.status(deeper) == "skipped"
    assert sim.status(down_complete) == "running"
    assert sim.status(after_complete) == "blocked"
    sim.complete(sim.lease_of(down_complete))
    assert sim.status(after_complete) == "running"
    # Every skipped task got a terminal event.
    skipped_events = {r.event.id for r in sim.resolved if r.event.status.value == "skipped"}
    assert skipped_events == {mid, down_success, down_failure, deeper}


def test_pipeline_example_alert_and_cleanup() -> None:
    """The book's ETL example: alert only on failure of load, cleanup either way."""
    for load_fails in (False, True):
        sim = make(workers=8)
        specs = [TaskSpec(payload="extract", key="extract")]
        specs += [TaskSpec(payload=f"t{i}", key=f"t{i}", deps=(Dep("extract"),)) for i in range(4)]
        specs.append(TaskSpec(payload="load", key="load", deps=tuple(Dep(f"t{i}") for i in range(4))))
        specs.append(TaskSpec(payload="alert", deps=(Dep("load", ON_FAILURE),)))
        specs.append(TaskSpec(payload="cleanup", deps=(Dep("load", ON_COMPLETE),)))
        ids = sim.submit_batch(specs)
        sim.runner = lambda lease, fail=load_fails: (
            1.0,
            Failure("x", permanent=True) if lease.payload == "load" and fail else Success(None),
        )
        sim.complete(sim.lease_of(ids[0]))
        sim.advance(10)
        statuses = {spec.payload: sim.status(tid) for spec, tid in zip(specs, ids, strict=True)}
        assert statuses["load"] == ("failed" if load_fails else "succeeded")
        assert statuses["alert"] == ("succeeded" if load_fails else "skipped")
        assert statuses["cleanup"] == "succeeded"


# ---------------------------------------------------------------------------------------------
# Parents that already finished


def test_parent_already_succeeded_resolves_immediately() -> None:
    sim = make()
    parent = sim.submit("parent", key="p")
    sim.complete(sim.lease_of(parent))
    ok = sim.submit("ok", deps=(Dep("p"),))
    never = sim.submit("never", deps=(Dep(parent, ON_FAILURE),))
    anyway = sim.submit("anyway", deps=(Dep(parent, ON_COMPLETE),))
    assert sim.status(ok) == "running"
    assert sim.status(never) == "skipped"
    assert sim.status(anyway) == "running"


def test_parent_already_failed_resolves_immediately() -> None:
    sim = make()
    parent = sim.submit("parent", key="p")
    sim.fail(sim.lease_of(parent), "bad", permanent=True)
    ok = sim.submit("ok", deps=(Dep("p"),))
    alert = sim.submit("alert", deps=(Dep("p", ON_FAILURE),))
    assert sim.status(ok) == "skipped"
    assert sim.status(alert) == "running"


def test_parent_already_skipped_skips_on_success_child() -> None:
    sim = make()
    root = sim.submit("root")
    mid = sim.submit("mid", key="mid", deps=(Dep(root),))
    sim.core.cancel(sim.now, root)
    sim.step()
    assert sim.status(mid) == "skipped"
    child = sim.submit("child", deps=(Dep("mid"),))
    cleanup = sim.submit("cleanup", deps=(Dep("mid", ON_COMPLETE),))
    assert sim.status(child) == "skipped"
    assert sim.status(cleanup) == "running"


def test_finished_parent_known_only_within_retention() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=2, initial_workers=2), retention=ns(60))
    parent = sim.submit("parent", key="p")
    sim.complete(sim.lease_of(parent))
    sim.advance(30)
    assert sim.status(sim.submit("late child", deps=(Dep(parent),))) == "running"
    sim.advance(31)
    with pytest.raises(AdmissionError) as err:
        sim.submit("too late", deps=(Dep(parent),))
    assert err.value.code is SubmitCode.UNKNOWN_DEPENDENCY
    with pytest.raises(AdmissionError) as err:
        sim.submit("too late by key", deps=(Dep("p"),))
    assert err.value.code is SubmitCode.UNKNOWN_DEPENDENCY


# ---------------------------------------------------------------------------------------------
# Unknown parents


def test_unknown_key_is_rejected_by_default() -> None:
    sim = make()
    with pytest.raises(AdmissionError) as err:
        sim.submit("child", deps=(Dep("nobody"),))
    assert err.value.code is SubmitCode.UNKNOWN_DEPENDENCY
    assert sim.core.list_tasks() == []


@pytest.mark.parametrize("policy", [UnknownDependencyPolicy.REJECT, UnknownDependencyPolicy.AWAIT])
def test_unknown_id_is_always_rejected(policy: UnknownDependencyPolicy) -> None:
    sim = make(unknown_dependency=policy, await_timeout=ns(5))
    known = sim.submit("known")
    with pytest.raises(AdmissionError) as err:
        sim.submit("child", deps=(Dep(known + 10_000),))
    assert err.value.code is SubmitCode.UNKNOWN_DEPENDENCY
    assert [t.id for t in sim.core.list_tasks()] == [known]


def test_awaited_key_blocks_until_the_parent_appears_and_succeeds() -> None:
    sim = awaiting_sim()
    child = sim.submit("child", deps=(Dep("later"),))
    assert sim.status(child) == "blocked"
    sim.advance(30)
    parent = sim.submit("parent", key="later")
    assert sim.status(child) == "blocked"
    sim.complete(sim.lease_of(parent))
    assert sim.status(child) == "running"


def test_awaited_key_appearing_as_failure_resolves_the_edge() -> None:
    sim = awaiting_sim()
    ok = sim.submit("ok", deps=(Dep("later"),))
    alert = sim.submit("alert", deps=(Dep("later", ON_FAILURE),))
    parent = sim.submit("parent", key="later")
    sim.fail(sim.lease_of(parent), "x", permanent=True)
    assert sim.status(ok) == "skipped"
    assert sim.status(alert) == "running"


def test_awaited_key_times_out_and_child_is_skipped() -> None:
    sim = awaiting_sim(timeout=10)
    child = sim.submit("child", key="c", deps=(Dep("never"),))
    grandchild = sim.submit("grandchild", deps=(Dep("c"),))
    sim.advance(9)
    assert sim.status(child) == "blocked"
    sim.advance(1.5)
    assert sim.status(child) == "skipped"
    assert sim.status(grandchild) == "skipped"
    assert "never" in (sim.info(child).message or "")
    # The key showing up later does not revive the child.
    parent = sim.submit("parent", key="never")
    sim.complete(sim.lease_of(parent))
    assert sim.status(child) == "skipped"
    assert child not in dispatched_ids(sim)


def test_await_timeout_does_not_fire_once_the_key_appeared() -> None:
    sim = awaiting_sim(timeout=10)
    child = sim.submit("child", deps=(Dep("slow"),))
    sim.advance(2)
    parent = sim.submit("parent", key="slow")
    sim.advance(20)  # the parent is still running past the await timeout
    assert sim.status(child) == "blocked"
    sim.complete(sim.lease_of(parent))
    assert sim.status(child) == "running"


def test_cancelled_awaiting_child_is_not_woken_by_the_key() -> None:
    sim = awaiting_sim()
    child = sim.submit("child", deps=(Dep("later"),))
    sim.core.cancel(sim.now, child)
    sim.step()
    parent = sim.submit("parent", key="later")
    sim.complete(sim.lease_of(parent))
    assert sim.status(child) == "cancelled"
    assert dispatched_ids(sim) == [parent]


def test_two_edges_on_one_awaited_key_are_both_kept() -> None:
    """Every edge counts, whether the parent was known at submission or awaited.

    With the parent known, on_success + on_failure edges on it can never both hold, so the child
    is Skipped; awaiting the key must give the same result, not drop the second edge.
    """
    known = make()
    parent = known.submit("parent", key="k")
    child = known.submit("child", deps=(Dep("k", ON_SUCCESS), Dep("k", ON_FAILURE)))
    known.complete(known.lease_of(parent))
    assert known.status(child) == "skipped"

    awaited = awaiting_sim()
    child = awaited.submit("child", deps=(Dep("k", ON_SUCCESS), Dep("k", ON_FAILURE)))
    parent = awaited.submit("parent", key="k")
    awaited.complete(awaited.lease_of(parent))
    assert awaited.status(child) == "skipped"


def test_awaiting_child_with_a_known_parent_too() -> None:
    sim = awaiting_sim()
    known = sim.submit("known", key="known")
    child = sim.submit("child", deps=(Dep("known"), Dep("unknown")))
    sim.complete(sim.lease_of(known))
    assert sim.status(child) == "blocked"
    other = sim.submit("other", key="unknown")
    sim.complete(sim.lease_of(other))
    assert sim.status(child) == "running"


# ---------------------------------------------------------------------------------------------
# Cycles


def test_depending_on_own_key_is_a_cycle() -> None:
    for policy in UnknownDependencyPolicy:
        sim = make(unknown_dependency=policy)
        with pytest.raises(AdmissionError) as err:
            sim.submit("selfish", key="me", deps=(Dep("me"),))
        assert err.value.code is SubmitCode.CYCLE
        assert sim.core.get("me") is None


def test_cycle_within_a_batch_is_rejected_with_an_index() -> None:
    sim = make()
    specs = [
        TaskSpec(payload="free", key="free"),
        TaskSpec(payload="a", key="a", deps=(Dep("b"),)),
        TaskSpec(payload="b", key="b", deps=(Dep("c"),)),
        TaskSpec(payload="c", key="c", deps=(Dep("a"),)),
    ]
    with pytest.raises(AdmissionError) as err:
        sim.submit_batch(specs)
    assert err.value.code is SubmitCode.CYCLE
    assert err.value.index in (1, 2, 3)
    assert sim.core.list_tasks() == []
    assert sim.core.get("free") is None


def test_self_cycle_in_batch_names_its_index() -> None:
    sim = make()
    with pytest.raises(AdmissionError) as err:
        sim.submit_batch([TaskSpec(key="x"), TaskSpec(key="y", deps=(Dep("y"),))])
    assert err.value.code is SubmitCode.CYCLE
    assert err.value.index == 1


def test_cycle_through_a_task_awaiting_the_new_key() -> None:
    sim = awaiting_sim(workers=0)
    waiting = sim.submit("waiting", key="a", deps=(Dep("b"),))
    with pytest.raises(AdmissionError) as err:
        sim.submit("closing", key="b", deps=(Dep("a"),))
    assert err.value.code is SubmitCode.CYCLE
    # Also through a longer chain: a <- c, and b would depend on c.
    downstream = sim.submit("downstream", key="c", deps=(Dep("a"),))
    with pytest.raises(AdmissionError) as err:
        sim.submit("closing", key="b", deps=(Dep(downstream),))
    assert err.value.code is SubmitCode.CYCLE
    # Nothing was admitted, and the awaiting task still waits for its key.
    assert sim.core.get("b") is None
    assert sim.status(waiting) == "blocked"
    # A harmless task with that key is fine and releases the chain.
    ok = sim.submit("ok", key="b")
    sim.set_capacity(4)
    sim.complete(sim.lease_of(ok))
    assert sim.status(waiting) == "running"


def test_cycle_through_awaiting_task_via_batch() -> None:
    sim = awaiting_sim(workers=0)
    sim.submit("waiting", key="a", deps=(Dep("b"),))
    with pytest.raises(AdmissionError) as err:
        sim.submit_batch(
            [
                TaskSpec(payload="fine", key="z"),
                TaskSpec(payload="closing", key="b", deps=(Dep("a"),)),
            ]
        )
    assert err.value.code is SubmitCode.CYCLE
    assert err.value.index == 1
    assert sim.core.get("z") is None


def test_cycle_through_two_awaiting_keys() -> None:
    sim = awaiting_sim(workers=0)
    sim.submit("a", key="a", deps=(Dep("b"),))  # a awaits b
    sim.submit("b", key="b", deps=(Dep("c"),))  # b defines the awaited key and awaits c
    with pytest.raises(AdmissionError) as err:
        sim.submit("c", key="c", deps=(Dep("a"),))  # c -> a -> b -> c
    assert err.value.code is SubmitCode.CYCLE


# ---------------------------------------------------------------------------------------------
# Batches


def test_batch_keys_may_be_referenced_in_any_order() -> None:
    sim = make(workers=4)
    ids = sim.submit_batch(
        [
            TaskSpec(payload="load", key="load", deps=(Dep("t1"), Dep("t2"))),
            TaskSpec(payload="t2", key="t2", deps=(Dep("extract"),)),
            TaskSpec(payload="t1", key="t1", deps=(Dep("extract"),)),
            TaskSpec(payload="extract", key="extract"),
        ]
    )
    assert len(ids) == 4 and len(set(ids)) == 4
    assert [sim.status(i) for i in ids] == ["blocked", "blocked", "blocked", "running"]
    sim.complete(sim.lease_of(ids[3]))
    assert sim.status(ids[1]) == "running" and sim.status(ids[2]) == "running"
    sim.complete(sim.lease_of(ids[1]))
    assert sim.status(ids[0]) == "blocked"
    sim.complete(sim.lease_of(ids[2]))
    assert sim.status(ids[0]) == "running"


def test_batch_returns_ids_in_input_order() -> None:
    sim = make(workers=0)
    results = sim.core.submit_batch(sim.now, [TaskSpec(payload=i, key=f"k{i}") for i in range(5)])
    sim.step()
    for i, result in enumerate(results):
        assert sim.info(result.id).key == f"k{i}"
        assert result.duplicate is False


def test_duplicate_key_in_batch_is_rejected() -> None:
    sim = make()
    with pytest.raises(AdmissionError) as err:
        sim.submit_batch([TaskSpec(key="a"), TaskSpec(key="b"), TaskSpec(key="a")])
    assert err.value.code is SubmitCode.DUPLICATE_KEY_IN_BATCH
    assert err.value.index == 2
    assert sim.core.list_tasks() == []


def test_batch_is_atomic_and_names_the_offending_index() -> None:
    sim = Sim.make(
        PoolConfig("default", max_workers=4, initial_workers=4), resources=[ResourceConfig.semaphore("gpu", 2)]
    )
    cases: list[tuple[TaskSpec, SubmitCode]] = [
        (TaskSpec(pool="nope"), SubmitCode.UNKNOWN_POOL),
        (TaskSpec(resources={"tpu": 1}), SubmitCode.UNKNOWN_RESOURCE),
        (TaskSpec(resources={"gpu": 3}), SubmitCode.RESOURCE_EXCEEDS_CAPACITY),
        (TaskSpec(deps=(Dep("missing"),)), SubmitCode.UNKNOWN_DEPENDENCY),
        (TaskSpec(deps=(Dep(987654321),)), SubmitCode.UNKNOWN_DEPENDENCY),
        (TaskSpec(key=""), SubmitCode.INVALID),
    ]
    for bad, code in cases:
        specs = [TaskSpec(payload="a", key="a"), TaskSpec(payload="b", deps=(Dep("a"),)), bad]
        with pytest.raises(AdmissionError) as err:
            sim.submit_batch(specs)
        assert err.value.code is code, bad
        assert err.value.index == 2, bad
        assert sim.core.list_tasks() == [], bad
        assert sim.dispatched == []
    # A good batch afterwards still works and the key "a" was never reserved.
    ids = sim.submit_batch([TaskSpec(payload="a", key="a")])
    assert sim.info("a").id == ids[0]


def test_batch_with_existing_key_returns_the_existing_task_and_links_to_it() -> None:
    sim = make(workers=1)
    existing = sim.submit("existing", key="extract")
    results = sim.core.submit_batch(
        sim.now,
        [
            TaskSpec(payload="again", key="extract"),
            TaskSpec(payload="child", key="child", deps=(Dep("extract"),)),
        ],
    )
    sim.step()
    assert results[0].id == existing and results[0].duplicate
    assert results[1].duplicate is False
    child = results[1].id
    assert sim.status(child) == "blocked"
    sim.complete(sim.lease_of(existing))
    assert sim.status(child) == "running"


def test_resubmitting_a_whole_batch_is_idempotent() -> None:
    sim = make(workers=4)
    specs = [TaskSpec(payload="a", key="a"), TaskSpec(payload="b", key="b", deps=(Dep("a"),))]
    first = sim.core.submit_batch(sim.now, specs)
    sim.step()
    second = sim.core.submit_batch(sim.now, specs)
    sim.step()
    assert [r.id for r in first] == [r.id for r in second]
    assert all(r.duplicate for r in second)
    assert len(sim.core.list_tasks()) == 2


def test_batch_child_of_a_finished_parent_in_the_store() -> None:
    sim = make(workers=2)
    parent = sim.submit("parent", key="p")
    sim.fail(sim.lease_of(parent), "x", permanent=True)
    ids = sim.submit_batch(
        [
            TaskSpec(payload="ok", deps=(Dep("p"),)),
            TaskSpec(payload="alert", deps=(Dep("p", ON_FAILURE),)),
        ]
    )
    assert sim.status(ids[0]) == "skipped"
    assert sim.status(ids[1]) == "running"


def test_batch_awaiting_unknown_key_and_defining_it_later() -> None:
    sim = awaiting_sim(workers=2)
    [child] = sim.submit_batch([TaskSpec(payload="child", deps=(Dep("later"),))])
    assert sim.status(child) == "blocked"
    [parent] = sim.submit_batch([TaskSpec(payload="parent", key="later")])
    sim.complete(sim.lease_of(parent))
    assert sim.status(child) == "running"


def test_children_never_start_before_parents_end() -> None:
    sim = make(workers=8)
    sim.runner = lambda lease: (1.0 + (lease.task_id % 3), Success(None))
    specs = [TaskSpec(payload="root", key="root")]
    for i in range(5):
        specs.append(TaskSpec(payload=f"m{i}", key=f"m{i}", deps=(Dep("root"),)))
    specs.append(TaskSpec(payload="sink", key="sink", deps=tuple(Dep(f"m{i}") for i in range(5))))
    ids = sim.submit_batch(specs)
    sim.advance(60)
    started = {lease.task_id: lease.started_at for lease in sim.dispatched}
    finished = {tid: sim.info(tid).finished_at for tid in ids}
    assert all(sim.status(tid) == "succeeded" for tid in ids)
    for i in range(1, 6):
        assert started[ids[i]] >= finished[ids[0]]  # type: ignore[operator]
        assert started[ids[6]] >= finished[ids[i]]  # type: ignore[operator]
