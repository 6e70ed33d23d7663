"""``make run``: a sharded cronoq cluster on this machine, and what a node of one shard does with
work for the other.

It starts 2 shards x 2 replicas of ``cronoq-server`` on SQLite files in a temporary folder
(``cronoq.cluster``), runs one ``cronoq.client.Worker`` per pool in this process (the ``pool2``
worker is deliberately pointed at shard s1 and follows the redirect to s2 by itself), submits a
burst of ``pool2`` tasks through s1's endpoint (the router forwards them to s2) and some
``default`` tasks through s1 too, waits for every result, and prints the merged snapshot and a
page of the merged task listing. It then keeps serving, with a ``curl`` example, until Ctrl-C,
and stops every process it started.

The tour of the embedded scheduler is ``python -m cronoq.demo_embedded``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from cronoq.client import Client, ClientError, Lease, Snapshot, TaskPage, Worker
from cronoq.cluster.launcher import Cluster, ClusterError
from cronoq.cluster.layout import ClusterOptions

__all__ = ["DemoReport", "main", "run_flow", "start_workers", "stop_workers"]

SHARD_BITS = 56
"""A task id's top 8 bits name the shard that created it."""
CONCURRENCY = 32
PREFERRED_BASE_PORT = 7070


def shard_of_id(task_id: int) -> int:
    return task_id >> SHARD_BITS


@dataclass
class DemoReport:
    """What the flow saw; ``run_flow`` fills it in."""

    forwarded_requested: int = 0
    forwarded: int = 0
    """``pool2`` tasks sent to s1 whose ids were issued by shard 2 (the router forwarded them)."""
    forward_refusal: str | None = None
    """Why s1 did not forward (a build without the router), when it did not."""
    local: int = 0
    results: collections.Counter[str] = field(default_factory=collections.Counter)
    outputs_by_pool: dict[str, int] = field(default_factory=dict)
    worker_redirects: list[str] = field(default_factory=list)
    snapshot: Snapshot | None = None
    page: TaskPage | None = None
    page_after: int = 0
    seconds: float = 0.0
    forward_streams: list[str] = field(default_factory=list)
    """"s1 -> s2" for each Forward stream a node's log says it opened to another shard."""
    batching_workers: dict[str, int] = field(default_factory=dict)
    """Work streams each node's log says batch their leases, by log file (replica) name."""


class _RedirectLog(logging.Handler):
    """Keeps the client's "pool ... is served by ...; reconnecting there" lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "reconnecting there" in message:
            self.lines.append(message)


async def handle(lease: Lease) -> dict[str, Any]:
    """The demo's executor: a little work, and an answer that says where it ran."""
    await asyncio.sleep(random.uniform(0.002, 0.01))
    payload = lease.json()
    return {"pool": lease.pool, "n": payload["n"], "square": payload["n"] ** 2}


async def _bounded(calls: Sequence[Callable[[], Awaitable[Any]]], limit: int = CONCURRENCY) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        async with gate:
            return await call()

    return await asyncio.gather(*(one(call) for call in calls))


async def start_workers(cluster: Cluster, say: Callable[[str], None] = print) -> tuple[list[Worker], list[str]]:
    """One worker per pool, both given s1's endpoint: the ``pool2`` one is redirected to s2.
    Returns the workers (running; stop them) and the redirects they logged."""
    s1 = cluster.shard("s1")
    token = cluster.token("worker")
    redirects = _RedirectLog()
    client_log = logging.getLogger("cronoq.client")
    client_log.addHandler(redirects)
    if client_log.getEffectiveLevel() > logging.INFO:
        client_log.setLevel(logging.INFO)
    workers = [
        Worker(s1.plan.endpoint, "default", handle, slots=16, token=token, name="demo-default", grace=1.0),
        # Pointed at the wrong shard on purpose: s1 answers with s2's endpoint and the worker goes there.
        Worker(s1.plan.endpoint, "pool2", handle, slots=16, token=token, name="demo-pool2", grace=1.0),
    ]
    runs = [asyncio.ensure_future(worker.run()) for worker in workers]
    try:
        await asyncio.gather(*(worker.wait_registered(30) for worker in workers))
    except TimeoutError:
        await stop_workers(workers)
        failed = [str(run.exception()) for run in runs if run.done() and run.exception() is not None]
        raise RuntimeError(f"the workers did not register: {failed or 'no answer within 30 s'}") from None
    finally:
        client_log.removeHandler(redirects)
    for line in redirects.lines:
        say(f"  worker: {line}")
    return workers, redirects.lines


async def stop_workers(workers: Sequence[Worker]) -> None:
    for worker in workers:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(worker.stop(grace=1.0), 10)


