"""Merging the answers of several shards."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from cronoq.router import RouteError, merge

from cronoq.proto import cronoq_pb2 as pb


async def events(ids: list[int], *, then: Exception | None = None, hold: bool = False,
                 closed: list[int] | None = None) -> AsyncIterator[pb.StatusEvent]:  # fmt: skip
    try:
        for task_id in ids:
            await asyncio.sleep(0)
            yield pb.StatusEvent(id=task_id)
        if then is not None:
            raise then
        if hold:
            await asyncio.Event().wait()
    finally:
        if closed is not None:
            closed.append(ids[0])


async def test_a_merged_stream_carries_every_event_and_ends_when_one_source_ends() -> None:
    closed: list[int] = []
    merged = merge.streams([events([1, 2], hold=True, closed=closed), events([10, 11, 12], closed=closed)])
    seen = [event.id async for event in merged]
    assert set(seen) >= {10, 11, 12} and seen.index(10) < seen.index(11) < seen.index(12)
    assert sorted(closed) == [1, 10]  # the source that was still open was closed too


async def test_a_sources_error_ends_the_merged_stream_with_it() -> None:
    failure = RouteError(grpc.StatusCode.UNAVAILABLE, "shard 's2' is unavailable")
    merged = merge.streams([events([1], hold=True), events([5], then=failure)])
    with pytest.raises(RouteError) as err:
        async for _ in merged:
            pass
    assert err.value is failure


def test_snapshots_add_up_and_keep_every_pool() -> None:
    one = pb.SnapshotResponse(pools=[pb.PoolSnapshot(name="a")], live_tasks=3, running=1, pending=2,
                              workers_connected=1, totals=pb.Totals(submitted=5, succeeded=2))  # fmt: skip
    two = pb.SnapshotResponse(pools=[pb.PoolSnapshot(name="b")], live_tasks=4, running=2, pending=2,
                              workers_connected=2, totals=pb.Totals(submitted=7, failed=1))  # fmt: skip
    out = merge.snapshots([one, two], ["s3"])
    assert [pool.name for pool in out.pools] == ["a", "b"]
    assert (out.live_tasks, out.running, out.pending, out.workers_connected) == (7, 3, 4, 3)
    assert (out.totals.submitted, out.totals.succeeded, out.totals.failed) == (12, 2, 1)
    assert list(out.unavailable_shards) == ["s3"]
