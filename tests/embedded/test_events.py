"""Status events: terminal by default, every transition on request, bounded buffers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import cronoq

from .conftest import Gate, eventually, within


async def ok(ctx: cronoq.TaskContext, payload: Any) -> Any:
    return payload


async def test_terminal_events_by_default() -> None:
    async def run(ctx: cronoq.TaskContext, payload: str) -> str:
        if payload == "bad":
            raise cronoq.Permanent("no good")
        return payload

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        before = time.time()
        async with sched.events() as events:
            good = await sched.submit("good", key="g")
            bad = await sched.submit("bad")
            received = [await within(events.__anext__()), await within(events.__anext__())]
        assert events.closed
    by_id = {e.id: e for e in received}
    assert set(by_id) == {good.id, bad.id}
    done = by_id[good.id]
    assert isinstance(done, cronoq.StatusEvent)
    assert (done.pool, done.key, done.status, done.attempt) == ("default", "g", "succeeded", 1)
    assert before <= done.at <= time.time()
    failed = by_id[bad.id]
    assert (failed.key, failed.status, failed.message) == (None, "failed", "no good")


async def test_every_transition_with_emit_transitions(gate: Gate) -> None:
    async def run(ctx: cronoq.TaskContext, payload: str) -> str:
        if payload == "p":
            await gate.wait()
        return payload

    pools = [cronoq.Pool("default", run)]
    async with cronoq.Scheduler(pools, emit_transitions=True) as sched, sched.events() as events:
        parent = await sched.submit("p", key="p")
        child = await sched.submit("c", after="p")
        await eventually(lambda: gate.waiting)
        gate.open()
        seen: dict[int, list[str]] = {parent.id: [], child.id: []}
        async for event in events:
            seen[event.id].append(event.status)
            if event.id == child.id and event.status == "succeeded":
                break
    assert seen[parent.id] == ["ready", "running", "succeeded"]
    assert seen[child.id] == ["blocked", "ready", "running", "succeeded"]


async def test_retrying_is_a_transition() -> None:
    async def flaky(ctx: cronoq.TaskContext, payload: Any) -> Any:
        if ctx.attempt == 1:
            raise RuntimeError("try again")
        return payload

    retry = cronoq.RetryPolicy(initial_backoff=0.01, jitter=False)
    pools = [cronoq.Pool("default", flaky, retry=retry)]
    async with cronoq.Scheduler(pools, emit_transitions=True) as sched, sched.events() as events:
        await sched.submit(1)
        statuses: list[tuple[str, int]] = []
        async for event in events:
            statuses.append((event.status, event.attempt))
            if event.status == "succeeded":
                break
    assert [s for s, _ in statuses] == ["ready", "running", "retrying", "ready", "running", "succeeded"]
    assert statuses[-1][1] == 2


async def test_slow_consumer_loses_the_oldest_events() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", ok)], event_capacity=2) as sched:
        events = sched.events()
        handles = [await sched.submit(i) for i in range(5)]
        for handle in handles:
            await within(handle)
        await eventually(lambda: events.lagged == 3)
        kept = [await within(events.__anext__()) for _ in range(2)]
        assert [e.id for e in kept] == [h.id for h in handles[3:]]
        assert events.lagged == 3
        await events.aclose()
        assert events.closed
        with pytest.raises(StopAsyncIteration):
            await events.__anext__()


async def test_on_lag_raise_reports_then_resumes() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", ok)], event_capacity=2) as sched:
        events = sched.events(on_lag="raise")
        handles = [await sched.submit(i) for i in range(5)]
        for handle in handles:
            await within(handle)
        await eventually(lambda: events.lagged == 3)
        with pytest.raises(cronoq.EventsLagged) as info:
            await within(events.__anext__())
        assert info.value.skipped == 3
        kept = [await within(events.__anext__()) for _ in range(2)]
        assert [e.id for e in kept] == [h.id for h in handles[3:]]
        # Nothing new was lost: the next task's event arrives without another EventsLagged.
        late = await sched.submit(99)
        event = await within(events.__anext__())
        assert event.id == late.id
        events.close()


async def test_events_rejects_an_unknown_lag_policy() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", ok)]) as sched:
        with pytest.raises(ValueError):
            sched.events(on_lag="explode")  # type: ignore[arg-type]


async def test_streams_end_when_the_scheduler_shuts_down() -> None:
    sched = cronoq.Scheduler([cronoq.Pool("default", ok)])
    await sched.start()
    events = sched.events()
    consumer = asyncio.ensure_future(_drain(events))
    await within(await sched.submit(1))
    await sched.shutdown()
    received = await within(consumer)
    assert [e.status for e in received] == ["succeeded"]
    assert events.closed


async def _drain(events: cronoq.EventStream) -> list[cronoq.StatusEvent]:
    return [event async for event in events]


async def test_several_streams_each_see_every_event(gate: Gate) -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", ok)]) as sched:
        first, second = sched.events(), sched.events()
        handle = await sched.submit("x")
        await within(handle)
        a = await within(first.__anext__())
        b = await within(second.__anext__())
        assert a == b
        assert a.id == handle.id
        first.close()
        second.close()