async def run_flow(
    cluster: Cluster, *, tasks: int = 200, local_tasks: int = 50, say: Callable[[str], None] = print
) -> DemoReport:
    """A burst through the other shard's node, results, merged reads (workers must be serving)."""
    report = DemoReport()
    s1, s2 = cluster.shard("s1"), cluster.shard("s2")
    client_token = cluster.token("client")
    started = time.perf_counter()
    async with Client(s1.plan.endpoint, token=client_token) as via_s1:
        target = via_s1
        direct: Client | None = None
        report.forwarded_requested = tasks
        say(f"submitting {tasks} pool2 tasks through s1's endpoint {s1.plan.endpoint} (pool2 lives on s2) ...")
        try:
            first = await via_s1.submit({"n": 0}, pool="pool2")
            ids = [first.id]
        except ClientError as exc:
            if exc.code != "failed_precondition":
                raise
            report.forward_refusal = str(exc)
            say(f"  s1 did not forward: {exc}")
            say(f"  (this build has no router yet) sending them to s2's endpoint {s2.plan.endpoint} instead")
            direct = Client(s2.plan.endpoint, token=client_token)
            target = direct
            ids = [(await direct.submit({"n": 0}, pool="pool2")).id]
        ids += [a.id for a in await _bounded([partial(target.submit, {"n": n}, pool="pool2") for n in range(1, tasks)])]
        report.forwarded = 0 if report.forward_refusal else sum(1 for i in ids if shard_of_id(i) == 2)
        say(f"submitting {local_tasks} default tasks through s1 (served there) ...")
        local_ids = [
            a.id for a in await _bounded([partial(via_s1.submit, {"n": n}, pool="default") for n in range(local_tasks)])
        ]
        report.local = sum(1 for i in local_ids if shard_of_id(i) == 1)
        say("waiting for every result ...")
        pool2_results = await _bounded([partial(target.wait, i, timeout=60) for i in ids])
        default_results = await _bounded([partial(via_s1.wait, i, timeout=60) for i in local_ids])
        for pool, results in (("pool2", pool2_results), ("default", default_results)):
            report.results.update(result.status for result in results)
            report.outputs_by_pool[pool] = sum(1 for r in results if r.ok and r.json()["pool"] == pool)
        report.seconds = time.perf_counter() - started
        # A page that crosses from shard 1's ids into shard 2's: one cursor over every shard.
        report.page_after = sorted(local_ids)[-3] if len(local_ids) >= 3 else 0
        report.page = await via_s1.list_tasks(after=report.page_after, limit=6)
        async with Client(s1.plan.endpoint, token=cluster.token("metrics")) as metrics:  # snapshots: metrics role
            report.snapshot = await metrics.snapshot()
        if direct is not None:
            await direct.close()
    read_transport(cluster.state_dir / "logs", report)
    return report


def read_transport(logs: Path, report: DemoReport) -> None:
    """What the servers' logs say about their traffic between processes (all of it gRPC): the
    Forward streams opened to other shards ("forward stream to shard s2 open") and the Work
    streams of workers that batch ("registered for pool ...: ..., batching")."""
    for log_file in sorted(logs.glob("*.log")):
        node = log_file.stem
        text = log_file.read_text(errors="replace")
        for shard in re.findall(r"forward stream to shard (\S+) open", text):
            line = f"{node.split('-')[0]} -> {shard}"
            if line not in report.forward_streams:
                report.forward_streams.append(line)
        streams = len(re.findall(r"registered for pool .*, batching", text))
        if streams:
            report.batching_workers[node] = streams


