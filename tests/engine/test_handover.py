"""A pool leaving one running engine and joining another (``engine/handover.py``), as a live pool
move does between two shards' leaders (docs/pool-moves.md): the moved pool's tasks, keys and
schedules continue on the target exactly as recovery would bring them back, and every other pool
of either engine keeps its leases, timers and counters.

The source's persisted mutations, folded the way a store recovers them (``test_restore.recover``)
and narrowed to the pool, stand for the rows the handover transaction copies."""

from __future__ import annotations

import contextlib

import pytest
from cronoq.engine import (
    AdmissionError,
    ConfigError,
    Core,
    CoreConfig,
    Dep,
    FixedStart,
    OverlapPolicy,
    PoolConfig,
    Recovered,
    RecurringSpec,
    RetryPolicy,
    Success,
    TaskSpec,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from .sim import START, Sim, ns
from .test_restore import recover

RETRY = RetryPolicy(max_attempts=3, initial_backoff=2 * 10**9, jitter=False)


def engine(shard: int, *pools: str) -> Sim:
    configs = [PoolConfig(name, max_workers=4, initial_workers=2, retry=RETRY) for name in pools]
    core = Core(CoreConfig(pools=configs, persist=True, id_shard=shard), now=START)
    return Sim(core)


def moving_config() -> PoolConfig:
    return PoolConfig("moving", max_workers=4, initial_workers=2, retry=RETRY)


def rows_of(*holders: Sim, pool: str = "moving") -> Recovered:
    """The pool's rows as the target's store holds them after the handover transaction (the
    mutations of every engine that held the pool, in order)."""
    everything = recover([mutation for sim in holders for mutation in sim.persisted])
    names = [s.spec.name for s in everything.recurring if s.spec.template.pool == pool]
    return Recovered(
        tasks=[item for item in everything.tasks if item.record.pool == pool],
        recurring=[s for s in everything.recurring if s.spec.name in names],
    )


def hand_over(source: Sim, target: Sim) -> None:
    """Drain, hand over, release and join, as the two leaders do."""
    source.core.withhold("moving")
    for lease in [lease for lease in source.running.values() if lease.pool == "moving"]:
        source.complete(lease)
    assert source.core.running_in("moving") == 0
    rows = rows_of(source)
    source.core.release_pool("moving")
    source.step()
    target.now = max(target.now, source.now)  # one clock for both shards
    target.core.join_pool(target.now, moving_config(), rows)
    target.step()


def test_pending_and_retrying_tasks_continue_on_the_target_and_other_pools_keep_their_leases() -> None:
    source, target = engine(1, "staying", "moving"), engine(2, "home")
    source.set_capacity(1, "moving")
    keyed = source.submit("k", pool="moving", key="order-7")
    waiting = source.submit("w", pool="moving")
    retried = source.submit("r", pool="staying")
    source.fail(source.lease_of(retried))  # another pool's retry timer stays armed
    busy = source.submit("s", pool="staying")
    home = target.submit("h", pool="home")
    assert source.status(keyed) == "running" and source.status(waiting) == "ready"

    hand_over(source, target)

    # Gone from the source: ids, keys, the pool itself; the other pool's lease still runs.
    assert source.core.get(waiting) is None and source.core.get("order-7") is None
    assert "moving" not in source.core.pools
    assert source.status(busy) == "running"
    assert source.complete(source.lease_of(busy))
    source.advance(3)
    assert source.status(retried) == "running"  # its retry fired on time
    assert all(lease.pool != "moving" for lease in source.running.values())
    # On the target: the finished task by id and key, the waiting one starts, its own pool goes on.
    assert target.status(keyed) == "succeeded" and target.info("order-7").id == keyed
    assert target.status(waiting) == "running"
    assert target.status(home) == "running"
    assert target.core.submit(target.now, TaskSpec(pool="moving", key="order-7")).duplicate
    fresh = target.submit("n", pool="moving")
    assert fresh >> 56 != keyed >> 56  # the target's own id range


def test_a_retry_waiting_at_the_handover_runs_once_on_the_target_and_never_on_the_source() -> None:
    source, target = engine(1, "staying", "moving"), engine(2, "home")
    task = source.submit("t", pool="moving")
    source.fail(source.lease_of(task))
    assert source.status(task) == "retrying"
    hand_over(source, target)
    source.advance(5)
    assert [lease.task_id for lease in source.dispatched].count(task) == 1
    target.advance(5)
    assert target.lease_of(task).attempt == 2


def test_a_schedule_fires_once_per_occurrence_across_the_handover() -> None:
    source, target = engine(1, "staying", "moving"), engine(2, "home")
    spec = RecurringSpec("every-minute", "* * * * *", TaskSpec(pool="moving", payload="tick"))
    source.runner = target.runner = lambda lease: (1.0, Success(None))
    source.core.add_recurring(source.now, spec)
    source.advance(60)
    before = [lease for lease in source.dispatched if lease.pool == "moving"]
    hand_over(source, target)
    source.advance(180)
    assert [lease for lease in source.dispatched if lease.pool == "moving"] == before
    target.advance(180)
    starts = [lease.task_id for lease in before + target.dispatched if lease.pool == "moving"]
    assert len(starts) == len(set(starts)) == 4  # one per minute boundary in 240 s
    assert [info.name for info in target.core.list_recurring()] == ["every-minute"]
    assert source.core.list_recurring() == []


def test_a_key_taken_on_the_target_meanwhile_keeps_naming_its_task() -> None:
    source, target = engine(1, "staying", "moving"), engine(2, "home")
    moved = source.submit("m", pool="moving", key="k")
    taken = target.submit("t", pool="home", key="k")
    hand_over(source, target)
    assert target.info("k").id == taken
    assert target.status(moved) == "succeeded"


def test_refusals() -> None:
    source = engine(1, "default", "moving")
    source.submit("r", pool="moving")
    with pytest.raises(ConfigError, match="running"):
        source.core.release_pool("moving")
    source.core.withhold("default")
    with pytest.raises(ConfigError, match="only pool"):
        engine(1, "moving").core.release_pool("moving")
    with pytest.raises(ConfigError, match="already"):
        source.core.join_pool(source.now, moving_config(), Recovered())


def play(sim: Sim, made: list[int], pool: str, op: str, n: int) -> None:
    if op == "submit":
        made.append(sim.submit(n, pool=pool))
    elif op == "keyed":
        made.append(sim.submit(n, pool=pool, key=f"{pool}-{n}"))
    elif op == "fixed":
        made.append(sim.submit(n, pool=pool, fixed_start=FixedStart(sim.now + ns(n + 1), ns(1))))
    elif op == "dependent" and made:
        parent = made[n % len(made)]
        info = sim.core.get(parent)
        if info is not None and info.pool == pool:
            made.append(sim.submit(n, pool=pool, deps=(Dep(parent),)))
    elif op in ("fail", "complete"):
        leases = [lease for lease in sim.running.values() if lease.pool == pool]
        if leases:
            lease = leases[n % len(leases)]
            sim.complete(lease) if op == "complete" else sim.fail(lease)
    elif op == "wait":
        sim.advance(n)


@settings(max_examples=60, deadline=None)
@given(
    plan=st.lists(
        st.tuples(
            st.sampled_from(["moving", "staying"]),
            st.sampled_from(["submit", "keyed", "fixed", "dependent", "fail", "complete", "wait"]),
            st.integers(0, 5),
        ),
        max_size=30,
    ),
    back=st.booleans(),
)
def test_every_task_is_known_on_exactly_one_engine_after_moves(plan: list[tuple[str, str, int]], back: bool) -> None:
    """Whatever the pools did before, after a move (and a move back) each task admitted is known
    to exactly one engine, with the status it had, and both engines' invariants hold."""
    source, target = engine(1, "staying", "moving"), engine(2, "home")
    made: list[int] = []
    for pool, op, n in plan:
        sim = source
        with contextlib.suppress(AdmissionError):  # a refused submission is not a task
            play(sim, made, pool, op, n)
    statuses = {task: source.status(task) for task in made if source.core.get(task) is not None}
    hand_over(source, target)
    for task in made:
        on_source, on_target = source.core.get(task), target.core.get(task)
        assert (on_source is None) != (on_target is None), task
        info = on_source or on_target
        assert info is not None
        assert (on_target is not None) == (info.pool == "moving")
        if task in statuses and info.pool == "staying":
            assert info.status.value == statuses[task]
    if back:
        # And back again, with the same engines' halves swapped.
        target.core.withhold("moving")
        for lease in [lease for lease in target.running.values() if lease.pool == "moving"]:
            target.complete(lease)
        rows = rows_of(source, target)
        ids = {item.record.id for item in rows.tasks}
        target.core.release_pool("moving")
        target.step()
        source.core.join_pool(source.now, moving_config(), rows)
        source.step()
        assert all(target.core.get(task) is None for task in ids)
        assert all(source.core.get(task) is not None for task in ids)
    source.advance(30)
    target.advance(30)


def test_overlap_guard_of_a_moved_schedule_still_applies() -> None:
    source, target = engine(1, "staying", "moving"), engine(2, "home")
    spec = RecurringSpec("slow", "* * * * *", TaskSpec(pool="moving"), overlap=OverlapPolicy.SKIP)
    source.core.add_recurring(source.now, spec)
    source.advance(60)
    hand_over(source, target)
    target.advance(120)
    assert target.core.list_recurring()[0].name == "slow"


def test_the_default_pool_can_leave_and_tasks_naming_no_pool_go_to_the_first_one_left() -> None:
    source = engine(1, "default", "staying")
    source.core.release_pool("default")
    source.step()
    assert source.core.default_pool == "staying"
    task = source.submit("x")
    assert source.info(task).pool == "staying"


def test_an_abort_arriving_after_the_pool_left_changes_nothing() -> None:
    source = engine(1, "staying", "moving")
    source.core.release_pool("moving")
    source.core.withhold("moving", False)  # the abort's "start attempts again", too late
    assert source.core.running_in("moving") == 0
    source.step()
