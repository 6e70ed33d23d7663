"""Shared resources, worker labels and tenant fair sharing, driven through the engine.

Spec: book "Resources: semaphores and rate limits" (dispatch rules 1-4, interaction with
priorities), "GPUs and other scarce resources", "LLM and agent workloads" (token bucket pacing),
"Worker labels" (groups, placement) and "Fair sharing between tenants".
"""

from __future__ import annotations

from collections import Counter

import pytest
from cronoq.engine import (
    AdmissionError,
    Failure,
    Fairness,
    PoolConfig,
    Priority,
    ResourceConfig,
    RetryPolicy,
    SubmitCode,
    Success,
    TaskSpec,
)

from .sim import Sim, ns


def res_sim(*resources: ResourceConfig, workers: int = 4, **pool: object) -> Sim:
    return Sim.make(
        PoolConfig(
            "default", max_workers=max(workers, 1), initial_workers=workers, retry=RetryPolicy(jitter=False), **pool
        ),  # type: ignore[arg-type]
        resources=list(resources),
    )


def gpu(n: int = 1) -> ResourceConfig:
    return ResourceConfig.semaphore("gpu", n)


def running_ids(sim: Sim) -> set[int]:
    return {lease.task_id for lease in sim.running.values()}


# ---------------------------------------------------------------------------------------------
# Semaphores


def test_semaphore_limits_concurrency_across_pools() -> None:
    sim = Sim.make(
        PoolConfig("ml", max_workers=4, initial_workers=4),
        PoolConfig("etl", max_workers=4, initial_workers=4),
        resources=[gpu(2)],
    )
    ml = [sim.submit(f"ml{i}", pool="ml", resources={"gpu": 1}) for i in range(3)]
    etl = sim.submit("etl", pool="etl", resources={"gpu": 1})
    assert running_ids(sim) == set(ml[:2])
    sim.complete(sim.lease_of(ml[0]))
    # FIFO among waiters, whatever their pool.
    assert running_ids(sim) == {ml[1], ml[2]}
    sim.complete(sim.lease_of(ml[1]))
    assert running_ids(sim) == {ml[2], etl}


def test_acquisition_is_all_or_nothing() -> None:
    sim = res_sim(gpu(2), ResourceConfig.semaphore("db", 1))
    holder = sim.submit("holds db", resources={"db": 1})
    both = sim.submit("gpu and db", resources={"gpu": 1, "db": 1})
    assert sim.status(both) == "ready"  # parked: waiting for a resource
    # The parked task took no GPU, so a task wanting both GPUs can run.
    big = sim.submit("both gpus", resources={"gpu": 2})
    assert sim.status(big) == "running"
    sim.complete(sim.lease_of(holder))
    assert sim.status(both) == "ready"  # db is free now, but the GPUs are not
    sim.complete(sim.lease_of(big))
    assert sim.status(both) == "running"


def test_parked_task_does_not_block_the_pool() -> None:
    sim = res_sim(gpu(1), workers=2)
    holder = sim.submit("holder", resources={"gpu": 1})
    parked = sim.submit("parked", resources={"gpu": 1})
    free = [sim.submit(f"cpu{i}") for i in range(3)]
    # The parked task occupies no slot: the second slot serves work that needs no GPU.
    assert running_ids(sim) == {holder, free[0]}
    sim.complete(sim.lease_of(free[0]))
    assert running_ids(sim) == {holder, free[1]}
    sim.complete(sim.lease_of(holder))
    assert running_ids(sim) == {free[1], parked}


def test_parked_tasks_are_reoffered_in_fifo_order() -> None:
    sim = res_sim(gpu(1), workers=8)
    ids = [sim.submit(f"g{i}", resources={"gpu": 1}) for i in range(5)]
    order = []
    while running_ids(sim):
        [tid] = running_ids(sim)
        order.append(tid)
        sim.advance(1)
        sim.complete(sim.lease_of(tid))
    assert order == ids


def test_waiter_is_woken_only_when_its_full_request_fits() -> None:
    sim = res_sim(gpu(3), workers=8)
    one = sim.submit("one", resources={"gpu": 1})
    two = sim.submit("two", resources={"gpu": 2})
    three = sim.submit("three", resources={"gpu": 3})
    assert running_ids(sim) == {one, two}
    sim.complete(sim.lease_of(one))
    assert sim.status(three) == "ready"  # 1 of 3 free: not enough
    sim.complete(sim.lease_of(two))
    assert sim.status(three) == "running"


