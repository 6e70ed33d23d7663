"""Submitting, looking up, cancelling and running tasks: every Scheduler method and task option."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import cronoq

from .conftest import Gate, eventually, settle, within


async def echo(ctx: cronoq.TaskContext, payload: Any) -> Any:
    return payload


def one_slot(executor: Any, **options: Any) -> cronoq.Pool:
    return cronoq.Pool("default", executor, max=1, autoscale=False, **options)


async def test_priority_order_with_one_slot(gate: Gate) -> None:
    order: list[str] = []

    async def run(ctx: cronoq.TaskContext, name: str) -> None:
        if name == "blocker":
            await gate.wait()
        order.append(name)

    async with cronoq.Scheduler([one_slot(run)]) as sched:
        await sched.enqueue("blocker")
        await eventually(lambda: gate.waiting)
        await sched.enqueue("low", priority="low")
        await sched.enqueue("normal")  # the default class
        await sched.enqueue("high", priority=cronoq.Priority.HIGH)
        await sched.enqueue("low2", priority=3)
        await sched.enqueue("critical", priority="CRITICAL")
        await sched.enqueue("normal2", priority="normal")
        snap = await sched.snapshot()
        assert snap.pool("default").pending_by_class == [1, 1, 2, 2]  # type: ignore[union-attr]
        gate.open()
        await eventually(lambda: len(order) == 7)
    assert order == ["blocker", "critical", "high", "normal", "normal2", "low", "low2"]


async def test_invalid_priority_is_refused() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        with pytest.raises(ValueError):
            await sched.submit(1, priority="urgent")
        with pytest.raises(ValueError):
            await sched.submit(1, priority=7)


async def test_key_deduplicates_submissions(gate: Gate) -> None:
    runs = 0

    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        nonlocal runs
        runs += 1
        await gate.wait()
        return payload

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        first = await sched.submit("first", key="k")
        second = await sched.submit("second", key="k")
        enqueued = await sched.enqueue("third", key="k")
        assert not first.duplicate
        assert second.duplicate
        assert second.id == first.id == enqueued
        gate.open()
        assert await within(first) == "first"
        assert await within(second) == "first"
        # A finished keyed task is still a duplicate within the retention window.
        third = await sched.submit("again", key="k")
        assert third.duplicate and third.id == first.id
        assert await within(third) == "first"
    assert runs == 1


async def test_handle_of_a_finished_task_returns_its_result() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        handle = await sched.submit({"answer": 42}, key="summary:42")
        await within(handle)
        by_key = await sched.handle("summary:42")
        by_id = await sched.handle(handle.id)
        assert by_key is not None and by_id is not None
        assert by_key.id == by_id.id == handle.id
        assert by_key.done()
        assert await within(by_key) == {"answer": 42}
        assert await within(by_id.result()) == {"answer": 42}
        assert await sched.handle("never-submitted") is None
        assert await sched.handle(123456789) is None
        assert await sched.status("summary:42") == "succeeded"
        assert await sched.status("never-submitted") is None


async def test_handle_of_a_live_task_resolves_when_it_finishes(gate: Gate) -> None:
    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        await gate.wait()
        return payload

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        task_id = await sched.enqueue("later", key="live")
        handle = await sched.handle("live")
        assert handle is not None and handle.id == task_id and not handle.done()
        await eventually(lambda: gate.waiting)
        assert await sched.status(task_id) == "running"
        gate.open()
        assert await within(handle) == "later"


async def test_handle_of_a_failed_task_raises_task_failed() -> None:
    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        raise cronoq.Permanent("broken input")

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        task_id = await sched.enqueue(1, key="bad")
        await eventually(lambda: _is(sched, task_id, "failed"))
        handle = await sched.handle("bad")
        assert handle is not None
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(handle)
        assert (info.value.status, info.value.message, info.value.task_id) == ("failed", "broken input", task_id)


async def _is(sched: cronoq.Scheduler, ref: int | str, status: str) -> bool:
    return await sched.status(ref) == status


async def test_refs_must_be_ids_or_keys() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        for bad in (True, 1.5, None, b"k"):
            with pytest.raises(TypeError):
                await sched.status(bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await sched.cancel(bad)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                await sched.handle(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await sched.submit(1, after=[1.5])  # type: ignore[list-item]


# ----------------------------------------------------------------------------------------------
# Cancellation


async def test_cancel_a_queued_task(gate: Gate) -> None:
    ran: list[str] = []

    async def run(ctx: cronoq.TaskContext, name: str) -> None:
        ran.append(name)
        await gate.wait()

    async with cronoq.Scheduler([one_slot(run)]) as sched:
        await sched.enqueue("blocker")
        await eventually(lambda: gate.waiting)
        queued = await sched.submit("queued", key="q")
        assert await sched.status("q") == "ready"
        assert await sched.cancel("q") is True
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(queued)
        assert info.value.status == "cancelled"
        assert await sched.status(queued.id) == "cancelled"
        assert await sched.cancel(queued.id) is False  # already finished
        assert await sched.cancel("unknown") is False
        gate.open()
        await settle()
    assert ran == ["blocker"]


async def test_cancel_a_running_task_cancels_its_asyncio_task() -> None:
    started = asyncio.Event()
    cancelled: list[bool] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(ctx.is_cancelled())
            raise

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        handle = await sched.submit(1)
        await within(started.wait())
        assert await sched.cancel(handle.id) is True
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(handle)
        assert info.value.status == "cancelled"
        await eventually(lambda: cancelled)
        assert (await sched.snapshot()).totals["cancelled"] == 1
    assert cancelled == [True]


async def test_handle_cancel_cancels_the_task() -> None:
    started = asyncio.Event()

    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        started.set()
        await asyncio.sleep(30)

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        handle = await sched.submit(1)
        await within(started.wait())
        handle.cancel()
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(handle)
        assert info.value.status == "cancelled"


async def test_awaiting_a_handle_can_be_cancelled_without_cancelling_the_task(gate: Gate) -> None:
    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        await gate.wait()
        return payload

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        handle = await sched.submit("kept")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(handle.result(), 0.01)
        gate.open()
        assert await within(handle) == "kept"


async def test_executor_that_cancels_itself_ends_cancelled() -> None:
    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        raise asyncio.CancelledError()

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(await sched.submit(1))
        assert info.value.status == "cancelled"


# ----------------------------------------------------------------------------------------------
# Timeouts and leases


async def test_timeout_cancels_the_attempt_and_retries() -> None:
    outcomes: list[str] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> str:
        assert ctx.timeout == 0.05
        if ctx.attempt == 1:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                outcomes.append(f"cancelled:{ctx.is_cancelled()}")
                raise
        outcomes.append("finished")
        return f"attempt {ctx.attempt}"

    retry = cronoq.RetryPolicy(max_attempts=2, initial_backoff=0.01, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", run, retry=retry)]) as sched:
        assert await within(await sched.submit(1, timeout=0.05)) == "attempt 2"
        totals = (await sched.snapshot()).totals
    assert outcomes == ["cancelled:True", "finished"]
    assert totals["timeouts"] == 1
    assert totals["retries"] == 1


async def test_timeouts_use_up_attempts() -> None:
    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        await asyncio.sleep(30)

    retry = cronoq.RetryPolicy(max_attempts=2, initial_backoff=0.01, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", run, retry=retry)]) as sched:
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(await sched.submit(1, timeout=0.02))
    assert info.value.status == "dead_lettered"


async def test_heartbeats_keep_a_lease_alive() -> None:
    async def run(ctx: cronoq.TaskContext, payload: Any) -> int:
        for _ in range(15):
            await asyncio.sleep(0.02)
            ctx.heartbeat()
        return ctx.attempt

    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", run, lease_ttl=0.15, retry=retry)]) as sched:
        assert await within(await sched.submit(1)) == 1
        assert (await sched.snapshot()).totals["lease_expiries"] == 0


async def test_a_lease_without_heartbeats_expires() -> None:
    cancelled: list[int] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> int:
        if ctx.attempt == 1:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(ctx.attempt)
                raise
        return ctx.attempt

    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", run, lease_ttl=0.05, retry=retry)]) as sched:
        assert await within(await sched.submit(1)) == 2
        assert (await sched.snapshot()).totals["lease_expiries"] == 1
    assert cancelled == [1]


# ----------------------------------------------------------------------------------------------
# Executors


async def test_sync_executors_run_in_the_default_thread_pool() -> None:
    from concurrent.futures import ThreadPoolExecutor

    loop_thread = threading.get_ident()
    threads: list[tuple[int, str]] = []

    def blocking(ctx: cronoq.TaskContext, payload: int) -> int:
        threads.append((threading.get_ident(), threading.current_thread().name))
        return payload + 1

    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="app-default")
    asyncio.get_running_loop().set_default_executor(pool)
    async with cronoq.Scheduler([cronoq.Pool("default", blocking)]) as sched:
        assert await within(await sched.submit(1)) == 2
    ((ident, name),) = threads
    assert ident != loop_thread
    assert name.startswith("app-default")  # the loop's default executor, whatever it is


async def test_sync_executor_outcomes() -> None:
    def blocking(ctx: cronoq.TaskContext, payload: str) -> str:
        if payload == "permanent":
            raise cronoq.Permanent("nope")
        if payload == "flaky" and ctx.attempt == 1:
            raise cronoq.Retryable("later", retry_after=0.01)
        return payload

    retry = cronoq.RetryPolicy(max_attempts=2, initial_backoff=0.01, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", blocking, retry=retry)]) as sched:
        assert await within(await sched.submit("flaky")) == "flaky"
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(await sched.submit("permanent"))
        assert (info.value.status, info.value.message) == ("failed", "nope")


async def test_sync_executor_sees_cancellation_through_the_context() -> None:
    entered = threading.Event()
    release = threading.Event()
    observed: list[bool] = []

    def blocking(ctx: cronoq.TaskContext, payload: Any) -> None:
        entered.set()
        release.wait(5)
        observed.append(ctx.is_cancelled())

    async with cronoq.Scheduler([cronoq.Pool("default", blocking)]) as sched:
        handle = await sched.submit(1)
        await eventually(entered.is_set)
        await sched.cancel(handle.id)
        with pytest.raises(cronoq.TaskFailed):
            await within(handle)
        release.set()
        await eventually(lambda: observed)
    assert observed == [True]


async def test_sync_executor_may_return_an_awaitable() -> None:
    def returns_coroutine(ctx: cronoq.TaskContext, payload: int) -> Any:
        async def later() -> int:
            return payload * 3

        return later()

    async with cronoq.Scheduler([cronoq.Pool("default", returns_coroutine)]) as sched:
        assert await within(await sched.submit(5)) == 15


async def test_callable_objects_and_partials_are_executors() -> None:
    import functools

    class Model:
        async def __call__(self, ctx: cronoq.TaskContext, payload: int) -> str:
            return f"async {payload} on {threading.get_ident() == loop_thread}"

    async def scaled(factor: int, ctx: cronoq.TaskContext, payload: int) -> int:
        return factor * payload

    loop_thread = threading.get_ident()
    pools = [cronoq.Pool("default", Model()), cronoq.Pool("partial", functools.partial(scaled, 10))]
    async with cronoq.Scheduler(pools) as sched:
        assert await within(await sched.submit(1)) == "async 1 on True"
        assert await within(await sched.submit(4, pool="partial")) == 40


async def test_executor_may_use_asyncio_timeouts_and_current_task() -> None:
    """The executor runs in its own asyncio task, also before its first suspension."""

    async def run(ctx: cronoq.TaskContext, payload: Any) -> str:
        mine = asyncio.current_task()
        try:
            async with asyncio.timeout(0.01):
                await asyncio.sleep(30)
        except TimeoutError:
            pass
        assert asyncio.current_task() is mine
        return "survived"

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        assert await within(await sched.submit(1)) == "survived"
        assert await within(await sched.submit(2)) == "survived"  # the scheduler still works


async def test_permanent_failure() -> None:
    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        raise cronoq.Permanent("bad request")

    retry = cronoq.RetryPolicy(max_attempts=5, initial_backoff=0.01)
    async with cronoq.Scheduler([cronoq.Pool("default", run, retry=retry)]) as sched:
        handle = await sched.submit(1)
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(handle)
        totals = (await sched.snapshot()).totals
    failed = info.value
    assert (failed.status, failed.message, failed.task_id) == ("failed", "bad request", handle.id)
    assert str(failed) == f"task {handle.id} ended as failed: bad request"
    assert totals["failed"] == 1 and totals["retries"] == 0


async def test_retries_exhausted_dead_letters_with_the_message() -> None:
    attempts: list[int] = []

    async def run(ctx: cronoq.TaskContext, payload: str) -> None:
        attempts.append(ctx.attempt)
        if payload == "retryable":
            raise cronoq.Retryable("still flaky")
        raise ValueError("boom")

    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.005, multiplier=1.0, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", run, retry=retry)]) as sched:
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(await sched.submit("retryable"))
        assert (info.value.status, info.value.message) == ("dead_lettered", "still flaky")
        # Any other exception is retryable; its message names the exception type.
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(await sched.submit("other", retry=cronoq.RetryPolicy(2, 0.005, jitter=False)))
        assert info.value.status == "dead_lettered"
        assert "boom" in info.value.message
        totals = (await sched.snapshot()).totals
    assert attempts == [1, 2, 3, 1, 2]
    assert totals["dead_lettered"] == 2


async def test_retry_policy_none_means_one_attempt() -> None:
    calls = 0

    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("no")

    async with cronoq.Scheduler([cronoq.Pool("default", run, retry=cronoq.RetryPolicy.none())]) as sched:
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(await sched.submit(1))
    assert info.value.status == "dead_lettered"
    assert calls == 1


async def test_context_carries_attempt_key_kind_and_tags() -> None:
    contexts: list[cronoq.TaskContext] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        contexts.append(ctx)
        if ctx.attempt == 1:
            raise cronoq.Retryable("again")

    retry = cronoq.RetryPolicy(initial_backoff=0.005, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("work", run, retry=retry)]) as sched:
        await within(await sched.submit(1, key="k1", kind="thumb", tags={"a": "b"}, timeout=9.0))
    assert [c.attempt for c in contexts] == [1, 2]
    assert {c.id for c in contexts} == {contexts[0].id}
    for ctx in contexts:
        assert (ctx.key, ctx.kind, ctx.pool, ctx.tags, ctx.timeout) == ("k1", "thumb", "work", {"a": "b"}, 9.0)
    assert "TaskContext" in repr(contexts[0])


async def test_enqueue_returns_the_task_id(gate: Gate) -> None:
    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        await gate.wait()

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        first = await sched.enqueue(1)
        second = await sched.enqueue(2)
        assert isinstance(first, int) and second > first
        gate.open()


async def test_fixed_start_runs_at_its_start_time() -> None:
    started: list[float] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        started.append(asyncio.get_running_loop().time())

    async with cronoq.Scheduler([cronoq.Pool("default", run)], emit_transitions=True) as sched:
        begin = asyncio.get_running_loop().time()
        handle = await sched.submit(1, start_in=0.1, tolerance=1.0)
        assert await sched.status(handle.id) == "scheduled"
        await within(handle)
    assert started[0] - begin >= 0.09


async def test_task_option_validation() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        with pytest.raises(ValueError):
            await sched.submit(1, deadline_in=1.0, deadline_at=2.0)
        with pytest.raises(ValueError):
            await sched.submit(1, start_in=1.0, start_at=2.0)
        with pytest.raises(ValueError):
            await sched.submit(1, timeout=-1.0)
        with pytest.raises(ValueError):
            await sched.submit(1, deadline_in=float("nan"))
        with pytest.raises(ValueError):
            await sched.submit(1, on_miss="explode", start_in=1.0)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await sched.submit(1, no_such_option=True)  # type: ignore[call-arg]
        with pytest.raises(TypeError):
            cronoq.Task(1, no_such_option=True)  # type: ignore[call-arg]
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit(1, key="bad\0key")
        assert info.value.code == "invalid"
        assert (await sched.snapshot()).totals["submitted"] == 0


async def test_sync_executor_heartbeats_from_its_thread() -> None:
    import time as _time

    def blocking(ctx: cronoq.TaskContext, payload: Any) -> int:
        for _ in range(12):
            _time.sleep(0.02)
            ctx.heartbeat()
        return ctx.attempt

    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", blocking, lease_ttl=0.12, retry=retry)]) as sched:
        assert await within(await sched.submit(1)) == 1
        assert (await sched.snapshot()).totals["lease_expiries"] == 0


async def test_an_executor_that_swallows_cancellation_overlaps_its_retry() -> None:
    """Its late return value is a stale completion: the retry's result wins."""
    finished: list[str] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> str:
        if ctx.attempt == 1:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                await asyncio.sleep(0.05)  # keeps running after being cancelled
            finished.append("stale")
            return "stale"
        finished.append("fresh")
        return "fresh"

    retry = cronoq.RetryPolicy(max_attempts=2, initial_backoff=0.001, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", run, max=2, autoscale=False, retry=retry)]) as sched:
        assert await within(await sched.submit(1, timeout=0.02)) == "fresh"
        await eventually(lambda: len(finished) == 2)
    assert finished == ["fresh", "stale"]


async def test_an_invalid_retry_after_hint_is_ignored() -> None:
    async def run(ctx: cronoq.TaskContext, payload: Any) -> int:
        if ctx.attempt == 1:
            raise cronoq.Retryable("odd hint", retry_after=-5.0)
        return ctx.attempt

    retry = cronoq.RetryPolicy(max_attempts=2, initial_backoff=0.001, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", run, retry=retry)]) as sched:
        assert await within(await sched.submit(1)) == 2


async def test_absolute_times_accept_aware_datetimes_and_unix_seconds() -> None:
    import datetime as dt
    import time as _time

    contexts: list[cronoq.TaskContext] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        contexts.append(ctx)

    soon = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=0.05)
    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        await within(await sched.submit(1, deadline_at=soon + dt.timedelta(hours=1), start_at=soon))
        await within(await sched.submit(2, deadline_at=_time.time() + 60))
        with pytest.raises(ValueError):
            await sched.submit(3, start_at=dt.datetime.now())  # naive: ambiguous
    assert contexts[0].deadline == pytest.approx(soon.timestamp() + 3600)
    assert contexts[1].deadline is not None


async def test_missed_fixed_starts_follow_the_miss_policy(gate: Gate) -> None:
    async def run(ctx: cronoq.TaskContext, payload: str) -> str:
        if payload == "blocker":
            await gate.wait()
        return payload

    async with cronoq.Scheduler([one_slot(run)]) as sched:
        await sched.enqueue("blocker")
        await eventually(lambda: gate.waiting)
        skip = await sched.submit("skip", start_in=0.01, tolerance=0.01, on_miss="skip")
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(skip)
        assert info.value.status == "missed"
        fail = await sched.submit("fail", start_in=0.01, tolerance=0.01, on_miss="fail")
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(fail)
        assert info.value.status == "failed"
        late = await sched.submit("late", start_in=0.01, tolerance=0.01)  # run_late is the default
        await asyncio.sleep(0.05)
        gate.open()
        assert await within(late) == "late"


async def test_reservation_conflict() -> None:
    async with cronoq.Scheduler([one_slot(echo)]) as sched:
        await sched.submit("first", start_in=30.0, tolerance=1.0, duration_hint=5.0)
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit("second", start_in=31.0, tolerance=1.0, duration_hint=5.0)
        assert info.value.code == "reservation_conflict"


async def test_awaiting_a_key_submitted_later() -> None:
    pool = cronoq.Pool("default", echo, unknown_dependency="await", await_timeout=5.0)
    async with cronoq.Scheduler([pool]) as sched:
        child = await sched.submit("child", after="producer")
        assert await sched.status(child.id) == "blocked"
        await sched.submit("producer", key="producer")
        assert await within(child) == "child"


async def test_an_awaited_key_that_never_appears_skips_the_child() -> None:
    pool = cronoq.Pool("default", echo, unknown_dependency="await", await_timeout=0.02)
    async with cronoq.Scheduler([pool]) as sched:
        child = await sched.submit("child", after="never")
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(child)
        assert info.value.status == "skipped"


async def test_unknown_dependencies_are_rejected_by_default() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit("child", after="never")
        assert info.value.code == "unknown_dependency"
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit("child", deps=[cronoq.Dep(987654321)])
        assert info.value.code == "unknown_dependency"


async def test_a_result_no_longer_cached_is_reported_as_gone() -> None:
    from cronoq._scheduler import OUTPUT_CACHE

    async with cronoq.Scheduler([cronoq.Pool("default", echo, max=64)]) as sched:
        first = await sched.submit("first", key="first")
        await within(first)
        handles = await sched.submit_batch([cronoq.Task(i) for i in range(OUTPUT_CACHE)])
        for handle in handles:
            await within(handle)
        assert await within(first) == "first"  # a handle that saw the result keeps it
        late = await sched.handle("first")
        assert late is not None
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(late)
        assert info.value.status == "succeeded"
