"""The bounds every unary call of the server runs under, whatever carried it (a gRPC call, an HTTP
request or a Forward stream).

At most ``limits.max_concurrent_requests`` calls in flight over the whole server, and at most
``limits.max_concurrent_requests_per_caller`` of them for one caller (RESOURCE_EXHAUSTED beyond
either), so one credential flooding the server leaves room for the others. Each call is cut off
past ``max_wait_s + request_timeout_s`` or the transport's own shorter time limit (CANCELLED);
shards the router could not ask are collected for the response's metadata.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from cronoq.config.schema import LimitsConfig
from cronoq.router import collect_unavailable

from .auth import Principal
from .errors import ApiError, Code

__all__ = ["UnaryRunner", "caller_of"]

Req = TypeVar("Req")
Resp = TypeVar("Resp")


def caller_of(principal: Principal) -> str | None:
    """Whose share of the in-flight limit a call uses: the tenant a credential pins, else the
    credential itself. None for callers without credentials (authentication off, the metrics
    listener), which only the server-wide limit bounds."""
    if principal.authorization is None and not principal.certificate:
        return None
    if principal.tenant is not None:
        return f"tenant {principal.tenant}"
    return principal.name


class UnaryRunner:
    """One per process, shared by the transports, so the in-flight limits are the server's."""

    def __init__(self, limits: LimitsConfig) -> None:
        self.limit = limits.max_concurrent_requests
        self.per_caller = limits.max_concurrent_requests_per_caller
        self.bound = limits.max_wait_s + limits.request_timeout_s
        self.inflight = 0
        self._by_caller: dict[str, int] = {}

    def held_by(self, caller: str) -> int:
        """Calls of ``caller`` (see ``caller_of``) in flight now."""
        return self._by_caller.get(caller, 0)

    async def run(self, principal: Principal, handler: Callable[[Principal, Req], Awaitable[Resp]], request: Req,
                  timeout: float | None = None) -> tuple[Resp, list[str]]:  # fmt: skip
        """``(response, shards that could not be asked)``; ApiError past the bounds."""
        caller = caller_of(principal)
        held = 0 if caller is None else self._by_caller.get(caller, 0)
        if held >= self.per_caller:
            raise ApiError(Code.RESOURCE_EXHAUSTED, "too many requests in flight for this credential; retry later")
        if self.inflight >= self.limit:
            raise ApiError(Code.RESOURCE_EXHAUSTED, "too many requests in flight; retry later")
        self.inflight += 1
        if caller is not None:
            self._by_caller[caller] = held + 1
        try:
            with collect_unavailable() as missing:
                # asyncio.timeout: no extra task, unlike wait_for
                async with asyncio.timeout(self.bound if timeout is None else min(timeout, self.bound)):
                    response = await handler(principal, request)
            return response, missing
        except TimeoutError:
            raise ApiError(Code.CANCELLED, "request timeout expired") from None
        finally:
            self.inflight -= 1
            if caller is not None:
                left = self._by_caller[caller] - 1
                if left:
                    self._by_caller[caller] = left
                else:
                    del self._by_caller[caller]
