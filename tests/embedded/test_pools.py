"""Pools, capacity, resources, backpressure, fair sharing, recurring schedules and snapshots."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import cronoq

from .conftest import Gate, eventually, settle, within


async def echo(ctx: cronoq.TaskContext, payload: Any) -> Any:
    return payload


class Tracker:
    """An executor that counts attempts in flight and waits at a gate."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.in_flight = 0
        self.peak = 0
        self.groups: list[dict[str, str]] = []
        self.order: list[Any] = []

    async def __call__(self, ctx: cronoq.TaskContext, payload: Any) -> Any:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.groups.append(dict(ctx.group))
        self.order.append(payload)
        try:
            await self.gate.wait(payload)
        finally:
            self.in_flight -= 1
        return payload


# ----------------------------------------------------------------------------------------------
# Capacity


async def test_fixed_pool_has_max_capacity(gate: Gate) -> None:
    tracker = Tracker(gate)
    async with cronoq.Scheduler([cronoq.Pool("default", tracker, max=3, autoscale=False)]) as sched:
        snap = (await sched.snapshot()).pool("default")
        assert snap is not None and (snap.capacity, snap.desired) == (3, 3)
        handles = [await sched.submit(i) for i in range(5)]
        await eventually(lambda: tracker.in_flight == 3)
        await settle()
        assert tracker.in_flight == 3
        snap = (await sched.snapshot()).pool("default")
        assert snap is not None and (snap.busy, snap.pending) == (3, 2)
        gate.open()
        for handle in handles:
            await within(handle)
    assert tracker.peak == 3


async def test_initial_capacity(gate: Gate) -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo, max=8, initial=2, autoscale=False)]) as sched:
        assert (await sched.snapshot()).pool("default").capacity == 2  # type: ignore[union-attr]


async def test_set_capacity(gate: Gate) -> None:
    tracker = Tracker(gate)
    async with cronoq.Scheduler([cronoq.Pool("default", tracker, max=4, autoscale=False)]) as sched:
        await sched.set_capacity("default", 1)
        handles = [await sched.submit(i) for i in range(4)]
        await eventually(lambda: tracker.in_flight == 1)
        await settle()
        assert tracker.in_flight == 1
        await sched.set_capacity("default", 2)
        await eventually(lambda: tracker.in_flight == 2)
        assert (await sched.snapshot()).pool("default").capacity == 2  # type: ignore[union-attr]
        gate.open()
        for handle in handles:
            await within(handle)
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.set_capacity("nope", 1)
        assert info.value.code == "unknown_pool"
    assert tracker.peak == 2


async def test_set_group_capacity_runs_labelled_tasks_on_that_group(gate: Gate) -> None:
    tracker = Tracker(gate)
    async with cronoq.Scheduler([cronoq.Pool("default", tracker, max=2, autoscale=False)]) as sched:
        gpu = await sched.submit("gpu-task", labels={"gpu": "a100"})
        plain = await sched.submit("plain")
        await eventually(lambda: "plain" in tracker.order)
        await settle()
        assert "gpu-task" not in tracker.order  # no group with that label yet
        assert await sched.status(gpu.id) == "ready"
        await sched.set_group_capacity("default", {"gpu": "a100"}, 1)
        await eventually(lambda: "gpu-task" in tracker.order)
        snap = (await sched.snapshot()).pool("default")
        assert snap is not None and snap.capacity == 3
        gate.open()
        assert await within(gpu) == "gpu-task"
        assert await within(plain) == "plain"
    assert tracker.groups[tracker.order.index("gpu-task")] == {"gpu": "a100"}
    assert tracker.groups[tracker.order.index("plain")] == {}


async def test_autoscale_is_the_default_and_capacity_follows_it(gate: Gate) -> None:
    tracker = Tracker(gate)
    pool = cronoq.Pool("default", tracker, min=1, max=4)
    async with cronoq.Scheduler([pool]) as sched:
        snap = (await sched.snapshot()).pool("default")
        assert snap is not None and snap.capacity == 1  # starts at min
    fast = cronoq.AutoscaleConfig(interval=0.02, drain_time=0.05, stabilization_window=0.0, cooldown=0.0)
    tracker = Tracker(gate)
    async with cronoq.Scheduler([cronoq.Pool("default", tracker, min=1, max=4, autoscale=fast)]) as sched:
        handles = [await sched.submit(i) for i in range(12)]
        await eventually(lambda: tracker.in_flight == 4)
        snap = (await sched.snapshot()).pool("default")
        assert snap is not None and snap.capacity == snap.desired == 4
        gate.open()
        for handle in handles:
            await within(handle)
    assert tracker.peak == 4


