"""Durable store benchmark: one JSON object per case on stdout, ``{"bench": "store", ...}``.

For each store (memory, SQLite file, Postgres schema):

* ``throughput_batch_100`` / ``throughput_batch_1000``: ``cronoq.Scheduler`` with one pool of 256
  slots and a no-op executor; N tasks submitted with ``submit_batch`` in batches of 100 or 1000,
  one batch at a time; timed from the first submission until every task succeeded. Figures:
  ``tasks_per_s``, ``commits_per_s``, ``rows_per_commit`` (task rows plus schedule rows written
  per commit, counted by a store subclass), ``ack_p50_ms``/``ack_p99_ms`` (how long one
  ``submit_batch`` took to be acknowledged, i.e. durably committed). Each case runs in a fresh
  process; with ``--runs`` above 1 the run with the median rate is reported. CPU per task, which a
  busy machine disturbs far less than the rate: ``cpu_us_per_task`` (this process, user plus
  system) and, on Postgres, ``pg_cpu_us_per_task`` (the server processes of the store's pool,
  read from ``/proc``, so only when the server runs on this machine).
* ``takeover_10000`` / ``takeover_100000`` (SQLite and Postgres; an in-memory store does not
  survive its process): a leader process submits that many tasks to a pool with no slots, a
  standby process waits for leadership, the leader is killed with SIGKILL, and ``takeover_ms``
  runs from the kill until the standby's executor starts its first attempt. Also reported:
  ``acquire_ms`` (kill until the standby leads), ``recover_ms`` (its ``store.recover()``) and
  ``restore_dispatch_ms`` (recovery done until the first dispatch: engine restore, first step).
  Standbys poll for leadership every 0.1 s; SQLite leases last 2 s (see the child script).

Postgres: the DSN in ``CRONOQ_BENCH_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``);
each case gets a fresh schema, dropped afterwards. A store that cannot be reached is reported as
``{"skipped": ...}`` and the others still run.

Run: python loadtests/store_bench.py [--tasks N] [--runs R] [--stores memory,sqlite,postgres]
     [--takeover 10000,100000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cronoq.engine.actions import Mutation, PutRecurring, PutTask, SetStatus

import cronoq

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
CHILD = Path(__file__).with_name("store_takeover_child.py")
STORES = ("memory", "sqlite", "postgres")


def emit(**fields: Any) -> None:
    print(json.dumps({"bench": "store", **fields}), flush=True)


def dsn() -> str:
    return os.environ.get("CRONOQ_BENCH_DSN", DEFAULT_DSN)


def new_schema() -> str:
    return f"cronoq_bench_{uuid.uuid4().hex[:12]}"


async def drop_schema(schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn())
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


def rows_of(mutations: Sequence[Mutation]) -> int:
    """How many rows a commit writes: one per task and one per schedule it touches.

    (Counted inside the measured loop, so the common kinds are told apart by exact type.)
    """
    tasks: set[int] = set()
    schedules: set[str] = set()
    for m in mutations:
        kind = type(m)
        if kind is SetStatus:
            tasks.add(m.id)
        elif kind is PutTask:
            tasks.add(m.task.id)
        elif isinstance(m, PutRecurring):
            schedules.add(m.spec.name)
        else:
            schedules.add(m.name)
    return len(tasks) + len(schedules)


def process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def backend_cpu_s(pid: int) -> float | None:
    """User plus system CPU of a local Postgres server process, or None if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pool_backends(store: Any) -> list[int]:
    """Server pids of the connections the Postgres store's pool holds (benchmark-only peeking)."""
    pool = getattr(store, "_pool", None)
    pids = []
    for holder in getattr(pool, "_holders", ()):
        conn = getattr(holder, "_con", None)
        if conn is not None and not conn.is_closed():
            pids.append(conn.get_server_pid())
    return pids


def counting(base: type) -> type:
    """A subclass of a store class that counts successful commits and the rows they wrote."""

    class Counting(base):  # type: ignore[misc]
        commits = 0
        rows = 0

        async def commit(self, epoch: int, mutations: Sequence[Mutation]) -> None:
            await super().commit(epoch, mutations)
            self.commits += 1
            self.rows += rows_of(mutations)

    return Counting


