"""The router of every node, against a real two-shard cluster on Postgres (one schema per shard):
calls for another shard are forwarded with the caller's token, lookups by key ask every shard,
reads are merged, and what cannot span shards is refused."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from cronoq.client import Lease, Worker
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.federation.conftest import P2_CLIENT_TOKEN, Federation
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN, METRICS_TOKEN, SCOPED_CLIENT_TOKEN, WORKER_TOKEN

SHARD_BITS = 56


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


class Stubs:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.tasks = pbg.TasksStub(channel)
        self.admin = pbg.AdminStub(channel)


@pytest.fixture
async def node1(federation: Federation) -> AsyncIterator[Stubs]:
    async with grpc.aio.insecure_channel(federation["s1"].address) as channel:
        yield Stubs(channel)


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


async def submit(stubs: Stubs, pool: str, *, key: str = "", token: str = CLIENT_TOKEN, **spec: Any) -> int:
    response = await stubs.tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool=pool, key=key, **spec)),
                                        metadata=bearer(token))  # fmt: skip
    return int(response.id)


async def echo(lease: Lease) -> bytes:
    return b"done:" + lease.payload


async def run_worker(target: str, pool: str) -> tuple[Worker, asyncio.Task[None]]:
    worker = Worker(target, pool, echo, slots=4, token=WORKER_TOKEN, backoff=(0.05, 0.5))
    return worker, asyncio.ensure_future(worker.run())


def http(method: str, url: str, token: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


# ------------------------------------------------------------------------------- forwarding


async def test_work_for_another_shard_is_forwarded_and_served_there(federation: Federation, node1: Stubs) -> None:
    worker, running = await run_worker(federation["s2"].address, "p2")
    try:
        response = await node1.tasks.Submit(
            pb.SubmitRequest(task=pb.TaskSpec(pool="p2", payload=b"x"), wait=True, wait_timeout_s=10),
            metadata=bearer(CLIENT_TOKEN),
        )
        assert response.id >> SHARD_BITS == 2  # admitted by shard s2
        assert response.result.status == pb.TASK_STATUS_SUCCEEDED and response.result.output == b"done:x"
        info = await node1.tasks.Get(pb.GetRequest(task=pb.TaskRef(id=response.id)), metadata=bearer(CLIENT_TOKEN))
        assert info.pool == "p2" and info.status == pb.TASK_STATUS_SUCCEEDED
        result = await node1.tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=response.id)), metadata=bearer(CLIENT_TOKEN))
        assert result.output == b"done:x"
    finally:
        await worker.stop(1)
        await running


async def test_batches_go_to_their_shard_and_never_span_two(federation: Federation, node1: Stubs) -> None:
    batch = pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool="p2"), pb.TaskSpec(pool="p2")])
    response = await node1.tasks.SubmitBatch(batch, metadata=bearer(CLIENT_TOKEN))
    assert [task.id >> SHARD_BITS for task in response.tasks] == [2, 2]
    mixed = pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool="default"), pb.TaskSpec(pool="p2")])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node1.tasks.SubmitBatch(mixed, metadata=bearer(CLIENT_TOKEN))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "one shard" in (err.value.details() or "")


async def test_dependencies_and_resources_stay_in_their_shard(federation: Federation, node1: Stubs) -> None:
    parent = await submit(node1, "default")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(node1, "p2", deps=[pb.Dep(target=pb.TaskRef(id=parent))])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "another shard" in (err.value.details() or "")
    batch = pb.SubmitBatchRequest(
        tasks=[pb.TaskSpec(pool="p2"), pb.TaskSpec(pool="p2", deps=[pb.Dep(target=pb.TaskRef(id=parent))])]
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node1.tasks.SubmitBatch(batch, metadata=bearer(CLIENT_TOKEN))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(f"task 1: dependency {parent} is a task of another shard")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(node1, "default", resources={"gpu": 1})  # gpu belongs to shard s2
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shard 's2'" in (err.value.details() or "")
    same_shard = await submit(node1, "p2", resources={"gpu": 1})
    assert same_shard >> SHARD_BITS == 2


async def test_credentials_are_checked_before_anything_about_shards(federation: Federation, node1: Stubs) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(node1, "p2", token="no-such-token-0123456789")
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(node1, "p2", token=SCOPED_CLIENT_TOKEN)  # scoped to "other"
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(node1, "p2", token=METRICS_TOKEN)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # A token scoped to p2 works through shard s1's node, and its tasks of p2 are visible to it.
    task_id = await submit(node1, "p2", token=P2_CLIENT_TOKEN)
    info = await node1.tasks.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)), metadata=bearer(P2_CLIENT_TOKEN))
    assert info.pool == "p2"
    # ... but a task of another pool looks like it does not exist, in either shard.
    other = await submit(node1, "default")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node1.tasks.Get(pb.GetRequest(task=pb.TaskRef(id=other)), metadata=bearer(P2_CLIENT_TOKEN))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_an_id_of_no_shard_is_not_found(federation: Federation, node1: Stubs) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node1.tasks.Get(pb.GetRequest(task=pb.TaskRef(id=(9 << SHARD_BITS) | 5)), metadata=bearer(CLIENT_TOKEN))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


# ------------------------------------------------------------------------------- keys


async def test_keys_are_looked_up_in_every_shard(federation: Federation, node1: Stubs) -> None:
    only_s2 = unique("k2")
    task_id = await submit(node1, "p2", key=only_s2)
    ref = pb.TaskRef(key=only_s2)
    info = await node1.tasks.Get(pb.GetRequest(task=ref), metadata=bearer(CLIENT_TOKEN))
    assert info.id == task_id
    cancelled = await node1.tasks.Cancel(pb.CancelRequest(task=ref), metadata=bearer(CLIENT_TOKEN))
    assert cancelled.cancelled
    result = await node1.tasks.Wait(pb.WaitRequest(task=ref, timeout_s=5), metadata=bearer(CLIENT_TOKEN))
    assert result.id == task_id and result.status == pb.TASK_STATUS_CANCELLED

    both = unique("both")
    await submit(node1, "default", key=both)
    await submit(node1, "p2", key=both)  # keys are unique per shard only
    for call, request in ((node1.tasks.Get, pb.GetRequest(task=pb.TaskRef(key=both))),
                          (node1.tasks.Cancel, pb.CancelRequest(task=pb.TaskRef(key=both))),
                          (node1.tasks.Wait, pb.WaitRequest(task=pb.TaskRef(key=both), timeout_s=1))):  # fmt: skip
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(request, metadata=bearer(CLIENT_TOKEN))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "use the task id" in (err.value.details() or "")

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await node1.tasks.Get(pb.GetRequest(task=pb.TaskRef(key=unique("nowhere"))), metadata=bearer(CLIENT_TOKEN))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


# ------------------------------------------------------------------------------- merged reads


async def test_listings_page_across_shards_in_id_order(federation: Federation, node1: Stubs) -> None:
    kind = unique("paged")
    submitted = [await submit(node1, pool, kind=kind) for pool in ("default", "p2", "other", "p2", "default", "p2")]
    seen: list[int] = []
    after = 0
    while True:
        page = await node1.tasks.ListTasks(pb.ListTasksRequest(after=after, limit=4), metadata=bearer(CLIENT_TOKEN))
        assert not page.unavailable_shards
        seen.extend(task.id for task in page.tasks)
        if not page.next_after:
            break
        after = page.next_after
    assert seen == sorted(seen) and len(seen) == len(set(seen))  # every task exactly once, in id order
    assert set(submitted) <= set(seen)
    assert {task_id >> SHARD_BITS for task_id in seen} == {1, 2}
    only = await node1.tasks.ListTasks(pb.ListTasksRequest(pools=["p2"], limit=50), metadata=bearer(CLIENT_TOKEN))
    assert only.tasks and {task.pool for task in only.tasks} == {"p2"}


async def test_snapshot_workers_and_schedules_cover_every_shard(federation: Federation, node1: Stubs) -> None:
    worker, running = await run_worker(federation["s2"].address, "p2")
    try:
        for _ in range(100):
            workers = await node1.admin.ListWorkers(pb.Empty(), metadata=bearer(METRICS_TOKEN))
            if any(info.pool == "p2" for info in workers.workers):
                break
            await asyncio.sleep(0.05)
        assert any(info.pool == "p2" for info in workers.workers) and not workers.unavailable_shards
        snapshot = await node1.admin.Snapshot(pb.Empty(), metadata=bearer(METRICS_TOKEN))
        assert {pool.name for pool in snapshot.pools} == {"default", "other", "p2"}
        assert snapshot.workers_connected >= 1 and not snapshot.unavailable_shards
        name = unique("nightly")
        template = pb.TaskSpec(pool="p2", payload=b"r")
        await node1.admin.AddRecurring(pb.RecurringRequest(name=name, cron="0 0 3 * * *", template=template),
                                       metadata=bearer(ADMIN_TOKEN))  # fmt: skip
        schedules = await node1.admin.ListRecurring(pb.Empty(), metadata=bearer(METRICS_TOKEN))
        assert [(s.name, s.pool) for s in schedules.schedules if s.name == name] == [(name, "p2")]
        async with grpc.aio.insecure_channel(federation["s2"].address) as channel:
            own = await pbg.AdminStub(channel).ListRecurring(pb.Empty(), metadata=bearer(METRICS_TOKEN))
            assert name in {s.name for s in own.schedules}  # it lives in shard s2
        removed = await node1.admin.RemoveRecurring(pb.RemoveRecurringRequest(name=name), metadata=bearer(ADMIN_TOKEN))
        assert removed.removed
    finally:
        await worker.stop(1)
        await running


async def test_a_watch_merges_every_shards_events(federation: Federation, node1: Stubs) -> None:
    call = node1.tasks.Watch(pb.WatchRequest(), metadata=bearer(CLIENT_TOKEN))
    await call.initial_metadata()
    ids = {await submit(node1, "default"), await submit(node1, "p2")}
    for task_id in ids:
        await node1.tasks.Cancel(pb.CancelRequest(task=pb.TaskRef(id=task_id)), metadata=bearer(CLIENT_TOKEN))
    seen: set[int] = set()

    async def read() -> None:
        async for event in call:
            if event.id in ids and event.status == pb.TASK_STATUS_CANCELLED:
                seen.add(event.id)
                if seen == ids:
                    return

    await asyncio.wait_for(read(), 10)
    call.cancel()


# ------------------------------------------------------------------------------- HTTP


async def test_http_requests_are_routed_too(federation: Federation) -> None:
    base = federation["s1"].http
    status, body = await asyncio.to_thread(http, "POST", f"{base}/v1/tasks", CLIENT_TOKEN,
                                           {"pool": "p2", "payload": "hello", "key": unique("h")})  # fmt: skip
    assert status == 200, body
    task_id = int(body["id"])
    assert task_id >> SHARD_BITS == 2
    status, info = await asyncio.to_thread(http, "GET", f"{base}/v1/tasks/{task_id}", CLIENT_TOKEN)
    assert status == 200 and info["pool"] == "p2" and "unavailable_shards" not in info
    status, body = await asyncio.to_thread(http, "POST", f"{base}/v1/tasks:batch", CLIENT_TOKEN,
                                           {"tasks": [{"pool": "default"}, {"pool": "p2"}]})  # fmt: skip
    assert status == 400 and body["code"] == "bad_request"
    status, snap = await asyncio.to_thread(http, "GET", f"{base}/v1/snapshot", METRICS_TOKEN)
    assert status == 200 and snap["unavailable_shards"] == [] and {p["name"] for p in snap["pools"]} >= {"p2"}


# ------------------------------------------------------------------------------- workers


async def test_a_worker_of_the_wrong_shard_ends_up_serving_on_the_right_one(federation: Federation,
                                                                           node1: Stubs) -> None:  # fmt: skip
    worker, running = await run_worker(federation["s1"].address, "p2")  # s1 does not serve p2
    try:
        response = await node1.tasks.Submit(
            pb.SubmitRequest(task=pb.TaskSpec(pool="p2", payload=b"r"), wait=True, wait_timeout_s=10),
            metadata=bearer(CLIENT_TOKEN),
        )
        assert response.result.status == pb.TASK_STATUS_SUCCEEDED and response.result.output == b"done:r"
        async with grpc.aio.insecure_channel(federation["s2"].address) as channel:
            workers = await pbg.AdminStub(channel).ListWorkers(pb.Empty(), metadata=bearer(METRICS_TOKEN))
        assert any(info.pool == "p2" for info in workers.workers)
    finally:
        await worker.stop(1)
        await running
