"""Which of gRPC's transport endpoints a cronoq process prefers.

gRPC's EventEngine endpoints (its default since 1.60) hand every message between an I/O thread,
the completion queue's poller thread and the asyncio event loop; the older endpoints do the I/O on
the poller thread itself. For cronoq's traffic, many small messages on long-lived streams, that is
a quarter to a third less CPU per message on each side (measured with a bare grpc-aio Work
stream: ~180 µs per lease round trip and side with the defaults, ~125 µs without them).

The choice is process-wide and read when gRPC creates its first channel or server, so it is made
through ``GRPC_EXPERIMENTS`` before that: ``cronoq-server`` does it first thing. Worker and client
processes may opt in by calling ``prefer_poller_endpoints()`` early (``cronoq.client`` re-exports
it); importing cronoq never changes another application's gRPC settings by itself.
"""

from __future__ import annotations

import os

import grpc

__all__ = ["GRPC_TRANSPORT_EXPERIMENTS", "prefer_poller_endpoints"]

GRPC_TRANSPORT_EXPERIMENTS = "-event_engine_client,-event_engine_listener"
"""The ``GRPC_EXPERIMENTS`` value that turns the EventEngine endpoints off."""

_KNOWN_RELEASES = ((1, 60), (1, 90))
"""gRPC releases known to have these switches (a later one would log them as unknown)."""


def prefer_poller_endpoints() -> bool:
    """Set ``GRPC_EXPERIMENTS`` for this process (and its children) unless it is already set
    (an empty value keeps gRPC's defaults) or gRPC is a release without these switches. Returns
    whether it set it. Call it before the process's first gRPC channel or server exists."""
    try:
        version = tuple(int(part) for part in grpc.__version__.split(".")[:2])
    except ValueError:
        return False
    if not _KNOWN_RELEASES[0] <= version < _KNOWN_RELEASES[1] or "GRPC_EXPERIMENTS" in os.environ:
        return False
    os.environ["GRPC_EXPERIMENTS"] = GRPC_TRANSPORT_EXPERIMENTS
    return True
