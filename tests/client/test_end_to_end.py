"""Client and Worker against a real (fake) gRPC server over loopback sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from cronoq.client import Client, ClientError, Lease, task
from cronoq.proto import cronoq_pb2 as pb
from tests.client.conftest import TOKEN
from tests.client.fake_server import FakeCronoq, eventually

CLIENT_TOKEN = "client-token-0123456789"


async def echo(lease: Lease) -> Any:
    body = lease.json() if lease.content_type == "application/json" else lease.text()
    return {"echo": body, "attempt": lease.attempt, "pool": lease.pool, "priority": lease.priority}


async def test_register_lease_complete_and_submit_wait(fake: FakeCronoq, start_worker: Any) -> None:
    running = start_worker(
        f"http://{fake.address}/", echo, pool="llm", slots=4, token=TOKEN, name="w1", labels={"gpu": "a100"}
    )
    worker = running.worker
    await worker.wait_registered(timeout=5)
    assert (worker.worker_id, worker.granted_slots, worker.server_protocol) == (1, 4, 3)
    assert worker.lease_ttl is None and worker.max_message_bytes is None
    assert worker.connections == 1

    stream = fake.streams[0]
    # batch_bytes: the Worker takes batched leases up to its channel's receive limit (gRPC's default).
    assert stream.register == pb.Register(
        pool="llm", slots=4, worker_name="w1", protocol_version=3, labels={"gpu": "a100"}, batch_bytes=4 * 1024 * 1024
    )
    assert stream.metadata["authorization"] == f"Bearer {TOKEN}"

    async with Client(fake.address, token=CLIENT_TOKEN) as client:
        sub = await client.submit({"prompt": "hi"}, pool="llm", priority="high", wait=True)
        assert sub.id == 1 and not sub.duplicate
        assert sub.result is not None and sub.result.ok
        assert sub.result.json() == {"echo": {"prompt": "hi"}, "attempt": 1, "pool": "llm", "priority": "high"}
        method, metadata, _ = fake.calls[-1]
        assert method == "Submit" and metadata["authorization"] == f"Bearer {CLIENT_TOKEN}"

    (complete,) = stream.of_kind("complete")
    assert complete.content_type == "application/json"
    assert stream.kinds() == ["complete"]
    await running.stop()


async def test_no_token_means_no_authorization_metadata(fake: FakeCronoq, start_worker: Any) -> None:
    running = start_worker(fake.address, echo)
    await running.worker.wait_registered(timeout=5)
    assert "authorization" not in fake.streams[0].metadata
    async with Client(fake.address) as client:
        await client.submit(None)
    assert "authorization" not in fake.calls[-1][1]
    await running.stop()


async def test_submit_wait_timeout_sets_deadline(fake: FakeCronoq) -> None:
    async with Client(fake.address) as client:
        with pytest.raises(TimeoutError):
            await client.submit("x", pool="nobody", wait=True, wait_timeout=0.05)
        remaining = fake.deadlines["Submit"]
        assert remaining is not None and 4.5 < remaining <= 5.2
        request = fake.calls[-1][2]
        assert request.wait and request.wait_timeout_s == 0.05
        with pytest.raises(TimeoutError):
            await client.submit("x", pool="nobody", wait=True, wait_timeout=30, call_timeout=0.05)
        sub = await client.submit("x", pool="nobody")
        assert fake.deadlines["Submit"] is None and sub.result is None
        assert not fake.calls[-1][2].HasField("wait_timeout_s")


async def test_task_rpcs(fake: FakeCronoq) -> None:
    async with Client(fake.address) as client:
        first = await client.submit("a", pool="p", key="k1", kind="kind-a", tenant="t1", priority="low")
        again = await client.submit("a", pool="p", key="k1")
        assert again.id == first.id and again.duplicate

        batch = await client.submit_batch([task("b", pool="p", key="k2"), task("c", pool="q", after="k2")])
        assert [s.id for s in batch] == [2, 3] and all(s.result is None for s in batch)
        assert list(fake.calls[-1][2].tasks) == [task("b", pool="p", key="k2"), task("c", pool="q", after="k2")]

        info = await client.get("k1")
        assert (info.id, info.status, info.pool, info.key, info.kind, info.tenant, info.priority) == (
            1,
            "ready",
            "p",
            "k1",
            "kind-a",
            "t1",
            "low",
        )
        assert info.created_at == 1.0 and info.started_at is None and not info.done
        assert (await client.get(2)).key == "k2"

        assert await client.cancel(2) is True
        assert await client.cancel("k2") is False
        assert (await client.get(2)).done

        page = await client.list_tasks(limit=2)
        assert [t.id for t in page.tasks] == [1, 2] and page.next_after == 2
        assert page.unavailable_shards == ("shard-9",)
        page = await client.list_tasks(after=2, limit=2)
        assert [t.id for t in page.tasks] == [3] and page.next_after is None
        page = await client.list_tasks(pools=["p"], statuses=["cancelled"])
        assert [t.id for t in page.tasks] == [2]
        request = fake.calls[-1][2]
        assert list(request.pools) == ["p"] and list(request.statuses) == [pb.TASK_STATUS_CANCELLED]

        for n in range(4, 9):
            await client.submit(n, pool="bulk")
        ids = [t.id async for t in client.iter_tasks(pools=["bulk"], page_size=2)]
        assert ids == [4, 5, 6, 7, 8]
        assert [c[2].after for c in fake.calls if c[0] == "ListTasks"][-3:] == [0, 5, 7]

        with pytest.raises(ClientError) as err:
            await client.get(999)
        assert err.value.code == "not_found" and not err.value.retryable

        fake.fail_next["Submit"] = (grpc.StatusCode.RESOURCE_EXHAUSTED, "pool full")
        with pytest.raises(ClientError) as err:
            await client.submit("x")
        assert (err.value.code, err.value.message, err.value.retryable) == ("resource_exhausted", "pool full", True)


async def test_wait_and_timeouts(fake: FakeCronoq, start_worker: Any) -> None:
    async with Client(fake.address) as client:
        sub = await client.submit("slow", pool="later")
        with pytest.raises(TimeoutError):
            await client.wait(sub.id, timeout=0.05)
        remaining = fake.deadlines["Wait"]
        assert remaining is not None and 4.5 < remaining <= 5.2
        assert fake.calls[-1][2].timeout_s == 0.05

        running = start_worker(fake.address, echo, pool="later")
        result = await client.wait(sub.id)
        assert not fake.calls[-1][2].HasField("timeout_s") and fake.deadlines["Wait"] is None
        assert result.ok and result.json()["echo"] == "slow"
        await running.stop()


async def test_watch_streams_until_cancelled(fake: FakeCronoq) -> None:
    async with Client(fake.address) as client:
        events: list[Any] = []

        async def consume() -> None:
            async for event in client.watch(["p"], ids=[1, 2], keys=["a"], all_transitions=True):
                events.append(event)

        consumer = asyncio.create_task(consume())
        await eventually(lambda: len(fake.watchers) == 1, what="watch to open")
        request = fake.watch_requests[-1]
        assert (list(request.pools), list(request.ids), list(request.keys), request.all_transitions) == (
            ["p"],
            [1, 2],
            ["a"],
            True,
        )
        await client.submit("x", pool="p", key="a")
        await client.submit("y", pool="p")
        fake.settle(1, pb.TASK_STATUS_SUCCEEDED, b"")
        fake.settle(2, pb.TASK_STATUS_FAILED, None, "boom")
        await eventually(lambda: len(events) == 2, what="two events")
        fake.end_watches((grpc.StatusCode.CANCELLED, "server going away"))
        await asyncio.wait_for(consumer, 5)  # ends silently
        assert [(e.id, e.status, e.key, e.pool, e.at, e.message) for e in events] == [
            (1, "succeeded", "a", "p", 1.0, ""),
            (2, "failed", "", "p", 2.0, "boom"),
        ]


async def test_watch_other_status_raises(fake: FakeCronoq) -> None:
    async with Client(fake.address) as client:
        stream = client.watch()

        async def first() -> Any:
            return await stream.__anext__()

        getter = asyncio.create_task(first())
        await eventually(lambda: len(fake.watchers) == 1, what="watch to open")
        fake.end_watches((grpc.StatusCode.DATA_LOSS, "consumer too slow"))
        with pytest.raises(ClientError) as err:
            await asyncio.wait_for(getter, 5)
        assert err.value.code == "data_loss"


async def test_watch_normal_end(fake: FakeCronoq) -> None:
    async with Client(fake.address) as client:
        seen = []

        async def consume() -> None:
            async for event in client.watch(all_transitions=False):
                seen.append(event)

        consumer = asyncio.create_task(consume())
        await eventually(lambda: len(fake.watchers) == 1, what="watch to open")
        fake.end_watches(None)
        await asyncio.wait_for(consumer, 5)
        assert seen == [] and fake.watch_requests[-1].all_transitions is False


async def test_admin_rpcs(fake: FakeCronoq, start_worker: Any) -> None:
    running = start_worker(fake.address, echo, pool="gpu", slots=2, name="w9", labels={"zone": "eu"})
    await running.worker.wait_registered(timeout=5)
    async with Client(fake.address) as client:
        snap = await client.snapshot()
        pool = snap.pool("default")
        assert pool is not None and pool.pending == 3 and pool.wait_p50 == 0.5
        assert (snap.running, snap.pending, snap.workers_connected) == (1, 3, 1)

        await client.add_recurring(
            "nightly",
            "0 3 * * *",
            {"job": 1},
            pool="gpu",
            kind="report",
            key="n",
            tz="Europe/Paris",
            overlap="queue_on_success",
            deadline_in=60,
        )
        request = fake.recurring["nightly"]
        assert (request.cron, request.tz, request.overlap) == ("0 3 * * *", "Europe/Paris", pb.OVERLAP_QUEUE_ON_SUCCESS)
        assert request.template == task({"job": 1}, pool="gpu", kind="report", key="n", deadline_in=60)

        prebuilt = task("x", pool="gpu")
        await client.add_recurring("hourly", "0 * * * *", prebuilt)
        assert fake.recurring["hourly"].template == prebuilt
        assert fake.recurring["hourly"].tz == "" and fake.recurring["hourly"].overlap == pb.OVERLAP_SKIP

        schedules = {r.name: r for r in await client.list_recurring()}
        assert schedules["nightly"].overlap == "queue_on_success" and schedules["nightly"].pool == "gpu"
        assert schedules["hourly"].overlap == "skip" and schedules["hourly"].next_at is None

        assert await client.remove_recurring("hourly") is True
        assert await client.remove_recurring("hourly") is False

        (w,) = await client.list_workers()
        assert (w.name, w.pool, w.labels, w.slots, w.connected_at) == ("w9", "gpu", {"zone": "eu"}, 2, 5.0)

        fake.fail_next["Snapshot"] = (grpc.StatusCode.PERMISSION_DENIED, "metrics role needed")
        with pytest.raises(ClientError) as err:
            await client.snapshot()
        assert err.value.code == "permission_denied"
    await running.stop()


async def test_client_reconnects_after_close(fake: FakeCronoq) -> None:
    client = Client(fake.address)
    await client.submit("a")
    await client.close()
    await client.submit("b")  # a new channel is opened lazily
    await client.close()
    await client.close()
    assert [c[0] for c in fake.calls] == ["Submit", "Submit"]
