"""A poison task fails itself, never its shard: the driver contains exceptions raised inside an
engine step, and a new leader loads past rows it cannot run.

With a store (memory, a real SQLite file, a real Postgres schema), an engine step that raises is
treated as having left the engine half-updated: the culprit task is dead-lettered, the engine is
rebuilt from the store and the step's other commands run again on it. Without a store the
culprit is dead-lettered in place and the invariants are checked. Either way: the caller of the
failing command gets an error, nothing half-done stays, the error is logged at ERROR and counted
in the ``engine_errors`` total (``cronoq_engine_errors_total`` on a server), and the driver keeps
leading.

Spec: design.md "Trust boundaries" (a single bad task or row can fail itself, never its shard),
durability-ha.txt "Recovery" (a new leader restores what the store holds).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cronoq.engine import (
    Core,
    CoreConfig,
    EngineFault,
    PoolConfig,
    ResourceConfig,
    RetryPolicy,
    TaskSpec,
    TaskStatus,
)
from cronoq.shard.driver import Driver

from .support import WAIT_S, Database, Sink, eventually

GPU = ResourceConfig.semaphore("gpu", 2)


class PoisonResources(dict[str, int]):
    """A resource request that raises once ``armed``: stands in for any bug met while the engine
    handles one particular task (here, when it tries to start it)."""

    armed = False

    def items(self) -> Any:
        if self.armed:
            raise RuntimeError("poisoned resource request")
        return super().items()


class LatePoison(dict[str, int]):
    """A resource request that passes admission, then raises every time it is read again."""

    reads = 0

    def items(self) -> Any:
        self.reads += 1
        if self.reads > 1:
            raise RuntimeError("poisoned after admission")
        return super().items()


def config(workers: int = 0) -> CoreConfig:
    pool = PoolConfig("default", max_workers=4, initial_workers=workers, retry=RetryPolicy(max_attempts=3))
    return CoreConfig(pools=(pool,), resources=(GPU,))


def database(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Database:
    return Database(kind, tmp_path, request.getfixturevalue("postgres_dsn") if kind == "postgres" else None)


async def _leading(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Driver, Sink, Any]]:
    db = database(kind, tmp_path, request)
    store = None if kind == "none" else db.store()
    sink = Sink()
    driver = Driver(config(), sink, store=store)
    await asyncio.wait_for(driver.lead(), WAIT_S)
    try:
        yield driver, sink, store
    finally:
        await driver.shutdown(0)
        if store is not None:
            await store.close()
        await db.drop()


@pytest.fixture(params=["memory", "sqlite", "postgres", "none"])
async def leader(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Driver, Sink, Any]]:
    """A leading driver over each store, and over none (the embedded scheduler's default)."""
    async for leading in _leading(request.param, tmp_path, request):
        yield leading


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def stored_leader(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Driver, Sink, Any]]:
    async for leading in _leading(request.param, tmp_path, request):
        yield leading


def engine_errors(driver: Driver) -> int:
    assert driver.core is not None
    return driver.core.totals["engine_errors"]


def error_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "cronoq.shard" and r.levelno >= logging.ERROR]


async def test_a_command_that_raises_half_way_leaves_nothing_behind(
    leader: tuple[Driver, Sink, Any], caplog: pytest.LogCaptureFixture
) -> None:
    driver, _, store = leader

    def half_then_raise(core: Core, now: int) -> None:
        core.submit(now, TaskSpec(key="half"))  # changes the engine...
        raise RuntimeError("bug after the change")  # ...then fails

    # All three are queued before the driver runs: they share one engine step.
    first = driver.call(lambda core, now: core.submit(now, TaskSpec(key="a")).id)
    poison = driver.call(half_then_raise)
    last = driver.call(lambda core, now: core.submit(now, TaskSpec(key="b")).id)
    a_id, b_id = await asyncio.wait_for(asyncio.gather(first, last), WAIT_S)
    with pytest.raises(RuntimeError, match="bug after the change"):
        await asyncio.wait_for(poison, WAIT_S)
    assert driver.leading
    core = driver.core
    assert core is not None
    half = core.get("half")
    if store is not None:
        assert half is None, "the failing command's change survived"
    else:  # nothing to rebuild from: what it created is dead-lettered instead, never run
        assert half is not None and half.status is TaskStatus.DEAD_LETTERED and half.attempt == 0
    assert core.get(a_id) is not None and core.get(b_id) is not None
    core.check_invariants()
    assert engine_errors(driver) == 1
    assert [r.exc_info[1] for r in error_records(caplog) if r.exc_info] and "bug after the change" in caplog.text
    # The shard goes on: a later submission is admitted and stored.
    later = await asyncio.wait_for(driver.call(lambda core, now: core.submit(now, TaskSpec(key="c")).id), WAIT_S)
    if store is not None:
        stored = {t.record.spec.key for t in (await store.recover(driver._clock())).tasks}
        assert stored == {"a", "b", "c"} and later > b_id


