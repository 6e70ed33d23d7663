"""Combining the answers of several shards into one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import cronoq_pb2 as pb

__all__ = ["SHARD_BITS", "concatenated", "pages", "snapshots", "streams"]

SHARD_BITS = 56
"""Task ids carry their shard's number above this bit."""

Listing = TypeVar("Listing", pb.ListWorkersResponse, pb.ListRecurringResponse, cpb.ListShardsResponse,
                   cpb.ListSchedulesResponse)  # fmt: skip

_TOTALS = tuple(pb.Totals.DESCRIPTOR.fields_by_name)


def snapshots(parts: Sequence[pb.SnapshotResponse], unavailable: Sequence[str]) -> pb.SnapshotResponse:
    """One snapshot of every shard: pools side by side (each pool lives in one shard), counts and
    totals summed, and the shards that could not be asked."""
    out = pb.SnapshotResponse(unavailable_shards=list(unavailable))
    for part in parts:
        out.pools.extend(part.pools)
        out.live_tasks += part.live_tasks
        out.running += part.running
        out.pending += part.pending
        out.workers_connected += part.workers_connected
        for name in _TOTALS:
            setattr(out.totals, name, getattr(out.totals, name) + getattr(part.totals, name))
    return out


def concatenated(out: Listing, field: str, parts: Sequence[Listing]) -> Listing:
    """``out`` with the entries of every part's repeated ``field`` (workers, schedules) appended."""
    entries = getattr(out, field)
    for part in parts:
        entries.extend(getattr(part, field))
    return out


_END = object()


async def streams(sources: Sequence[AsyncIterator[pb.StatusEvent]]) -> AsyncIterator[pb.StatusEvent]:
    """Events of every source as they come. Ends when any source ends; a source's error is raised
    here. Closing this iterator closes every source."""
    if len(sources) == 1:
        async for event in sources[0]:
            yield event
        return
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1024)

    async def pump(source: AsyncIterator[pb.StatusEvent]) -> None:
        try:
            async for event in source:
                await queue.put(event)
        except Exception as exc:
            await queue.put(exc)
            return
        await queue.put(_END)

    pumps = [asyncio.ensure_future(pump(source)) for source in sources]
    try:
        while True:
            item = await queue.get()
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            yield item  # type: ignore[misc]
    finally:
        for task in pumps:
            task.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
        for source in sources:
            with contextlib.suppress(Exception):
                await source.aclose()  # type: ignore[attr-defined]


async def pages(
    shards: Sequence[Any],
    after: int,
    limit: int,
    newest_first: bool,
    ask: Callable[[Any, int, int], Awaitable[pb.ListTasksResponse | None]],
) -> pb.ListTasksResponse:
    """One page of a listing over every shard, in id order (newest first: the reverse), with one
    cursor. An id's top bits name the shard that created it, not the one holding it (a moved
    pool's tasks keep their ids), so every shard is asked for a page from the cursor, together,
    and the pages are merged by id.

    ``shards`` are the shards the listing concerns, each with ``name``; ``ask(shard, cursor,
    limit)`` answers that shard's page, or None when the shard could not be asked (it is then
    named in ``unavailable_shards``)."""
    parts = await asyncio.gather(*(ask(shard, after, limit) for shard in shards))
    page = pb.ListTasksResponse()
    merged: list[pb.TaskInfo] = []
    more = False
    for shard, part in zip(shards, parts, strict=True):
        if part is None:
            page.unavailable_shards.append(shard.name)
            continue
        merged.extend(part.tasks)
        page.unavailable_shards.extend(part.unavailable_shards)
        more = more or bool(part.next_after)
    merged.sort(key=lambda info: info.id, reverse=newest_first)
    page.tasks.extend(merged[:limit])
    if page.tasks and (more or len(merged) > limit):
        page.next_after = page.tasks[-1].id
    return page
