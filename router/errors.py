"""The router's one error type.

The router sits below the server's API layer, so it cannot raise the server's ``ApiError``;
it raises ``RouteError`` with a gRPC status instead, and the server maps it (and any status a peer
answered with) onto its own error type.
"""

from __future__ import annotations

import grpc

__all__ = ["RouteError"]


class RouteError(Exception):
    """A routed call failed with ``code``; ``message`` is safe to show the caller.

    ``metadata`` is extra response metadata, e.g. ``cronoq-shard`` / ``cronoq-shard-endpoint``
    when the caller should go to another shard itself."""

    def __init__(self, code: grpc.StatusCode, message: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.metadata = metadata

    def __repr__(self) -> str:
        return f"RouteError({self.code.name}, {self.message!r})"
