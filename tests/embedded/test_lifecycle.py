"""Starting, shutting down, and calls outside the scheduler's lifetime."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import cronoq

from .conftest import Gate, eventually, within


async def echo(ctx: cronoq.TaskContext, payload: Any) -> Any:
    return payload


def _every_call(sched: cronoq.Scheduler) -> list[Any]:
    """One coroutine (or callable) per public method that needs a running scheduler."""
    return [
        lambda: sched.submit(1),
        lambda: sched.enqueue(1),
        lambda: sched.submit_batch([cronoq.Task(1)]),
        lambda: sched.cancel(1),
        lambda: sched.status(1),
        lambda: sched.handle(1),
        lambda: sched.handle("key"),
        lambda: sched.snapshot(),
        lambda: sched.set_capacity("default", 1),
        lambda: sched.set_group_capacity("default", {"a": "b"}, 1),
        lambda: sched.add_recurring("r", "* * * * *", 1),
        lambda: sched.remove_recurring("r"),
        lambda: sched.events(),
    ]


async def _call(fn: Any) -> Any:
    result = fn()
    if asyncio.iscoroutine(result):
        return await result
    return result


async def test_calls_before_start_raise_runtime_error() -> None:
    sched = cronoq.Scheduler([cronoq.Pool("default", echo)])
    assert not sched.started
    for fn in _every_call(sched):
        with pytest.raises(RuntimeError):
            await _call(fn)


async def test_calls_after_shutdown_raise_scheduler_error() -> None:
    sched = cronoq.Scheduler([cronoq.Pool("default", echo)])
    await sched.start()
    assert sched.started
    await sched.shutdown()
    assert not sched.started
    for fn in _every_call(sched):
        with pytest.raises(cronoq.SchedulerError):
            await _call(fn)
    await sched.shutdown()  # idempotent
    with pytest.raises(cronoq.SchedulerError):
        await sched.start()


async def test_start_twice_raises() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        with pytest.raises(cronoq.SchedulerError):
            await sched.start()


def test_a_scheduler_belongs_to_the_loop_that_started_it() -> None:
    sched = cronoq.Scheduler([cronoq.Pool("default", echo)])

    async def start() -> None:
        await sched.start()
        assert await within(await sched.submit(1)) == 1

    # The first loop closes without a shutdown (asyncio.run cancels the scheduler's tasks).
    asyncio.run(start())

    async def later() -> None:
        with pytest.raises(cronoq.SchedulerError):
            await sched.submit(2)

    asyncio.run(later())


async def test_calls_from_another_loop_are_refused() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        errors: list[BaseException] = []

        def other_thread() -> None:
            async def call() -> None:
                await sched.submit(1)

            try:
                asyncio.run(call())
            except BaseException as err:
                errors.append(err)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(10)
        assert len(errors) == 1 and isinstance(errors[0], cronoq.SchedulerError)


async def test_configuration_errors() -> None:
    with pytest.raises(cronoq.SchedulerError):
        cronoq.Scheduler([])
    with pytest.raises(cronoq.SchedulerError):
        cronoq.Scheduler([cronoq.Pool("a", echo), cronoq.Pool("a", echo)])
    with pytest.raises(ValueError):  # refused by the Pool itself, as the published package does
        cronoq.Pool("a", echo, min=5, max=2)
    with pytest.raises(TypeError):
        cronoq.Scheduler(["default"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        cronoq.Pool("a", "not callable")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cronoq.Pool("a", echo, overflow="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cronoq.Pool("a", echo, lease_ttl=-1.0)
    with pytest.raises(ValueError):
        cronoq.Pool("a", echo, default_duration=float("nan"))
    with pytest.raises(ValueError):
        cronoq.RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError):
        cronoq.RetryPolicy(initial_backoff=-1.0)
    with pytest.raises(ValueError):
        cronoq.AutoscaleConfig(slo={"urgent": 1.0})
    with pytest.raises(ValueError):
        cronoq.Dep("a", on="sometimes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cronoq.Dep(1.5)  # type: ignore[arg-type]


async def test_shutdown_lets_running_attempts_finish_then_cancels_the_rest(gate: Gate) -> None:
    cancelled: list[Any] = []

    async def run(ctx: cronoq.TaskContext, payload: str) -> str:
        try:
            if payload == "quick":
                await asyncio.sleep(0.02)
            else:
                await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(payload)
            raise
        return payload

    sched = cronoq.Scheduler([cronoq.Pool("default", run, max=2, autoscale=False)])
    await sched.start()
    quick = await sched.submit("quick")
    slow = await sched.submit("slow")
    queued = await sched.submit("queued")
    await eventually(lambda: gate.waiting)
    events = sched.events()
    await within(sched.shutdown(grace=0.3))
    assert cancelled == ["slow"]  # cancelled, and given the chance to unwind before shutdown returned
    assert await within(quick) == "quick"  # finished within the grace period
    for handle in (slow, queued):
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(handle)
        assert (info.value.status, info.value.task_id) == ("shutdown", handle.id)
    assert [e.status async for e in events] == ["succeeded"]
    assert events.closed


async def test_shutdown_returns_once_running_attempts_are_done(gate: Gate) -> None:
    """A generous grace is not waited out when nothing is running any more."""

    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        await asyncio.sleep(0.01)
        return payload

    sched = cronoq.Scheduler([cronoq.Pool("default", run)])
    await sched.start()
    handle = await sched.submit(1)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await within(sched.shutdown(grace=30.0))
    assert loop.time() - began < 20.0  # far below the grace: the attempt's completion was seen
    assert await within(handle) == 1


async def test_async_with_uses_shutdown_grace(gate: Gate) -> None:
    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        await gate.wait()

    async with cronoq.Scheduler([cronoq.Pool("default", run)], shutdown_grace=0.01) as sched:
        handle = await sched.submit(1)
        await eventually(lambda: gate.waiting)
    with pytest.raises(cronoq.TaskFailed) as info:
        await within(handle)
    assert info.value.status == "shutdown"


async def test_exception_inside_async_with_still_shuts_down() -> None:
    sched = cronoq.Scheduler([cronoq.Pool("default", echo)])
    with pytest.raises(ZeroDivisionError):
        async with sched:
            await sched.submit(1)
            1 / 0  # noqa: B018
    assert not sched.started
    with pytest.raises(cronoq.SchedulerError):
        await sched.submit(2)


def test_runs_on_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")

    def blocking(ctx: cronoq.TaskContext, payload: int) -> int:
        return payload + 1

    async def main() -> list[Any]:
        pools = [cronoq.Pool("default", echo), cronoq.Pool("sync", blocking)]
        async with cronoq.Scheduler(pools) as sched:
            handles = [await sched.submit(i) for i in range(20)]
            handles.append(await sched.submit(41, pool="sync"))
            return [await within(h) for h in handles]

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == [*range(20), 42]


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "sqlite"])
async def test_shutdown_right_after_a_burst_of_submissions(durable: bool, tmp_path: Any) -> None:
    store = cronoq.SqliteStore(tmp_path / "state.db", full_sync=False) if durable else None
    sched = cronoq.Scheduler([cronoq.Pool("default", echo)], store=store)
    await sched.start()
    submissions = [asyncio.ensure_future(sched.enqueue(i)) for i in range(300)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(sched.shutdown(grace=0))
    stopped, _ = await asyncio.wait([stopping], timeout=2.0)
    if not stopped:  # unstick the driver so that the test leaves nothing behind, then fail
        for task in asyncio.all_tasks():
            if task.get_name() == "cronoq-driver":
                task.cancel()
        await within(stopping)
    _, unresolved = await asyncio.wait(submissions, timeout=2.0)
    for submission in submissions:
        if submission.done():
            submission.exception()  # accepted, or refused with SchedulerError: both fine
        else:
            submission.cancel()
    assert stopped, "shutdown hung"
    assert not unresolved, f"{len(unresolved)} submissions never resolved"