# ---------------------------------------------------------------------------------------------
# Throughput (runs in a child process per case)


async def noop(ctx: cronoq.TaskContext, payload: object) -> None:
    return None


async def throughput(store_kind: str, total: int, batch: int, workdir: str) -> dict[str, Any]:
    schema = None
    if store_kind == "memory":
        from cronoq.stores.memory import MemoryStore

        store = counting(MemoryStore)()
    elif store_kind == "sqlite":
        from cronoq.stores.sqlite import SqliteStore

        store = counting(SqliteStore)(os.path.join(workdir, f"{uuid.uuid4().hex}.db"))
    else:
        from cronoq.stores.postgres import PostgresStore

        schema = new_schema()
        store = counting(PostgresStore)(dsn(), schema=schema)
    try:
        pool = cronoq.Pool("default", noop, max=256, autoscale=False)
        async with cronoq.Scheduler([pool], store=store) as sched:
            commits0, rows0 = store.commits, store.rows  # leave out what opening wrote
            acks: list[float] = []
            backends0 = {pid: backend_cpu_s(pid) for pid in pool_backends(store)}
            cpu0 = process_cpu_s()
            started = time.perf_counter()
            for base in range(0, total, batch):
                tasks = [cronoq.Task(i) for i in range(base, min(base + batch, total))]
                sent = time.perf_counter()
                await sched.submit_batch(tasks)
                acks.append(time.perf_counter() - sent)
            while (await sched.snapshot()).totals["succeeded"] < total:
                await asyncio.sleep(0.002)
            elapsed = time.perf_counter() - started
            cpu = process_cpu_s() - cpu0
            pg_cpu: float | None = 0.0
            for pid in pool_backends(store):  # a connection opened meanwhile counts from zero
                now_s, before = backend_cpu_s(pid), backends0.get(pid) or 0.0
                pg_cpu = None if now_s is None or pg_cpu is None else pg_cpu + now_s - before
            commits, rows = store.commits - commits0, store.rows - rows0
    finally:
        if schema is not None:
            await drop_schema(schema)
    acks.sort()
    return {
        "tasks": total,
        "batch": batch,
        "seconds": round(elapsed, 3),
        "tasks_per_s": round(total / elapsed),
        "commits": commits,
        "commits_per_s": round(commits / elapsed, 1),
        "rows_per_commit": round(rows / max(commits, 1), 1),
        "acks": len(acks),
        "ack_p50_ms": round(acks[len(acks) // 2] * 1000, 2),
        "ack_p99_ms": round(acks[min(len(acks) - 1, int(len(acks) * 0.99))] * 1000, 2),
        "cpu_us_per_task": round(cpu / total * 1e6, 1),
        **({"pg_cpu_us_per_task": round(pg_cpu / total * 1e6, 1)} if schema is not None and pg_cpu is not None else {}),
    }


def child_main(store_kind: str, total: int, batch: int, workdir: str) -> None:
    install_uvloop()
    print(json.dumps(asyncio.run(throughput(store_kind, total, batch, workdir))), flush=True)


def run_throughput(store_kind: str, total: int, batch: int, runs: int, workdir: str) -> None:
    results = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, __file__, "--child", store_kind, "--tasks", str(total), "--batch", str(batch),
             "--workdir", workdir],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if out.returncode != 0:
            emit(case=f"throughput_batch_{batch}", store=store_kind, error=out.stderr.strip()[-800:])
            return
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    results.sort(key=lambda r: r["tasks_per_s"])
    median = results[len(results) // 2]
    extra = {"runs": runs, "tasks_per_s_all": [r["tasks_per_s"] for r in results]} if runs > 1 else {}
    emit(case=f"throughput_batch_{batch}", store=store_kind, loop=LOOP, **median, **extra)


# ---------------------------------------------------------------------------------------------
# Takeover after SIGKILL


class Child:
    """A takeover child process whose stdout lines (``EVENT time details``) are read as they come."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip
        self.events: dict[str, list[str]] = {}
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_for(self, event: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while event not in self.events:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise TimeoutError(f"no {event} within {timeout} s") from None
            if line is None:
                self.proc.wait(10)
                err = self.proc.stderr.read()[-1500:] if self.proc.stderr is not None else ""
                raise RuntimeError(f"child exited before {event}: {err}")
            name, *rest = line.split()
            self.events[name] = rest
        return self.events[event]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


def run_takeover(store_kind: str, live: int, workdir: str) -> None:
    schema = None
    if store_kind == "sqlite":
        path = os.path.join(workdir, f"takeover-{uuid.uuid4().hex}.db")
        spec = f"sqlite:{path}"
    else:
        schema = new_schema()
        spec = f"postgres:{dsn()}#{schema}"
    leader = standby = None
    try:
        leader = Child("--store", spec, "--role", "leader", "--submit", str(live))
        leader.wait_for("LEADER", 60)
        submitted = time.perf_counter()
        leader.wait_for("READY", 600)
        submit_s = time.perf_counter() - submitted
        standby = Child("--store", spec, "--role", "standby")
        standby.wait_for("STANDBY", 60)
        time.sleep(0.5)  # let it settle into polling for leadership
        killed = time.time()
        os.kill(leader.proc.pid, signal.SIGKILL)
        dispatched = float(standby.wait_for("DISPATCH", 120)[0])
        acquired = float(standby.events["ACQUIRED"][0])
        recovered_at, recover_s, recovered_tasks = standby.events["RECOVERED"][:3]
        emit(
            case=f"takeover_{live}",
            store=store_kind,
            live_tasks=live,
            recovered_tasks=int(recovered_tasks),
            takeover_ms=round((dispatched - killed) * 1000),
            acquire_ms=round((acquired - killed) * 1000),
            recover_ms=round(float(recover_s) * 1000),
            restore_dispatch_ms=round((dispatched - float(recovered_at)) * 1000),
            lock_poll_s=0.1,
            **({"lease_ttl_s": 2.0} if store_kind == "sqlite" else {}),
            leader_submit_s=round(submit_s, 2),
        )
    except (TimeoutError, RuntimeError) as exc:
        emit(case=f"takeover_{live}", store=store_kind, live_tasks=live, error=str(exc))
    finally:
        for child in (leader, standby):
            if child is not None:
                child.kill()
        if schema is not None:
            asyncio.run(drop_schema(schema))


# ---------------------------------------------------------------------------------------------


def install_uvloop() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


LOOP = "asyncio"


def postgres_reachable() -> str | None:
    async def probe() -> None:
        import asyncpg

        conn = await asyncpg.connect(dsn(), timeout=5)
        await conn.close()

    try:
        asyncio.run(probe())
    except Exception as exc:  # any failure: report it and carry on with the other stores
        return f"{type(exc).__name__}: {exc}"
    return None


def main() -> int:
    global LOOP
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=30_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--takeover", default="10000,100000", help="live task counts; empty for none")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=1000, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args.child, args.tasks, args.batch, args.workdir)
        return 0
    LOOP = install_uvloop()
    stores = [s for s in args.stores.split(",") if s]
    unknown = set(stores) - set(STORES)
    if unknown:
        parser.error(f"unknown stores: {sorted(unknown)}")
    sizes = [int(n) for n in args.takeover.split(",") if n]
    workdir = tempfile.mkdtemp(prefix="cronoq-store-bench-")
    try:
        for store_kind in stores:
            if store_kind == "postgres":
                problem = postgres_reachable()
                if problem is not None:
                    emit(case="all", store="postgres", skipped=f"cannot reach {dsn()}: {problem}")
                    continue
            for batch in (100, 1000):
                run_throughput(store_kind, args.tasks, batch, args.runs, workdir)
            if store_kind != "memory":
                for live in sizes:
                    run_takeover(store_kind, live, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
