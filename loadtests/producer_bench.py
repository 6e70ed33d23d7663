"""Producer-side cost of submitting to a ``cronoq-server``: one JSON object per case on stdout,
``{"bench": "producer", ...}``.

Each case starts its own ``cronoq-server`` (one shard, the Postgres store in a database of the
case's own, created and dropped here) with no worker attached, so every figure is what accepting
and durably recording submissions costs; the tasks stay pending. Cases:

* ``grpc_submit_c64``: ``--single-tasks`` tasks, one ``Client.submit`` each, 64 at once over one
  channel.
* ``grpc_submit_c64_coalesced``: the same with ``Client(coalesce=True)``: the 64 concurrent
  submits leave together in SubmitBatch calls (``cronoq._client.coalesce``), each caller still
  waiting for its own acknowledgement.
* ``grpc_submit_batch_100`` / ``grpc_submit_batch_1000``: ``--batch-tasks`` tasks sent with
  ``Client.submit_batch`` in batches of 100 or 1000, 4 batches at once.
* ``http_submit_c64``: ``--single-tasks`` tasks, one ``POST /v1/tasks`` each, 64 at once (one
  connection each; a 429/503 is retried after 10 ms and counted).
* ``http_wrk_c64``: the same requests from ``wrk`` (a C load generator, so the client's own CPU
  is a small share of the machine) for ``--wrk-seconds``: 64 connections, each a request at a
  time, each body a task with a key of its own (``wrk_submit.lua``). Skipped without ``wrk`` on
  the PATH (``scripts/ensure_wrk.sh`` installs it). ``tasks`` is the requests answered 200;
  ``statuses`` counts every answer; ``server_submitted`` what the server admitted (the answers
  still on their way when wrk stopped included); the client CPU is wrk's.

Figures: ``tasks_per_s`` (acknowledged tasks over the time from the first submission to the last
acknowledgement), ``ack_p50_ms`` / ``ack_p99_ms`` (how long one call took to be acknowledged),
and the CPU per task of the load client (this process, ``client_cpu_us_per_task``), the server
(``server_cpu_us_per_task``) and the Postgres backends of the case's database plus the
instance's WAL writer (``postgres_cpu_us_per_task``), with ``machine_busy_pct``.

Postgres: ``CRONOQ_BENCH_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``), a database
on that instance the bench may create databases from. Figures vary with the machine's load:
compare cases of one run.

Run: python loadtests/producer_bench.py [--cases grpc_submit_c64,...] [--single-tasks N]
     [--batch-tasks N] [--wrk-seconds S] [--wrk-threads T]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers.systems.base import Database
from peers.usage import Parts, Usage, per_task
from server_bench import HTTP_CONCURRENCY, POOL, Server, load_http, ms, percentile

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
SINGLE_CONCURRENCY = 64
BATCH_SUBMITTERS = 4
WRK_SCRIPT = Path(__file__).with_name("wrk_submit.lua")
WRK_MAX_RATE = 30_000
"""Tasks per second the server's pending limit is sized for in the wrk case (it runs for a time)."""
CASES = (
    "grpc_submit_c64",
    "grpc_submit_c64_coalesced",
    "grpc_submit_batch_100",
    "grpc_submit_batch_1000",
    "http_submit_c64",
    "http_wrk_c64",
)


def emit(**fields: Any) -> None:
    print(json.dumps({"bench": "producer", **fields}), flush=True)


async def in_parallel(total: int, concurrency: int, call: Callable[[int], Awaitable[None]]) -> None:
    """``call(i)`` for every ``i`` below ``total``, ``concurrency`` at a time, in order of ``i``."""
    work = iter(range(total))

    async def one_lane() -> None:
        for i in work:
            await call(i)

    await asyncio.gather(*(one_lane() for _ in range(concurrency)))


