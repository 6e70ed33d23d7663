"""Moving a pool between the shards of a running cluster (``docs/pool-moves.md``), against real
``cronoq-server`` processes on SQLite files and on Postgres: under load, nothing acknowledged is
lost, no attempt runs twice, keys and ids follow the pool, and what would span shards is refused."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cronoq.client import Lease, Worker
from cronoq.proto import console_pb2 as cpb
from cronoq.proto import console_pb2_grpc as cpbg
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.cli.conftest import Cli
from tests.federation.conftest import Node, free_port
from tests.federation.test_placements import Stores
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN, METRICS_TOKEN, TOKENS_TOML, WORKER_TOKEN

SHARD_BITS = 56
CLIENT = (("authorization", f"Bearer {CLIENT_TOKEN}"),)
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
HERE = (("cronoq-forwarded", "1"),)
"""Marks a call as forwarded: the node answers it from its own shard."""
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED)
"""Answers while a shard takes the lead again or a pool is handed over. A call in flight when its
shard steps down ends CANCELLED (outcome unknown): the test counts only answered submissions."""


def config(store: str, ports: dict[str, int]) -> str:
    return f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
http_addr = "127.0.0.1:{{http_port}}"
shutdown_grace_s = 1

[limits]
max_wait_s = 30

{store}

{TOKENS_TOML}
[[pools]]
name = "default"
retry = {{ max_attempts = 5, initial_backoff_s = 0.05, max_backoff_s = 0.2 }}

[[pools]]
name = "other"

[[pools]]
name = "p1"
retry = {{ max_attempts = 5, initial_backoff_s = 0.05, max_backoff_s = 0.2 }}

[[pools]]
name = "p2"

[[shards]]
name = "s1"
number = 1
pools = ["default", "other", "p1"]
endpoint = "http://127.0.0.1:{ports["s1"]}"

[[shards]]
name = "s2"
number = 2
pools = ["p2"]
endpoint = "http://127.0.0.1:{ports["s2"]}"
"""


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path, postgres_dsn: str) -> Iterator[Stores]:
    chosen = Stores(request.param, tmp_path, postgres_dsn)
    yield chosen
    chosen.drop()


@pytest.fixture
def cluster(tmp_path: Path, stores: Stores) -> Iterator[dict[str, Node]]:
    ports = {"s1": free_port(), "s2": free_port()}
    text = config(stores.section, ports)
    nodes = {name: Node(tmp_path, text, name, port, free_port(), name) for name, port in ports.items()}
    try:
        for node in nodes.values():
            node.start()
        yield nodes
    finally:
        for node in nodes.values():
            node.kill()


class Runs:
    """What workers ran: each (task id, attempt) they were handed, how many times."""

    def __init__(self) -> None:
        self.count: collections.Counter[tuple[int, int]] = collections.Counter()

    async def handler(self, lease: Lease) -> bytes:
        self.count[(lease.task_id, lease.attempt)] += 1
        await asyncio.sleep(0.01)
        return b"ok"


async def submit_retrying(stub: pbg.TasksStub, spec: pb.TaskSpec) -> int:
    """A Submit answered with an id, retried while the pool's shard is taking over or moving."""
    for _ in range(600):
        try:
            return int((await stub.Submit(pb.SubmitRequest(task=spec), metadata=CLIENT, timeout=10)).id)
        except grpc.aio.AioRpcError as error:
            if error.code() not in RETRYABLE:
                raise
        await asyncio.sleep(0.05)
    raise AssertionError("the submission was never admitted")


async def wait_done(stub: pbg.TasksStub, task_id: int) -> pb.TaskResult:
    for _ in range(600):
        try:
            result = await stub.Wait(pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=20), metadata=CLIENT)
        except grpc.aio.AioRpcError as error:
            if error.code() not in RETRYABLE:
                raise
            await asyncio.sleep(0.05)
            continue
        return result
    raise AssertionError(f"task {task_id} never ended")


async def until_served(console: cpbg.ConsoleStub, pool: str, shard: str) -> cpb.MoveStatus:
    """The pool's move status once ``shard`` serves it (or the last one read, after 30 s)."""
    status = cpb.MoveStatus()
    for _ in range(600):
        with contextlib.suppress(grpc.aio.AioRpcError):
            status = await console.GetMove(cpb.MoveRequest(pool=pool), metadata=ADMIN)
            if status.shard == shard:
                break
        await asyncio.sleep(0.05)
    return status