def test_high_priority_waiter_gets_the_resource_before_later_waiters() -> None:
    sim = res_sim(gpu(1), workers=8)
    holder = sim.submit("holder", resources={"gpu": 1})
    urgent = sim.submit("urgent", priority=Priority.HIGH, resources={"gpu": 1})
    later = [sim.submit(f"later{i}", priority=Priority.LOW, resources={"gpu": 1}) for i in range(3)]
    sim.complete(sim.lease_of(holder))
    assert running_ids(sim) == {urgent}
    sim.complete(sim.lease_of(urgent))
    assert running_ids(sim) == {later[0]}


def test_cancelling_a_woken_waiter_passes_the_units_on() -> None:
    """A waiter woken for free units but cancelled before it starts must not keep them promised.

    Rule 3: when units return, parked tasks are re-queued as many as the free units can satisfy.
    """
    sim = res_sim(gpu(1), workers=3)
    holder = sim.submit("holder", resources={"gpu": 1})
    woken = sim.submit("woken", resources={"gpu": 1})
    next_in_line = sim.submit("next", resources={"gpu": 1})
    cpu = [sim.submit("cpu0"), sim.submit("cpu1")]  # the pool is now full
    critical = sim.submit("critical", priority=Priority.CRITICAL)
    assert sim.status(critical) == "ready"
    # The GPU and a slot come back: "woken" is re-queued, but the critical task takes the slot.
    sim.complete(sim.lease_of(holder))
    assert sim.status(critical) == "running"
    assert sim.status(woken) == "ready"
    sim.core.cancel(sim.now, woken)
    sim.step()
    for tid in (*cpu, critical):
        sim.complete(sim.lease_of(tid))
    sim.advance(10)
    # The GPU is free and nobody holds it: the next waiter must run.
    assert sim.status(next_in_line) == "running"


def test_woken_waiter_overtaken_by_higher_priority_keeps_its_place() -> None:
    """FIFO among waiters of a resource survives a higher-priority task taking the units first."""
    sim = res_sim(gpu(1), workers=4)
    holder = sim.submit("holder", resources={"gpu": 1})
    older = sim.submit("older", priority=Priority.LOW, resources={"gpu": 1})
    younger = sim.submit("younger", priority=Priority.LOW, resources={"gpu": 1})
    # The holder finishes and, in the same step, a high-priority task wanting the GPU arrives.
    lease = sim.lease_of(holder)
    sim.core.complete(sim.now, lease.id, Success(None))
    sim.running.pop(lease.id)
    urgent = sim.core.submit(sim.now, TaskSpec(payload="urgent", priority=Priority.HIGH, resources={"gpu": 1})).id
    sim.step()
    assert sim.status(urgent) == "running"  # priority first
    sim.complete(sim.lease_of(urgent))
    # The older waiter was waiting before the younger one: it goes first.
    assert sim.status(older) == "running"
    assert sim.status(younger) == "ready"


def test_semaphore_units_return_at_the_end_of_every_attempt() -> None:
    sim = res_sim(gpu(1), workers=4)
    first = sim.submit("first", resources={"gpu": 1}, timeout=ns(5))
    second = sim.submit("second", resources={"gpu": 1}, timeout=ns(5))
    third = sim.submit("third", resources={"gpu": 1})
    sim.fail(sim.lease_of(first))  # retryable failure
    assert running_ids(sim) == {second}
    sim.advance(5)  # timeout of second
    assert sim.status(second) == "retrying"
    assert len(running_ids(sim)) == 1
    current = next(iter(running_ids(sim)))
    sim.core.cancel(sim.now, current)  # cancellation of a running attempt
    sim.step()
    assert len(running_ids(sim)) == 1
    assert third in {lease.task_id for lease in sim.dispatched}


def test_token_bucket_paces_dispatches() -> None:
    sim = res_sim(ResourceConfig.token_bucket("api", rate=1.0, burst=2), workers=10)
    ids = [sim.submit(f"call{i}", resources={"api": 1}) for i in range(5)]
    plain = sim.submit("no tokens needed")
    assert sim.status(plain) == "running"
    sim.runner = lambda lease: (0.1, Success(None))
    for lease in list(sim.running.values()):
        sim.complete(lease)
    sim.advance(10)
    starts = {lease.task_id: (lease.started_at - sim.dispatched[0].started_at) / 1e9 for lease in sim.dispatched}
    assert [starts[i] for i in ids] == [0.0, 0.0, 1.0, 2.0, 3.0]


