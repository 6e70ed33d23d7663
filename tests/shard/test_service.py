"""The shard service with in-process worker sessions (the gRPC layer is tested elsewhere)."""

from __future__ import annotations

import asyncio

import pytest
from cronoq.engine import CoreConfig, PoolConfig, TaskSpec, TaskStatus, UnknownTask
from cronoq.engine.types import NS_PER_S
from cronoq.shard.blob import Blob, BlobCodec
from cronoq.shard.service import ShardService, WaitTimeout, WorkerRefused
from cronoq.shard.workers import AbortOut, LeaseOut, SessionEnd, ShutdownOut
from cronoq.stores import MemoryStore


def service(**pool: object) -> ShardService:
    pool.setdefault("lease_ttl", 30 * NS_PER_S)
    config = CoreConfig(pools=(PoolConfig("default", **pool),))  # type: ignore[arg-type]
    return ShardService(config, store=MemoryStore(codec=BlobCodec()))


async def next_out(session: object) -> object:
    return await asyncio.wait_for(session.outbound.get(), 5)  # type: ignore[attr-defined]


async def test_a_task_runs_on_a_registered_worker_and_its_result_waits() -> None:
    svc = service()
    await svc.lead()
    worker = svc.register_worker("default", 2, "w1", {}, 3)
    task_id, duplicate = await svc.submit(TaskSpec(payload=Blob(b"hi", "text/plain")))
    assert not duplicate
    out = await next_out(worker)
    assert isinstance(out, LeaseOut) and out.lease.task_id == task_id and out.lease.attempt == 1
    waiting = asyncio.ensure_future(svc.wait(task_id, 5))
    svc.worker_complete(worker, out.lease.id, Blob(b"done", "text/plain"))
    result = await waiting
    assert result.status is TaskStatus.SUCCEEDED and result.output == Blob(b"done", "text/plain")
    info = await svc.get(task_id)
    assert info is not None and info[1] is True
    await svc.shutdown(0.1)
    assert isinstance(await next_out(worker), ShutdownOut)


async def test_disconnect_fails_leases_as_retryable_and_another_worker_gets_the_retry() -> None:
    svc = service(retry=__import__("cronoq.engine", fromlist=["RetryPolicy"]).RetryPolicy(initial_backoff=0))
    await svc.lead()
    first = svc.register_worker("default", 1, "a", {}, 3)
    task_id, _ = await svc.submit(TaskSpec(payload=Blob(b"x")))
    lease = await next_out(first)
    assert isinstance(lease, LeaseOut)
    second = svc.register_worker("default", 1, "b", {}, 3)
    svc.unregister_worker(first)
    retry = await next_out(second)
    assert isinstance(retry, LeaseOut) and retry.lease.task_id == task_id and retry.lease.attempt == 2
    await svc.shutdown(0.1)


