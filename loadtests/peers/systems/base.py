"""What the driver needs from each system under test, and helpers the systems share."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peers.usage import Parts

LOADTESTS = Path(__file__).resolve().parents[2]
ROOT = LOADTESTS.parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


@dataclass
class Case:
    """One workload as the driver runs it; systems read what concerns them."""

    workload: str  # noop | sleep10 | backlog | sustained
    tasks: int
    workers: int  # worker processes
    concurrency: int  # tasks each worker process runs at once (where the system has such a knob)
    workdir: Path
    dsn: str = DEFAULT_DSN  # a database of the Postgres instance the bench may create databases in
    redis_url: str = DEFAULT_REDIS
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:10])

    @property
    def handler(self) -> str:
        """What each task does: ``sleep10`` awaits 10 ms, every other workload's tasks do nothing."""
        return "sleep10" if self.workload == "sleep10" else "noop"


class System:
    """A task queue under test: its backend, its workers and how to submit to it.

    ``open`` prepares the backend (a fresh database, a server process); ``worker_commands`` are
    started by the driver and must report through ``peers.probe``; ``submit`` sends one chunk of
    tasks whose payload is the submit time stamp (0 when the task is not a latency sample).
    A system that runs tasks in the driver's own process (``in_process``) instead provides
    ``start_consuming``/``completed``/``span``/``take_latencies_ms``.
    """

    name = ""
    backend = ""  # postgres | redis
    durability = ""
    in_process = False
    libraries: tuple[str, ...] = ()  # importable modules the system needs

    def __init__(self, case: Case) -> None:
        self.case = case
        self.parts = Parts()
        self.settings: dict[str, Any] = {}
        self.database: Database | None = None  # a Postgres-based system's own database

    def missing(self) -> str | None:
        """None when the libraries this system needs can be imported, else what is missing."""
        import importlib.util

        absent = [name for name in self.libraries if importlib.util.find_spec(name) is None]
        return f"not installed: {', '.join(absent)} (pip install -e '.[peers]')" if absent else None

    async def open(self) -> None:
        raise NotImplementedError

    def worker_commands(self) -> list[list[str]]:
        raise NotImplementedError

    def worker_env(self) -> dict[str, str]:
        """Environment variables the worker processes need besides ``child_env()``."""
        return {}

    def expected_processes(self) -> int:
        """How many processes will run tasks (and report probes) once the workers are up."""
        return self.case.workers

    async def submit(self, stamps: list[float]) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    # in-process systems only
    async def start_consuming(self) -> None:
        raise NotImplementedError

    def completed(self) -> int:
        raise NotImplementedError

    def span(self) -> tuple[float, float]:
        raise NotImplementedError

    def take_latencies_ms(self) -> list[float]:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# Shared helpers


def python_command(module: str, *args: str) -> list[str]:
    """Run ``peers.systems.<module>`` as a worker script."""
    return [sys.executable, "-m", f"peers.systems.{module}", *args]


def child_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(LOADTESTS), env.get("PYTHONPATH", "")) if p)
    for name in ("CRONOQ_CONFIG", "CRONOQ_SHARD"):
        env.pop(name, None)
    return env


def stop_group(proc: subprocess.Popen[Any], timeout: float = 15.0) -> None:
    """SIGTERM a process started in its own session, then SIGKILL its whole group if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    proc.wait(10)


def database_dsn(base: str, database: str) -> str:
    """``base`` with its database replaced by ``database``."""
    head, _, tail = base.partition("?")
    root = head.rsplit("/", 1)[0]
    return f"{root}/{database}" + (f"?{tail}" if tail else "")


class Database:
    """A Postgres database of its own (on the instance of ``base_dsn``), created on ``create`` and
    dropped on ``drop``."""

    @classmethod
    def for_case(cls, case: Case, system: str) -> Database:
        return cls(case.dsn, f"peers_{system}_{case.run_id}")

    def __init__(self, base_dsn: str, name: str) -> None:
        self.base_dsn = base_dsn
        self.name = name
        self.dsn = database_dsn(base_dsn, name)
        self.postmaster: int | None = None

    async def create(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.base_dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{self.name}"')
            # Read while the backend lives: its parent is the postmaster (None when not local).
            self.postmaster = _parent_of(await conn.fetchval("SELECT pg_backend_pid()"))
        finally:
            await conn.close()

    async def drop(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.base_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        finally:
            await conn.close()

    async def durability(self) -> str:
        """The durability settings in force for this database, as ``fsync=..., synchronous_commit=...``."""
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            return ", ".join(
                [f"{name}={await conn.fetchval(f'SHOW {name}')}" for name in ("fsync", "synchronous_commit")]
            )
        finally:
            await conn.close()


def _parent_of(pid: int) -> int | None:
    """The parent of a local process (the postmaster of a backend), or None when not local."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class Analyzer:
    """``ANALYZE`` of a database every ``every_s`` seconds, as autovacuum would keep its planner
    statistics fresh where it is on (it is off on the shared benchmark instance, and a queue
    table that never gets statistics can get a plan that scans it for every job)."""

    def __init__(self, dsn: str, every_s: float) -> None:
        self.dsn = dsn
        self.every_s = every_s
        self.runs = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        import asyncpg

        conn = await asyncpg.connect(self.dsn)
        try:
            while True:
                await asyncio.sleep(self.every_s)
                await conn.execute("ANALYZE")
                self.runs += 1
        finally:
            await conn.close()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


async def bounded_gather(calls: list[Any], limit: int) -> None:
    """Await the coroutines of ``calls`` with at most ``limit`` in flight."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Any) -> None:
        async with gate:
            await call

    await asyncio.gather(*(one(call) for call in calls))


async def redis_delete_matching(url: str, patterns: list[str]) -> int:
    """Delete the keys matching ``patterns`` (the case's own keys) from the Redis at ``url``."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(url)
    deleted = 0
    try:
        for pattern in patterns:
            batch: list[bytes] = []
            async for key in client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    deleted += await client.delete(*batch)
                    batch = []
            if batch:
                deleted += await client.delete(*batch)
    finally:
        await client.aclose()
    return deleted


async def redis_persistence(url: str) -> str:
    """What the Redis at ``url`` writes to disk, as a short phrase."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(url)
    try:
        save = (await client.config_get("save")).get("save", "")
        aof = (await client.config_get("appendonly")).get("appendonly", "no")
    finally:
        await client.aclose()
    if not save and aof == "no":
        return "Redis persists nothing (no RDB snapshots, no AOF): a Redis restart loses every queued task"
    return f"Redis save={save!r} appendonly={aof}"