def test_token_bucket_tokens_are_spent_not_returned() -> None:
    sim = res_sim(ResourceConfig.token_bucket("api", rate=0.1, burst=1), workers=4)
    first = sim.submit("a", resources={"api": 1})
    sim.complete(sim.lease_of(first))
    second = sim.submit("b", resources={"api": 1})
    assert sim.status(second) == "ready"
    sim.advance(9.9)
    assert sim.status(second) == "ready"
    sim.advance(0.1)
    assert sim.status(second) == "running"


def test_combined_rate_and_concurrency_limits() -> None:
    sim = res_sim(
        ResourceConfig.token_bucket("openai", rate=2.0, burst=4), ResourceConfig.semaphore("conc", 2), workers=10
    )
    need = {"openai": 1, "conc": 1}
    sim.runner = lambda lease: (3.0, Success(None))
    ids = [sim.submit(i, resources=need) for i in range(8)]
    sim.advance(60)
    assert all(sim.status(i) == "succeeded" for i in ids)
    # Never more than two at once.
    intervals = sorted((lease.started_at, sim.info(lease.task_id).finished_at or 0) for lease in sim.dispatched)
    for t, _ in intervals:
        concurrent = sum(1 for s, e in intervals if s <= t < e)
        assert concurrent <= 2
    # Never faster than the bucket allows: at most burst + rate * elapsed starts in any span.
    starts = [s for s, _ in intervals]
    for i, first in enumerate(starts):
        for j in range(i, len(starts)):
            assert j - i + 1 <= 4 + 2.0 * (starts[j] - first) / 1e9 + 1e-9


def test_resource_admission_errors() -> None:
    sim = res_sim(gpu(2), ResourceConfig.token_bucket("api", rate=1.0, burst=3))
    for resources, code in [
        ({"gpu": 3}, SubmitCode.RESOURCE_EXCEEDS_CAPACITY),
        ({"api": 4}, SubmitCode.RESOURCE_EXCEEDS_CAPACITY),
        ({"tpu": 1}, SubmitCode.UNKNOWN_RESOURCE),
    ]:
        with pytest.raises(AdmissionError) as err:
            sim.submit("x", resources=resources)
        assert err.value.code is code
        with pytest.raises(AdmissionError) as err:
            sim.submit_batch([TaskSpec(), TaskSpec(resources=resources)])
        assert err.value.code is code and err.value.index == 1
    assert sim.core.list_tasks() == []
    # Exactly the capacity is fine.
    assert sim.status(sim.submit("x", resources={"gpu": 2, "api": 3})) == "running"


def test_retry_of_a_task_holding_a_resource_waits_for_it_again() -> None:
    sim = res_sim(gpu(1), workers=4)
    flaky = sim.submit("flaky", resources={"gpu": 1})
    other = sim.submit("other", resources={"gpu": 1})
    sim.complete(sim.lease_of(flaky), Failure("oops"))
    assert running_ids(sim) == {other}
    sim.advance(2)
    assert sim.status(flaky) == "ready"
    sim.complete(sim.lease_of(other))
    assert running_ids(sim) == {flaky}


# ---------------------------------------------------------------------------------------------
# Worker labels and groups


def label_sim(unlabeled: int = 1) -> Sim:
    return Sim.make(PoolConfig("inference", max_workers=10, initial_workers=unlabeled))


A100 = {"gpu": "a100"}


def test_task_needing_labels_waits_without_blocking_the_pool() -> None:
    sim = label_sim(unlabeled=1)
    needs_gpu = sim.submit("needs gpu", pool="inference", labels=A100)
    plain = sim.submit("plain", pool="inference")
    assert sim.status(needs_gpu) == "ready"
    assert sim.status(plain) == "running"
    assert sim.lease_of(plain).group == {}
    sim.set_capacity(1, pool="inference", labels=A100)
    lease = sim.lease_of(needs_gpu)
    assert dict(lease.group) == A100


def test_labeled_task_runs_on_a_group_with_more_labels() -> None:
    sim = label_sim(unlabeled=0)
    sim.set_capacity(1, pool="inference", labels={"gpu": "a100", "zone": "eu"})
    tid = sim.submit("x", pool="inference", labels=A100)
    assert dict(sim.lease_of(tid).group) == {"gpu": "a100", "zone": "eu"}


