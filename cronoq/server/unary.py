"""The bounds every unary call of the server runs under, whatever carried it (a gRPC call or a Forward stream).

At most ``limits.max_concurrent_requests`` calls in flight (RESOURCE_EXHAUSTED beyond), each cut
off past ``max_wait_s + request_timeout_s`` or the caller's own shorter time limit (CANCELLED);
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

__all__ = ["UnaryRunner"]

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class UnaryRunner:
    """One per process, shared by the transports, so the in-flight limit is the server's."""

    def __init__(self, limits: LimitsConfig) -> None:
        self.limit = limits.max_concurrent_requests
        self.bound = limits.max_wait_s + limits.request_timeout_s
        self.inflight = 0

    async def run(self, principal: Principal, handler: Callable[[Principal, Req], Awaitable[Resp]], request: Req,
                  timeout: float | None = None) -> tuple[Resp, list[str]]:  # fmt: skip
        """``(response, shards that could not be asked)``; ApiError past the bounds."""
        if self.inflight >= self.limit:
            raise ApiError(Code.RESOURCE_EXHAUSTED, "too many requests in flight; retry later")
        self.inflight += 1
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
