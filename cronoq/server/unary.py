"""The bounds every unary call of the server runs under, whatever carried it (a gRPC call, an HTTP
request or a Forward stream).

At most ``limits.max_concurrent_requests`` calls in flight over the whole server, and at most
``limits.max_concurrent_requests_per_caller`` of them for one caller (RESOURCE_EXHAUSTED beyond
either), so one credential flooding the server leaves room for the others. Each call is cut off
past ``max_wait_s + request_timeout_s`` or the transport's own shorter time limit (CANCELLED), or
when the caller's own deadline passes (DEADLINE_EXCEEDED: a gRPC deadline, a forwarded call's
time limit); ``time_left`` tells the router what is left of it, so a call it forwards carries the
rest and the shard answering it stops when the caller stops waiting. Shards the router could not
ask are collected for the response's metadata.

Streams (Watch, Work, Forward) are counted per caller too (``StreamSlots``): at most
``limits.max_streams_per_caller`` open for one credential or tenant, RESOURCE_EXHAUSTED beyond.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from cronoq.config.schema import LimitsConfig
from cronoq.router import collect_unavailable

from .auth import Principal
from .errors import ApiError, Code

__all__ = ["StreamSlots", "UnaryRunner", "caller_of", "time_left"]

Req = TypeVar("Req")
Resp = TypeVar("Resp")

_DEADLINE: ContextVar[float | None] = ContextVar("cronoq_call_deadline", default=None)
"""When the unary call running in this context must be answered (event loop time)."""


def time_left() -> float | None:
    """Seconds left until the unary call running now must be answered; None outside one."""
    deadline = _DEADLINE.get()
    return None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())


def caller_of(principal: Principal) -> str | None:
    """Whose share of the in-flight limit a call uses: the tenant a credential pins, else the
    credential itself. None for callers without credentials (authentication off, the metrics
    listener), which only the server-wide limit bounds."""
    if principal.authorization is None and not principal.certificate:
        return None
    if principal.tenant is not None:
        return f"tenant {principal.tenant}"
    return principal.name


class StreamSlots:
    """Streams open now, per caller (see ``caller_of``), across every transport of the server."""

    def __init__(self, per_caller: int) -> None:
        self.per_caller = per_caller
        self._by_caller: dict[str, int] = {}

    def held_by(self, caller: str) -> int:
        return self._by_caller.get(caller, 0)

    @contextlib.contextmanager
    def hold(self, principal: Principal, kind: str) -> Iterator[None]:
        """One open stream of ``kind`` (Watch, Work, Forward) for the caller, while the block
        runs; RESOURCE_EXHAUSTED when the caller has ``per_caller`` open already."""
        caller = caller_of(principal)
        if caller is None:
            yield
            return
        held = self._by_caller.get(caller, 0)
        if held >= self.per_caller:
            raise ApiError(
                Code.RESOURCE_EXHAUSTED,
                f"too many streams open for this credential ({self.per_caller}, "
                f"limits.max_streams_per_caller); close one before opening "
                f"another {kind} stream",
            )
        self._by_caller[caller] = held + 1
        try:
            yield
        finally:
            left = self._by_caller[caller] - 1
            if left:
                self._by_caller[caller] = left
            else:
                del self._by_caller[caller]


class UnaryRunner:
    """One per process, shared by the transports, so the in-flight limits are the server's (and
    so are the stream counts, ``streams``)."""

    def __init__(self, limits: LimitsConfig) -> None:
        self.limit = limits.max_concurrent_requests
        self.per_caller = limits.max_concurrent_requests_per_caller
        self.bound = limits.max_wait_s + limits.request_timeout_s
        self.inflight = 0
        self._by_caller: dict[str, int] = {}
        self.streams = StreamSlots(limits.max_streams_per_caller)

    def held_by(self, caller: str) -> int:
        """Calls of ``caller`` (see ``caller_of``) in flight now."""
        return self._by_caller.get(caller, 0)

    async def run(
        self,
        principal: Principal,
        handler: Callable[[Principal, Req], Awaitable[Resp]],
        request: Req,
        timeout: float | None = None,
        *,
        deadline: float | None = None,
        collect: bool = True,
    ) -> tuple[Resp, list[str]]:
        """``(response, shards that could not be asked)``; ApiError past the bounds.

        ``timeout`` is the transport's own time limit (CANCELLED past it, like the server's
        bound); ``deadline`` the seconds the caller itself waits (DEADLINE_EXCEEDED past it).
        ``collect=False``: the caller has no use for the shards (the list is always empty)."""
        caller = caller_of(principal)
        held = 0 if caller is None else self._by_caller.get(caller, 0)
        if held >= self.per_caller:
            raise ApiError(Code.RESOURCE_EXHAUSTED, "too many requests in flight for this credential; retry later")
        if self.inflight >= self.limit:
            raise ApiError(Code.RESOURCE_EXHAUSTED, "too many requests in flight; retry later")
        limit = self.bound if timeout is None else min(timeout, self.bound)
        callers_own = False
        if deadline is not None and math.isfinite(deadline) and deadline < limit:
            limit, callers_own = max(0.0, deadline), True
        self.inflight += 1
        if caller is not None:
            self._by_caller[caller] = held + 1
        token = _DEADLINE.set(asyncio.get_running_loop().time() + limit)
        try:
            if not collect:
                async with asyncio.timeout(limit):
                    return await handler(principal, request), []
            with collect_unavailable() as missing:
                # asyncio.timeout: no extra task, unlike wait_for
                async with asyncio.timeout(limit):
                    response = await handler(principal, request)
            return response, missing
        except TimeoutError:
            if callers_own:
                raise ApiError(Code.DEADLINE_EXCEEDED, "the caller's deadline passed before the answer") from None
            raise ApiError(Code.CANCELLED, "request timeout expired") from None
        finally:
            _DEADLINE.reset(token)
            self.inflight -= 1
            if caller is not None:
                left = self._by_caller[caller] - 1
                if left:
                    self._by_caller[caller] = left
                else:
                    del self._by_caller[caller]
