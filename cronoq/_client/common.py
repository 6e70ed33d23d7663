"""Constants and type aliases shared by the client modules."""

from __future__ import annotations

import logging
from typing import Any

#: Worker protocol version sent in ``Register.protocol_version``.
PROTOCOL_VERSION = 3

#: How many shard redirects in a row a worker follows before giving up.
MAX_REDIRECTS = 3

Payload = bytes | bytearray | memoryview | str | dict[str, Any] | list[Any] | int | float | bool | None
TaskRef = int | str

log = logging.getLogger("cronoq.client")

GRPC_DEFAULT_RECEIVE = 4 * 1024 * 1024
"""gRPC's limit on a received message when the channel options set none."""
