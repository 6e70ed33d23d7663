"""Shard-scaling benchmark: one JSON object per case on stdout, ``{"bench": "shard_scaling", ...}``,
then a small table.

Each cluster is started with ``cronoq.cluster`` (one replica per shard, no proxy: each shard's
endpoint is its server's own listener), authentication on, and ``--workers`` remote worker
processes per shard (this file's ``worker`` mode: a ``cronoq.client.Worker`` with a no-op handler).

Cases:

* ``submit_batch_round_robin`` with 1, 2 and 4 shards: ``--tasks`` tasks in SubmitBatch calls of
  1000, the pools taken in turn and the nodes in turn (every (pool, node) pair equally often, so
  with N shards (N-1)/N of the batches are forwarded by the router), ``--submitters`` calls in
  flight. ``tasks_per_s`` counts from the first submission until every task succeeded (pool
  snapshots of every node, polled every 20 ms); ``cpu_s_per_1000_tasks`` is the CPU time of all
  server processes together (user + system, from /proc/<pid>/stat) per 1000 tasks;
  ``server_cpu_us_per_task`` the same in µs per task, ``server_cpu_us_per_task_by_shard`` each
  shard's server CPU over the tasks of its own pools (1/N of them): flat as shards are added
  when nothing is spent on the shards being many, and what a projection to N machines rests on.
* ``single_submit_owner`` / ``single_submit_foreign`` on the 2-shard cluster: Submit of one
  ``pool2`` task to its own shard's node (s2) or to the other node (s1, which forwards it over
  its Forward stream to s2, see ``cronoq.router.forward``).
  ``p50_ms`` / ``p99_ms``: acknowledgement latency of ``--latency-samples`` calls made one at a
  time; ``tasks_per_s``: ``--single-tasks`` calls, 32 in flight. The two nodes take turns (call
  by call for the latency, in four rounds for the throughput), so both see the same machine;
  ``forwarding_cost`` gives the foreign node's extra p50 and lost throughput in percent.

* ``grpc_hop_floor``: the same client calling a trivial grpc-aio server directly and through a
  trivial grpc-aio proxy (``grpc_hop.py``): ``hop_p50_ms`` and ``proxy_cpu_us_per_call`` are what
  one extra grpc-aio unary call costs on this machine: what forwarding would cost with a unary
  call per forwarded call instead of the Forward stream.

Without the router in the build, a foreign node refuses with FAILED_PRECONDITION: the scaling
cases then submit every batch to its owner (reported as ``"router": false``) and the foreign
case reports the error and is skipped.

Store: SQLite files in a temporary folder, or Postgres (one fresh schema per shard, dropped
afterwards) when ``--dsn`` or ``CRONOQ_BENCH_DSN`` is given. On a 2-core machine every server,
worker and this process share the same cores: read ``machine_busy_pct`` with the figures.

Run: python loadtests/shard_scaling.py [--shards 1,2,4] [--tasks N] [--workers W] [--slots S]
     [--submitters K] [--latency-samples M] [--single-tasks T] [--dsn URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpc_hop
from server_bench import machine_ticks, ms, percentile, process_cpu_s  # the shared /proc accounting

ROOT = Path(__file__).resolve().parents[1]
BATCH = 1000
POLL_S = 0.02
SINGLE_CONCURRENCY = 32
THROUGHPUT_ROUNDS = 4
"""Rounds of the single-submit throughput, taken in turn by the owner and the foreign node."""
BENCH = "shard_scaling"

results: list[dict[str, Any]] = []


def emit(**fields: Any) -> None:
    record = {"bench": BENCH, **fields}
    results.append(record)
    print(json.dumps(record), flush=True)


class CpuMeter:
    def __init__(self, server_pids: list[int], worker_pids: list[int]) -> None:
        self.server_pids = server_pids
        self.worker_pids = worker_pids
        self.before = self._sample()

    def _sample(self) -> tuple[list[float], float, tuple[int, int]]:
        servers = [process_cpu_s(pid) for pid in self.server_pids]
        workers = sum(process_cpu_s(pid) for pid in self.worker_pids)
        return servers, workers, machine_ticks()

    def stop(self) -> dict[str, Any]:
        servers, workers, (busy, total) = self._sample()
        before_servers, before_workers, (before_busy, before_total) = self.before
        per_server = [after - before for after, before in zip(servers, before_servers, strict=True)]
        return {
            "server_cpu_s": round(sum(per_server), 2),
            "server_cpu_s_each": [round(spent, 2) for spent in per_server],
            "workers_cpu_s": round(workers - before_workers, 2),
            "machine_busy_pct": round(100.0 * (busy - before_busy) / max(total - before_total, 1), 1),
        }


# ------------------------------------------------------------------------------- workers


async def _serve_worker(target: str, pool: str, slots: int) -> None:
    from cronoq.client import Lease, Worker

    async def noop(lease: Lease) -> None:
        return None

    worker = Worker(
        target,
        pool,
        noop,
        slots=slots,
        token=os.environ.get("CRONOQ_WORKER_TOKEN"),
        name=f"scaling-{os.getpid()}",
        grace=0.0,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(worker.stop(grace=0.0)))
    running = asyncio.ensure_future(worker.run())
    await worker.wait_registered(60)
    print("registered", flush=True)
    await running


def worker_main(argv: list[str]) -> None:
    from cronoq.client import prefer_poller_endpoints

    prefer_poller_endpoints()  # as server_worker.py: a worker tuned for throughput
    target, pool, slots = argv[0], argv[1], int(argv[2])
    run_loop(_serve_worker(target, pool, slots))


class WorkerProcesses:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, target: str, pool: str, count: int, slots: int) -> None:
        for _ in range(count):
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "worker", target, pool, str(slots)],
                    stdout=subprocess.PIPE,
                    text=True,
                    cwd=ROOT,
                    env=self.env,
                )
            )

    def wait_registered(self) -> None:
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if "registered" not in line:
                raise RuntimeError(f"a worker did not register (exit code {proc.poll()})")

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


# ------------------------------------------------------------------------------- cluster


@dataclass
class Bench:
    cluster: Any
    clients: dict[str, Any]  # shard name -> client-role Client on that node
    readers: dict[str, Any]  # shard name -> metrics-role Client on that node
    workers: WorkerProcesses
    pools: list[str]
    owner: dict[str, str]  # pool -> shard name

    async def close(self) -> None:
        for client in [*self.clients.values(), *self.readers.values()]:
            await client.close()
        self.workers.stop()
        await self.cluster.stop()


async def start_bench(shards: int, args: argparse.Namespace, workdir: Path) -> Bench:
    from cronoq.cluster.launcher import Cluster
    from cronoq.cluster.layout import ClusterOptions

    from cronoq.client import Client

    pending = max(4 * args.tasks, 100_000)
    options = ClusterOptions(
        shards=shards,
        replicas=1,
        proxy=False,
        base_port=0,
        state=workdir / f"cluster-{shards}",
        dsn=args.dsn,
        schema_prefix=f"bench_{uuid.uuid4().hex[:8]}_",
        pool_max=max(args.slots, 64),
        limits={
            "max_tasks_per_batch": BATCH,
            "max_pending_total": pending,
            "max_pending_per_pool": pending,
            "max_concurrent_requests": 4096,
        },
        shutdown_grace_s=0.5,
        server_env={"CRONOQ_LOG": "warning"},
        restart=False,  # a server that dies must fail the run, not be hidden by a restart
    )
    cluster = Cluster(options, say=lambda text: print(text, file=sys.stderr, flush=True))
    await cluster.start()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CRONOQ_WORKER_TOKEN": cluster.token("worker")}
    workers = WorkerProcesses(env)
    try:
        for shard in cluster.shards:
            for pool in shard.plan.pools:
                workers.start(shard.plan.grpc_target, pool, args.workers, args.slots)
        workers.wait_registered()
    except BaseException:
        workers.stop()
        await cluster.stop()
        raise
    grpc_options = [("grpc.max_receive_message_length", 64 << 20)]
    clients = {
        s.name: Client(s.plan.grpc_target, token=cluster.token("client"), options=grpc_options) for s in cluster.shards
    }
    readers = {s.name: Client(s.plan.grpc_target, token=cluster.token("metrics")) for s in cluster.shards}
    pools = [pool for shard in cluster.shards for pool in shard.plan.pools]
    owner = {pool: shard.name for shard in cluster.shards for pool in shard.plan.pools}
    return Bench(cluster, clients, readers, workers, pools, owner)


async def succeeded_by_pool(bench: Bench) -> dict[str, int]:
    """Succeeded count of every pool. Each node answers for its own pools at least (and for all
    of them once the router merges snapshots), so the highest count per pool is the true one."""
    counts: dict[str, int] = dict.fromkeys(bench.pools, 0)
    snapshots = await asyncio.gather(*(reader.snapshot() for reader in bench.readers.values()))
    for snapshot in snapshots:
        for pool in snapshot.pools:
            if pool.name in counts:
                counts[pool.name] = max(counts[pool.name], pool.succeeded)
    return counts


async def wait_succeeded(bench: Bench, target: int, timeout: float) -> float:
    deadline = time.perf_counter() + timeout
    while True:
        done = sum((await succeeded_by_pool(bench)).values())
        now = time.perf_counter()
        if done >= target:
            return now
        if now > deadline:
            raise TimeoutError(f"only {done} of {target} tasks succeeded after {timeout} s")
        await asyncio.sleep(POLL_S)


def is_refusal(exc: BaseException) -> bool:
    return getattr(exc, "code", None) == "failed_precondition"


# --------------------------------------------------------------------------------- cases


async def case_round_robin(bench: Bench, shards: int, args: argparse.Namespace, store: str) -> None:
    from cronoq.client import task

    nodes = list(bench.clients)
    n = len(bench.pools)
    batches: list[tuple[str, str, list[Any]]] = []
    for index, base in enumerate(range(0, args.tasks, BATCH)):
        pool = bench.pools[index % n]
        node = nodes[(index // n) % len(nodes)]
        specs = [task(i, pool=pool) for i in range(base, min(base + BATCH, args.tasks))]
        batches.append((pool, node, specs))
    # Warm-up: one small batch per (pool, node) pair, which also tells whether the router forwards.
    router = True
    warm = 0
    for pool in bench.pools:
        for node in nodes:
            try:
                await bench.clients[node].submit_batch([task(-1, pool=pool) for _ in range(10)])
            except Exception as exc:
                if not is_refusal(exc):
                    raise
                router = False
                await bench.clients[bench.owner[pool]].submit_batch([task(-1, pool=pool) for _ in range(10)])
            warm += 10
    await wait_succeeded(bench, warm, 60)
    baseline = sum((await succeeded_by_pool(bench)).values())
    work = iter(batches)
    forwarded = 0

    async def submitter() -> None:
        nonlocal forwarded
        for pool, node, specs in work:
            target = node if router else bench.owner[pool]
            answer = await bench.clients[target].submit_batch(specs)
            if len(answer) != len(specs):
                raise RuntimeError(f"a batch of {len(specs)} was answered with {len(answer)} ids")
            forwarded += target != bench.owner[pool]

    servers = [r for r in bench.cluster.replicas if r.pid]
    meter = CpuMeter([r.pid for r in servers], bench.workers.pids)
    started = time.perf_counter()
    await asyncio.gather(*(submitter() for _ in range(args.submitters)))
    submitted = time.perf_counter()
    done = await wait_succeeded(bench, baseline + args.tasks, args.timeout)
    cpu = meter.stop()
    elapsed = done - started
    emit(
        case="submit_batch_round_robin",
        shards=shards,
        store=store,
        tasks=args.tasks,
        batch=BATCH,
        submitters=args.submitters,
        workers_per_pool=args.workers,
        slots_per_worker=args.slots,
        router=router,
        forwarded_batches=forwarded,
        batches=len(batches),
        tasks_per_s=round(args.tasks / elapsed),
        submit_tasks_per_s=round(args.tasks / (submitted - started)),
        wall_s=round(elapsed, 3),
        cpu_s_per_1000_tasks=round(cpu["server_cpu_s"] * 1000 / args.tasks, 3),
        # Every shard's server CPU over the tasks of its own pools (each shard gets 1/N of them).
        server_cpu_us_per_task_by_shard={
            replica.name: round(spent * 1e6 / (args.tasks / shards), 1)
            for replica, spent in zip(servers, cpu.pop("server_cpu_s_each"), strict=True)
        },
        server_cpu_us_per_task=round(cpu["server_cpu_s"] * 1e6 / args.tasks, 1),
        workers_cpu_us_per_task=round(cpu["workers_cpu_s"] * 1e6 / args.tasks, 1),
        **cpu,
    )


async def _submit_gated(gate: asyncio.Semaphore, client: Any, pool: str) -> None:
    async with gate:
        await client.submit(None, pool=pool)


async def case_forwarding(bench: Bench, args: argparse.Namespace, store: str) -> None:
    """Single Submits of ``pool2`` to its owner (s2) and through the other node (s1), interleaved
    so both see the same machine: latency samples alternate call by call, throughput rounds node
    by node. Emits ``single_submit_owner``, ``single_submit_foreign`` and ``forwarding_cost``."""
    pool = bench.pools[1]  # pool2, owned by s2
    nodes = {"single_submit_owner": "s2", "single_submit_foreign": "s1"}
    try:
        for node in nodes.values():
            await bench.clients[node].submit({"warm": True}, pool=pool)
    except Exception as exc:
        if not is_refusal(exc):
            raise
        emit(case="single_submit_foreign", shards=len(bench.clients), store=store, node="s1", pool=pool,
             skipped=f"the node refused to forward (no router in this build?): {exc}"[:500])  # fmt: skip
        return
    for _ in range(20):  # warm the channels and the peer connection
        for node in nodes.values():
            await bench.clients[node].submit(None, pool=pool)
    latencies: dict[str, list[float]] = {case: [] for case in nodes}
    order = list(nodes.items())
    for index in range(args.latency_samples):
        for case, node in order if index % 2 == 0 else order[::-1]:
            started = time.perf_counter()
            await bench.clients[node].submit(None, pool=pool)
            latencies[case].append(time.perf_counter() - started)
    elapsed: dict[str, float] = dict.fromkeys(nodes, 0.0)
    cpu: dict[str, dict[str, float]] = {case: {} for case in nodes}
    rounds = THROUGHPUT_ROUNDS
    per_round = max(1, args.single_tasks // rounds)
    for index in range(rounds):
        for case, node in order if index % 2 == 0 else order[::-1]:
            gate = asyncio.Semaphore(SINGLE_CONCURRENCY)
            meter = CpuMeter([r.pid for r in bench.cluster.replicas if r.pid], bench.workers.pids)
            started = time.perf_counter()
            await asyncio.gather(*(_submit_gated(gate, bench.clients[node], pool) for _ in range(per_round)))
            elapsed[case] += time.perf_counter() - started
            for key, value in meter.stop().items():
                if key != "server_cpu_s_each":
                    cpu[case][key] = cpu[case].get(key, 0.0) + value
    tasks = per_round * rounds
    figures: dict[str, dict[str, float]] = {}
    for case, node in nodes.items():
        figures[case] = {"p50_ms": ms(percentile(latencies[case], 0.5)), "tasks_per_s": round(tasks / elapsed[case])}
        emit(
            case=case,
            shards=len(bench.clients),
            store=store,
            node=node,
            pool=pool,
            owner=bench.owner[pool],
            latency_samples=len(latencies[case]),
            p50_ms=figures[case]["p50_ms"],
            p99_ms=ms(percentile(latencies[case], 0.99)),
            tasks=tasks,
            concurrency=SINGLE_CONCURRENCY,
            tasks_per_s=figures[case]["tasks_per_s"],
            cpu_s_per_1000_tasks=round(cpu[case]["server_cpu_s"] * 1000 / tasks, 3),
            server_cpu_s=round(cpu[case]["server_cpu_s"], 2),
            workers_cpu_s=round(cpu[case]["workers_cpu_s"], 2),
            machine_busy_pct=round(cpu[case]["machine_busy_pct"] / rounds, 1),
        )
    owner, foreign = figures["single_submit_owner"], figures["single_submit_foreign"]
    emit(
        case="forwarding_cost",
        shards=len(bench.clients),
        store=store,
        p50_extra_pct=round(100 * (foreign["p50_ms"] / owner["p50_ms"] - 1), 1),
        throughput_loss_pct=round(100 * (1 - foreign["tasks_per_s"] / owner["tasks_per_s"]), 1),
    )


# ---------------------------------------------------------------------------------- main


async def drop_schemas(dsn: str, prefix: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        for row in await conn.fetch("SELECT nspname FROM pg_namespace WHERE nspname LIKE $1", prefix + "%"):
            await conn.execute(f'DROP SCHEMA IF EXISTS "{row["nspname"]}" CASCADE')
    finally:
        await conn.close()


async def main_async(args: argparse.Namespace) -> None:
    store = "postgres" if args.dsn else "sqlite"
    counts = [int(n) for n in args.shards.split(",") if n]
    with tempfile.TemporaryDirectory(prefix="cronoq-shard-bench-") as tmp:
        for shards in counts:
            bench = None
            try:
                bench = await start_bench(shards, args, Path(tmp))
                await case_round_robin(bench, shards, args, store)
                if shards == 2:
                    await case_forwarding(bench, args, store)
                    # What one bare grpc-aio hop costs here, for reading the forwarding figures.
                    floor = await grpc_hop.measure(args.latency_samples, args.single_tasks)
                    emit(case="grpc_hop_floor", shards=2, store="none", p50_ms=floor["proxied_p50_ms"], **floor)
            except Exception as exc:
                emit(
                    case="submit_batch_round_robin",
                    shards=shards,
                    store=store,
                    error=f"{type(exc).__name__}: {exc}"[-1500:],
                )
            finally:
                if bench is not None:
                    await bench.close()
                if args.dsn and bench is not None:
                    await drop_schemas(args.dsn, bench.cluster.options.schema_prefix)
    print_table()


def print_table() -> None:
    print()
    print(f"{'case':28} {'shards':>6} {'tasks/s':>9} {'cpu s/1000':>10} {'p50 ms':>8} {'p99 ms':>8}  note")
    for r in results:
        note = "skipped" if "skipped" in r else ("error" if "error" in r else "")
        if r.get("router") is False:
            note = "no router: submitted to owners"
        if "server_cpu_us_per_task_by_shard" in r:
            shares = ", ".join(f"{name} {us:g}" for name, us in r["server_cpu_us_per_task_by_shard"].items())
            note = f"server CPU µs per task of its shard: {shares} {note}".rstrip()
        print(
            f"{r['case']:28} {r['shards']:>6} {r.get('tasks_per_s', '-')!s:>9} "
            f"{r.get('cpu_s_per_1000_tasks', '-')!s:>10} {r.get('p50_ms', '-')!s:>8} {r.get('p99_ms', '-')!s:>8}  "
            f"{note}"
        )


def run_loop(coro: Any) -> Any:
    if os.environ.get("CRONOQ_NO_UVLOOP") != "1":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--shards", default="1,2,4", help="shard counts to run (default 1,2,4)")
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks of each round-robin case")
    parser.add_argument("--workers", type=int, default=1, help="worker processes per pool")
    parser.add_argument("--slots", type=int, default=256, help="slots of each worker")
    parser.add_argument("--submitters", type=int, default=4, help="SubmitBatch calls in flight")
    parser.add_argument("--latency-samples", type=int, default=1000, help="sequential Submits for p50/p99")
    parser.add_argument("--single-tasks", type=int, default=5000, help="Submits for the single-submit throughput")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for completion")
    parser.add_argument(
        "--dsn",
        default=os.environ.get("CRONOQ_BENCH_DSN") or None,
        help="Postgres URL (default: $CRONOQ_BENCH_DSN; none: SQLite)",
    )
    args = parser.parse_args()
    if args.tasks < BATCH:
        parser.error(f"--tasks must be at least {BATCH}")
    run_loop(main_async(args))


if __name__ == "__main__":
    main()