def describe(report: DemoReport, cluster: Cluster) -> str:
    lines = [""]
    if report.forward_refusal is None:
        lines.append(
            f"forwarded: {report.forwarded} of {report.forwarded_requested} pool2 submissions sent to s1 "
            "got ids of shard 2 (the top 8 bits of an id name its shard)"
        )
    else:
        lines.append(f"forwarded: none; s1 refused pool2 work ({report.forward_refusal})")
    lines.append(f"local:     {report.local} default submissions were served by s1 itself")
    statuses = ", ".join(f"{count} {status}" for status, count in sorted(report.results.items()))
    lines.append(
        f"results:   {statuses} in {report.seconds:.2f}s; outputs report the pool they ran in: "
        + ", ".join(f"{pool} {n}" for pool, n in report.outputs_by_pool.items())
    )
    if report.worker_redirects:
        lines.append("redirect:  the pool2 worker was pointed at s1 and followed cronoq-shard-endpoint to s2")
    if report.forward_streams or report.batching_workers:
        streams = ", ".join(f"{node} {count}" for node, count in report.batching_workers.items()) or "none"
        lines.append(
            f"transport: gRPC only; Forward streams {', '.join(report.forward_streams) or '(none)'}; "
            f"Work streams batching leases: {streams} (see README, Transport)"
        )
    snap = report.snapshot
    if snap is not None:
        lines.append("")
        lines.append("merged snapshot, asked of s1 (one answer for every shard):")
        lines.append(
            f"  {'pool':8} {'shard':5} {'succeeded':>9} {'pending':>7} {'running':>7} {'workers':>7} {'wait p50':>9}"
        )
        for pool in snap.pools:
            shard = cluster.shard_of_pool(pool.name).name
            lines.append(
                f"  {pool.name:8} {shard:5} {pool.succeeded:>9} {pool.pending:>7} {pool.busy:>7} "
                f"{pool.workers_connected:>7} {pool.wait_p50 * 1000:>7.1f}ms"
            )
        lines.append(
            f"  totals: submitted {snap.totals.submitted}, succeeded {snap.totals.succeeded}; "
            f"unavailable_shards: {list(snap.unavailable_shards)}"
        )
    page = report.page
    if page is not None:
        lines.append("")
        lines.append(
            f"a page of the merged task listing (id order over every shard, after={report.page_after}), asked of s1:"
        )
        for info in page.tasks:
            lines.append(f"  {info.id:>20}  shard {shard_of_id(info.id)}  {info.pool:8} {info.status}")
        lines.append(f"  next_after: {page.next_after}; unavailable_shards: {list(page.unavailable_shards)}")
    return "\n".join(lines)


def serving_help(cluster: Cluster) -> str:
    s1 = cluster.shard("s1")
    body = '{"pool": "pool2", "payload": {"hello": "from curl"}, "wait": true, "wait_timeout_s": 5}'
    return "\n".join(
        [
            "",
            f"web console: {s1.plan.http_url}/ui/ (any node serves it; sign in with a token from",
            f"  {cluster.tokens_path}: CRONOQ_ADMIN_TOKEN sees and does everything, CRONOQ_METRICS_TOKEN only looks)",
            "",
            "the cluster keeps serving; in another shell:",
            f"  source {cluster.tokens_path}",
            f'  curl -s {s1.plan.http_url}/v1/tasks -H "Authorization: Bearer $CRONOQ_CLIENT_TOKEN" \\',
            f"       -H 'content-type: application/json' -d '{body}'",
            f"  python -m cronoq.cluster status --state {cluster.state_dir}",
            "  (any node answers: the call above reaches s1, which forwards it to s2, where the demo's worker runs it)",
            "",
            "Ctrl-C stops every worker and server and deletes the temporary folder.",
        ]
    )


async def _start_cluster(state: Path) -> Cluster:
    """The cluster on ports 7070.. when they are free, else on free ports."""
    for base_port in (PREFERRED_BASE_PORT, 0):
        cluster = Cluster(ClusterOptions(shards=2, replicas=2, state=state, base_port=base_port, console=True))
        try:
            await cluster.start()
            return cluster
        except ClusterError as exc:
            if base_port == 0 or "cannot listen" not in str(exc):
                raise
            print(f"ports {PREFERRED_BASE_PORT}.. are taken ({exc}); using free ports")
    raise AssertionError("unreachable")


async def _demo(state: Path) -> None:
    cluster = await _start_cluster(state)
    workers: list[Worker] = []
    try:
        print(cluster.summary())
        print()
        workers, redirects = await start_workers(cluster)
        report = await run_flow(cluster)
        report.worker_redirects = redirects
        print(describe(report, cluster))
        print(serving_help(cluster), flush=True)
        # Serve (the cluster restarts any server that dies) until _main cancels this task on
        # Ctrl-C, once; the finally below then stops everything.
        await asyncio.get_running_loop().create_future()
    finally:
        print("\nstopping workers and servers ...", flush=True)
        await stop_workers(workers)
        await cluster.stop()


async def _main() -> int:
    state = Path(tempfile.mkdtemp(prefix="cronoq-demo-"))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    demo = asyncio.ensure_future(_demo(state))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({demo, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not demo.done():
            demo.cancel()  # _demo's finally stops everything
        results = await asyncio.gather(demo, return_exceptions=True)
    finally:
        stopping.cancel()
        shutil.rmtree(state, ignore_errors=True)
    error = results[0]
    if isinstance(error, BaseException) and not isinstance(error, asyncio.CancelledError):
        print(f"the demo failed: {error}", file=sys.stderr)
        return 1
    print("stopped; nothing is left running.")
    return 0


def main() -> int:
    print("cronoq demo: a sharded cluster on this machine (2 shards x 2 replicas, SQLite)\n", flush=True)
    return asyncio.run(_main())


if __name__ == "__main__":
    sys.exit(main())
