"""The Tasks and Admin services of a real server, through cronoq.client."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from cronoq.client import Client, ClientError, Lease, task
from tests.server.harness import ADMIN_TOKEN, METRICS_TOKEN, ServerProcess
from tests.waiting import eventually


async def upper(lease: Lease) -> bytes:
    return lease.payload.upper()


async def test_submit_with_wait_returns_the_workers_output(client: Client, workers) -> None:
    await workers("default", upper, slots=2)
    done = await client.submit(b"hello", wait=True, wait_timeout=5, kind="shout", tags={"k": "v"})
    assert done.result is not None
    assert done.result.status == "succeeded" and done.result.output == b"HELLO"
    info = await client.get(done.id)
    assert (info.status, info.pool, info.kind, info.attempt, info.output_available) == (
        "succeeded",
        "default",
        "shout",
        1,
        True,
    )
    assert info.created_at is not None and info.finished_at is not None


async def test_lease_carries_the_task_fields(client: Client, workers) -> None:
    seen: list[Lease] = []

    async def record(lease: Lease) -> str:
        seen.append(lease)
        return "ok"

    await workers("default", record)
    done = await client.submit(
        {"n": 1},
        wait=True,
        key="lease-fields",
        kind="k1",
        priority="high",
        timeout=30,
        deadline_in=60,
        tags={"team": "x"},
    )
    assert done.result is not None and done.result.text() == "ok"
    lease = seen[0]
    assert lease.json() == {"n": 1} and lease.content_type == "application/json"
    assert (lease.key, lease.kind, lease.priority, lease.pool, lease.tags) == (
        "lease-fields",
        "k1",
        "high",
        "default",
        {"team": "x"},
    )
    assert lease.timeout == 30 and lease.deadline is not None and lease.lease_ttl == 30


async def test_a_batch_dag_runs_parents_first_and_keys_deduplicate(client: Client, workers) -> None:
    order: list[str] = []

    async def run(lease: Lease) -> bytes:
        order.append(lease.key)
        await asyncio.sleep(0.01)
        return lease.key.encode()

    await workers("dag", run, slots=4)
    # Children are listed before their parents: keys may be referenced anywhere in the batch.
    specs = [
        task(b"load", pool="dag", key="etl-load", after=["etl-transform"]),
        task(b"transform", pool="dag", key="etl-transform", after=["etl-extract"]),
        task(b"extract", pool="dag", key="etl-extract"),
        task(b"notify", pool="dag", key="etl-notify", deps=[("etl-load", "on_complete")]),
    ]
    submitted = await client.submit_batch(specs)
    assert [s.duplicate for s in submitted] == [False] * 4
    assert len({s.id for s in submitted}) == 4
    result = await client.wait("etl-notify", timeout=10)
    assert result.status == "succeeded" and result.output == b"etl-notify"
    assert order == ["etl-extract", "etl-transform", "etl-load", "etl-notify"]
    again = await client.submit_batch([task(b"x", pool="dag", key="etl-extract")])
    assert again[0].duplicate and again[0].id == submitted[2].id
    dup = await client.submit(b"y", pool="dag", key="etl-load")
    assert dup.duplicate and dup.id == submitted[0].id


async def test_get_list_wait_and_cancel(client: Client) -> None:
    ids = [(await client.submit(f"t{i}", pool="other", key=f"lwc-{i}")).id for i in range(3)]
    info = await client.get("lwc-1")
    assert info.id == ids[1] and info.status == "ready" and info.key == "lwc-1"

    with pytest.raises(TimeoutError):
        await client.wait(ids[0], timeout=0.2)

    first = await client.list_tasks(pools=["other"], statuses=["ready"], after=ids[0] - 1, limit=2)
    assert [t.id for t in first.tasks] == ids[:2] and first.next_after == ids[1]
    second = await client.list_tasks(pools=["other"], statuses=["ready"], after=first.next_after, limit=2)
    assert [t.id for t in second.tasks][:1] == ids[2:]
    everything = [t.id async for t in client.iter_tasks(pools=["other"], page_size=1)]
    assert set(ids) <= set(everything) and everything == sorted(everything)

    assert await client.cancel(ids[0]) is True
    assert await client.cancel(ids[0]) is False
    assert await client.cancel("lwc-1") is True
    result = await client.wait(ids[0], timeout=1)
    assert result.status == "cancelled" and result.output is None
    cancelled = await client.list_tasks(pools=["other"], statuses=["cancelled"])
    assert {ids[0], ids[1]} <= {t.id for t in cancelled.tasks}
    assert await client.cancel(ids[2]) is True

    with pytest.raises(ClientError) as missing:
        await client.get(123456789)
    assert missing.value.code == "not_found"
    with pytest.raises(ClientError) as missing_key:
        await client.wait("no-such-key", timeout=1)
    assert missing_key.value.code == "not_found"


async def test_list_limit_is_capped_by_max_list(client: Client) -> None:
    # max_list is 50 in this server's configuration.
    await client.submit_batch([task(b"", pool="other") for _ in range(60)])
    page = await client.list_tasks(pools=["other"], limit=1000)
    assert len(page.tasks) == 50 and page.next_after == page.tasks[-1].id
    default = await client.list_tasks(pools=["other"])
    assert len(default.tasks) == 50  # limit 0 means 100, capped at 50


async def test_watch_streams_terminal_events_and_transitions(client: Client, workers) -> None:
    terminal: list[tuple[str, str]] = []
    transitions: list[tuple[str, str]] = []
    # Markers: tasks submitted and cancelled until both watches have reported one, which proves both
    # subscriptions are open on the server (a watch reports only what happens after it opened).
    markers = [f"w-open-{n}" for n in range(100)]

    async def follow_terminal() -> None:
        async for event in client.watch(["watched"]):
            terminal.append((event.key, event.status))
            if event.key == "w-2":
                return

    async def follow_all() -> None:
        async for event in client.watch(keys=["w-1", *markers], all_transitions=True):
            transitions.append((event.key, event.status))
            if (event.key, event.status) == ("w-1", "succeeded"):
                return

    def reported(key: str) -> bool:
        return (key, "cancelled") in terminal and (key, "cancelled") in transitions

    watchers = [asyncio.ensure_future(follow_terminal()), asyncio.ensure_future(follow_all())]
    for marker in markers:
        await client.cancel((await client.submit(b"marker", pool="watched", key=marker)).id)
        with contextlib.suppress(AssertionError):
            await eventually(lambda marker=marker: reported(marker), limit=0.5)
            break
    else:
        raise AssertionError("the watches never reported a marker task")
    await client.submit(b"other pool", pool="other", key="w-elsewhere")
    await workers("watched", upper)
    await client.submit(b"1", pool="watched", key="w-1", wait=True)
    await client.submit(b"2", pool="watched", key="w-2", wait=True)
    await asyncio.wait_for(asyncio.gather(*watchers), 10)
    assert [event for event in terminal if event[0] not in markers] == [("w-1", "succeeded"), ("w-2", "succeeded")]
    statuses = [status for key, status in transitions if key == "w-1"]
    assert "running" in statuses and statuses[-1] == "succeeded"


async def test_snapshot_workers_and_recurring(server: ServerProcess, workers) -> None:
    await workers("watched", upper, name="snap-worker", slots=3)
    async with Client(server.address, token=METRICS_TOKEN) as metrics:
        snap = await metrics.snapshot()
        pool = snap.pool("watched")
        assert pool is not None and pool.capacity == 3 and pool.workers_connected == 1
        assert pool.groups[0].labels == {} and pool.groups[0].capacity == 3
        assert snap.workers_connected >= 1 and snap.totals.submitted >= 0
        listed = [w for w in await metrics.list_workers() if w.name == "snap-worker"]
        assert len(listed) == 1 and listed[0].pool == "watched" and listed[0].slots == 3
    async with Client(server.address, token=ADMIN_TOKEN) as admin:
        await admin.add_recurring("nightly", "0 3 * * *", b"report", pool="other", key="nightly", deadline_in=60)
        schedules = {s.name: s for s in await admin.list_recurring()}
        nightly = schedules["nightly"]
        assert (nightly.cron, nightly.pool, nightly.overlap, nightly.tz) == ("0 3 * * *", "other", "skip", "")
        assert nightly.next_at is not None and nightly.last_task_id is None
        with pytest.raises(ClientError) as bad:
            await admin.add_recurring("bad", "0 3 * * *", b"x", pool="other", start_in=5)
        assert bad.value.code == "invalid_argument"
        with pytest.raises(ClientError) as bad_cron:
            await admin.add_recurring("bad", "not a cron", b"x", pool="other")
        assert bad_cron.value.code == "invalid_argument"
        assert await admin.remove_recurring("nightly") is True
        assert await admin.remove_recurring("nightly") is False


async def test_failures_retries_and_permanent_failures(client: Client, workers) -> None:
    attempts: dict[str, int] = {}

    async def flaky(lease: Lease) -> bytes:
        attempts[lease.key] = lease.attempt
        if lease.key == "always-fails":
            raise RuntimeError("boom")
        if lease.attempt < 2:
            raise ValueError("not yet")
        return b"finally"

    await workers("default", flaky, slots=2)
    ok = await client.submit(b"", key="flaky-ok", wait=True)
    assert ok.result is not None and ok.result.output == b"finally" and attempts["flaky-ok"] == 2
    bad = await client.submit(b"", key="always-fails", wait=True)
    assert bad.result is not None and bad.result.status == "dead_lettered"
    assert "RuntimeError: boom" in bad.result.message and attempts["always-fails"] == 3


async def test_submit_wait_timeout_is_deadline_exceeded_and_the_task_keeps_going(client: Client) -> None:
    with pytest.raises(TimeoutError):
        await client.submit(b"", pool="other", key="wait-timeout", wait=True, wait_timeout=0.2)
    info = await client.get("wait-timeout")
    assert info.status == "ready"
    await client.cancel("wait-timeout")


async def test_payload_encodings_round_trip(client: Client, workers) -> None:
    async def echo(lease: Lease) -> bytes:
        return json.dumps({"ct": lease.content_type, "len": len(lease.payload)}).encode()

    await workers("default", echo)
    text = await client.submit("héllo", wait=True)
    assert text.result is not None and text.result.json() == {"ct": "text/plain; charset=utf-8", "len": 6}
    empty = await client.submit(None, wait=True)
    assert empty.result is not None and empty.result.json() == {"ct": "", "len": 0}