def test_labeled_task_never_runs_on_a_non_matching_group() -> None:
    sim = label_sim(unlabeled=2)
    sim.set_capacity(2, pool="inference", labels={"gpu": "t4"})
    tid = sim.submit("x", pool="inference", labels=A100)
    sim.advance(60)
    assert sim.status(tid) == "ready"
    assert sim.dispatched == []


def test_label_waiter_starts_when_a_matching_slot_frees_in_submission_order() -> None:
    sim = label_sim(unlabeled=2)
    sim.set_capacity(1, pool="inference", labels=A100)
    first = sim.submit("first", pool="inference", labels=A100)
    second = sim.submit("second", pool="inference", labels=A100)
    third = sim.submit("third", pool="inference", labels=A100)
    plain = sim.submit("plain", pool="inference")
    assert sim.status(first) == "running"
    assert sim.status(plain) == "running"
    sim.complete(sim.lease_of(plain))  # an unlabeled slot frees: no use to the waiters
    assert sim.status(second) == "ready"
    sim.complete(sim.lease_of(first))
    assert sim.status(second) == "running" and sim.status(third) == "ready"
    assert dict(sim.lease_of(second).group) == A100
    sim.complete(sim.lease_of(second))
    assert sim.status(third) == "running"


def test_label_waiter_starts_when_a_matching_group_connects() -> None:
    sim = label_sim(unlabeled=1)
    waiting = [sim.submit(i, pool="inference", labels=A100) for i in range(3)]
    sim.set_capacity(2, pool="inference", labels=A100)
    assert {sim.status(t) for t in waiting[:2]} == {"running"}
    assert sim.status(waiting[2]) == "ready"
    assert all(dict(lease.group) == A100 for lease in sim.dispatched)


def test_free_group_serves_while_another_group_retires_slots() -> None:
    """A matching worker that connects and is idle takes a waiting labeled task, even while a
    different group still finishes an attempt above its (reduced) capacity."""
    sim = label_sim(unlabeled=1)
    plain = sim.submit("plain", pool="inference")
    sim.set_capacity(0, pool="inference")  # the unlabeled worker leaves; its attempt goes on
    assert sim.status(plain) == "running"
    sim.set_capacity(1, pool="inference", labels=A100)  # a GPU worker connects, idle
    needs_gpu = sim.submit("needs gpu", pool="inference", labels=A100)
    assert sim.status(needs_gpu) == "running"
    assert dict(sim.lease_of(needs_gpu).group) == A100


def test_group_capacity_shows_in_snapshot() -> None:
    sim = label_sim(unlabeled=2)
    sim.set_capacity(3, pool="inference", labels=A100)
    sim.submit("x", pool="inference", labels=A100)
    [pool] = sim.core.snapshot(sim.now).pools
    assert pool.capacity == 5
    groups = {tuple(sorted(g.labels.items())): (g.capacity, g.busy) for g in pool.groups}
    assert groups == {(): (2, 0), (("gpu", "a100"),): (3, 1)}


def test_cancel_label_waiter() -> None:
    sim = label_sim(unlabeled=1)
    tid = sim.submit("x", pool="inference", labels=A100)
    sim.core.cancel(sim.now, tid)
    sim.step()
    sim.set_capacity(1, pool="inference", labels=A100)
    assert sim.status(tid) == "cancelled"
    assert sim.dispatched == []


# ---------------------------------------------------------------------------------------------
# Fair sharing between tenants


def fair_sim(weights: dict[str, float] | None = None, workers: int = 0) -> Sim:
    pool = PoolConfig("llm", max_workers=4, initial_workers=workers, fairness=Fairness(weights or {}))
    sim = Sim.make(pool)
    sim.runner = lambda lease: (1.0, Success(None))
    return sim


def tenants_in_order(sim: Sim) -> list[str]:
    return [str(lease.payload) for lease in sim.dispatched]


def test_weights_give_proportional_dispatches_even_if_one_queued_first() -> None:
    sim = fair_sim({"acme": 3, "globex": 1})
    for _ in range(40):
        sim.submit("globex", pool="llm", tenant="globex")
    for _ in range(40):
        sim.submit("acme", pool="llm", tenant="acme")
    sim.set_capacity(1, pool="llm")
    sim.advance(39.5)
    first = tenants_in_order(sim)[:40]
    counts = Counter(first)
    assert 29 <= counts["acme"] <= 31, counts
    # The ratio holds throughout, not only on average.
    for end in range(8, 41, 8):
        window = Counter(first[:end])
        assert abs(window["acme"] - 3 * window["globex"]) <= 4, (end, window)