# ----------------------------------------------------------------------------------------------
# Resources and admission errors


async def test_resources_exceeding_capacity_are_refused() -> None:
    resources = [cronoq.Resource.semaphore("gpu", 2), cronoq.Resource.token_bucket("api", 10.0, 5)]
    async with cronoq.Scheduler([cronoq.Pool("default", echo)], resources=resources) as sched:
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit(1, resources={"gpu": 3})
        assert info.value.code == "resource_exceeds_capacity"
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit(1, resources={"api": 6})
        assert info.value.code == "resource_exceeds_capacity"
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit(1, resources={"disk": 1})
        assert info.value.code == "unknown_resource"
        assert await within(await sched.submit("fits", resources={"gpu": 2, "api": 5})) == "fits"


async def test_unknown_pool_is_refused() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit(1, pool="elsewhere")
        assert info.value.code == "unknown_pool"
        assert "elsewhere" in info.value.message
        with pytest.raises(cronoq.SubmitError):
            await sched.enqueue(1, pool="elsewhere")


async def test_semaphore_is_shared_between_pools(gate: Gate) -> None:
    tracker = Tracker(gate)
    pools = [cronoq.Pool("a", tracker, max=4, autoscale=False), cronoq.Pool("b", tracker, max=4, autoscale=False)]
    async with cronoq.Scheduler(pools, resources=[cronoq.Resource.semaphore("db", 3)]) as sched:
        handles = [await sched.submit(i, pool="ab"[i % 2], resources={"db": 1}) for i in range(8)]
        await eventually(lambda: tracker.in_flight == 3)
        await settle()
        assert tracker.in_flight == 3
        gate.open()
        for handle in handles:
            await within(handle)
    assert tracker.peak == 3


# ----------------------------------------------------------------------------------------------
# Backpressure


async def test_max_pending_with_reject_overflow(gate: Gate) -> None:
    tracker = Tracker(gate)
    pool = cronoq.Pool("default", tracker, max=1, autoscale=False, max_pending=2, overflow="reject")
    async with cronoq.Scheduler([pool]) as sched:
        running = await sched.submit("running")
        await eventually(lambda: tracker.in_flight == 1)
        queued = [await sched.submit(i) for i in range(2)]
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit("one too many")
        assert info.value.code == "overloaded"
        with pytest.raises(cronoq.SubmitError):
            await sched.submit_batch([cronoq.Task("batch too")])
        gate.open()
        for handle in [running, *queued]:
            await within(handle)
        assert await within(await sched.submit("room again")) == "room again"


async def test_max_pending_with_wait_overflow_blocks_until_space(gate: Gate) -> None:
    tracker = Tracker(gate)
    pool = cronoq.Pool("default", tracker, max=1, autoscale=False, max_pending=1, overflow="wait")
    async with cronoq.Scheduler([pool]) as sched:
        first = await sched.submit("first")
        await eventually(lambda: tracker.in_flight == 1)
        second = await sched.submit("second")
        third = asyncio.ensure_future(sched.submit("third"))
        enqueued = asyncio.ensure_future(sched.enqueue("fourth"))
        await eventually(lambda: len(sched._space_waiters) == 2)  # both were refused as full and wait
        assert not third.done() and not enqueued.done()
        gate.open()
        handle = await within(third)
        assert isinstance(await within(enqueued), int)
        assert [await within(h) for h in (first, second, handle)] == ["first", "second", "third"]
        await eventually(lambda: "fourth" in tracker.order)


async def test_shedding_the_lowest_priority(gate: Gate) -> None:
    tracker = Tracker(gate)
    pool = cronoq.Pool("default", tracker, max=1, autoscale=False, max_pending=2, overflow="shed_lowest")
    async with cronoq.Scheduler([pool]) as sched:
        await sched.submit("running")
        await eventually(lambda: tracker.in_flight == 1)
        low = await sched.submit("low", priority="low")
        normal = await sched.submit("normal")
        high = await sched.submit("high", priority="high")
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(low)
        assert info.value.status == "shed"
        gate.open()
        assert await within(high) == "high"
        assert await within(normal) == "normal"