def move_in_thread(cli: Cli, *args: str) -> tuple[threading.Thread, list[str]]:
    """``cronoq admin move-pool ARGS`` beside the load; what it printed (and exited with)."""
    said: list[str] = []

    def run() -> None:
        done = cli("admin", "move-pool", *args, timeout=150)
        said.append(f"exit {done.returncode}: {done.stdout.decode()} {done.stderr.decode()}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, said


async def test_a_pool_moves_under_load_and_keeps_its_tasks_keys_ids_and_schedules(
    cluster: dict[str, Node], stores: Stores
) -> None:
    runs = Runs()
    async with (
        grpc.aio.insecure_channel(cluster["s1"].address) as c1,
        grpc.aio.insecure_channel(cluster["s2"].address) as c2,
    ):
        s1, s2 = pbg.TasksStub(c1), pbg.TasksStub(c2)
        await pbg.AdminStub(c1).AddRecurring(
            pb.RecurringRequest(name="p1-yearly", cron="0 0 1 1 *", template=pb.TaskSpec(pool="p1")), metadata=ADMIN
        )
        keyed = {f"k{i}": await submit_retrying(s1, pb.TaskSpec(pool="p1", key=f"k{i}")) for i in range(20)}
        later = await submit_retrying(s1, pb.TaskSpec(pool="p1", start_in_s=3600))
        workers = [
            Worker(cluster["s1"].address, pool, runs.handler, slots=4, token=WORKER_TOKEN, backoff=(0.05, 0.3))
            for pool in ("p1", "default")
        ]
        running = [asyncio.ensure_future(worker.run()) for worker in workers]
        acked: dict[str, list[int]] = {"p1": [], "default": []}
        stop = asyncio.Event()

        async def produce(pool: str, stub: pbg.TasksStub) -> None:
            while not stop.is_set():
                acked[pool].append(await submit_retrying(stub, pb.TaskSpec(pool=pool)))
                await asyncio.sleep(0.01)

        producers = [asyncio.ensure_future(produce("p1", s2)), asyncio.ensure_future(produce("default", s2))]
        try:
            while len(acked["p1"]) < 20:
                await asyncio.sleep(0.05)
            thread, said = move_in_thread(Cli(cluster["s2"].address), "p1", "--to", "s2", "--wait")
            await asyncio.to_thread(thread.join, 150)
            assert said and "pool p1 is served by shard s2 (placement version 2)" in said[0], (
                said,
                cluster["s1"].stderr()[-5000:],
            )
            after_move = len(acked["p1"])
            while len(acked["p1"]) < after_move + 20:  # admission goes on, on s2
                await asyncio.sleep(0.05)
            stop.set()
            await asyncio.gather(*producers)
            for task_id in [*keyed.values(), *acked["p1"], *acked["default"]]:
                result = await wait_done(s1, task_id)
                assert result.status == pb.TASK_STATUS_SUCCEEDED, (task_id, result)
        finally:
            stop.set()
            for worker in workers:
                await worker.stop(grace=0)
            for task in [*running, *producers]:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task

        # No attempt ran twice; every acknowledged task ran.
        assert max(runs.count.values()) == 1
        ran = {task_id for task_id, _ in runs.count}
        assert {*keyed.values(), *acked["p1"], *acked["default"]} <= ran
        # New p1 tasks are s2's, the old ones kept their s1 ids; default stayed on s1.
        assert acked["p1"][-1] >> SHARD_BITS == 2
        assert all(task_id >> SHARD_BITS == 1 for task_id in keyed.values())
        assert all(task_id >> SHARD_BITS == 1 for task_id in acked["default"])
        # Keys followed their tasks: one task each, same id, now held by s2.
        for key, task_id in keyed.items():
            info = await s1.Get(pb.GetRequest(task=pb.TaskRef(key=key)), metadata=CLIENT)
            assert info.id == task_id
            held = await s2.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)), metadata=(*CLIENT, *HERE))
            assert held.pool == "p1"
        # A listing over both shards, page by page, finds every task once, in id order, though s2
        # now holds ids of s1.
        listed: list[int] = []
        after = 0
        for _ in range(1000):  # a cursor that went back would page forever
            page = await s1.ListTasks(
                pb.ListTasksRequest(pools=["p1", "default"], after=after, limit=7), metadata=CLIENT
            )
            listed.extend(info.id for info in page.tasks)
            if not page.next_after:
                break
            after = page.next_after
        else:
            raise AssertionError(f"the listing did not end; it went {listed[-30:]}")
        assert listed == sorted(set(listed))
        assert {*keyed.values(), later, *acked["p1"], *acked["default"]} <= set(listed)
        # The scheduled task and the schedule moved too; s1 keeps only forwarding records.
        moved = await s1.Get(pb.GetRequest(task=pb.TaskRef(id=later)), metadata=CLIENT)
        assert moved.status == pb.TASK_STATUS_SCHEDULED
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await s1.Get(pb.GetRequest(task=pb.TaskRef(id=later)), metadata=(*CLIENT, *HERE))
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert dict(refused.value.trailing_metadata() or ())["cronoq-shard"] == "s2"
        on_s2 = await pbg.AdminStub(c2).ListRecurring(pb.Empty(), metadata=(*ADMIN, *HERE))
        on_s1 = await pbg.AdminStub(c1).ListRecurring(pb.Empty(), metadata=(*ADMIN, *HERE))
        assert [s.name for s in on_s2.schedules] == ["p1-yearly"]
        assert [s.name for s in on_s1.schedules] == []
    if stores.kind == "postgres":
        # A live move: neither leader stepped down; the pool left s1's engine and joined s2's.
        for node in cluster.values():
            log = node.stderr()
            assert log.count("leadership gained") == 1 and "taking the lead again" not in log, log[-3000:]
        assert "handed to shard 's2' while leading" in cluster["s1"].stderr()
        assert "pool 'p1' joined this shard's engine" in cluster["s2"].stderr()
    # Both records agree, at the new version.
    text = Cli(cluster["s1"].address).ok("admin", "topology", token=METRICS_TOKEN)
    assert "s2  topology version 2  serves: p1@2, p2@1" in text
    assert "disagreement" not in text


