"""A whole shard down (SQLite files, real processes): the other shard keeps serving, reads name the
missing shard, and nothing that might touch the missing shard's tasks is guessed."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.federation.conftest import Federation
from tests.federation.test_routing import bearer, http
from tests.server.harness import CLIENT_TOKEN, METRICS_TOKEN


async def test_reads_name_a_missing_shard_and_the_others_keep_serving(sqlite_federation: Federation) -> None:
    cluster = sqlite_federation
    key = f"k-{uuid.uuid4().hex[:8]}"
    async with grpc.aio.insecure_channel(cluster["s1"].address) as channel:
        tasks, admin = pbg.TasksStub(channel), pbg.AdminStub(channel)
        auth = bearer(CLIENT_TOKEN)
        here = await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="default", key=key)), metadata=auth)
        await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2")), metadata=auth)
        cluster["s2"].kill()

        snapshot = await admin.Snapshot(pb.Empty(), metadata=bearer(METRICS_TOKEN))
        assert list(snapshot.unavailable_shards) == ["s2"]
        assert {pool.name for pool in snapshot.pools} == {"default", "other"}
        listing = await tasks.ListTasks(pb.ListTasksRequest(), metadata=auth)
        assert list(listing.unavailable_shards) == ["s2"] and here.id in {task.id for task in listing.tasks}
        workers = await admin.ListWorkers(pb.Empty(), metadata=bearer(METRICS_TOKEN))
        assert list(workers.unavailable_shards) == ["s2"]

        # Submissions to the shard that is up succeed; those for the missing one say so.
        await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="default")), metadata=auth)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2")), metadata=auth)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "s2" in (err.value.details() or "")

        # Get by key still finds the task a reachable shard holds, naming the missing shard ...
        call = tasks.Get(pb.GetRequest(task=pb.TaskRef(key=key)), metadata=auth)
        info = await call
        assert info.id == here.id
        assert dict(await call.trailing_metadata()).get("cronoq-unavailable-shards") == "s2"
        # ... but Cancel by key is refused: the missing shard might hold the same key.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await tasks.Cancel(pb.CancelRequest(task=pb.TaskRef(key=key)), metadata=auth)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        cancelled = await tasks.Cancel(pb.CancelRequest(task=pb.TaskRef(id=here.id)), metadata=auth)
        assert cancelled.cancelled  # by id it is clear where the task lives

    base = cluster["s1"].http
    status, body = await asyncio.to_thread(http, "GET", f"{base}/v1/snapshot", METRICS_TOKEN)
    assert status == 200 and body["unavailable_shards"] == ["s2"]
    status, body = await asyncio.to_thread(http, "GET", f"{base}/v1/tasks/by-key/{key}", CLIENT_TOKEN)
    assert status == 200 and body["unavailable_shards"] == ["s2"] and body["id"] == str(here.id)
    status, body = await asyncio.to_thread(http, "GET", f"{base}/v1/tasks", CLIENT_TOKEN)
    assert status == 200 and body["unavailable_shards"] == ["s2"]

    # The shard comes back: everything is answered again, and its acknowledged task is still there.
    cluster["s2"].start()
    async with grpc.aio.insecure_channel(cluster["s1"].address) as channel:
        tasks = pbg.TasksStub(channel)
        for _ in range(100):
            listing = await tasks.ListTasks(pb.ListTasksRequest(pools=["p2"]), metadata=bearer(CLIENT_TOKEN))
            if not listing.unavailable_shards:
                break
            await asyncio.sleep(0.1)
        assert not listing.unavailable_shards and len(listing.tasks) == 1