# ----------------------------------------------------------------------------------------------
# Fair sharing


async def _fair_order(gate: Gate, **pool_options: Any) -> list[str]:
    tracker = Tracker(gate)
    pool = cronoq.Pool("default", tracker, max=1, autoscale=False, **pool_options)
    async with cronoq.Scheduler([pool]) as sched:
        await sched.enqueue("blocker")
        await eventually(lambda: tracker.in_flight == 1)
        # Tenant b arrives first: plain FIFO would run all of b before any of a.
        await sched.submit_batch([cronoq.Task("b", tenant="b") for _ in range(8)])
        await sched.submit_batch([cronoq.Task("a", tenant="a") for _ in range(8)])
        gate.open()
        await eventually(lambda: len(tracker.order) == 17)
    return tracker.order[1:]


async def test_tenant_weights_share_the_pool_by_ratio(gate: Gate) -> None:
    order = await _fair_order(gate, tenant_weights={"a": 3.0, "b": 1.0})
    assert 5 <= order[:8].count("a") <= 7


async def test_fair_share_alternates_tenants(gate: Gate) -> None:
    order = await _fair_order(gate, fair_share=True)
    assert 3 <= order[:6].count("a") <= 4


async def test_without_fair_sharing_tenants_are_fifo(gate: Gate) -> None:
    order = await _fair_order(gate)
    assert order == ["b"] * 8 + ["a"] * 8


# ----------------------------------------------------------------------------------------------
# Recurring schedules


async def test_recurring_every_second_then_removed() -> None:
    runs: list[cronoq.TaskContext] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        assert payload == {"job": "tick"}
        runs.append(ctx)

    witnessed: list[float] = []

    async def witness(ctx: cronoq.TaskContext, payload: Any) -> None:
        witnessed.append(time.time())

    async with cronoq.Scheduler([cronoq.Pool("default", run), cronoq.Pool("witness", witness)]) as sched:
        await sched.add_recurring(
            "ticker", "* * * * * *", {"job": "tick"}, key="tick", kind="tick", tags={"x": "1"}, tolerance=0.5
        )
        await eventually(lambda: runs, limit=5.0)
        assert await sched.remove_recurring("ticker") is True
        assert await sched.remove_recurring("ticker") is False
        seen = len(runs)
        # A witness schedule of the same period, added after the removal, running twice proves a
        # whole period passed in which the removed one would have fired.
        await sched.add_recurring("witness", "* * * * * *", {"job": "witness"}, pool="witness", tolerance=0.5)
        await eventually(lambda: len(witnessed) >= 2, limit=5.0)
        # An occurrence already created before the removal may still run; nothing after it.
        assert len(runs) <= seen + 1
    ctx = runs[0]
    assert ctx.kind == "tick"
    assert ctx.tags["x"] == "1"
    assert ctx.tags["cronoq.recurring"] == "ticker"
    assert ctx.key is not None and ctx.key.startswith("tick@")


async def test_recurring_replaces_by_name() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        await sched.add_recurring("job", "0 0 * * *", 1)
        await sched.add_recurring("job", "0 12 * * *", 2, tz="Europe/Lisbon", overlap="queue")
        assert await sched.remove_recurring("job") is True


async def test_recurring_validation_errors() -> None:
    """Bad argument values raise ValueError (as the published package's do); a cron expression,
    zone or template the scheduler cannot use raises SchedulerError. Nothing is added either way."""
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        scheduler_errors: list[dict[str, Any]] = [
            {"cron": "not a cron"},
            {"cron": "* * * * *", "tz": "Mars/Olympus_Mons"},
            {"cron": "* * * * *", "pool": "nope"},
            {"cron": "* * * * *", "resources": {"unknown": 1}},
        ]
        value_errors: list[dict[str, Any]] = [
            {"cron": "* * * * *", "overlap": "sometimes"},
            {"cron": "* * * * *", "on_miss": "panic"},
            {"cron": "* * * * *", "tolerance": -1.0},
            {"cron": "* * * * *", "tolerance": float("nan")},
            {"cron": "* * * * *", "deadline_in": float("inf")},
            {"cron": "* * * * *", "timeout": 1e308},
            {"cron": "* * * * *", "priority": "urgent"},
            {"cron": "* * * * *", "name": ""},
        ]
        for calls, error in ((scheduler_errors, cronoq.SchedulerError), (value_errors, ValueError)):
            for call in calls:
                name = call.pop("name", "bad")
                cron = call.pop("cron")
                with pytest.raises(error):
                    await sched.add_recurring(name, cron, {"p": 1}, **call)
        assert await sched.remove_recurring("bad") is False


