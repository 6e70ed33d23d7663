"""Durable state with SqliteStore: stored before acknowledged, restarts, crashes and handover."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import cronoq

from .conftest import eventually, within

CHILD = Path(__file__).with_name("durable_child.py")


def fast_store(path: Path) -> cronoq.SqliteStore:
    return cronoq.SqliteStore(path, lease_ttl=1.0, lease_renew=0.2, lock_poll=0.1)


class Child:
    """A scheduler in another process (``durable_child.py``), read line by line."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[list[str]] = []

    @classmethod
    async def start(cls, mode: str, path: Path) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(CHILD),
            mode,
            str(path),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def expect(self, *words: str) -> list[str]:
        """Read until a line starting with ``words``; return that line's words."""
        assert self.proc.stdout is not None
        while True:
            raw = await within(self.proc.stdout.readline())
            if not raw:
                raise AssertionError(f"child exited before printing {words}; saw {self.lines}")
            line = raw.decode().split()
            self.lines.append(line)
            if tuple(line[: len(words)]) == words:
                return line

    def stored(self) -> dict[str, int]:
        return {line[1]: int(line[2]) for line in self.lines if line[0] == "stored"}

    async def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"stop\n")
        await self.proc.stdin.drain()
        assert await within(self.proc.wait()) == 0

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)

    async def reap(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


class Second:
    """The executor of the restarted scheduler: it marks its results as its own."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, int]] = []

    async def __call__(self, ctx: cronoq.TaskContext, payload: Any) -> Any:
        self.runs.append((payload["name"], ctx.attempt))
        return {"by": "second", "name": payload["name"], "attempt": ctx.attempt}


def second_scheduler(path: Path, executor: Second, store: cronoq.SqliteStore | None = None) -> cronoq.Scheduler:
    store = fast_store(path) if store is None else store
    return cronoq.Scheduler([cronoq.Pool("default", executor, max=4, autoscale=False)], store=store)


def refusals_of(store: cronoq.SqliteStore) -> list[float]:
    """A spy on the store's attempts to take the lease (each attempt still runs): the times of
    those refused because another process holds it."""
    refused: list[float] = []
    take = store._take_sync

    def spied_take() -> tuple[int, int] | None:
        taken = take()
        if taken is None:
            refused.append(time.monotonic())
        return taken

    store._take_sync = spied_take  # type: ignore[method-assign]
    return refused


def rows(path: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


# ----------------------------------------------------------------------------------------------
# In one process


async def echo(ctx: cronoq.TaskContext, payload: Any) -> Any:
    return payload


async def test_submissions_return_once_stored(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with cronoq.Scheduler(
        [cronoq.Pool("default", echo, max=1, autoscale=False)], store=fast_store(path)
    ) as sched:
        await sched.set_capacity("default", 0)  # nothing runs: the rows show what was stored
        task_id = await sched.enqueue({"doc": 42}, key="summary:42")
        assert rows(path, "SELECT id, status FROM cronoq_tasks WHERE id = ?", task_id) == [(task_id, "ready")]
        handle = await sched.submit([1, "two", None], key="list")
        batch = await sched.submit_batch([cronoq.Task("a", key="ba"), cronoq.Task("b", key="bb", after="ba")])
        stored = {row[0] for row in rows(path, "SELECT id FROM cronoq_tasks")}
        assert {task_id, handle.id, *(h.id for h in batch)} <= stored
        assert await sched.cancel("summary:42") is True
        assert rows(path, "SELECT status FROM cronoq_tasks WHERE id = ?", task_id) == [("cancelled",)]
        await sched.add_recurring("nightly", "0 3 * * *", {"job": "rollup"})
        assert rows(path, "SELECT name FROM cronoq_recurring") == [("nightly",)]
        assert await sched.remove_recurring("nightly") is True
        assert rows(path, "SELECT name FROM cronoq_recurring") == []


async def test_a_payload_json_cannot_hold_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with cronoq.Scheduler([cronoq.Pool("default", echo)], store=fast_store(path)) as sched:
        for payload in (b"raw bytes", {1, 2}, object(), {"nested": {"t": (1, {2})}}):
            with pytest.raises(TypeError):
                await sched.submit(payload)
            with pytest.raises(TypeError):
                await sched.enqueue(payload, key="bad")
        with pytest.raises(TypeError):
            await sched.submit_batch([cronoq.Task("fine", key="fine"), cronoq.Task(b"bytes")])
        with pytest.raises(TypeError):
            await sched.add_recurring("bad", "* * * * *", {1, 2})
        assert await sched.status("bad") is None
        assert await sched.status("fine") is None
        assert (await sched.snapshot()).totals["submitted"] == 0
        assert rows(path, "SELECT count(*) FROM cronoq_tasks") == [(0,)]
        assert await within(await sched.submit({"ok": [1, 2.5, "x", None, True]})) == {"ok": [1, 2.5, "x", None, True]}


async def test_without_a_store_payloads_are_plain_objects() -> None:
    marker = object()
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        assert await within(await sched.submit(marker)) is marker


async def test_a_result_the_codec_cannot_encode_is_not_stored_but_the_task_succeeds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"

    async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
        return {"a", "set"} if payload == "set" else payload

    with caplog.at_level(logging.WARNING, logger="cronoq"):
        async with cronoq.Scheduler([cronoq.Pool("default", run)], store=fast_store(path)) as sched:
            handle = await sched.submit("set", key="set")
            assert await within(handle) == {"a", "set"}
            assert await sched.status("set") == "succeeded"
            assert await within(await sched.submit("plain", key="plain")) == "plain"
    assert any("cannot be stored" in record.getMessage() for record in caplog.records)
    async with cronoq.Scheduler([cronoq.Pool("default", run)], store=fast_store(path)) as sched:
        later = await sched.handle("set")
        assert later is not None
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(later)
        assert info.value.status == "succeeded"  # it did succeed, but the result is gone
        assert await within(await sched.handle("plain")) == "plain"  # type: ignore[misc]


class TupleCodec:
    """A codec that keeps tuples and bytes (JSON cannot)."""

    def encode(self, obj: Any, /) -> bytes:
        return repr(obj).encode()

    def decode(self, data: bytes, /) -> Any:
        import ast

        return ast.literal_eval(data.decode())


async def test_a_custom_codec(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    async with cronoq.Scheduler([cronoq.Pool("default", echo)], store=fast_store(path), codec=TupleCodec()) as sched:
        assert await within(await sched.submit((1, b"x"), key="t")) == (1, b"x")
    async with cronoq.Scheduler([cronoq.Pool("default", echo)], store=fast_store(path), codec=TupleCodec()) as sched:
        assert await within(await sched.handle("t")) == (1, b"x")  # type: ignore[misc]
    with pytest.raises(TypeError):
        cronoq.Scheduler([cronoq.Pool("default", echo)], codec="json")


async def test_restart_in_the_same_process_keeps_results_and_failures(tmp_path: Path) -> None:
    path = tmp_path / "state.db"

    async def run(ctx: cronoq.TaskContext, payload: str) -> str:
        if payload == "bad":
            raise cronoq.Permanent("bad payload")
        return payload.upper()

    async with cronoq.Scheduler([cronoq.Pool("default", run)], store=fast_store(path)) as sched:
        assert await within(await sched.submit("good", key="good")) == "GOOD"
        with pytest.raises(cronoq.TaskFailed):
            await within(await sched.submit("bad", key="bad"))
    async with cronoq.Scheduler([cronoq.Pool("default", run)], store=fast_store(path)) as sched:
        assert await within(await sched.handle("good")) == "GOOD"  # type: ignore[misc]
        failed = await sched.handle("bad")
        assert failed is not None
        with pytest.raises(cronoq.TaskFailed) as info:
            await within(failed)
        assert (info.value.status, info.value.message) == ("failed", "bad payload")
        again = await sched.submit("good", key="good")  # still a duplicate after the restart
        assert again.duplicate and await within(again) == "GOOD"


# ----------------------------------------------------------------------------------------------
# Across processes


async def test_restart_runs_queued_and_interrupted_tasks_and_keeps_results(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    child = await Child.start("prepare", path)
    try:
        done_result = await child.expect("result", "done")
        assert json.loads(done_result[2]) == {"by": "first", "name": "done"}
        await child.expect("started", "hang", "1")
        await child.expect("ready")
        await child.stop()
    finally:
        await child.reap()
    ids = child.stored()
    second = Second()
    async with second_scheduler(path, second) as sched:
        done = await sched.handle("done")
        assert done is not None and done.id == ids["done"]
        assert await within(done) == {"by": "first", "name": "done"}  # the stored result
        hang = await sched.handle("hang")
        queued = await sched.handle(ids["queued"])
        assert hang is not None and queued is not None
        assert await within(hang) == {"by": "second", "name": "hang", "attempt": 2}  # attempt 1 was used
        assert await within(queued) == {"by": "second", "name": "queued", "attempt": 1}
        assert await sched.remove_recurring("nightly") is True  # schedules survive too
    assert sorted(second.runs) == [("hang", 2), ("queued", 1)]


async def test_sigkill_mid_run_loses_no_acknowledged_task(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    child = await Child.start("flood", path)
    try:
        await child.expect("started", "hang", "1")
        await child.expect("stored", "f25")
        child.kill()
        await child.reap()
    finally:
        await child.reap()
    acknowledged = child.stored()
    assert len(acknowledged) >= 26
    second = Second()
    async with second_scheduler(path, second) as sched:  # waits for the dead leader's lease to lapse
        for key, task_id in acknowledged.items():
            handle = await sched.handle(task_id)
            assert handle is not None, f"acknowledged task {key} was lost"
            assert await within(handle) == {"by": "second", "name": key, "attempt": 1}
        hang = await sched.handle("hang")
        assert hang is not None
        assert await within(hang) == {"by": "second", "name": "hang", "attempt": 2}
        totals = (await sched.snapshot()).totals
    assert totals["succeeded"] >= len(acknowledged) + 1


async def test_a_second_process_waits_in_start_and_takes_over_on_stop(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    child = await Child.start("lead", path)
    second = Second()
    store = fast_store(path)
    refused = refusals_of(store)
    sched = second_scheduler(path, second, store)
    try:
        await child.expect("ready")
        starting = asyncio.ensure_future(sched.start())
        await eventually(lambda: len(refused) >= 3)  # it polled the lease several times, in vain
        assert not starting.done()
        assert not sched.started
        with pytest.raises(RuntimeError):  # not started until it leads
            await sched.submit({"name": "early"})
        await child.stop()
        await within(starting)
        assert sched.started
        handover = await sched.handle("handover")
        assert handover is not None
        assert await within(handover) == {"by": "second", "name": "handover", "attempt": 1}
        await eventually(lambda: ("hang", 2) in second.runs)
    finally:
        await child.reap()
        await sched.shutdown()


async def test_a_second_process_takes_over_when_the_leader_is_killed(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    child = await Child.start("lead", path)
    second = Second()
    store = fast_store(path)
    refused = refusals_of(store)
    sched = second_scheduler(path, second, store)
    try:
        await child.expect("ready")
        starting = asyncio.ensure_future(sched.start())
        await eventually(lambda: len(refused) >= 3)
        assert not starting.done()
        child.kill()
        await within(starting)  # after the dead leader's lease (1 s) expires
        handover = await sched.handle("handover")
        assert handover is not None
        assert await within(handover) == {"by": "second", "name": "handover", "attempt": 1}
    finally:
        await child.reap()
        await sched.shutdown()


async def test_a_paused_leader_that_was_replaced_stops(tmp_path: Path) -> None:
    """A leader paused past its lease is fenced when it wakes: it stops, and calls raise SchedulerError."""
    path = tmp_path / "state.db"
    child = await Child.start("poll", path)
    second = Second()
    sched = second_scheduler(path, second)
    try:
        await child.expect("ready")
        os.kill(child.proc.pid, signal.SIGSTOP)
        await within(sched.start())  # takes over once the paused leader's lease lapses
        os.kill(child.proc.pid, signal.SIGCONT)
        assert (await child.expect("stopped"))[1] == "SchedulerError"
        assert (await child.expect("handle"))[1] == "shutdown"
        assert (await child.expect("started-flag"))[1] == "False"
        assert await within(child.proc.wait()) == 0
        hang = await sched.handle("hang")
        assert hang is not None
        assert await within(hang) == {"by": "second", "name": "hang", "attempt": 2}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.proc.pid, signal.SIGCONT)
        await child.reap()
        await sched.shutdown()
