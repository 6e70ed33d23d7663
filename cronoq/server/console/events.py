"""``GET /v1/events``: the Watch stream over HTTP, as newline-delimited JSON.

Each line is one JSON object with one member naming what it is:

- ``{"subscribed": {"unavailable_shards": [...]}}`` first, once every shard that could be asked
  has subscribed (events from then on are delivered);
- ``{"event": {...}}`` for each status change (the shape of ``shapes.event_json``);
- ``{"ping": "<unix ns>"}`` after ``HEARTBEAT_S`` without an event, so that a client (and any proxy
  in between) can tell a quiet stream from a dead one;
- ``{"end": {...}}`` last: ``{"reason": "time limit"}`` after ``limits.max_wait_s`` (reconnect
  to go on), or ``{"error": message, "code": reason}`` when a shard's stream ended (not the
  leader any more, the reader fell too far behind, ...).

A stream is bounded in time like a waiting request, so that a page left open does not hold a
request forever; the console reconnects. Events between two streams are not replayed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from cronoq.proto import cronoq_pb2 as pb

from ..errors import from_exception
from .shapes import event_json

__all__ = ["HEARTBEAT_S", "MEDIA_TYPE", "lines"]

HEARTBEAT_S = 15.0
MEDIA_TYPE = "application/x-ndjson"


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


async def _next(events: AsyncIterator[pb.StatusEvent]) -> pb.StatusEvent:
    return await events.__anext__()


async def lines(
    events: AsyncIterator[pb.StatusEvent], unavailable: Sequence[str], limit_s: float
) -> AsyncIterator[bytes]:
    """The lines of one stream of ``events`` (a subscription already made), for ``limit_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    pending: asyncio.Future[pb.StatusEvent] | None = None
    try:
        yield _line({"subscribed": {"unavailable_shards": list(unavailable)}})
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                yield _line({"end": {"reason": "time limit"}})
                return
            if pending is None:
                # One read in flight across heartbeats: cancelling a read would end the generator.
                pending = asyncio.ensure_future(_next(events))
            done, _ = await asyncio.wait({pending}, timeout=min(HEARTBEAT_S, remaining))
            if not done:
                if loop.time() < deadline:
                    yield _line({"ping": str(time.time_ns())})
                continue
            finished, pending = pending, None
            try:
                event = finished.result()
            except StopAsyncIteration:
                yield _line({"end": {"reason": "the stream ended"}})
                return
            except Exception as exc:
                error = from_exception(exc)
                yield _line({"end": {"error": error.message, "code": error.code.reason}})
                return
            yield _line({"event": event_json(event)})
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        close = getattr(events, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
