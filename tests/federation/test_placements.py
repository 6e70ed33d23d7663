"""Pool placements as durable, versioned data, against three real ``cronoq-server`` processes on
SQLite files: a shard's record wins over the file (and the server says what differs), a shard
refuses a pool it no longer serves naming the placement's version, and a node routing on the old
placement learns the new one from that refusal and retries once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cronoq.stores.placements import advance_placement
from cronoq.stores.postgres import PostgresStore
from cronoq.stores.sqlite import SqliteStore

from cronoq.client import Lease, Worker
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.cli.conftest import Cli
from tests.federation.conftest import Node, _drop_schemas, free_port
from tests.server.harness import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    METRICS_TOKEN,
    SCOPED_METRICS_TOKEN,
    TOKENS_TOML,
    WORKER_TOKEN,
)

SHARD_BITS = 56
CLIENT = (("authorization", f"Bearer {CLIENT_TOKEN}"),)
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
SHARDS = ("s1", "s2", "s3")


def config(store: str, ports: dict[str, int]) -> str:
    shards = "".join(
        f'[[shards]]\nname = "{name}"\nnumber = {number}\npools = [{pools}]\n'
        f'endpoint = "http://127.0.0.1:{ports[name]}"\n\n'
        for number, (name, pools) in enumerate(
            zip(SHARDS, ('"default", "other"', '"p2", "p4"', '"p3"'), strict=True), start=1
        )
    )
    return f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
http_addr = "127.0.0.1:{{http_port}}"
shutdown_grace_s = 1

{store}

{TOKENS_TOML}
[[pools]]
name = "default"

[[pools]]
name = "p2"

[[pools]]
name = "p3"

[[pools]]
name = "other"

[[pools]]
name = "p4"

{shards}"""


class Stores:
    """Where the shards keep their state: SQLite files, or one Postgres schema per shard."""

    def __init__(self, kind: str, directory: Path, dsn: str) -> None:
        self.kind, self.directory, self.dsn = kind, directory, dsn
        self.prefix = f"cronoq_pl{uuid.uuid4().hex[:10]}"

    @property
    def section(self) -> str:
        if self.kind == "sqlite":
            return f'[store]\nkind = "sqlite"\npath = "{self.directory}/{{shard}}.db"'
        return f'[store]\nkind = "postgres"\nurl = "{self.dsn}"\nschema = "{self.prefix}_{{shard}}"'

    def place(self, shard: str, pool: str, owner: str, version: int) -> None:
        """Write a placement into ``shard``'s record, as a move does."""
        store: Any = (
            SqliteStore(self.directory / f"{shard}.db")
            if self.kind == "sqlite"
            else PostgresStore(self.dsn, schema=f"{self.prefix}_{shard}")
        )
        assert asyncio.run(advance_placement(store, pool, owner, version))

    def drop(self) -> None:
        if self.kind == "postgres":
            _drop_schemas(self.dsn, self.prefix)


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path, postgres_dsn: str) -> Iterator[Stores]:
    chosen = Stores(request.param, tmp_path, postgres_dsn)
    yield chosen
    chosen.drop()


@pytest.fixture
def nodes(tmp_path: Path, stores: Stores) -> Iterator[dict[str, Node]]:
    """s1 serves ``default`` (and ``other``, which the harness's scoped tokens name), s2 ``p2`` and
    ``p4``, s3 ``p3`` by the file; then p2's placement is moved to s1 (version 2) in the records of
    s1 and s2, as a finished move leaves them, and those two are restarted. s3 was not told: its
    record still has the file's placement."""
    ports = {name: free_port() for name in SHARDS}
    text = config(stores.section, ports)
    started = {name: Node(tmp_path, text, name, ports[name], free_port(), name) for name in SHARDS}
    try:
        for node in started.values():
            node.start()
        for name in ("s1", "s2"):
            started[name].stop()
            stores.place(name, "p2", "s1", 2)
            started[name].start()
        yield started
    finally:
        for node in started.values():
            node.kill()


@pytest.fixture
async def s3(nodes: dict[str, Node]) -> AsyncIterator[pbg.TasksStub]:
    async with grpc.aio.insecure_channel(nodes["s3"].address) as channel:
        yield pbg.TasksStub(channel)


async def echo(lease: Lease) -> bytes:
    return b"done:" + lease.payload


