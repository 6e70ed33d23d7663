"""One workload on one system, in a process of its own: ``python -m peers.driver SYSTEM WORKLOAD ...``.

Prints one JSON object (the figures of the case) as its last stdout line. ``bench.py`` runs one
driver per (workload, system) so that no library's state leaks into another's figures and the
driver's own CPU is the load client's.

The flow of every workload:

* ``noop`` / ``sleep10``: start the workers, warm up (until every worker process has run a task),
  then submit ``tasks`` tasks in chunks of ``CHUNK`` from ``SUBMITTERS`` concurrent submitters and
  time from the first submission to the last completion (``tasks_per_s``).
* ``backlog``: submit ``tasks`` tasks with no worker running (``enqueue_tasks_per_s``), then start
  the workers and time from the first completion to the last (``drain_tasks_per_s``).
* ``sustained``: start the workers, warm up, then submit ``rate`` tasks per second for
  ``duration`` seconds (every ``TICK_S`` one chunk of the tasks due, stamped when it is due and
  sent by one of ``SUBMITTERS`` concurrent submitters) and report the submit-to-start latency of
  every task (``latency_p50_ms``, ``latency_p99_ms``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server_bench import percentile

from peers.probe import ProbeReader
from peers.systems import SYSTEMS, load
from peers.systems.base import Analyzer, Case, System, child_env, stop_group
from peers.usage import Usage, per_task

CHUNK = 1000
SUBMITTERS = 4
TICK_S = 0.01
WARMUP_TASKS = 64
WARMUP_S = 30.0
POLL_S = 0.01
ANALYZE_EVERY_S = 5.0  # Postgres-based systems: planner statistics as autovacuum would keep them
STOP_S = 3.0  # then the worker's process group is killed


class Fleet:
    """The worker processes of a case, their probes and stderr files."""

    def __init__(self, system: System, workdir: Path) -> None:
        self.system = system
        self.workdir = workdir
        self.procs: list[subprocess.Popen[str]] = []
        self.reader = ProbeReader()

    def start(self) -> None:
        env = {**child_env(), **self.system.worker_env()}
        for n, command in enumerate(self.system.worker_commands()):
            with open(self.workdir / f"worker{n}.stderr", "w") as stderr:
                proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                        env=env, cwd=self.workdir, start_new_session=True)  # fmt: skip
            self.procs.append(proc)
            self.reader.follow(proc)
        self.system.parts.workers = [proc.pid for proc in self.procs]

    def check_alive(self) -> None:
        for n, proc in enumerate(self.procs):
            if proc.poll() is not None:
                tail = (self.workdir / f"worker{n}.stderr").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"worker {n} exited with {proc.returncode}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM every worker at once (the figures are taken: no need for a graceful drain)."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            stop_group(proc, timeout=STOP_S)


class Progress:
    """Completed-task counts and times, from the fleet's probes or from an in-process system."""

    def __init__(self, system: System, fleet: Fleet | None) -> None:
        self.system = system
        self.fleet = fleet

    def done(self) -> int:
        return self.fleet.reader.done() if self.fleet else self.system.completed()

    def span(self) -> tuple[float, float]:
        return self.fleet.reader.span() if self.fleet else self.system.span()

    def latencies_ms(self) -> list[float]:
        return self.fleet.reader.take_latencies() if self.fleet else self.system.take_latencies_ms()

    async def wait_for(self, target: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.done() < target:
            if self.fleet is not None:
                self.fleet.check_alive()
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(POLL_S)
        return True


def chunks(total: int, size: int) -> Iterator[int]:
    for base in range(0, total, size):
        yield min(size, total - base)


async def submit_all(system: System, total: int, deadline: float = float("inf")) -> int:
    """``total`` unstamped tasks in chunks of ``CHUNK`` from ``SUBMITTERS`` concurrent submitters,
    taking no new chunk after ``deadline`` (``time.monotonic()``); how many were submitted."""
    work = chunks(total, CHUNK)
    submitted = 0

    async def submitter() -> None:
        nonlocal submitted
        for size in work:
            await system.submit([0.0] * size)
            submitted += size
            if time.monotonic() > deadline:
                return

    await asyncio.gather(*(submitter() for _ in range(SUBMITTERS)))
    return submitted


async def warm_up(system: System, progress: Progress) -> dict[str, Any]:
    """Submit small rounds until every worker process has run a task (or ``WARMUP_S`` passed)."""
    expected = system.expected_processes()
    deadline = time.monotonic() + WARMUP_S
    rounds = 0
    while True:
        rounds += 1
        target = progress.done() + WARMUP_TASKS
        await system.submit([0.0] * WARMUP_TASKS)
        if not await progress.wait_for(target, WARMUP_S):
            raise RuntimeError(f"warm-up tasks did not complete within {WARMUP_S} s")
        seen = progress.fleet.reader.processes() if progress.fleet else expected
        if seen >= expected or time.monotonic() > deadline:
            progress.latencies_ms()
            return {"warmup_rounds": rounds, "processes_warm": seen}


async def throughput(system: System, progress: Progress, usage: Usage, tasks: int, timeout: float) -> dict[str, Any]:
    base = progress.done()
    usage.start()
    started = time.time()
    await submit_all(system, tasks)
    submitted = time.time()
    finished = await progress.wait_for(base + tasks, timeout)
    cpu = usage.stop()
    done = progress.done() - base
    end = progress.span()[1] if finished else time.time()
    out: dict[str, Any] = {
        "tasks": tasks,
        "tasks_per_s": round(done / max(end - started, 1e-9)),
        "wall_s": round(end - started, 3),
        "submit_tasks_per_s": round(tasks / max(submitted - started, 1e-9)),
        **cpu,
        **per_task(cpu, done),
    }
    if not finished:
        out.update(timed_out=True, completed=done)
    return out


async def backlog(system: System, fleet: Fleet | None, progress: Progress, usage: Usage, tasks: int,
                  timeout: float) -> dict[str, Any]:  # fmt: skip
    usage.start()
    started = time.time()
    requested, tasks = tasks, await submit_all(system, tasks, time.monotonic() + timeout)
    enqueued = time.time()
    enqueue_cpu = usage.stop()
    out: dict[str, Any] = {
        "tasks": tasks,
        **({"enqueue_timed_out": True, "tasks_requested": requested} if tasks < requested else {}),
        "enqueue_tasks_per_s": round(tasks / max(enqueued - started, 1e-9)),
        "enqueue_s": round(enqueued - started, 3),
        **{f"enqueue_{k}": v for k, v in per_task(enqueue_cpu, tasks).items()},
    }
    usage.start()
    consuming = time.time()
    if fleet is not None:
        fleet.start()
        usage.parts = system.parts  # the workers exist now
    else:
        await system.start_consuming()
    finished = await progress.wait_for(tasks, timeout)
    cpu = usage.stop()
    done = progress.done()
    first, last = progress.span()
    if not finished:
        last = time.time()
    out.update(
        drain_tasks_per_s=round(done / max(last - first, 1e-9)),
        drain_s=round(last - first, 3),
        startup_s=round(first - consuming, 3),
        **cpu,
        **per_task(cpu, done),
    )
    if not finished:
        out.update(timed_out=True, completed=done)
    return out


async def sustained(system: System, progress: Progress, usage: Usage, rate: float, duration: float,
                    timeout: float) -> dict[str, Any]:  # fmt: skip
    progress.latencies_ms()
    base = progress.done()
    usage.start()
    started = time.monotonic()
    sent = 0
    late_ticks = 0
    # Up to SUBMITTERS chunks in flight, so that a slow acknowledgement does not hold back the
    # next tick; a chunk is stamped before it waits for a free submitter, so that wait counts too.
    gate = asyncio.Semaphore(SUBMITTERS)
    sending: list[asyncio.Task[None]] = []

    async def send(stamps: list[float]) -> None:
        try:
            await system.submit(stamps)
        finally:
            gate.release()

    while (elapsed := time.monotonic() - started) < duration:
        due = int(rate * elapsed) - sent
        if due > 0:
            stamp = time.time()
            await gate.acquire()
            sending.append(asyncio.ensure_future(send([stamp] * due)))
            sent += due
        pause = TICK_S - (time.monotonic() - started - elapsed)
        if pause > 0:
            await asyncio.sleep(pause)
        else:
            late_ticks += 1
    await asyncio.gather(*sending)
    submit_s = time.monotonic() - started
    finished = await progress.wait_for(base + sent, timeout)
    cpu = usage.stop()
    latencies = progress.latencies_ms()
    out: dict[str, Any] = {
        "target_tasks_per_s": round(rate),
        "achieved_submit_tasks_per_s": round(sent / submit_s),
        "tasks": sent,
        "duration_s": round(submit_s, 2),
        "late_ticks": late_ticks,
        "latency_samples": len(latencies),
        "latency_p50_ms": round(percentile(latencies, 0.50), 2) if latencies else None,
        "latency_p99_ms": round(percentile(latencies, 0.99), 2) if latencies else None,
        "latency_max_ms": round(max(latencies), 2) if latencies else None,
        **cpu,
        **per_task(cpu, sent),
    }
    if not finished:
        out.update(timed_out=True, completed=progress.done() - base)
    return out


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    case = Case(workload=args.workload, tasks=args.tasks, workers=args.workers, concurrency=args.concurrency,
                workdir=workdir, dsn=args.dsn, redis_url=args.redis_url)  # fmt: skip
    system = load(args.system)(case)
    result: dict[str, Any] = {"system": system.name, "backend": system.backend}
    if (why := system.missing()) is not None:
        return {**result, "skipped": why}
    fleet = None if system.in_process else Fleet(system, workdir)
    progress = Progress(system, fleet)
    analyzer: Analyzer | None = None
    try:
        await system.open()
        result["durability"] = system.durability
        if system.database is not None:
            analyzer = Analyzer(system.database.dsn, ANALYZE_EVERY_S)
            analyzer.start()
        if args.workload == "backlog":
            outcome = await backlog(system, fleet, progress, Usage(system.parts), args.tasks, args.timeout)
        else:
            if fleet is not None:
                fleet.start()
            else:
                await system.start_consuming()
            result.update(await warm_up(system, progress))
            usage = Usage(system.parts)
            if args.workload == "sustained":
                outcome = await sustained(system, progress, usage, args.rate, args.duration, args.timeout)
            else:
                outcome = await throughput(system, progress, usage, args.tasks, args.timeout)
        result.update(outcome)
        result["settings"] = system.settings
        if analyzer is not None:
            result["analyze_runs"] = analyzer.runs
        return result
    except Exception as exc:
        tail = list(fleet.reader.other_lines)[-10:] if fleet else []
        return {**result, "error": f"{type(exc).__name__}: {exc}"[-2500:], "worker_output": tail}
    finally:
        if analyzer is not None:
            await analyzer.stop()
        if fleet is not None:
            fleet.stop()
        await system.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=sorted(SYSTEMS))
    parser.add_argument("workload", choices=("noop", "sleep10", "backlog", "sustained"))
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rate", type=float, default=1000.0, help="sustained: tasks per second")
    parser.add_argument("--duration", type=float, default=10.0, help="sustained: seconds of submitting")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for completion")
    parser.add_argument(
        "--dsn", default=os.environ.get("CRONOQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test")
    )
    parser.add_argument("--redis-url", default=os.environ.get("CRONOQ_BENCH_REDIS", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix=f"peers-{args.system}-") as tmp:
        coro = interruptible(run(args, Path(tmp)))
        try:
            import uvloop
        except ImportError:
            result = asyncio.run(coro)
        else:
            result = uvloop.run(coro)
    print(json.dumps(result), flush=True)


async def interruptible(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run ``coro``; SIGTERM or SIGINT cancels it, so that its clean-up (workers, server,
    database) still runs."""
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        return {"system": sys.argv[1] if len(sys.argv) > 1 else "?", "error": "interrupted"}


if __name__ == "__main__":
    main()
