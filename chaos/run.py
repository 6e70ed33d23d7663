"""One run of one drill: a real cluster under load from producer and worker processes, the fault,
the drain, then the checker over the ledger and what the cluster stored.

Order of a run: (Postgres, fault proxy,) cluster with every shard led; workers; the recurring
schedule; producers; the drill's ``inject`` (which waits for some load before it strikes and
leaves everything running again); producers finish; the drain waits for every acknowledged task
to succeed (bounded); every task the cluster knows is listed; then everything is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from cronoq.cluster.launcher import Cluster, RunningShard
from cronoq.cluster.layout import ClusterOptions, Placement, pools_of_shard, shard_name
from cronoq.cluster.replica import Replica

from cronoq.client import Client, ClientError, task

from .checker import CheckResult, Execution, Fault, History, StoredTask, check
from .drills import Drill
from .faultproxy import FaultProxy
from .ledger import Ledger, Submission
from .netns import POSTGRES_NODE, Network, cluster_network
from .netns import available as netns_available
from .netns import placements as network_placements
from .ownership import Move
from .postgres import ThrowawayPostgres
from .processes import ChildProcess, LeaderMonitor
from .producer import ProducerPlan

__all__ = ["RunContext", "RunOptions", "RunOutcome", "history_from_ledger", "outcome_json", "run_drill"]

RECURRING_NAME = "chaos-tick"
WORK_S = 0.005


@dataclass(frozen=True, slots=True)
class RunOptions:
    shards: int = 1
    replicas: int = 2
    tasks: int = 2000
    rate: float = 200.0
    seed: int = 1
    store: str = "sqlite"
    pause_s: float = 15.0
    """How long ``leader-pause`` keeps the leader stopped (and other drills their outages, scaled)."""
    dsn: str | None = None
    """A Postgres to make schemas in (drills that stop Postgres always get a throwaway one)."""
    producers: int = 2
    workers_per_shard: int = 2
    worker_slots: int = 16
    drain_timeout_s: float = 120.0
    recurring: bool = True
    dep_every: int = 10
    backlog: int = 0
    """Live tasks (scheduled an hour ahead) put into the first shard before the load, so a new
    leader has that many to recover (the checker does not follow them)."""
    net: str = "auto"
    """How partition drills cut nodes: ``netns`` (namespaces and routes), ``proxy`` (loopback
    proxies), or ``auto``: ``netns`` where this process may make namespaces."""


@dataclass(slots=True)
class RunOutcome:
    drill: str
    run: int
    seed: int
    options: RunOptions
    result: CheckResult
    duration_s: float
    drained: bool
    history: History
    notes: list[str] = field(default_factory=list)
    net: str | None = None
    """``netns`` or ``proxy`` for drills that partition nodes."""


class RunContext:
    """What a drill's ``inject`` works with."""

    def __init__(self, drill: Drill, options: RunOptions, run_dir: Path, rng: random.Random) -> None:
        self.drill = drill
        self.options = options
        self.run_dir = run_dir
        self.rng = rng
        self.ledger = Ledger(run_dir / "ledger.db")
        self.cluster: Cluster | None = None
        self.postgres: ThrowawayPostgres | None = None
        self.proxy: FaultProxy | None = None
        self.network: Network | None = None
        self.monitor: LeaderMonitor | None = None
        self.workers: list[ChildProcess] = []
        self.producers: list[ChildProcess] = []
        self.notes: list[str] = []

    # ---------------------------------------------------------------------------------- access

    @property
    def running(self) -> Cluster:
        assert self.cluster is not None
        return self.cluster

    def shard(self, name: str | None = None) -> RunningShard:
        """A shard by name; without one, a shard picked by the seed."""
        shards = self.running.shards
        return self.running.shard(name) if name else shards[self.rng.randrange(len(shards))]

    async def leader(self, shard: RunningShard, timeout: float = 60.0) -> Replica:
        """The replica serving ``shard`` now (waiting for one)."""
        assert self.monitor is not None
        await self.monitor.wait_for(shard.name, lambda names: names is not None and "," not in names, timeout)
        names = self.monitor.current.get(shard.name)
        if names is None:
            raise RuntimeError(f"shard {shard.name} has no leader after {timeout:.0f}s")
        return shard.replica(names)

    async def wait_new_leader(self, shard: RunningShard, old: str | None, timeout: float = 60.0) -> bool:
        """Wait until one replica other than ``old`` serves ``shard``."""
        assert self.monitor is not None
        return await self.monitor.wait_for(
            shard.name, lambda names: names is not None and "," not in names and names != old, timeout
        )

    async def wait_takeover(self, shard: RunningShard, old: str, timeout: float = 90.0) -> bool:
        """After ``old`` was hit: wait until the monitor saw it stop serving, then until some replica
        (a standby, or ``old`` itself restarted) serves the shard again."""
        assert self.monitor is not None
        await self.monitor.wait_for(shard.name, lambda names: names != old, 5.0)
        return await self.wait_serving(shard, timeout)

    async def wait_serving(self, shard: RunningShard, timeout: float = 60.0) -> bool:
        assert self.monitor is not None
        return await self.monitor.wait_for(shard.name, lambda names: names is not None, timeout)

    async def wait_load(self, fraction: float) -> None:
        """Wait until producers have had ``fraction`` of the tasks acknowledged (or have all exited)."""
        wanted = int(self.options.tasks * fraction)
        while True:
            done = self.ledger.query("SELECT count(*) FROM submissions WHERE acked = 1")[0][0]
            if isinstance(done, int) and done >= wanted:
                return
            if not any(p.alive for p in self.producers):
                return
            await asyncio.sleep(0.1)

    @contextlib.asynccontextmanager
    async def fault(self, name: str, target: str, shard: str | None = None, detail: str = "") -> AsyncIterator[None]:
        """Record a fault from entering to leaving the block."""
        seq = self.ledger.fault_started(name, target, shard, detail)
        try:
            yield
        finally:
            self.ledger.fault_ended(seq)

    def note(self, text: str) -> None:
        self.notes.append(text)

    async def restart_worker(self, worker: ChildProcess) -> None:
        await worker.wait(5.0)
        worker.start()