async def test_moves_that_would_split_dependencies_or_break_rules_are_refused(cluster: dict[str, Node]) -> None:
    async with grpc.aio.insecure_channel(cluster["s1"].address) as channel:
        tasks, console = pbg.TasksStub(channel), cpbg.ConsoleStub(channel)  # type: ignore[no-untyped-call]
        # A p1 task waiting for a task of "default" (held back an hour): a live edge across pools.
        parent = await submit_retrying(tasks, pb.TaskSpec(pool="default", start_in_s=3600))
        child = await submit_retrying(
            tasks, pb.TaskSpec(pool="p1", deps=[pb.Dep(target=pb.TaskRef(id=parent), cond=pb.EDGE_COND_ON_SUCCESS)])
        )

        async def refused(request: cpb.MovePoolRequest, token: str = ADMIN_TOKEN) -> grpc.aio.AioRpcError:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await console.MovePool(request, metadata=(("authorization", f"Bearer {token}"),))
            return caught.value

        assert (await refused(cpb.MovePoolRequest(pool="p1", to="s2"), CLIENT_TOKEN)).code() is (
            grpc.StatusCode.PERMISSION_DENIED
        )
        error = await refused(cpb.MovePoolRequest(pool="p1", to="s9"))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and "no shard is named 's9'" in error.details()
        error = await refused(cpb.MovePoolRequest(pool="p1", to="s1"))
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and "already served by shard 's1'" in error.details()
        error = await refused(cpb.MovePoolRequest(pool="p2", to="s1"))
        assert error.code() is grpc.StatusCode.FAILED_PRECONDITION and "last pool of shard 's2'" in error.details()
        error = await refused(cpb.MovePoolRequest(pool="nope", to="s2"))
        assert error.code() is grpc.StatusCode.NOT_FOUND

        status = await console.MovePool(cpb.MovePoolRequest(pool="p1", to="s2"), metadata=ADMIN)
        assert status.phase == "draining" and status.target == "s2" and status.version == 2
        for _ in range(400):  # the source takes the lead again and checks the move
            with contextlib.suppress(grpc.aio.AioRpcError):
                status = await console.GetMove(cpb.MoveRequest(pool="p1"), metadata=ADMIN)
                if status.phase not in ("draining", "requested", "transferring"):
                    break
            await asyncio.sleep(0.05)
        assert status.phase == "refused"
        assert status.shard == "s1" and status.placement_version == 1
        assert "pool 'p1' has live dependency edges with pools 'default' of shard 's1'" in status.message
        # Nothing moved: the child is still s1's, waiting.
        info = await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=child)), metadata=(*CLIENT, *HERE))
        assert info.pool == "p1" and info.status == pb.TASK_STATUS_BLOCKED