async def test_the_record_wins_over_the_file_and_the_server_names_the_difference(nodes: dict[str, Node]) -> None:
    expected = "pool 'p2': the file places it on shard 's2', the durable record (version 2) on shard 's1'"
    assert expected in nodes["s1"].stderr()
    assert expected in nodes["s2"].stderr()
    assert "the durable record" not in nodes["s3"].stderr()  # its record agrees with the file


async def test_a_shard_refuses_a_pool_it_gave_away_naming_the_new_placement(nodes: dict[str, Node]) -> None:
    async with grpc.aio.insecure_channel(nodes["s2"].address) as channel:
        call = pbg.TasksStub(channel).Submit(
            pb.SubmitRequest(task=pb.TaskSpec(pool="p2", payload=b"x")),
            metadata=(*CLIENT, ("cronoq-forwarded", "1")),  # answer here, as a forwarded call is
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    trailers = dict(refused.value.trailing_metadata() or ())
    assert trailers["cronoq-shard"] == "s1"
    assert trailers["cronoq-pool"] == "p2"
    assert trailers["cronoq-topology-version"] == "2"


async def test_a_node_on_the_old_placement_learns_the_new_one_and_the_task_runs_there(
    nodes: dict[str, Node], s3: pbg.TasksStub
) -> None:
    # s3 routes p2 to s2 by the file; s2 refuses naming s1 at version 2; s3 retries at s1.
    first = await s3.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2", payload=b"one")), metadata=CLIENT)
    assert first.id >> SHARD_BITS == 1
    # A batch and a schedule take the learned placement too, and a listing of the pool reads s1.
    batch = await s3.SubmitBatch(
        pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool="p2", payload=b"two"), pb.TaskSpec(pool="p2", payload=b"3")]),
        metadata=CLIENT,
    )
    assert [task_id >> SHARD_BITS for task_id in (task.id for task in batch.tasks)] == [1, 1]
    listed = await s3.ListTasks(pb.ListTasksRequest(pools=["p2"]), metadata=CLIENT)
    assert sorted(task.id for task in listed.tasks) == sorted([first.id, *(task.id for task in batch.tasks)])
    # s1's engine runs p2: a worker of p2 on s1 completes the task.
    worker = Worker(nodes["s1"].address, "p2", echo, slots=2, token=WORKER_TOKEN, backoff=(0.05, 0.5))
    running = asyncio.ensure_future(worker.run())
    try:
        result = await s3.Wait(pb.WaitRequest(task=pb.TaskRef(id=first.id), timeout_s=20), metadata=CLIENT)
    finally:
        await worker.stop(grace=0)
        running.cancel()
    assert result.status == pb.TASK_STATUS_SUCCEEDED
    assert result.output == b"done:one"


async def test_calls_refused_together_on_the_old_placement_all_go_on_to_the_new_one(s3: pbg.TasksStub) -> None:
    """Submits sent at once share the refusal (one SubmitBatch to s2, or several calls): each goes
    on to s1, not only the one whose refusal taught s3 the new placement."""
    answers = await asyncio.gather(
        *(s3.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2", payload=b"x")), metadata=CLIENT) for _ in range(20))
    )
    assert [answer.id >> SHARD_BITS for answer in answers] == [1] * 20


async def test_a_pool_both_shards_refuse_is_unavailable_to_the_caller(nodes: dict[str, Node], stores: Stores) -> None:
    """Records caught mid-change (two moves in flight): s1's places ``other`` on s2 (version 2),
    s2's back on s1 (version 3). s3 routes to s1 by the file, learns s2 from the refusal, is
    refused there too: the caller hears UNAVAILABLE, which it retries, not a refusal."""
    for name, owner, version in (("s1", "s2", 2), ("s2", "s1", 3)):
        nodes[name].stop()
        await asyncio.to_thread(stores.place, name, "other", owner, version)
        nodes[name].start()
    async with grpc.aio.insecure_channel(nodes["s3"].address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pbg.TasksStub(channel).Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="other")), metadata=CLIENT)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "pool 'other' is changing shards; retry shortly" in (caught.value.details() or "")


