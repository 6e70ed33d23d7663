"""The per-task fast paths of the embedded API behave exactly like the general paths they skip.

A bare ``Task(payload)`` (or ``submit`` without options) gets its spec without validating absent
options; an attempt's ``TaskContext`` reads the lease lazily; an executor that returns None reports
a prebuilt outcome. Each test pins the result of a fast path to the general one.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import cronoq
from cronoq._options import TaskOptions, _build_spec, build_spec, plain_spec

from .conftest import eventually, within

NOW = 1_700_000_000 * 10**9

NO_OPTIONS: TaskOptions = {}  # every option left out: the full validation path still runs


@pytest.mark.parametrize("payload", [None, 0, 7, "text", {"doc": [1, 2.5, None]}, b"raw"])
def test_a_bare_task_gets_the_spec_full_validation_would_build(payload: Any) -> None:
    validated = _build_spec(payload, NOW, NO_OPTIONS)
    assert cronoq.Task(payload).to_spec(NOW, trace=False) == validated
    assert plain_spec(payload, trace=False) == validated
    assert build_spec(payload, NOW, trace=False) == validated
    assert cronoq.Task(payload, priority=None, key=None, tags=None).to_spec(NOW, trace=False) == validated


def test_options_that_are_set_still_go_through_validation() -> None:
    task = cronoq.Task(1, priority="high", key="k", tags={"n": 3}, timeout=2.0, deadline_in=5.0)
    spec = task.to_spec(NOW, trace=False)
    assert spec == build_spec(
        1, NOW, priority="high", key="k", tags={"n": 3}, timeout=2.0, deadline_in=5.0, trace=False
    )
    assert (spec.priority, spec.key, dict(spec.tags)) == (cronoq.Priority.HIGH, "k", {"n": "3"})
    assert (spec.timeout, spec.deadline) == (2 * 10**9, NOW + 5 * 10**9)
    # Empty but present options take the general path and give the same spec as absent ones.
    assert cronoq.Task(1, tags={}, resources={}, after=[]).to_spec(NOW, trace=False) == plain_spec(1, trace=False)
    with pytest.raises(ValueError):
        cronoq.Task(1, timeout=-1.0).to_spec(NOW)
    with pytest.raises(TypeError):
        cronoq.Task(1, kind=5).to_spec(NOW)  # type: ignore[arg-type]


def test_bare_specs_do_not_share_state_a_caller_could_change() -> None:
    first, second = plain_spec(1, trace=False), plain_spec(2, trace=False)
    first.tags = {"mine": "x"}  # replacing a spec's map (what tracing does) leaves others alone
    assert dict(second.tags) == {} and second.payload == 2


async def test_bare_and_optioned_tasks_run_alike_in_a_batch() -> None:
    seen: list[tuple[Any, str, str | None, dict[str, str]]] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        seen.append((payload, ctx.kind, ctx.key, ctx.tags))
        return payload

    async with cronoq.Scheduler([cronoq.Pool("default", run, max=4, autoscale=False)]) as sched:
        handles = await sched.submit_batch([cronoq.Task("bare"), cronoq.Task("keyed", key="k", tags={"t": "1"})])
        assert [await within(h) for h in handles] == ["bare", "keyed"]
        assert all(not h.duplicate for h in handles)
        again = await sched.submit_batch([cronoq.Task("other", key="k")])
        assert again[0].duplicate and again[0].id == handles[1].id
        assert await within(again[0]) == "keyed"  # a finished duplicate resolves from the cache
    assert sorted(seen, key=repr) == sorted(
        [("bare", "default", None, {}), ("keyed", "default", "k", {"t": "1"})], key=repr
    )


async def test_the_context_reads_its_lease_and_copies_tags_and_group_once() -> None:
    contexts: list[cronoq.TaskContext] = []
    snapshots: list[tuple[Any, ...]] = []

    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        contexts.append(ctx)
        assert ctx.tags is ctx.tags and ctx.group is ctx.group  # one dict, not a copy per access
        snapshots.append(
            (
                ctx.id,
                ctx.attempt,
                ctx.kind,
                ctx.key,
                ctx.pool,
                dict(ctx.tags),
                dict(ctx.group),
                ctx.timeout,
                ctx.deadline,
                ctx.is_cancelled(),
            )
        )
        ctx.tags["scribbled"] = "by attempt"  # must not reach the engine or the next attempt
        if ctx.attempt == 1:
            raise cronoq.Retryable("again", retry_after=0.0)

    retry = cronoq.RetryPolicy(max_attempts=2, initial_backoff=0.0, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", run, retry=retry)]) as sched:
        handle = await sched.submit(
            "p", kind="report", key="r1", tags={"team": "a"}, timeout=30.0, deadline_at=2_000_000_000.0
        )
        assert await within(handle) is None
    assert len(snapshots) == 2
    for attempt, snapshot in enumerate(snapshots, start=1):
        assert snapshot == (
            handle.id,
            attempt,
            "report",
            "r1",
            "default",
            {"team": "a"},
            {},
            30.0,
            2_000_000_000.0,
            False,
        )
    assert contexts[0].tags == {"team": "a", "scribbled": "by attempt"}
    assert repr(contexts[1]) == f"TaskContext(id={handle.id}, attempt=2, pool='default', kind='report')"


async def test_an_aborted_attempt_is_marked_and_its_asyncio_task_cancelled() -> None:
    started = asyncio.Event()
    contexts: list[cronoq.TaskContext] = []
    tasks: list[asyncio.Task[Any] | None] = []
    cancelled = asyncio.Event()

    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        contexts.append(ctx)
        tasks.append(asyncio.current_task())
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        handle = await sched.submit("slow")
        await within(started.wait())
        assert await sched.cancel(handle.id) is True
        await within(cancelled.wait())
        assert contexts[0].is_cancelled()
        assert tasks[0] is not None and await eventually(lambda: tasks[0].done())  # type: ignore[union-attr]
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(handle)
        assert info.value.status == "cancelled"


class ReprCodec:
    """A codec that is not JSON: None is stored as the text ``None``."""

    def encode(self, obj: Any, /) -> bytes:
        return repr(obj).encode()

    def decode(self, data: bytes, /) -> Any:
        import ast

        return ast.literal_eval(data.decode())


def stored_outputs(path: Path) -> dict[int, bytes]:
    conn = sqlite3.connect(path)
    try:
        return {row[0]: bytes(row[1]) for row in conn.execute("SELECT id, output FROM cronoq_tasks WHERE has_output")}
    finally:
        conn.close()


@pytest.mark.parametrize(("codec", "stored_none"), [(None, b"null"), (ReprCodec(), b"None")])
async def test_a_none_result_is_stored_and_read_back_through_the_codec(
    tmp_path: Path, codec: Any, stored_none: bytes
) -> None:
    path = tmp_path / "state.db"

    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        return None if payload == "none" else payload

    def store() -> cronoq.SqliteStore:
        return cronoq.SqliteStore(path, lease_ttl=1.0, lease_renew=0.2, lock_poll=0.1)

    async with cronoq.Scheduler([cronoq.Pool("default", run)], store=store(), codec=codec) as sched:
        handles = await sched.submit_batch([cronoq.Task("none", key="n"), cronoq.Task(5, key="five")])
        assert [await within(h) for h in handles] == [None, 5]
    assert stored_outputs(path)[handles[0].id] == stored_none
    async with cronoq.Scheduler([cronoq.Pool("default", run)], store=store(), codec=codec) as sched:
        later = await sched.handle("n")
        assert later is not None and await within(later) is None
        five = await sched.handle("five")
        assert five is not None and await within(five) == 5