async def test_a_move_is_finished_by_the_next_leaders_when_both_are_killed_mid_way(cluster: dict[str, Node]) -> None:
    """Both leaders die (SIGKILL) right after the move is recorded, wherever the source had got:
    the restarted ones finish it, the pool ends on one shard, and every task is there once."""
    runs = Runs()
    async with grpc.aio.insecure_channel(cluster["s1"].address) as channel:
        tasks, console = pbg.TasksStub(channel), cpbg.ConsoleStub(channel)  # type: ignore[no-untyped-call]
        ids = [await submit_retrying(tasks, pb.TaskSpec(pool="p1", key=f"c{i}")) for i in range(30)]
        status = await console.MovePool(cpb.MovePoolRequest(pool="p1", to="s2"), metadata=ADMIN)
        assert status.phase == "draining"
    for node in cluster.values():
        node.kill()
    for node in cluster.values():
        node.start()
    async with grpc.aio.insecure_channel(cluster["s1"].address) as channel:
        tasks, console = pbg.TasksStub(channel), cpbg.ConsoleStub(channel)  # type: ignore[no-untyped-call]
        status = await until_served(console, "p1", "s2")
        assert status.shard == "s2" and status.placement_version == 2
        worker = Worker(cluster["s1"].address, "p1", runs.handler, slots=4, token=WORKER_TOKEN, backoff=(0.05, 0.3))
        running = asyncio.ensure_future(worker.run())
        try:
            for task_id in ids:
                assert (await wait_done(tasks, task_id)).status == pb.TASK_STATUS_SUCCEEDED
            for i, task_id in enumerate(ids):
                assert (await tasks.Get(pb.GetRequest(task=pb.TaskRef(key=f"c{i}")), metadata=CLIENT)).id == task_id
        finally:
            await worker.stop(grace=0)
            running.cancel()
    assert sorted(task_id for task_id, _ in runs.count) == sorted(ids)
    assert max(runs.count.values()) == 1
    text = Cli(cluster["s1"].address).ok("admin", "topology", token=METRICS_TOKEN)
    assert "p1@2" in text and "disagreement" not in text