async def test_a_worker_that_lets_a_lease_expire_is_disconnected_and_the_retry_goes_elsewhere() -> None:
    retry = __import__("cronoq.engine", fromlist=["RetryPolicy"]).RetryPolicy(initial_backoff=0)
    svc = service(retry=retry, lease_ttl=NS_PER_S // 5)
    await svc.lead()
    stalled = svc.register_worker("default", 2, "a", {}, 3)
    task_id, _ = await svc.submit(TaskSpec(payload=Blob(b"x")))
    lease = await next_out(stalled)
    assert isinstance(lease, LeaseOut)
    healthy = svc.register_worker("default", 1, "b", {}, 3)
    # No heartbeat: the lease expires, its worker is told (abort) and then let go.
    abort = await next_out(stalled)
    assert isinstance(abort, AbortOut) and abort.lease_id == lease.lease.id and abort.reason == "lease expired"
    assert stalled.closed and stalled.ended_by is SessionEnd.LEASE_EXPIRED
    assert stalled.id not in svc.workers.sessions
    again = await next_out(healthy)
    assert isinstance(again, LeaseOut) and again.lease.task_id == task_id and again.lease.attempt == 2
    assert healthy.ended_by is None
    await svc.shutdown(0.1)


async def test_nack_hands_the_same_attempt_to_another_worker() -> None:
    svc = service()
    await svc.lead()
    first = svc.register_worker("default", 1, "a", {}, 3)
    second = svc.register_worker("default", 1, "b", {}, 3)
    await svc.submit(TaskSpec(payload=Blob(b"x")))
    got_first = await next_out(first) if not first.outbound.empty() else None
    holder, other = (first, second) if got_first is not None else (second, first)
    lease = got_first if got_first is not None else await next_out(second)
    assert isinstance(lease, LeaseOut)
    svc.worker_nack(holder, lease.lease.id, "busy")
    again = await next_out(other)
    assert isinstance(again, LeaseOut) and again.lease.id == lease.lease.id and again.lease.attempt == 1
    await svc.shutdown(0.1)


async def test_cancel_aborts_the_running_lease() -> None:
    svc = service()
    await svc.lead()
    worker = svc.register_worker("default", 1, "a", {}, 3)
    task_id, _ = await svc.submit(TaskSpec(payload=Blob(b"x")))
    lease = await next_out(worker)
    assert await svc.cancel(task_id) is True
    abort = await next_out(worker)
    assert isinstance(abort, AbortOut) and isinstance(lease, LeaseOut) and abort.lease_id == lease.lease.id
    assert await svc.cancel(task_id) is False
    with pytest.raises(UnknownTask):
        await svc.cancel(123456)
    await svc.shutdown(0.1)


async def test_old_protocol_and_unknown_pool_are_refused() -> None:
    svc = service()
    await svc.lead()
    with pytest.raises(WorkerRefused) as old:
        svc.register_worker("default", 1, "a", {}, 2)
    assert old.value.code == "failed_precondition"
    with pytest.raises(WorkerRefused) as unknown:
        svc.register_worker("nope", 1, "a", {}, 3)
    assert unknown.value.code == "not_found"
    await svc.shutdown(0.1)


async def test_wait_times_out_while_the_task_keeps_running() -> None:
    svc = service()
    await svc.lead()
    task_id, _ = await svc.submit(TaskSpec(payload=Blob(b"x")))
    with pytest.raises(WaitTimeout):
        await svc.wait(task_id, 0.05)
    info = await svc.get(task_id)
    assert info is not None and info[0].status is TaskStatus.READY
    await svc.shutdown(0.1)


async def test_watch_sees_terminal_events_and_drops_a_slow_reader() -> None:
    svc = service()
    svc.options.watch_buffer = 2
    await svc.lead()
    worker = svc.register_worker("default", 8, "a", {}, 3)
    sub = svc.watch(None, (), (), all_transitions=False)
    ids = [tid for tid, _ in await svc.submit_batch([TaskSpec(payload=Blob(b"x")) for _ in range(4)])]
    for _ in ids:
        lease = await next_out(worker)
        assert isinstance(lease, LeaseOut)
        svc.worker_complete(worker, lease.lease.id, Blob(b""))
    first = await asyncio.wait_for(sub.next(), 5)
    assert first.status is TaskStatus.SUCCEEDED
    with pytest.raises(Exception, match="behind"):
        for _ in range(5):
            await asyncio.wait_for(sub.next(), 5)
    await svc.shutdown(0.1)


async def test_finished_rows_are_pruned_after_keep_finished(tmp_path: object) -> None:
    from pathlib import Path

    from cronoq.shard.driver import DriverOptions
    from cronoq.shard.service import ServiceOptions
    from cronoq.stores.sqlite import SqliteStore

    store = SqliteStore(Path(str(tmp_path)) / "shard.db", codec=BlobCodec())
    options = ServiceOptions(driver=DriverOptions(keep_finished_s=0.0, prune_interval_s=0.05))
    config = CoreConfig(pools=(PoolConfig("default", lease_ttl=30 * NS_PER_S),))
    svc = ShardService(config, store=store, options=options)
    await svc.lead()
    worker = svc.register_worker("default", 1, "w", {}, 3)
    task_id, _ = await svc.submit(TaskSpec(payload=Blob(b"x")))
    lease = await next_out(worker)
    assert isinstance(lease, LeaseOut)
    svc.worker_complete(worker, lease.lease.id, Blob(b"out"))
    assert (await svc.wait(task_id, 5)).status is TaskStatus.SUCCEEDED
    assert (await store.load_output(task_id))[0] is True
    for _ in range(100):
        if not (await store.load_output(task_id))[0]:
            break
        await asyncio.sleep(0.05)
    assert (await store.load_output(task_id))[0] is False, "the finished row should have been pruned"
    await svc.shutdown(0.1)
    await store.close()