# ================================================================================== the run


def _producer_plans(ctx: RunContext, run_tag: str) -> list[tuple[ProducerPlan, str]]:
    options, drill = ctx.options, ctx.drill
    cluster = ctx.running
    plans = []
    producers = max(options.producers, drill.min_producers)
    per = max(1, options.tasks // producers)
    # Each shard's first pool, then the others: with one pool per shard, one producer per shard.
    pools = [(shard, pool) for depth in range(drill.pools_per_shard) for shard in cluster.shards
             for pool in shard.plan.pools[depth : depth + 1]]  # fmt: skip
    for index in range(producers):
        shard, pool = pools[index % len(pools)]
        # Producers enter through s1's endpoint: tasks of other shards' pools are forwarded.
        target = cluster.shards[0].plan.grpc_target
        count = per if index < producers - 1 else options.tasks - per * (producers - 1)
        plan = ProducerPlan(
            name=f"p{index + 1}",
            target=target,
            ledger=str(ctx.ledger.path),
            pool=pool,
            count=count,
            rate=options.rate / producers,
            seed=options.seed * 1000 + index,
            key_prefix=f"{run_tag}-p{index + 1}",
            dep_every=options.dep_every,
            task_timeout_s=drill.task_timeout_s,
            work_s=WORK_S,
            slow_fraction=drill.slow_fraction,
            slow_s=drill.slow_s,
        )
        plans.append((plan, shard.name))
    return plans


async def _fill_backlog(client: Client, pool: str, count: int) -> None:
    """``count`` live tasks: children of one task due in an hour, so they wait (blocked) through
    the whole run; in batches of 1000, four batches in flight."""
    parent = (await client.submit({"work": 0.0, "slow": 0.0}, pool=pool, start_in=3600.0)).id
    spec = task({"work": 0.0, "slow": 0.0}, pool=pool, after=parent)
    slots = asyncio.Semaphore(4)

    async def batch(size: int) -> None:
        async with slots:
            await client.submit_batch([spec] * size)

    await asyncio.gather(*(batch(min(1000, count - start)) for start in range(0, count, 1000)))


async def _drain(ctx: RunContext, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if ctx.ledger.acked_ids() <= ctx.ledger.finished_ids():
            return True
        await asyncio.sleep(0.2)
    return False


async def _stored_tasks(client: Client, pools: list[str], settle_s: float = 30.0) -> tuple[list[StoredTask], list[str]]:
    """Every task the cluster reports (all shards), with the output of those that took more than
    one attempt (only those can carry a stale outcome). A listing that missed a shard (one still
    electing its leader after the last fault) is read again from the start for up to ``settle_s``:
    a shard that did not answer must not count as tasks lost."""
    deadline = asyncio.get_running_loop().time() + settle_s
    while True:
        tasks, problems = await _list_once(client, pools)
        if not problems or asyncio.get_running_loop().time() >= deadline:
            return tasks, problems
        await asyncio.sleep(0.5)


async def _list_once(client: Client, pools: list[str]) -> tuple[list[StoredTask], list[str]]:
    tasks: list[StoredTask] = []
    problems: list[str] = []
    cursor = 0
    while True:
        page = await client.list_tasks(pools=pools, after=cursor, limit=1000)
        if page.unavailable_shards:
            problems.append(f"listing missed shards {', '.join(page.unavailable_shards)}")
        for info in page.tasks:
            output = None
            if info.status == "succeeded" and info.attempt > 1 and info.output_available:
                with contextlib.suppress(ClientError, TimeoutError):
                    output = (await client.wait(info.id, timeout=5.0)).output
            tasks.append(
                StoredTask(
                    info.id,
                    info.key or None,
                    info.status,
                    info.attempt,
                    info.max_attempts,
                    info.created_at or 0.0,
                    output,
                )
            )
        if page.next_after is None:
            return tasks, problems
        cursor = page.next_after


def _undrained(ledger: Ledger, stored: list[StoredTask]) -> list[str]:
    """For a run that did not drain: what the ledger and the store say of the tasks it waited for."""
    by_id = {task.id: task for task in stored}
    waiting = sorted(ledger.acked_ids() - ledger.finished_ids())
    notes = [f"drain: {len(waiting)} acknowledged task(s) never succeeded in the ledger"]
    for task_id in waiting[:5]:
        task = by_id.get(task_id)
        runs = ledger.query("SELECT attempt, worker, outcome FROM executions WHERE task_id = ?", (task_id,))
        state = "missing from the store" if task is None else f"{task.status} at attempt {task.attempt}"
        notes.append(f"drain: task {task_id} is {state}; executions {runs}")
    return notes


def history_from_ledger(ledger: Ledger) -> History:
    """Everything a run recorded, as the checker takes it (offline too: ``cronoq chaos check``)."""
    history = History()
    history.stored = [
        StoredTask(
            int(i),
            None if key is None else str(key),
            str(status),
            int(attempt),
            int(most),
            float(at),
            None if output is None else bytes(output),
        )
        for i, key, status, attempt, most, at, output in ledger.query("SELECT * FROM stored_tasks")
    ]
    history.leadership = [
        (str(shard), float(at), None if leader is None else str(leader))
        for shard, at, leader in ledger.query("SELECT shard, at, leader FROM leadership ORDER BY rowid")
    ]
    for row in ledger.query("SELECT * FROM submissions"):
        producer, seq, key, pool, parent, task_id, acked, dup, tries, sent, acked_at, error = row
        history.submissions.append(
            Submission(
                str(producer),
                int(seq),
                str(key),
                str(pool),
                None if parent is None else str(parent),
                None if task_id is None else int(task_id),
                bool(acked),
                bool(dup),
                int(tries),
                float(sent),
                None if acked_at is None else float(acked_at),
                None if error is None else str(error),
            )
        )
    history.client_errors = [(str(p), float(at), str(c)) for p, at, c in ledger.query("SELECT * FROM client_errors")]
    for table, target in (("executions", history.executions), ("repeats", history.repeats)):
        columns = "task_id, attempt, worker, lease, " + (
            "key, started_at, finished_at, outcome" if table == "executions" else "'', started_at, NULL, NULL"
        )
        for task_id, attempt, worker, lease, key, started, finished, outcome in ledger.query(
            f"SELECT {columns} FROM {table}"
        ):
            target.append(
                Execution(
                    int(task_id),
                    int(attempt),
                    str(worker),
                    int(lease),
                    str(key),
                    float(started),
                    None if finished is None else float(finished),
                    None if outcome is None else str(outcome),
                )
            )
    history.moves = [
        Move(
            str(pool),
            int(version),
            str(source),
            str(target),
            float(asked),
            None if done is None else float(done),
            str(fault),
        )
        for pool, version, source, target, asked, done, fault in ledger.query("SELECT * FROM moves ORDER BY rowid")
    ]
    for name, target_name, shard, started, ended in ledger.query(
        "SELECT name, target, shard, started_at, ended_at FROM faults ORDER BY seq"
    ):
        history.faults.append(
            Fault(
                str(name),
                str(target_name),
                None if shard is None else str(shard),
                float(started),
                None if ended is None else float(ended),
            )
        )
    return history


async def run_drill(
    drill: Drill, options: RunOptions, *, run: int = 1, keep_dir: Path | None = None, say: object = print
) -> RunOutcome:
    """One run of ``drill``; the seed of the run is ``options.seed``."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"cronoq-chaos-{drill.name}-"))
    rng = random.Random(options.seed)
    ctx = RunContext(drill, options, run_dir, rng)
    started = time.monotonic()
    drained = False
    stored: list[StoredTask] = []
    run_tag = f"{drill.name}-r{run}-s{options.seed}"
    net = _net_of(drill, options)
    shard_names = [shard_name(number) for number in range(1, options.shards + 1)]
    replica_names = [f"{shard}-r{index}" for shard in shard_names for index in range(1, options.replicas + 1)]
    placements: dict[str, Placement] = {}
    try:
        dsn = options.dsn if options.store == "postgres" else None
        if net == "netns":
            ctx.network = cluster_network(shard_names, replica_names, postgres=options.store == "postgres")
            await asyncio.to_thread(ctx.network.create)
            placements = network_placements(ctx.network, shard_names, replica_names)
        if options.store == "postgres" and (dsn is None or drill.own_postgres or ctx.network is not None):
            # In namespaces the servers cannot reach a Postgres on loopback: the drill's own runs
            # in a namespace of its own, which the partition can cut too.
            network = ctx.network
            ctx.postgres = (
                ThrowawayPostgres()
                if network is None
                else ThrowawayPostgres(host=network.address(POSTGRES_NODE), prefix=network.prefix(POSTGRES_NODE))
            )
            await asyncio.to_thread(ctx.postgres.start)
            dsn = ctx.postgres.dsn
        if dsn is not None and drill.fault_proxy and ctx.network is None:
            port = int(dsn.rsplit(":", 1)[1].split("/", 1)[0])
            ctx.proxy = FaultProxy(port)
            await ctx.proxy.start()
            dsn = dsn.replace(f":{port}/", f":{ctx.proxy.port}/")
        cluster_options = ClusterOptions(
            shards=options.shards,
            replicas=options.replicas,
            dsn=dsn,
            state=run_dir / "cluster",
            base_port=0,
            # Unique per run (not from the seed): runs sharing a --dsn must not share schemas.
            schema_prefix=f"chaos_{uuid.uuid4().hex[:12]}_",
            restart=drill.restart,
            pool_settings=dict(drill.pool_settings),
            pools_per_shard=drill.pools_per_shard,
            limits={"max_pending_per_pool": 2 * options.backlog + 100_000} if options.backlog else {},
            shutdown_grace_s=1.0,
            placements=placements,
            # The namespaces' addresses are not loopback; the drill's own network is trusted.
            insecure_peer_http=bool(placements),
        )
        ctx.cluster = Cluster(cluster_options, say=lambda text: ctx.notes.append(text))
        if ctx.proxy is not None:
            # Before the start: the servers' first connections (the lock session) must be known too.
            running = ctx.cluster
            ctx.proxy.owners = lambda: _replica_pids(running)
        await ctx.cluster.start()
        ctx.monitor = LeaderMonitor(ctx.cluster.shards)
        ctx.monitor.start()
        worker_token, client_token = ctx.cluster.token("worker"), ctx.cluster.token("client")
        logs = run_dir / "logs"
        logs.mkdir(exist_ok=True)
        for serving, pool in [(shard, pool) for shard in ctx.cluster.shards for pool in shard.plan.pools]:
            for index in range(options.workers_per_shard):
                first = pool == serving.plan.pools[0]
                name = f"{serving.name}-w{index + 1}" if first else f"{pool}-w{index + 1}"
                worker = ChildProcess(
                    name,
                    "cronoq.chaos.worker",
                    [
                        serving.plan.grpc_target,
                        pool,
                        name,
                        str(ctx.ledger.path),
                        str(options.worker_slots),
                    ],
                    token=worker_token,
                    log=logs / f"{name}.log",
                )
                worker.start()
                ctx.workers.append(worker)
        admin = Client(ctx.cluster.shards[0].plan.grpc_target, token=ctx.cluster.token("admin"))
        if options.recurring:
            # Every second, one occurrence; the checker sees each occurrence's key at most once.
            await admin.add_recurring(RECURRING_NAME, "* * * * * *", {"work": WORK_S, "slow": 0.0}, key=RECURRING_NAME,
                                      pool=ctx.cluster.shards[0].plan.pools[0])  # fmt: skip
        if options.backlog:
            await _fill_backlog(admin, ctx.cluster.shards[0].plan.pools[0], options.backlog)
        for plan, _shard in _producer_plans(ctx, run_tag):
            path = run_dir / f"{plan.name}.json"
            plan.write(path)
            producer = ChildProcess(plan.name, "cronoq.chaos.producer", [str(path)], token=client_token,
                                    log=logs / f"{plan.name}.log")  # fmt: skip
            producer.start()
            ctx.producers.append(producer)
        await drill.inject(ctx)
        for producer in ctx.producers:
            await producer.wait(options.drain_timeout_s + 120.0)
        drained = await _drain(ctx, options.drain_timeout_s)
        if options.recurring:
            with contextlib.suppress(ClientError, TimeoutError):
                await admin.remove_recurring(RECURRING_NAME)
        pools = [pool for number in range(1, options.shards + 1)
                 for pool in pools_of_shard(number, drill.pools_per_shard)]  # fmt: skip
        lister = Client(ctx.cluster.shards[0].plan.grpc_target, token=ctx.cluster.token("admin"))
        try:
            stored, problems = await _stored_tasks(lister, pools)
            ctx.notes.extend(problems)
            if not drained:
                ctx.notes.extend(_undrained(ctx.ledger, stored))
        finally:
            await lister.close()
            await admin.close()
    finally:
        for child in [*ctx.producers, *ctx.workers]:
            await child.stop(5.0)
        if ctx.monitor is not None:
            await ctx.monitor.close()
        if ctx.cluster is not None:
            await ctx.cluster.stop()
        if ctx.proxy is not None:
            await ctx.proxy.close()
        if ctx.postgres is not None:
            await asyncio.to_thread(ctx.postgres.destroy)
        if ctx.network is not None:
            await asyncio.to_thread(ctx.network.destroy)
    # Kept with the run, so the checker can judge it again offline from the ledger alone.
    if ctx.monitor is not None:
        ctx.ledger.add_leadership(ctx.monitor.changes)
    ctx.ledger.add_stored((t.id, t.key, t.status, t.attempt, t.max_attempts, t.submitted_at, t.output) for t in stored)
    history = history_from_ledger(ctx.ledger)
    ctx.ledger.close()
    result = check(history)
    if keep_dir is not None:
        keep_dir.mkdir(parents=True, exist_ok=True)
        target = keep_dir / f"{drill.name}-run{run}"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(run_dir, target, ignore=shutil.ignore_patterns("*.db-wal", "*.db-shm", "*.sock"))
    shutil.rmtree(run_dir, ignore_errors=True)
    return RunOutcome(drill.name, run, options.seed, options, result, time.monotonic() - started, drained, history,
                      ctx.notes, net)  # fmt: skip


def _net_of(drill: Drill, options: RunOptions) -> str | None:
    """How this run partitions nodes (None: the drill does not)."""
    if not drill.netns:
        return None
    if options.net == "auto":
        return "netns" if netns_available() else "proxy"
    return options.net


def _replica_pids(cluster: Cluster) -> dict[int, str]:
    """The pids of the cluster's servers now (they change when a replica restarts)."""
    return {replica.pid: replica.name for replica in cluster.replicas if replica.pid is not None}


def outcome_json(outcome: RunOutcome) -> str:
    """The run as one JSON line."""
    result = outcome.result
    measures = result.faults
    leaderless = [m.leaderless_s for m in measures if m.leaderless_s is not None]
    return json.dumps(
        {
            "drill": outcome.drill,
            "run": outcome.run,
            "seed": outcome.seed,
            "store": outcome.options.store,
            "shards": outcome.options.shards,
            "replicas": outcome.options.replicas,
            "net": outcome.net,
            "tasks": result.tasks,
            "acknowledged": result.acknowledged,
            "lost": result.lost,
            "repeated": result.repeated,
            "stale_writes": result.stale_writes,
            "stale_outcomes": result.stale_outcomes,
            "late_leases": result.late_leases,
            "ok": result.ok and outcome.drained,
            "drained": outcome.drained,
            "violations": [{"rule": v.rule, "detail": v.detail} for v in result.violations],
            "takeover_s": leaderless,
            "faults": [
                {
                    "name": m.name,
                    "target": m.target,
                    "shard": m.shard,
                    "duration_s": round(m.duration_s, 3),
                    "leaderless_s": None if m.leaderless_s is None else round(m.leaderless_s, 3),
                    "unavailable_s": round(m.unavailable_s, 3),
                    "client_errors": m.errors,
                    "throughput_dip": None if m.dip is None else round(m.dip, 3),
                    "recovery_s": None if m.recovery_s is None else round(m.recovery_s, 3),
                }
                for m in measures
            ],
            "moves": [
                {
                    "pool": m.pool,
                    "version": m.version,
                    "from": m.source,
                    "to": m.target,
                    "fault": m.fault,
                    "duration_s": None if m.duration_s is None else round(m.duration_s, 3),
                    "admission_gap_s": None if m.admission_gap_s is None else round(m.admission_gap_s, 3),
                    "others_ratio": None if m.others_ratio is None else round(m.others_ratio, 3),
                }
                for m in result.moves
            ],
            "duration_s": round(outcome.duration_s, 2),
            "client_error_codes": dict(Counter(code for _, _, code in outcome.history.client_errors)),
            "unacknowledged_errors": sorted({s.error or "" for s in outcome.history.submissions if not s.acked})[:5],
            "notes": [note for note in outcome.notes if _noteworthy(note)],
        },
        sort_keys=False,
    )


def _noteworthy(note: str) -> bool:
    """The drill's own remarks and the launcher's warnings; not its routine start-up lines."""
    return (
        note.startswith("!!")
        or "no leader" in note
        or "took over" in note
        or "found no" in note
        or ("listing missed" in note)
    )