async def grpc_single(client: Any, total: int) -> list[float]:
    acks: list[float] = []

    async def submit(i: int) -> None:
        started = time.perf_counter()
        await client.submit(i, pool=POOL)
        acks.append(time.perf_counter() - started)

    await in_parallel(total, SINGLE_CONCURRENCY, submit)
    return acks


async def grpc_batches(client: Any, total: int, size: int) -> list[float]:
    from cronoq.client import task

    acks: list[float] = []

    async def submit(n: int) -> None:
        base = n * size
        specs = [task(i, pool=POOL) for i in range(base, min(base + size, total))]
        started = time.perf_counter()
        answer = await client.submit_batch(specs)
        acks.append(time.perf_counter() - started)
        if len(answer) != len(specs):
            raise RuntimeError(f"a batch of {len(specs)} was answered with {len(answer)} ids")

    await in_parallel(-(-total // size), BATCH_SUBMITTERS, submit)
    return acks


def children_cpu_s() -> float:
    """CPU seconds of this process's children that have exited (wrk, once it is waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def http_wrk(base_url: str, seconds: int, threads: int) -> dict[str, Any]:
    """One wrk run against ``POST /v1/tasks``: its ``wrk-result`` line, and wrk's CPU seconds."""
    before = children_cpu_s()
    proc = await asyncio.create_subprocess_exec(
        "wrk", f"-t{threads}", f"-c{SINGLE_CONCURRENCY}", f"-d{seconds}s", "--timeout", "60s",
        "-s", str(WRK_SCRIPT), f"{base_url}/v1/tasks", "--", POOL, uuid.uuid4().hex[:8],
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    wrk_cpu = children_cpu_s() - before
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("wrk-result "):
            result: dict[str, Any] = json.loads(line.removeprefix("wrk-result "))
            result["wrk_cpu_s"] = round(wrk_cpu, 3)
            return result
    raise RuntimeError(f"wrk printed no result (exit {proc.returncode}): {(out + err).decode(errors='replace')[-800:]}")


def wrk_figures(run: dict[str, Any], cpu: dict[str, float], threads: int) -> dict[str, Any]:
    """The case's figures from a wrk run; wrk's CPU is the client's."""
    statuses = {int(status): count for status, count in run["statuses"].items()}
    acknowledged = statuses.get(200, 0)
    refused = {status: count for status, count in statuses.items() if status not in (200, 429, 503)}
    if refused or run["socket_errors"]:
        raise RuntimeError(f"wrk got answers other than 200/429/503: {statuses}, socket errors {run['socket_errors']}")
    cpu = {**cpu, "client_cpu_s": run["wrk_cpu_s"]}
    elapsed = run["duration_us"] / 1e6
    return {
        "tasks": acknowledged,
        "calls": run["requests"],
        "tasks_per_s": round(acknowledged / elapsed),
        "wall_s": round(elapsed, 3),
        "ack_p50_ms": round(run["p50_us"] / 1000, 2),
        "ack_p99_ms": round(run["p99_us"] / 1000, 2),
        "ack_max_ms": round(run["max_us"] / 1000, 2),
        **cpu,
        **per_task(cpu, acknowledged),
        "statuses": {str(status): count for status, count in sorted(statuses.items())},
        "wrk_threads": threads,
    }


async def run_case(case: str, total: int, dsn: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    from cronoq.client import Client

    database = Database(dsn, f"producer_{uuid.uuid4().hex[:10]}")
    await database.create()
    store = f'[store]\nkind = "postgres"\nurl = {json.dumps(database.dsn)}\nschema = "cronoq_bench"'
    if case == "http_wrk_c64":
        total = int(WRK_MAX_RATE * args.wrk_seconds)
    server = Server(workdir, store, pending=max(2 * total, 1000))
    try:
        server.start()
        assert server.proc is not None
        usage = Usage(Parts(server=server.proc.pid, postmaster=database.postmaster, database=database.name))
        async with Client(server.grpc_target, coalesce=case.endswith("_coalesced")) as client:
            await client.submit(None, pool=POOL)  # the channel is up and the store answers
            usage.start()
            started = time.perf_counter()
            retries = None
            wrk_run: dict[str, Any] | None = None
            if case == "http_wrk_c64":
                wrk_run = await http_wrk(server.http_base, args.wrk_seconds, args.wrk_threads)
                acks = []
            elif case.startswith("grpc_submit_c64"):
                acks = await grpc_single(client, total)
            elif case.startswith("grpc_submit_batch_"):
                acks = await grpc_batches(client, total, int(case.rsplit("_", 1)[1]))
            else:
                acks, retries = await load_http(server.http_base, total, lambda i: None, {})
            elapsed = time.perf_counter() - started
            cpu = usage.stop()
            coalescer = client._coalescer  # SubmitBatch calls the coalesced case made
            batch_calls = coalescer.batches_sent if coalescer is not None else None
            totals = (await client.snapshot()).totals
    except Exception:
        print(f"server stderr (tail):\n{server.stderr()[-3000:]}", file=sys.stderr, flush=True)
        raise
    finally:
        server.stop()
        await database.drop()
    if wrk_run is not None:
        # Admitted by the server (the first, warm-up submission aside): the acknowledged tasks, plus
        # those whose answers were still on their way when wrk stopped.
        return {**wrk_figures(wrk_run, cpu, args.wrk_threads), "concurrency": SINGLE_CONCURRENCY,
                "server_submitted": int(totals.submitted) - 1, "shed_tasks": int(totals.shed)}  # fmt: skip
    result: dict[str, Any] = {
        "tasks": total,
        "calls": len(acks),
        "tasks_per_s": round(total / elapsed),
        "wall_s": round(elapsed, 3),
        "ack_p50_ms": ms(percentile(acks, 0.50)),
        "ack_p99_ms": ms(percentile(acks, 0.99)),
        "ack_max_ms": ms(max(acks)),
        **cpu,
        **per_task(cpu, total),
    }
    if case.startswith("http"):
        result.update(concurrency=HTTP_CONCURRENCY, retried_requests=retries)
    elif case.startswith("grpc_submit_c64"):
        result["concurrency"] = SINGLE_CONCURRENCY
        if batch_calls is not None:
            result["submit_batch_calls"] = batch_calls
    else:
        result["concurrent_batches"] = BATCH_SUBMITTERS
    result["shed_tasks"] = int(totals.shed)
    return result


async def main_async(args: argparse.Namespace) -> None:
    cases = [c for c in args.cases.split(",") if c]
    for name in cases:
        if name not in CASES:
            raise SystemExit(f"unknown case {name!r} ({', '.join(CASES)})")
    dsn = os.environ.get("CRONOQ_BENCH_DSN", DEFAULT_DSN)
    with tempfile.TemporaryDirectory(prefix="cronoq-producer-bench-") as tmp:
        for n, case in enumerate(cases):
            total = args.batch_tasks if "batch" in case else args.single_tasks
            workdir = Path(tmp) / f"case{n}"
            workdir.mkdir()
            if case == "http_wrk_c64" and shutil.which("wrk") is None:
                emit(case=case, store="postgres", skipped="wrk is not installed (scripts/ensure_wrk.sh)")
                continue
            try:
                emit(case=case, store="postgres", **await run_case(case, total, dsn, workdir, args))
            except Exception as exc:
                emit(case=case, store="postgres", error=f"{type(exc).__name__}: {exc}"[-1500:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--single-tasks", type=int, default=20_000, help="tasks of the one-per-call cases")
    parser.add_argument("--batch-tasks", type=int, default=100_000, help="tasks of the batch cases")
    parser.add_argument("--wrk-seconds", type=int, default=10, help="how long the wrk case runs")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk's threads (its connections are 64)")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(main_async(args))
    else:
        uvloop.run(main_async(args))


if __name__ == "__main__":
    main()
