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

Figures: ``tasks_per_s`` (acknowledged tasks over the time from the first submission to the last
acknowledgement), ``ack_p50_ms`` / ``ack_p99_ms`` (how long one call took to be acknowledged),
and the CPU per task of the load client (this process, ``client_cpu_us_per_task``), the server
(``server_cpu_us_per_task``) and the Postgres backends of the case's database plus the
instance's WAL writer (``postgres_cpu_us_per_task``), with ``machine_busy_pct``.

Postgres: ``CRONOQ_BENCH_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``), a database
on that instance the bench may create databases from. Figures vary with the machine's load:
compare cases of one run.

Run: python loadtests/producer_bench.py [--cases grpc_submit_c64,...] [--single-tasks N]
     [--batch-tasks N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
CASES = (
    "grpc_submit_c64",
    "grpc_submit_c64_coalesced",
    "grpc_submit_batch_100",
    "grpc_submit_batch_1000",
    "http_submit_c64",
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


async def run_case(case: str, total: int, dsn: str, workdir: Path) -> dict[str, Any]:
    from cronoq.client import Client

    database = Database(dsn, f"producer_{uuid.uuid4().hex[:10]}")
    await database.create()
    store = f'[store]\nkind = "postgres"\nurl = {json.dumps(database.dsn)}\nschema = "cronoq_bench"'
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
            if case.startswith("grpc_submit_c64"):
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
            try:
                emit(case=case, store="postgres", **await run_case(case, total, dsn, workdir))
            except Exception as exc:
                emit(case=case, store="postgres", error=f"{type(exc).__name__}: {exc}"[-1500:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--single-tasks", type=int, default=20_000, help="tasks of the one-per-call cases")
    parser.add_argument("--batch-tasks", type=int, default=100_000, help="tasks of the batch cases")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(main_async(args))
    else:
        uvloop.run(main_async(args))


if __name__ == "__main__":
    main()