async def test_running_attempts_finish_on_the_source_and_a_draining_move_can_be_aborted(
    cluster: dict[str, Node],
) -> None:
    """While a move drains, the pool's running attempts go on at the source (their outcomes are
    accepted there) and nothing new of the pool starts; an abort then lets it start again. A second
    move waits for the running attempts, and only then hands the pool over: every task ran once,
    at attempt 1."""
    started: asyncio.Queue[tuple[int, int]] = asyncio.Queue()
    release: dict[int, asyncio.Event] = collections.defaultdict(asyncio.Event)

    async def handler(lease: Lease) -> bytes:
        started.put_nowait((lease.task_id, lease.attempt))
        await release[lease.task_id].wait()
        return b"ok"

    async with grpc.aio.insecure_channel(cluster["s1"].address) as channel:
        tasks, console = pbg.TasksStub(channel), cpbg.ConsoleStub(channel)  # type: ignore[no-untyped-call]
        worker = Worker(cluster["s1"].address, "p1", handler, slots=2, token=WORKER_TOKEN, backoff=(0.05, 0.3))
        running = asyncio.ensure_future(worker.run())
        try:
            child = 0
            first = await submit_retrying(tasks, pb.TaskSpec(pool="p1"))
            hold = await submit_retrying(tasks, pb.TaskSpec(pool="p1"))  # runs until the end: the move drains
            assert {await asyncio.wait_for(started.get(), 30) for _ in range(2)} == {(first, 1), (hold, 1)}
            status = await console.MovePool(cpb.MovePoolRequest(pool="p1", to="s2"), metadata=ADMIN)
            assert status.phase == "draining"
            second = await submit_retrying(tasks, pb.TaskSpec(pool="p1"))  # admitted while draining
            release[first].set()
            assert (await wait_done(tasks, first)).status == pb.TASK_STATUS_SUCCEEDED  # accepted at the source
            info = await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=second)), metadata=(*CLIENT, *HERE))
            assert info.status == pb.TASK_STATUS_READY  # the free slot starts nothing of the pool

            aborted = await console.AbortMove(cpb.MoveRequest(pool="p1"), metadata=ADMIN)
            assert (aborted.phase, aborted.shard) == ("aborted", "s1")
            assert await asyncio.wait_for(started.get(), 30) == (second, 1)  # dispatch goes on
            with pytest.raises(grpc.aio.AioRpcError) as again:
                await console.AbortMove(cpb.MoveRequest(pool="p1"), metadata=ADMIN)
            assert again.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "is 'aborted': it is over, there is nothing to abort" in again.value.details()

            status = await console.MovePool(cpb.MovePoolRequest(pool="p1", to="s2"), metadata=ADMIN)
            assert status.phase == "draining"  # hold and the second task are running
            release[second].set()
            release[hold].set()
            status = await until_served(console, "p1", "s2")
            assert (status.shard, status.placement_version) == ("s2", 2)
            for task_id in (first, hold, second):  # one attempt each: none was cut off and retried
                assert (await wait_done(tasks, task_id)).status == pb.TASK_STATUS_SUCCEEDED
                info = await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)), metadata=CLIENT)
                assert (info.status, info.attempt) == (pb.TASK_STATUS_SUCCEEDED, 1)
            # A task may depend on a moved one: its id names s1, but s2 holds it now.
            child = await submit_retrying(
                tasks, pb.TaskSpec(pool="p1", deps=[pb.Dep(target=pb.TaskRef(id=second), cond=pb.EDGE_COND_ON_SUCCESS)])
            )
            assert child >> SHARD_BITS == 2
            release[child].set()
            assert (await wait_done(tasks, child)).status == pb.TASK_STATUS_SUCCEEDED
            with pytest.raises(grpc.aio.AioRpcError) as done:  # the target owns it, and has no move of it
                await console.AbortMove(cpb.MoveRequest(pool="p1"), metadata=ADMIN)
            assert done.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "pool 'p1' has no move to abort on this shard" in done.value.details()
        finally:
            await worker.stop(grace=0)
            running.cancel()
            with contextlib.suppress(BaseException):
                await running
    assert started.qsize() == 1  # the child; nothing ran twice
    assert started.get_nowait() == (child, 1)


async def test_the_http_route_moves_a_pool_reports_it_and_refuses_what_it_cannot_do(cluster: dict[str, Node]) -> None:
    """``/v1/admin/pools/{pool}/move``: the console calls over HTTP, entered at the shard that
    does not serve the pool (the router forwards them)."""
    import aiohttp

    url = f"{cluster['s2'].http}/v1/admin/pools/p1/move"
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession() as http:

        async def call(method: str, body: object = None, token: str = ADMIN_TOKEN) -> tuple[int, dict[str, object]]:
            headers = {"Authorization": f"Bearer {token}"}
            async with http.request(method, url, json=body, headers=headers) as response:
                return response.status, await response.json()

        status, before = await call("GET", token=METRICS_TOKEN)
        assert status == 200 and before == {"pool": "p1", "shard": "s1", "placement_version": 1}
        assert (await call("POST", {"to": "s2"}, token=METRICS_TOKEN))[0] == 403
        status, error = await call("POST", {"to": "s2", "now": True})
        assert status == 400 and "now: unknown field" in str(error)
        status, error = await call("POST", {})
        assert status == 400 and str(error).count("to: ") == 1
        status, error = await call("POST", {"to": "s9"})
        assert status == 400 and "no shard is named 's9'" in str(error)
        status, error = await call("DELETE")
        assert status == 409 and "pool 'p1' has no move to abort" in str(error)

        status, started = await call("POST", {"to": "s2"})
        assert status == 200 and started["phase"] == "draining" and started["target"] == "s2", started
        assert started["version"] == 2 and isinstance(started["updated_unix_ns"], str)
        for _ in range(600):
            async with http.get(url, headers=admin) as response:
                now = await response.json() if response.status == 200 else {}
            if now.get("shard") == "s2":
                break
            await asyncio.sleep(0.05)
        assert now == {"pool": "p1", "shard": "s2", "placement_version": 2}  # s2 has no move of it