async def test_a_task_whose_start_raises_is_dead_lettered_and_the_rest_runs(
    leader: tuple[Driver, Sink, Any], caplog: pytest.LogCaptureFixture
) -> None:
    driver, sink, store = leader
    poison = PoisonResources(gpu=1)
    ids = await asyncio.wait_for(driver.call(lambda core, now: [
        core.submit(now, TaskSpec(key="poison", resources=poison)).id,
        core.submit(now, TaskSpec(key="fine", resources={"gpu": 1})).id,
    ]), WAIT_S)  # fmt: skip
    poison.armed = True
    driver.post(lambda core, now: core.set_capacity(now, "default", 2))  # dispatch meets the poison
    await eventually(lambda: any(r.id == ids[0] for r in sink.resolved), "the poison task to end")
    await eventually(lambda: any(d.task_id == ids[1] for d in sink.dispatched), "the other task to start")
    ended = next(r for r in sink.resolved if r.id == ids[0])
    assert ended.status is TaskStatus.DEAD_LETTERED
    assert ended.message is not None and "internal error" in ended.message and "poisoned" in ended.message
    assert driver.leading and engine_errors(driver) == 1
    assert driver.core is not None
    driver.core.check_invariants()
    assert any("poisoned resource request" in str(r.exc_info[1]) for r in error_records(caplog) if r.exc_info)
    if store is not None:
        # The dead letter is durable: a new leader sees it, and does not run the task again.
        await eventually(lambda: driver._queue == [], "the step to be committed")
        await asyncio.wait_for(driver.call(lambda core, now: None), WAIT_S)
        recovered = {t.record.id: t.status for t in (await store.recover(driver._clock())).tasks}
        assert recovered[ids[0]] is TaskStatus.DEAD_LETTERED