async def test_a_pool_handed_to_the_entry_shard_that_has_not_taken_it_yet_is_unavailable(
    nodes: dict[str, Node], stores: Stores
) -> None:
    """s1's record places ``other`` on s2 (version 2), as right after a live handover, before s2's
    leader took the pool. A call entering at s2 goes to s1 by s2's own record, learns version 2
    from the refusal and is retried here, where s2 still refuses naming its old placement: the
    caller hears UNAVAILABLE, which it retries (the pool-move drill saw producers give up on the
    refusal)."""
    nodes["s1"].stop()
    await asyncio.to_thread(stores.place, "s1", "other", "s2", 2)
    nodes["s1"].start()
    async with grpc.aio.insecure_channel(nodes["s2"].address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await pbg.TasksStub(channel).Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="other")), metadata=CLIENT)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "pool 'other' is changing shards; retry shortly" in (caught.value.details() or "")


async def test_schedules_follow_the_learned_placement(nodes: dict[str, Node]) -> None:
    async with grpc.aio.insecure_channel(nodes["s3"].address) as channel:
        admin = pbg.AdminStub(channel)
        request = pb.RecurringRequest(name="p2-nightly", cron="0 3 * * *", template=pb.TaskSpec(pool="p2"))
        await admin.AddRecurring(request, metadata=ADMIN)
    async with grpc.aio.insecure_channel(nodes["s1"].address) as channel:
        # s1's own schedules (a forwarded call is answered by its shard alone).
        listed = await pbg.AdminStub(channel).ListRecurring(pb.Empty(), metadata=(*ADMIN, ("cronoq-forwarded", "1")))
    assert [schedule.name for schedule in listed.schedules] == ["p2-nightly"]


def test_admin_topology_shows_each_record_and_where_they_disagree(nodes: dict[str, Node]) -> None:
    cli = Cli(nodes["s3"].address)
    text = cli.ok("admin", "topology", token=METRICS_TOKEN)
    assert "s1  topology version 2  serves: default@1, other@1, p2@2" in text
    assert "s2  topology version 2  serves: p4@1" in text
    assert "s3  topology version 1  serves: p3@1" in text
    assert (
        "file differs: pool 'p2': the file places it on shard 's2', the durable record (version 2) on shard 's1'"
        in text
    )
    assert (
        "disagreement: pool p2: s1 and s2 place it on s1 (version 2); s3 place it on s2 (version 1) "
        "(the highest version is the newest)" in text
    )
    answer = cli.json("admin", "topology", token=METRICS_TOKEN)
    by_name = {shard["name"]: shard for shard in answer["shards"]}
    assert {"pool": "p2", "shard": "s1", "version": "2"} in by_name["s2"]["placements"]
    assert by_name["s3"]["topology_differences"] == []
    assert len(answer["disagreements"]) == 1


def test_a_pool_scoped_caller_sees_only_its_pools_placements(nodes: dict[str, Node]) -> None:
    answer = Cli(nodes["s3"].address).json("admin", "topology", token=SCOPED_METRICS_TOKEN)
    pools = {placed["pool"] for shard in answer["shards"] for placed in shard["placements"]}
    assert pools == {"other"}
    assert all(not shard["topology_differences"] for shard in answer["shards"])  # they are about p2
    assert answer["disagreements"] == []


def test_a_standby_that_takes_over_reads_the_placements_as_they_are_then(tmp_path: Path, stores: Stores) -> None:
    """The record is read by each new leader, not when the process started: a standby started
    before p2 moved away serves without p2 once it leads."""
    ports = {name: free_port() for name in SHARDS}
    text = config(stores.section, ports)
    s1 = Node(tmp_path, text, "s1", ports["s1"], free_port(), "s1")
    s2a = Node(tmp_path, text, "s2", ports["s2"], free_port(), "s2a")
    s2b = Node(tmp_path, text, "s2", free_port(), free_port(), "s2b")
    try:
        s1.start()
        s2a.start()
        s2b.start(expect="standby")
        stores.place("s2", "p2", "s1", 2)  # while s2a leads and s2b stands by
        s2a.kill()
        s2b.wait_for("listening")
        assert "the durable record (version 2) on shard 's1'" in s2b.stderr()

        async def calls() -> None:
            async with grpc.aio.insecure_channel(s2b.address) as channel:
                stub = pbg.TasksStub(channel)
                here = (*CLIENT, ("cronoq-forwarded", "1"))  # answered by s2b itself
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2")), metadata=here)
                assert dict(refused.value.trailing_metadata() or ())["cronoq-topology-version"] == "2"
                kept = await stub.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p4")), metadata=here)
                assert kept.id >> SHARD_BITS == 2

        asyncio.run(calls())
    finally:
        for node in (s1, s2a, s2b):
            node.kill()