def test_equal_shares_with_fair_share_and_no_weights() -> None:
    sim = fair_sim()
    for _ in range(20):
        sim.submit("a", pool="llm", tenant="a")
    for _ in range(20):
        sim.submit("b", pool="llm", tenant="b")
    sim.set_capacity(1, pool="llm")
    sim.advance(19.5)
    counts = Counter(tenants_in_order(sim)[:20])
    assert counts == {"a": 10, "b": 10}


def test_no_banked_credit() -> None:
    sim = fair_sim(workers=1)
    for _ in range(20):
        sim.submit("busy", pool="llm", tenant="busy")
    sim.advance(20)  # "busy" ran alone: it gets everything
    assert tenants_in_order(sim) == ["busy"] * 20
    # Now both have work; "idle" had nothing waiting, so it does not catch up.
    sim.core.set_capacity(sim.now, "llm", 0)
    for _ in range(10):
        sim.submit("idle", pool="llm", tenant="idle")
    for _ in range(10):
        sim.submit("busy", pool="llm", tenant="busy")
    sim.set_capacity(1, pool="llm")
    sim.advance(9.5)
    counts = Counter(tenants_in_order(sim)[20:30])
    assert 4 <= counts["idle"] <= 6, counts


def test_tasks_without_tenant_share_as_one_more_tenant() -> None:
    sim = fair_sim({"acme": 1.0})
    for _ in range(15):
        sim.submit("acme", pool="llm", tenant="acme")
    for _ in range(15):
        sim.submit("none", pool="llm")
    for _ in range(15):
        sim.submit("globex", pool="llm", tenant="globex")
    sim.set_capacity(1, pool="llm")
    sim.advance(14.5)
    counts = Counter(tenants_in_order(sim)[:15])
    assert counts == {"acme": 5, "none": 5, "globex": 5}


def test_priority_comes_before_fair_share() -> None:
    sim = fair_sim({"acme": 3, "globex": 1})
    for _ in range(10):
        sim.submit("acme-normal", pool="llm", tenant="acme")
    sim.submit("globex-critical", pool="llm", tenant="globex", priority=Priority.CRITICAL)
    sim.submit("globex-high", pool="llm", tenant="globex", priority=Priority.HIGH)
    sim.set_capacity(1, pool="llm")
    sim.advance(2.5)
    assert tenants_in_order(sim)[:3] == ["globex-critical", "globex-high", "acme-normal"]


def test_deadline_tasks_are_outside_the_fair_share() -> None:
    sim = fair_sim({"acme": 3, "globex": 1})
    for _ in range(40):
        sim.submit("globex", pool="llm", tenant="globex")
    for _ in range(40):
        sim.submit("acme", pool="llm", tenant="acme")
    # Urgent globex work with deadlines: ordered by urgency, ahead of the fair-share queue.
    for _ in range(8):
        sim.submit("globex-deadline", pool="llm", tenant="globex", deadline=sim.now + ns(2))
    sim.set_capacity(1, pool="llm")
    sim.advance(47.5)
    order = tenants_in_order(sim)
    assert order[:8] == ["globex-deadline"] * 8
    # The deadline work did not use up globex's share of the rest.
    counts = Counter(order[8:48])
    assert 29 <= counts["acme"] <= 31, counts


def test_retried_task_keeps_its_place_in_a_fair_pool() -> None:
    """A retried task keeps its original submission time, so it keeps its place (book,
    "Retry policy"); fair sharing orders tenants, not a tenant's own tasks among themselves."""
    sim = Sim.make(
        PoolConfig("llm", max_workers=4, initial_workers=1, fairness=Fairness({}), retry=RetryPolicy(jitter=False))
    )
    ids = [sim.submit(f"a{i}", pool="llm", tenant="a") for i in range(5)]
    sim.fail(sim.lease_of(ids[0]))  # a0 retries after 1 s while a1 runs
    sim.advance(2)
    sim.complete(sim.lease_of(ids[1]))
    assert [lease.payload for lease in sim.dispatched] == ["a0", "a1", "a0"]


def test_tenant_alone_gets_everything() -> None:
    sim = fair_sim({"acme": 1, "globex": 100}, workers=3)
    for _ in range(6):
        sim.submit("acme", pool="llm", tenant="acme")
    assert len(sim.running) == 3
    sim.advance(1.5)
    assert tenants_in_order(sim) == ["acme"] * 6