async def test_a_submission_whose_task_faults_in_its_own_step_is_refused(
    stored_leader: tuple[Driver, Sink, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The culprit was never stored, so nothing can be dead-lettered: the command that created it
    runs again once on the rebuilt engine, then is refused; everything else goes on."""
    driver, sink, store = stored_leader
    driver.post(lambda core, now: core.set_capacity(now, "default", 2))
    fine = driver.call(lambda core, now: core.submit(now, TaskSpec(key="fine")).id)
    poison = driver.call(lambda core, now: core.submit(now, TaskSpec(key="poison", resources=LatePoison(gpu=1))).id)
    with pytest.raises(EngineFault, match="poisoned after admission"):
        await asyncio.wait_for(poison, WAIT_S)
    fine_id = await asyncio.wait_for(fine, WAIT_S)
    await eventually(lambda: any(d.task_id == fine_id for d in sink.dispatched), "the other task to start")
    assert driver.leading and engine_errors(driver) == 2  # the first run and the one retry
    core = driver.core
    assert core is not None and core.get("poison") is None
    core.check_invariants()
    keys = {t.record.spec.key for t in (await store.recover(driver._clock())).tasks}
    assert keys == {"fine"}


async def test_a_step_the_store_cannot_encode_is_refused_and_the_engine_rebuilt(
    stored_leader: tuple[Driver, Sink, Any], caplog: pytest.LogCaptureFixture
) -> None:
    driver, _, _ = stored_leader
    good = await asyncio.wait_for(driver.call(lambda core, now: core.submit(now, TaskSpec(key="good")).id), WAIT_S)
    with pytest.raises((TypeError, ValueError)):
        await asyncio.wait_for(driver.call(lambda core, now: core.submit(now, TaskSpec(payload=object())).id), WAIT_S)
    await asyncio.wait_for(driver.call(lambda core, now: None), WAIT_S)  # runs on the rebuilt engine
    assert driver.leading and engine_errors(driver) == 1
    core = driver.core
    assert core is not None
    core.check_invariants()
    assert [t.key for t in core.list_tasks()] == ["good"] and core.get(good) is not None
    assert error_records(caplog)


# ---------------------------------------------------------------------------------------------
# A new leader meets rows it cannot run


def _poisoned_rows() -> dict[str, tuple[dict[str, Any], TaskStatus]]:
    """Column edits, and the status a new leader must give each task. The first two are sound
    tasks whose recovery used to raise (the backoff of their next attempt overflowed), so no
    leader could ever lead; the others hold values no task may have."""
    retrying, dead = TaskStatus.RETRYING, TaskStatus.DEAD_LETTERED
    return {
        "overflow": ({"status": "running", "attempt": 1025, "max_attempts": 2000,
                      "spec": {"retry": {"max_attempts": 2000, "initial_backoff": 10**9, "multiplier": 2.0,
                                         "max_backoff": 60 * 10**9, "jitter": True}}}, retrying),
        "huge_multiplier": ({"status": "running", "attempt": 3, "max_attempts": 9,
                             "spec": {"retry": {"max_attempts": 9, "initial_backoff": 1, "multiplier": 1e308,
                                                "max_backoff": 3600 * 10**9, "jitter": False}}}, retrying),
        "nan": ({"status": "running", "attempt": 1, "max_attempts": 5,
                 "spec": {"retry": {"max_attempts": 5, "initial_backoff": 1, "multiplier": math.nan,
                                    "max_backoff": 5, "jitter": False}}}, dead),
        "deadline": ({"status": "ready", "spec": {"deadline": 2**70}}, dead),
        "attempts": ({"status": "running", "attempt": 9}, dead),
        "garbage": ({"status": "ready", "spec": "{not json"}, dead),
    }  # fmt: skip


def _spec_text(edit: Any) -> str:
    if isinstance(edit, str):
        return edit
    return json.dumps({"status": "ready", **edit}, allow_nan=True)  # NaN as a tampered row may hold it


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_a_new_leader_dead_letters_rows_it_cannot_run_and_leads(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """Rows are edited directly in the real database; before the fix, the first one (a running
    task at attempt 1025 of a doubling backoff) made every recovery raise, so no leader ever led."""
    rows = _poisoned_rows()
    db = database(kind, tmp_path, request)
    first = db.store()
    epoch = await asyncio.wait_for(first.acquire_leadership(), WAIT_S)
    seed = Core(CoreConfig(pools=(PoolConfig("default", max_workers=4, initial_workers=0),), persist=True,
                           id_epoch=epoch))  # fmt: skip
    now = 1_700_000_000 * 10**9
    ids = {name: seed.submit(now, TaskSpec(key=name)).id for name in [*rows, "healthy"]}
    await first.commit(epoch, seed.drain().mutations)
    await first.close()
    for name, (edit, _) in rows.items():
        for column, value in edit.items():
            await db.set_column(ids[name], column, _spec_text(value) if column == "spec" else value)
    expected = {name: status for name, (_, status) in rows.items()}
    dead = [name for name, status in expected.items() if status is TaskStatus.DEAD_LETTERED]

    store = db.store()
    sink = Sink()
    driver = Driver(config(workers=4), sink, store=store)
    try:
        await asyncio.wait_for(driver.lead(), WAIT_S)
        assert driver.leading
        core = driver.core
        assert core is not None
        core.check_invariants()
        assert {name: core.get(ids[name]).status for name in rows} == expected  # type: ignore[union-attr]
        for name in dead:
            message = core.get(ids[name]).message  # type: ignore[union-attr]
            assert message and ("cannot be restored" in message or "quarantined" in message), name
        assert core.totals["engine_errors"] == len(dead)
        await eventually(lambda: any(d.task_id == ids["healthy"] for d in sink.dispatched), "the healthy task")
        # The dead letters are stored: the next leader finds them dead-lettered already.
        await asyncio.wait_for(driver.call(lambda core, now: None), WAIT_S)
        reader = db.store()
        try:
            stored = {t.record.id: t.status for t in (await reader.recover(driver._clock())).tasks}
        finally:
            await reader.close()
        assert {name: stored[ids[name]] for name in rows} == expected
    finally:
        await driver.shutdown(0)
        await store.close()
        await db.drop()
    assert "quarantined" in caplog.text  # the undecodable row is reported at ERROR by the store


async def test_a_fault_while_a_pool_is_being_handed_over_steps_down_instead_of_rebuilding(
    stored_leader: tuple[Driver, Sink, Any],
) -> None:
    """An engine rebuilt from the store while a released pool's rows may still be there would end
    them as "pool no longer configured": the leader steps down, and the next one resumes the move
    (docs/pool-moves.md)."""
    driver, _, _ = stored_leader
    driver.pools_away.add("leaving")

    def fault(core: Core, now: int) -> None:
        core.submit(now, TaskSpec(key="half"))
        raise RuntimeError("bug while a pool is away")

    with pytest.raises(Exception):  # noqa: B017 - the caller hears an error of some kind
        await asyncio.wait_for(driver.call(fault), WAIT_S)
    await asyncio.wait_for(driver.wait_stepped_down(), WAIT_S)
    assert not driver.leading
    assert "being handed over" in (driver.stop_reason or "")
