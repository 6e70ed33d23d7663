"""The Python examples of the book, run as tests (quickstart, executors, testing, use cases)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import cronoq

from .conftest import Gate, eventually, within


async def test_quickstart_first_scheduler() -> None:
    seen: list[cronoq.TaskContext] = []

    async def summarize(ctx: cronoq.TaskContext, text: str) -> str:
        seen.append(ctx)
        await asyncio.sleep(0.01)
        return text[:20]

    before = time.time()
    pools = [cronoq.Pool("default", summarize, min=1, max=8)]
    async with cronoq.Scheduler(pools) as sched:
        handle = await sched.submit("a long document that goes on and on", priority="high", deadline_in=5.0)
        assert await within(handle) == "a long document that"
        assert handle.done()
    (ctx,) = seen
    assert ctx.id == handle.id
    assert ctx.attempt == 1
    assert ctx.kind == "default"
    assert ctx.key is None
    assert ctx.pool == "default"
    assert ctx.tags == {}
    assert ctx.group == {}
    assert ctx.timeout is None
    assert ctx.deadline is not None and before + 5.0 <= ctx.deadline <= time.time() + 5.0
    assert not ctx.is_cancelled()


async def test_tasks_without_pool_go_to_the_pool_named_default_or_the_first() -> None:
    async def run(ctx: cronoq.TaskContext, x: Any) -> str:
        return ctx.pool

    named = cronoq.Scheduler([cronoq.Pool("a", run), cronoq.Pool("default", run)])
    assert named.default_pool == "default"
    async with named as sched:
        assert await within(await sched.submit(1)) == "default"
    first = cronoq.Scheduler([cronoq.Pool("a", run), cronoq.Pool("b", run)])
    assert first.default_pool == "a"
    assert first.pools == ["a", "b"]
    async with first as sched:
        assert await within(await sched.submit(1)) == "a"
        assert await within(await sched.submit(1, pool="b")) == "b"


async def test_scheduling_options_reach_the_executor() -> None:
    contexts: dict[Any, cronoq.TaskContext] = {}

    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        contexts[ctx.key] = ctx
        return payload

    limits = [cronoq.Resource.token_bucket("llm-api", rate=100.0, burst=10)]
    async with cronoq.Scheduler([cronoq.Pool("default", run)], resources=limits) as sched:
        fetch = await sched.submit({"fetch": 42}, key="fetch:42")
        handle = await sched.submit(
            {"doc": 42},
            pool="default",
            kind="summarize",
            priority=cronoq.Priority.HIGH,
            key="summary:42",
            deadline_in=30.0,
            timeout=60.0,
            retry=cronoq.RetryPolicy(max_attempts=5, initial_backoff=0.5),
            resources={"llm-api": 1},
            after=["fetch:42"],
            tags={"who": "test", "n": 7},
        )
        assert await within(handle) == {"doc": 42}
        assert await within(fetch) == {"fetch": 42}
    ctx = contexts["summary:42"]
    assert ctx.kind == "summarize"
    assert ctx.timeout == 60.0
    assert ctx.tags == {"who": "test", "n": "7"}  # tag values become strings
    assert ctx.deadline is not None


async def test_retries_and_failures_section() -> None:
    """Retryable(retry_after=...) retries, Permanent fails at once, other exceptions retry."""

    async def call_api(ctx: cronoq.TaskContext, status: int) -> str:
        if status == 429 and ctx.attempt == 1:
            raise cronoq.Retryable("rate limited", retry_after=0.01)
        if status == 400:
            raise cronoq.Permanent("bad request")
        if status == 500 and ctx.attempt == 1:
            raise RuntimeError("server error")
        return f"ok after {ctx.attempt}"

    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", call_api, retry=retry)]) as sched:
        assert await within(await sched.submit(429)) == "ok after 2"
        assert await within(await sched.submit(500)) == "ok after 2"
        bad = await sched.submit(400)
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(bad)
    assert info.value.status == "failed"
    assert info.value.message == "bad request"
    assert info.value.task_id == bad.id


async def test_executor_retries() -> None:
    """The Python example of "Testing your executors", verbatim apart from the marker."""
    calls = 0

    async def run(ctx: cronoq.TaskContext, x: int) -> int:
        nonlocal calls
        calls += 1
        if ctx.attempt < 2:
            raise cronoq.Retryable("flaky")
        return x * 2

    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", run, retry=retry)]) as s:
        assert await within(await s.submit(21)) == 42
    assert calls == 2


async def test_batches_and_dependencies_section() -> None:
    order: list[str] = []

    async def run(ctx: cronoq.TaskContext, step: str) -> str:
        order.append(step)
        return step.upper()

    async with cronoq.Scheduler([cronoq.Pool("default", run, max=4)]) as sched:
        handles = await sched.submit_batch(
            [
                cronoq.Task("extract", key="extract"),
                cronoq.Task("transform", key="transform", after="extract"),
                cronoq.Task("load", key="load", after="transform"),
                cronoq.Task("alert", deps=[cronoq.Dep("load", on="failure")]),
            ]
        )
        assert [await within(h) for h in handles[:3]] == ["EXTRACT", "TRANSFORM", "LOAD"]
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(handles[3])
        assert info.value.status == "skipped"
    assert order == ["extract", "transform", "load"]


# ----------------------------------------------------------------------------------------------
# Use case: LLM and agent workloads


async def test_llm_setup_from_the_book() -> None:
    """The Python version of the LLM setup runs as written (with a fake model call)."""

    async def call_model(ctx: cronoq.TaskContext, prompt: str) -> str:
        await asyncio.sleep(0.001)
        return f"answer to {prompt}"

    limits = [
        cronoq.Resource.token_bucket("openai", rate=50.0, burst=100),
        cronoq.Resource.semaphore("openai-concurrency", 20),
    ]
    autoscale = cronoq.AutoscaleConfig(slo={"high": 2.0})
    assert autoscale.slo == {"high": 2.0}
    pool = cronoq.Pool("llm", call_model, min=2, max=64, autoscale=autoscale)
    async with cronoq.Scheduler([pool], resources=limits) as sched:
        chat = await sched.submit(
            "hi", pool="llm", priority="high", deadline_in=2.0, resources={"openai": 1, "openai-concurrency": 1}
        )
        eval_id = await sched.enqueue(
            "eval item",
            pool="llm",
            kind="eval",
            priority="low",
            retry=cronoq.RetryPolicy(max_attempts=8),
            resources={"openai": 1, "openai-concurrency": 1},
        )
        assert await within(chat) == "answer to hi"
        assert await within((await sched.handle(eval_id)).result()) == "answer to eval item"  # type: ignore[union-attr]


async def test_llm_semaphore_caps_requests_in_flight() -> None:
    in_flight = 0
    peak = 0

    async def call_model(ctx: cronoq.TaskContext, prompt: int) -> int:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return prompt

    limits = [cronoq.Resource.semaphore("openai-concurrency", 2)]
    pool = cronoq.Pool("llm", call_model, max=8, autoscale=False)
    async with cronoq.Scheduler([pool], resources=limits) as sched:
        handles = [await sched.submit(i, resources={"openai-concurrency": 1}) for i in range(10)]
        assert [await within(h) for h in handles] == list(range(10))
    assert peak == 2


async def test_llm_token_bucket_parks_tasks_without_occupying_workers(gate: Gate) -> None:
    """A task that cannot get a token waits as ready, holding no worker, and runs when one refills."""
    started: list[int] = []

    async def call_model(ctx: cronoq.TaskContext, prompt: int) -> int:
        started.append(prompt)
        return prompt

    # One token now, the next one about 0.2 s later.
    limits = [cronoq.Resource.token_bucket("openai", rate=5.0, burst=1)]
    pool = cronoq.Pool("llm", call_model, max=4, autoscale=False)
    async with cronoq.Scheduler([pool], resources=limits) as sched:
        first = await sched.submit(1, resources={"openai": 1})
        second = await sched.submit(2, resources={"openai": 1})
        assert await within(first) == 1
        if not second.done():
            assert await sched.status(second.id) == "ready"
            snap = await sched.snapshot()
            assert snap.pool("llm").busy == 0  # type: ignore[union-attr]
        assert await within(second) == 2
    assert started == [1, 2]


async def test_llm_retry_after_delays_the_next_attempt() -> None:
    failed_at: list[float] = []
    started_at: list[float] = []

    async def call_model(ctx: cronoq.TaskContext, prompt: str) -> str:
        started_at.append(time.monotonic())
        if ctx.attempt == 1:
            failed_at.append(time.monotonic())
            raise cronoq.Retryable("429", retry_after=0.2)
        return "answer"

    # The policy alone would retry after 1 ms; the hint asks for at least 0.2 s.
    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.001, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("llm", call_model, retry=retry)], emit_transitions=True) as sched:
        async with sched.events() as events:
            handle = await sched.submit("q")
            statuses = []
            async for event in events:
                statuses.append(event.status)
                if event.status == "succeeded":
                    break
        assert await within(handle) == "answer"
    assert "retrying" in statuses
    assert len(started_at) == 2
    assert started_at[1] - failed_at[0] >= 0.19


async def test_llm_chat_turn_overtakes_queued_evaluation_work(gate: Gate) -> None:
    order: list[str] = []

    async def call_model(ctx: cronoq.TaskContext, prompt: str) -> None:
        if prompt == "blocker":
            await gate.wait()
        order.append(prompt)

    async with cronoq.Scheduler([cronoq.Pool("llm", call_model, max=1, autoscale=False)]) as sched:
        blocker = await sched.submit("blocker")
        await eventually(lambda: gate.waiting)
        for i in range(3):
            await sched.enqueue(f"eval{i}", kind="eval", priority="low")
        chat = await sched.submit("chat", kind="chat", priority="high", deadline_in=2.0)
        gate.open()
        await within(blocker)
        await within(chat)
        await eventually(lambda: len(order) == 5)
    assert order == ["blocker", "chat", "eval0", "eval1", "eval2"]


# ----------------------------------------------------------------------------------------------
# Use case: interactive and batch work on shared capacity


async def test_interactive_and_batch_priority_order(gate: Gate) -> None:
    order: list[str] = []

    async def run(ctx: cronoq.TaskContext, job: str) -> None:
        if job == "blocker":
            await gate.wait()
        order.append(job)

    autoscale = cronoq.AutoscaleConfig(slo={"critical": 0.5, "high": 2.0})
    assert autoscale.slo == {"critical": 0.5, "high": 2.0}
    async with cronoq.Scheduler([cronoq.Pool("app", run, max=1, autoscale=False)]) as sched:
        await sched.enqueue("blocker")
        await eventually(lambda: gate.waiting)
        for i in range(3):
            await sched.enqueue(f"reindex{i}", priority="low", kind="reindex")
        await sched.submit("export", priority="high", kind="export-interactive")
        await sched.enqueue("normal", kind="misc")
        webhook = await sched.submit("webhook", priority="critical", kind="webhook")
        gate.open()
        await within(webhook)
        await eventually(lambda: len(order) == 7)
        snap = await sched.snapshot()
    assert order == ["blocker", "webhook", "export", "normal", "reindex0", "reindex1", "reindex2"]
    assert snap.pool("app").priority_adherence == 1.0  # type: ignore[union-attr]


# ----------------------------------------------------------------------------------------------
# Use case: pipelines and DAGs


def _pipeline() -> list[cronoq.Task]:
    return [
        cronoq.Task("extract", key="extract"),
        *[cronoq.Task(("transform", i), key=f"t{i}", after="extract") for i in range(4)],
        cronoq.Task("load", key="load", after=[f"t{i}" for i in range(4)]),
        cronoq.Task("alert", deps=[cronoq.Dep("load", on="failure")]),
        cronoq.Task("cleanup", deps=[cronoq.Dep("load", on="complete")]),
    ]


def _step_name(step: Any) -> str:
    return step if isinstance(step, str) else f"t{step[1]}"


async def _run_pipeline(fail: str | None) -> tuple[list[str], list[tuple[str, Any]]]:
    ran: list[str] = []

    async def run(ctx: cronoq.TaskContext, step: Any) -> str:
        name = _step_name(step)
        ran.append(name)
        if name == fail:
            raise cronoq.Permanent(f"{name} broke")
        return name

    outcomes: list[tuple[str, Any]] = []
    async with cronoq.Scheduler([cronoq.Pool("default", run, max=4)]) as sched:
        handles = await sched.submit_batch(_pipeline())
        assert [h.duplicate for h in handles] == [False] * len(handles)
        for handle in handles:
            try:
                outcomes.append(("ok", await within(handle)))
            except cronoq.TaskFailed as failed:
                outcomes.append((failed.status, failed.task_id == handle.id))
    return ran, outcomes


async def test_dag_pipeline_all_succeed() -> None:
    ran, outcomes = await _run_pipeline(fail=None)
    assert ran[0] == "extract"
    assert sorted(ran[1:5]) == ["t0", "t1", "t2", "t3"]
    assert ran[5:] == ["load", "cleanup"]  # fan-in waits for every transform; alert never runs
    assert outcomes == [
        ("ok", "extract"),
        *[("ok", f"t{i}") for i in range(4)],
        ("ok", "load"),
        ("skipped", True),
        ("ok", "cleanup"),
    ]


async def test_dag_pipeline_load_fails_runs_alert_and_cleanup() -> None:
    ran, outcomes = await _run_pipeline(fail="load")
    assert sorted(ran[6:]) == ["alert", "cleanup"]
    assert outcomes[5] == ("failed", True)
    assert outcomes[6] == ("ok", "alert")
    assert outcomes[7] == ("ok", "cleanup")


async def test_dag_skipped_propagates_except_on_complete() -> None:
    """A failed transform skips load; the alert (on load's failure) is skipped too; cleanup runs."""
    ran, outcomes = await _run_pipeline(fail="t2")
    assert "load" not in ran and "alert" not in ran
    assert ran[-1] == "cleanup"
    assert outcomes[3] == ("failed", True)
    assert outcomes[5] == ("skipped", True)
    assert outcomes[6] == ("skipped", True)
    assert outcomes[7] == ("ok", "cleanup")


async def test_dag_batch_with_a_cycle_is_rejected_as_a_whole() -> None:
    async def run(ctx: cronoq.TaskContext, step: Any) -> None:
        raise AssertionError("nothing of a rejected batch may run")

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit_batch(
                [
                    cronoq.Task("a", key="a"),
                    cronoq.Task("b", key="b", after="a"),
                    cronoq.Task("c", key="c", after=["b", "d"]),
                    cronoq.Task("d", key="d", after="c"),
                ]
            )
        assert info.value.code == "cycle"
        for key in "abcd":
            assert await sched.status(key) is None
            assert await sched.handle(key) is None
        assert (await sched.snapshot()).totals["submitted"] == 0


async def test_dag_batch_error_names_the_offending_index() -> None:
    async def run(ctx: cronoq.TaskContext, step: Any) -> None:
        return None

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit_batch([cronoq.Task("a", key="a"), cronoq.Task("b", pool="nope")])
        assert info.value.code == "unknown_pool"
        assert "task 1" in str(info.value)
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit_batch([cronoq.Task("a", key="x"), cronoq.Task("b", key="x")])
        assert info.value.code == "duplicate_key_in_batch"
        assert "task 1" in str(info.value)
        with pytest.raises(cronoq.SubmitError) as info:
            await sched.submit_batch([cronoq.Task("a"), cronoq.Task("b"), cronoq.Task("c", after="never-seen")])
        assert info.value.code == "unknown_dependency"
        assert "task 2" in str(info.value)
        assert await sched.status("a") is None
        assert (await sched.snapshot()).totals["submitted"] == 0


async def test_dag_resubmitting_a_batch_returns_the_existing_tasks() -> None:
    runs = 0

    async def run(ctx: cronoq.TaskContext, step: Any) -> str:
        nonlocal runs
        runs += 1
        return _step_name(step)

    async with cronoq.Scheduler([cronoq.Pool("default", run, max=4)]) as sched:
        first = await sched.submit_batch(_pipeline()[:6])
        assert [await within(h) for h in first][-1] == "load"
        again = await sched.submit_batch(_pipeline()[:6])
        assert [h.duplicate for h in again] == [True] * 6
        assert [h.id for h in again] == [h.id for h in first]
        assert [await within(h) for h in again] == ["extract", "t0", "t1", "t2", "t3", "load"]
    assert runs == 6


async def test_dag_late_child_of_a_finished_parent_runs() -> None:
    async def run(ctx: cronoq.TaskContext, step: str) -> str:
        return step

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        await within(await sched.submit("parent", key="parent"))
        child = await sched.submit("child", after="parent")
        assert await within(child) == "child"