# ----------------------------------------------------------------------------------------------
# Snapshots


async def test_snapshot_fields(gate: Gate) -> None:
    tracker = Tracker(gate)
    pools = [
        cronoq.Pool("default", tracker, max=2, autoscale=False),
        cronoq.Pool(
            "other",
            echo,
            max=1,
            autoscale=False,
        ),
    ]
    async with cronoq.Scheduler(pools) as sched:
        await sched.submit("a")
        await sched.submit("b")
        await sched.submit("c", priority="high")
        await eventually(lambda: tracker.in_flight == 2)
        snap = await sched.snapshot()
        assert isinstance(snap, cronoq.Snapshot)
        assert [p.name for p in snap.pools] == ["default", "other"]
        assert (snap.live_tasks, snap.running, snap.pending) == (3, 2, 1)
        assert snap.totals["submitted"] == 3 and snap.totals["dispatched"] == 2
        pool = snap.pool("default")
        assert isinstance(pool, cronoq.PoolSnapshot)
        assert (pool.capacity, pool.busy, pool.pending, pool.desired) == (2, 2, 1, 2)
        assert list(pool.pending_by_class) == [0, 1, 0, 0]
        assert snap.pool("missing") is None
        for name in ("held", "ready", "reservations", "dispatched", "succeeded", "failed", "retried"):
            assert isinstance(getattr(pool, name), int)
        for name in (
            "window",
            "priority_adherence",
            "fixed_start_hit_rate",
            "utilization",
            "schedule_efficiency",
            "wait_mean",
            "wait_p50",
            "wait_p90",
            "wait_p99",
            "run_p50",
            "run_p99",
            "worker_seconds",
            "cost",
        ):
            assert isinstance(getattr(pool, name), float)
        gate.open()
        await eventually(lambda: len(tracker.order) == 3)
        await eventually(lambda: _succeeded(sched, 3))
        snap = await sched.snapshot()
        assert (snap.live_tasks, snap.running, snap.pending) == (0, 0, 0)
        assert snap.pool("default").succeeded == 3  # type: ignore[union-attr]
        assert set(snap.totals) >= {
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
        }


async def _succeeded(sched: cronoq.Scheduler, count: int) -> bool:
    return (await sched.snapshot()).totals["succeeded"] == count


async def test_cost_accounting() -> None:
    scale = cronoq.AutoscaleConfig(cost_per_worker_second=1.0)
    async with cronoq.Scheduler([cronoq.Pool("default", echo, autoscale=scale)]) as sched:

        async def charged() -> bool:
            pool = (await sched.snapshot()).pool("default")
            assert pool is not None
            return pool.cost > 0 and pool.worker_seconds > 0

        await eventually(charged)  # workers cost from the start, whether busy or not


async def test_shutdown_while_waiting_for_room(gate: Gate) -> None:
    tracker = Tracker(gate)
    pool = cronoq.Pool("default", tracker, max=1, autoscale=False, max_pending=1, overflow="wait")
    sched = cronoq.Scheduler([pool])
    await sched.start()
    await sched.submit("running")
    await eventually(lambda: tracker.in_flight == 1)
    await sched.submit("queued")
    waiting = asyncio.ensure_future(sched.submit("waiting"))
    await eventually(lambda: len(sched._space_waiters) == 1)
    assert not waiting.done()
    await sched.shutdown(grace=0.01)
    with pytest.raises(cronoq.SchedulerError):
        await within(waiting)


async def test_shedding_the_oldest_low_task(gate: Gate) -> None:
    tracker = Tracker(gate)
    pool = cronoq.Pool("default", tracker, max=1, autoscale=False, max_pending=2, overflow="shed_oldest")
    async with cronoq.Scheduler([pool]) as sched:
        await sched.submit("running")
        await eventually(lambda: tracker.in_flight == 1)
        old = await sched.submit("old", priority="low")
        new = await sched.submit("new", priority="low")
        normal = await sched.submit("normal")
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(old)
        assert info.value.status == "shed"
        gate.open()
        assert await within(normal) == "normal"
        assert await within(new) == "new"
        assert (await sched.snapshot()).totals["shed"] == 1
