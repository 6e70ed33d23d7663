"""Crash drills with real processes on real stores: nothing acknowledged is lost, attempt
numbers never repeat, a fenced leader never writes."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from cronoq.engine import TaskStatus
from cronoq.stores.postgres import PostgresStore
from cronoq.stores.sqlite import SqliteStore

from .procs import ShardProcess, log_lines

TASKS = 120


def _store_arg(kind: str, tmp_path: Path, dsn: str | None, schema: str | None) -> str:
    if kind == "sqlite":
        return f"sqlite:{tmp_path / 'shard.db'}"
    return f"postgres:{dsn}#{schema}"


async def _final_statuses(kind: str, tmp_path: Path, dsn: str | None, schema: str | None) -> dict[int, TaskStatus]:
    store = SqliteStore(tmp_path / "shard.db") if kind == "sqlite" else PostgresStore(dsn or "", schema=schema or "")
    try:
        recovered = await store.recover(time.time_ns(), 10**15)
    finally:
        await store.close()
    return {item.record.id: item.status for item in recovered.tasks}


def _mid_attempt(log: Path, min_done: int) -> bool:
    """Enough attempts finished, and at least one is running right now."""
    lines = log_lines(log)
    done = {(t, a) for e, t, a, _ in lines if e == "done"}
    started = {(t, a) for e, t, a, _ in lines if e == "start"}
    return len(done) >= min_done and bool(started - done)


def _check_attempts(log: Path) -> list[tuple[str, int, int, int]]:
    lines = log_lines(log)
    starts = Counter((task_id, attempt) for event, task_id, attempt, _ in lines if event == "start")
    repeated = [key for key, count in starts.items() if count > 1]
    assert not repeated, f"attempt numbers repeated: {repeated[:5]}"
    return lines


@pytest.fixture(params=["sqlite", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def pg(store_kind: str, request: pytest.FixtureRequest) -> tuple[str | None, str | None]:
    if store_kind != "postgres":
        return None, None
    dsn = request.getfixturevalue("postgres_dsn")
    schema = request.getfixturevalue("pg_schema")
    return dsn, schema


def test_leader_killed_standby_recovers_every_acknowledged_task(
    store_kind: str, pg: tuple[str | None, str | None], tmp_path: Path
) -> None:
    dsn, schema = pg
    store = _store_arg(store_kind, tmp_path, dsn, schema)
    log = tmp_path / "attempts.log"
    leader = ShardProcess(
        "--store", store, "--submit", str(TASKS), "--run-seconds", "0.05", "--slots", "4", "--log", str(log)
    )
    standby = None
    try:
        leader.wait_for(lambda lines: any(line.startswith("LEADER") for line in lines))
        standby = ShardProcess(
            "--store", store, "--run-seconds", "0.01", "--slots", "8", "--log", str(log), "--exit-when-idle"
        )
        leader.wait_for(lambda lines: sum(line.startswith("ACK") for line in lines) == TASKS)
        # Let some attempts finish and some be mid-flight, then kill the leader outright.
        deadline = time.monotonic() + 20
        while not _mid_attempt(log, min_done=12) and time.monotonic() < deadline:
            time.sleep(0.005)
        leader.kill()
        standby.wait_for(lambda lines: any(line.startswith("LEADER") for line in lines))
        standby.wait_for(lambda lines: "IDLE" in lines, timeout=60)
        assert standby.wait_exit() == 0
    finally:
        leader.kill()
        if standby is not None:
            standby.kill()
    acked = leader.acked()
    assert len(acked) == TASKS
    statuses = asyncio.run(_final_statuses(store_kind, tmp_path, dsn, schema))
    assert all(statuses.get(task_id) is TaskStatus.SUCCEEDED for task_id in acked), {
        task_id: statuses.get(task_id) for task_id in acked if statuses.get(task_id) is not TaskStatus.SUCCEEDED
    }
    lines = _check_attempts(log)
    leader_pid = leader.proc.pid
    started_by_leader = {(t, a) for e, t, a, p in lines if e == "start" and p == leader_pid}
    done_by_leader = {(t, a) for e, t, a, p in lines if e == "done" and p == leader_pid}
    interrupted = started_by_leader - done_by_leader
    assert interrupted, "the drill should kill the leader mid-attempt"
    for task_id, attempt in interrupted:
        later = [a for e, t, a, p in lines if e == "start" and t == task_id and p != leader_pid]
        # The interrupted attempt counts as used: the new leader runs a later attempt number.
        if later:
            assert min(later) > attempt


def test_paused_leader_is_fenced_and_never_writes(
    store_kind: str, pg: tuple[str | None, str | None], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    dsn, schema = pg
    store = _store_arg(store_kind, tmp_path, dsn, schema)
    log = tmp_path / "attempts.log"
    leader = ShardProcess("--store", store, "--submit", "40", "--run-seconds", "0.3", "--slots", "4", "--log", str(log))
    standby = None
    try:
        leader.wait_for(lambda lines: sum(line.startswith("ACK") for line in lines) == 40)
        standby = ShardProcess(
            "--store", store, "--run-seconds", "0.01", "--slots", "8", "--log", str(log), "--exit-when-idle"
        )
        leader.signal(signal.SIGSTOP)
        if store_kind == "postgres":
            asyncio.run(_terminate_lock_sessions(dsn or ""))
        standby.wait_for(lambda lines: any(line.startswith("LEADER") for line in lines), timeout=30)
        leader.signal(signal.SIGCONT)
        leader.wait_for(lambda lines: any(line.startswith("DOWN") for line in lines), timeout=30)
        standby.wait_for(lambda lines: "IDLE" in lines, timeout=60)
        assert standby.wait_exit() == 0
    finally:
        leader.signal(signal.SIGCONT) if leader.proc.poll() is None else None
        leader.kill()
        if standby is not None:
            standby.kill()
    down = next(line for line in leader.lines if line.startswith("DOWN"))
    assert "fenced" in down or "lost" in down
    statuses = asyncio.run(_final_statuses(store_kind, tmp_path, dsn, schema))
    assert all(statuses.get(task_id) is TaskStatus.SUCCEEDED for task_id in leader.acked())
    _check_attempts(log)


async def _terminate_lock_sessions(dsn: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()


def test_store_outage_keeps_the_shard_running_and_loses_nothing(private_postgres: object, tmp_path: Path) -> None:
    """The database goes away for a few seconds: durable calls wait, no new attempt starts, and
    afterwards every acknowledged task completes."""
    cluster = private_postgres
    store = f"postgres:{cluster.dsn}#outage"  # type: ignore[attr-defined]
    log = tmp_path / "attempts.log"
    shard = ShardProcess(
        "--store",
        store,
        "--submit",
        "60",
        "--run-seconds",
        "0.1",
        "--slots",
        "2",
        "--log",
        str(log),
        "--exit-when-idle",
        "--session-timeout",
        "10",
    )
    try:
        shard.wait_for(lambda lines: sum(line.startswith("ACK") for line in lines) == 60)
        deadline = time.monotonic() + 20
        while sum(1 for e in log_lines(log) if e[0] == "done") < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        cluster.pause()  # type: ignore[attr-defined]
        time.sleep(3)
        assert shard.proc.poll() is None, "the shard must keep running through a short outage"
        cluster.resume()  # type: ignore[attr-defined]
        shard.wait_for(lambda lines: "IDLE" in lines, timeout=90)
        assert shard.wait_exit() == 0
    finally:
        shard.kill()
    assert not any(line.startswith("DOWN") for line in shard.lines), shard.lines[-5:]
    statuses = asyncio.run(_final_statuses("postgres", tmp_path, cluster.dsn, "outage"))  # type: ignore[attr-defined]
    assert all(statuses.get(task_id) is TaskStatus.SUCCEEDED for task_id in shard.acked())
    _check_attempts(log)
