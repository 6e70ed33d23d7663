"""What the Worker sends on the Work stream, checked against a real gRPC server on loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import cronoq
from cronoq.client import CancelTask, Lease, Reject
from cronoq.proto import cronoq_pb2 as pb
from tests.client.fake_server import FakeCronoq, WorkStream, eventually


async def outcome_handler(lease: Lease) -> Any:
    what = lease.text()
    if what == "bytes":
        return b"\x00raw"
    if what == "str":
        return "plain"
    if what == "none":
        return None
    if what == "json":
        return [1, {"a": True}]
    if what == "retry":
        raise cronoq.Retryable("later please", retry_after=2.5)
    if what == "retry-now":
        raise cronoq.Retryable("again")
    if what == "perm":
        raise cronoq.Permanent("bad input")
    if what == "reject":
        raise Reject("gpu busy")
    if what == "cancel":
        raise CancelTask()
    if what == "boom":
        raise ValueError("nope")
    if what == "own-cancel":
        raise asyncio.CancelledError()
    if what == "unencodable":
        return {"x": object()}
    if what == "big":
        return b"x" * 2000
    raise AssertionError(what)


def by_lease(stream: WorkStream) -> dict[int, tuple[str, Any]]:
    out = {}
    for m in stream.received:
        kind = m.WhichOneof("msg")
        body = getattr(m, kind)
        if hasattr(body, "lease"):
            out[body.lease] = (kind, body)
    return out


async def run_outcomes(fake: FakeCronoq, start_worker: Any, payloads: list[str]) -> tuple[WorkStream, dict[str, Any]]:
    running = start_worker(fake.address, outcome_handler, slots=len(payloads))
    await running.worker.wait_registered(timeout=5)
    stream = fake.streams[0]
    lease_of = {}
    for what in payloads:
        rec_id = fake._admit(pb.TaskSpec(payload=what.encode(), pool="default")).id
        lease_of[what] = rec_id
    await eventually(lambda: len(by_lease(stream)) == len(payloads), what="a report per lease")
    reports = by_lease(stream)
    task_to_lease = {tid: lid for lid, tid in fake.leases.items()}
    result = {what: reports[task_to_lease[tid]] for what, tid in lease_of.items()}
    await running.stop()
    return stream, result


async def test_handler_outcomes_protocol_3(fake: FakeCronoq, start_worker: Any) -> None:
    fake.max_message_bytes = 2500
    payloads = [
        "bytes",
        "str",
        "none",
        "json",
        "retry",
        "retry-now",
        "perm",
        "reject",
        "cancel",
        "boom",
        "own-cancel",
        "unencodable",
        "big",
    ]
    _, got = await run_outcomes(fake, start_worker, payloads)

    def complete(what: str) -> tuple[bytes, str]:
        kind, body = got[what]
        assert kind == "complete", (what, kind)
        return body.output, body.content_type

    assert complete("bytes") == (b"\x00raw", "application/octet-stream")
    assert complete("str") == (b"plain", "text/plain; charset=utf-8")
    assert complete("none") == (b"", "")
    assert complete("json") == (b'[1, {"a": true}]', "application/json")

    def fail(what: str) -> pb.Fail:
        kind, body = got[what]
        assert kind == "fail", (what, kind)
        return body

    f = fail("retry")
    assert (f.permanent, f.message, f.HasField("retry_after_s"), f.retry_after_s) == (False, "later please", True, 2.5)
    f = fail("retry-now")
    assert (f.permanent, f.message, f.HasField("retry_after_s")) == (False, "again", False)
    f = fail("perm")
    assert (f.permanent, f.message) == (True, "bad input")
    f = fail("boom")
    assert (f.permanent, f.message, f.HasField("retry_after_s")) == (False, "ValueError: nope", False)
    assert fail("own-cancel").permanent is False
    assert fail("unencodable").permanent is True
    f = fail("big")
    assert f.permanent is True and "2000" in f.message

    kind, body = got["reject"]
    assert kind == "nack" and body.reason == "gpu busy"
    kind, body = got["cancel"]
    assert kind == "cancelled"


async def test_output_size_limit_boundary(fake: FakeCronoq, start_worker: Any) -> None:
    fake.max_message_bytes = 2000 + 1024  # exactly fits: len + 1024 == limit
    _, got = await run_outcomes(fake, start_worker, ["big"])
    assert got["big"][0] == "complete"


async def test_protocol_1_fallbacks(fake: FakeCronoq, start_worker: Any) -> None:
    fake.protocol_version = 0  # read as protocol 1
    running = start_worker(fake.address, outcome_handler)
    await running.worker.wait_registered(timeout=5)
    assert running.worker.server_protocol == 1
    await running.stop()
    fake.streams.clear()

    _, got = await run_outcomes(fake, start_worker, ["reject", "cancel"])
    kind, body = got["reject"]
    assert (kind, body.permanent, body.message) == ("fail", False, "gpu busy")
    kind, body = got["cancel"]
    assert (kind, body.permanent) == ("fail", True)


async def test_registered_fields(fake: FakeCronoq, start_worker: Any) -> None:
    fake.lease_ttl_s = 12.0
    fake.granted_slots = 2
    fake.max_message_bytes = 4096
    fake.protocol_version = 7
    running = start_worker(fake.address, outcome_handler, slots=5)
    await running.worker.wait_registered(timeout=5)
    w = running.worker
    assert (w.worker_id, w.lease_ttl, w.granted_slots, w.server_protocol, w.max_message_bytes) == (1, 12.0, 2, 7, 4096)
    await running.stop()


async def test_heartbeats_from_registered_ttl(fake: FakeCronoq, start_worker: Any) -> None:
    fake.lease_ttl_s = 0.09  # period 0.03 s
    release = asyncio.Event()
    witness_release = asyncio.Event()

    async def slow(lease: Lease) -> str:
        await (release if lease.payload == b"x" else witness_release).wait()
        return "done"

    running = start_worker(fake.address, slow)
    await running.worker.wait_registered(timeout=5)
    stream = fake.streams[0]
    fake._admit(pb.TaskSpec(payload=b"x", pool="default"))
    await eventually(lambda: running.worker.running == 1, what="lease to start")
    started = asyncio.get_running_loop().time()
    await eventually(lambda: len(stream.of_kind("heartbeat")) >= 3, what="three heartbeats")
    elapsed = asyncio.get_running_loop().time() - started
    assert elapsed >= 0.06  # the first beat comes one period after the start, not at once
    assert {h.lease for h in stream.of_kind("heartbeat")} == {1000}
    release.set()
    await eventually(lambda: bool(stream.of_kind("complete")), what="completion")
    count = len(stream.of_kind("heartbeat"))
    # A second lease's own beats witness that several periods passed: the first got none meanwhile.
    fake._admit(pb.TaskSpec(payload=b"witness", pool="default"))
    await eventually(lambda: len([h for h in stream.of_kind("heartbeat") if h.lease != 1000]) >= 3, what="witness")
    assert len([h for h in stream.of_kind("heartbeat") if h.lease == 1000]) == count  # stops with the lease
    witness_release.set()
    await running.stop()


async def test_lease_ttl_overrides_registered_ttl(fake: FakeCronoq, start_worker: Any) -> None:
    fake.lease_ttl_s = 60.0  # would mean one beat every 20 s
    fake.lease_ttl_per_lease = 0.03  # period 0.01 s
    release = asyncio.Event()
    seen: list[Lease] = []

    async def slow(lease: Lease) -> None:
        seen.append(lease)
        await release.wait()

    running = start_worker(fake.address, slow)
    await running.worker.wait_registered(timeout=5)
    fake._admit(pb.TaskSpec(pool="default"))
    await eventually(lambda: len(fake.streams[0].of_kind("heartbeat")) >= 3, timeout=2, what="fast heartbeats")
    assert seen[0].lease_ttl == 0.03
    release.set()
    await running.stop()


async def test_no_ttl_no_heartbeats(fake: FakeCronoq, start_worker: Any) -> None:
    release = asyncio.Event()

    async def slow(lease: Lease) -> None:
        await release.wait()

    running = start_worker(fake.address, slow, slots=2)
    await running.worker.wait_registered(timeout=5)
    fake._admit(pb.TaskSpec(pool="default"))
    await eventually(lambda: running.worker.running == 1, what="lease to start")
    # A witness lease that does carry a TTL beats every 0.01 s; its beats prove time passed.
    fake.lease_ttl_per_lease = 0.03
    fake._admit(pb.TaskSpec(pool="default"))
    stream = fake.streams[0]
    await eventually(lambda: len(stream.of_kind("heartbeat")) >= 3, what="the witness's heartbeats")
    assert {beat.lease for beat in stream.of_kind("heartbeat")} == {1001}  # none for the lease without a TTL
    release.set()
    await running.stop()


async def test_abort_cancels_handler_and_sends_nothing(fake: FakeCronoq, start_worker: Any) -> None:
    fake.auto_dispatch = False
    observed: dict[str, Any] = {}

    async def waits_forever(lease: Lease) -> str:
        observed["lease"] = lease
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            observed["cancelled_event"] = lease.cancelled.is_set()
            raise
        return "never"

    running = start_worker(fake.address, waits_forever)
    await running.worker.wait_registered(timeout=5)
    stream = fake.streams[0]
    tid = fake._admit(pb.TaskSpec(pool="default")).id
    stream.send(lease=fake.lease_for(tid, ""))
    await eventually(lambda: running.worker.running == 1, what="lease to start")
    assert observed["lease"].pool == "default"  # empty Lease.pool: the worker's own pool
    stream.send(abort=pb.Abort(lease=1000, reason="timeout"))
    await eventually(lambda: "cancelled_event" in observed, what="handler cancellation")
    assert observed["cancelled_event"] is True
    assert running.worker.running == 0
    stream.send(abort=pb.Abort(lease=4242, reason="unknown lease is ignored"))
    await running.stop()
    assert stream.kinds() == ["set_slots"]  # the stream is ordered: nothing was sent before the stop's SetSlots(0)


async def test_leases_beyond_granted_slots_are_given_back(fake: FakeCronoq, start_worker: Any) -> None:
    fake.auto_dispatch = False
    fake.granted_slots = 1
    release = asyncio.Event()

    async def slow(lease: Lease) -> str:
        await release.wait()
        return "ok"

    running = start_worker(fake.address, slow, slots=3)
    await running.worker.wait_registered(timeout=5)
    assert running.worker.granted_slots == 1
    stream = fake.streams[0]
    for _ in range(2):
        tid = fake._admit(pb.TaskSpec(pool="default")).id
        stream.send(lease=fake.lease_for(tid, "default"))
    await eventually(lambda: bool(stream.of_kind("nack")), what="a nack")
    (nack,) = stream.of_kind("nack")
    assert (nack.lease, nack.reason) == (1001, "worker has no free slot")
    assert running.worker.running == 1
    release.set()
    await eventually(lambda: bool(stream.of_kind("complete")), what="completion")
    assert stream.of_kind("complete")[0].lease == 1000
    await running.stop()


async def test_requested_slots_apply_when_all_granted(fake: FakeCronoq, start_worker: Any) -> None:
    fake.auto_dispatch = False
    release = asyncio.Event()

    async def slow(lease: Lease) -> None:
        await release.wait()

    running = start_worker(fake.address, slow, slots=2)
    await running.worker.wait_registered(timeout=5)
    assert running.worker.granted_slots == 2  # Registered.slots == 0 → all requested granted
    stream = fake.streams[0]
    for _ in range(3):
        tid = fake._admit(pb.TaskSpec(pool="default")).id
        stream.send(lease=fake.lease_for(tid, "default"))
    await eventually(lambda: bool(stream.of_kind("nack")), what="a nack")
    assert running.worker.running == 2
    release.set()
    await running.stop()


async def test_graceful_stop(fake: FakeCronoq, start_worker: Any) -> None:
    fake.auto_dispatch = False
    started = asyncio.Event()

    async def slowish(lease: Lease) -> str:
        started.set()
        await asyncio.sleep(0.3)
        return "finished"

    running = start_worker(fake.address, slowish)
    await running.worker.wait_registered(timeout=5)
    stream = fake.streams[0]
    stream.send(lease=fake.lease_for(fake._admit(pb.TaskSpec(pool="default")).id, "default"))
    await started.wait()
    stopper = asyncio.create_task(running.worker.stop(grace=5))
    second = asyncio.create_task(running.worker.stop())  # concurrent stops share one shutdown
    await eventually(lambda: bool(stream.of_kind("set_slots")), what="SetSlots(0)")
    assert stream.of_kind("set_slots")[0].slots == 0
    # A lease that races the stop is handed back.
    stream.send(lease=fake.lease_for(fake._admit(pb.TaskSpec(pool="default")).id, "default"))
    await asyncio.wait_for(asyncio.gather(stopper, second), 10)
    await asyncio.wait_for(running.task, 5)
    assert stream.kinds() == ["set_slots", "nack", "complete"]
    assert stream.of_kind("nack")[0].reason == "worker is stopping"
    assert stream.of_kind("complete")[0].output == b"finished"
    assert stream.half_closed.is_set()
    assert running.worker.running == 0


async def test_stop_cancels_after_grace(fake: FakeCronoq, start_worker: Any) -> None:
    cancelled = asyncio.Event()

    async def stubborn(lease: Lease) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    running = start_worker(fake.address, stubborn)
    await running.worker.wait_registered(timeout=5)
    stream = fake.streams[0]
    fake._admit(pb.TaskSpec(pool="default"))
    await eventually(lambda: running.worker.running == 1, what="lease to start")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await asyncio.wait_for(running.worker.stop(grace=0.1), 5)
    assert loop.time() - t0 < 2.0
    await asyncio.wait_for(running.task, 5)
    assert cancelled.is_set()
    assert stream.kinds() == ["set_slots"]


async def test_sync_handler_is_supported(fake: FakeCronoq, start_worker: Any) -> None:
    def plain(lease: Lease) -> str:
        return lease.text().upper()

    running = start_worker(fake.address, plain)
    await running.worker.wait_registered(timeout=5)
    fake._admit(pb.TaskSpec(payload=b"abc", pool="default"))
    await eventually(lambda: bool(fake.streams[0].of_kind("complete")), what="completion")
    assert fake.streams[0].of_kind("complete")[0].output == b"ABC"
    await running.stop()


@pytest.mark.parametrize("slots", [1, 3])
async def test_lease_fields_reach_the_handler(fake: FakeCronoq, start_worker: Any, slots: int) -> None:
    seen: list[Lease] = []

    async def record(lease: Lease) -> None:
        seen.append(lease)

    running = start_worker(fake.address, record, pool="gpu", slots=slots)
    await running.worker.wait_registered(timeout=5)
    fake._admit(
        pb.TaskSpec(
            payload=b'{"n": 1}',
            content_type="application/json",
            pool="gpu",
            kind="k",
            key="key-1",
            tags={"traceparent": "00-abc"},
            priority=pb.PRIORITY_CRITICAL,
            timeout_s=9.5,
        )
    )
    await eventually(lambda: bool(seen), what="the handler to run")
    lease = seen[0]
    assert (lease.id, lease.task_id, lease.attempt, lease.kind, lease.key) == (1000, 1, 1, "k", "key-1")
    assert (lease.pool, lease.priority, lease.timeout, lease.deadline) == ("gpu", "critical", 9.5, None)
    assert lease.tags == {"traceparent": "00-abc"} and lease.json() == {"n": 1}
    await running.stop()
