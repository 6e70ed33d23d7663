"""Talk to a cronoq server over gRPC: ``Client`` submits and follows tasks, ``Worker`` serves a pool.

Needs the ``client`` extra (``pip install "cronoq[client]"``), which brings grpcio and protobuf.
Everything here is asyncio-based (``grpc.aio``). Channels are opened lazily on the event loop that
first uses them and reopened when an object is used from another loop.

Errors: a failed RPC raises ``ClientError`` whose ``code`` is the lower-case gRPC status name
(``not_found``, ``unavailable``, ...); an expired deadline raises the builtin ``TimeoutError``.

A ``Worker`` opens one ``cronoq.v1.Workers/Work`` stream, registers for its pool and runs the
handler for every lease it receives. It announces batching (``Register.batch_bytes``): a cronoq
server that takes it up sends the leases ready at once in one message, and the Worker reports the
outcomes and heartbeats ready at once in one message; with any other server it speaks the
published one-message-per-lease protocol. The handler's outcome decides what is reported back:

* a return value (bytes, str, None or anything JSON-serialisable) completes the attempt;
* ``cronoq.Retryable`` fails it retryably (honouring ``retry_after``), ``cronoq.Permanent`` for good,
  any other exception retryably;
* ``Reject`` hands the lease back unrun, ``CancelTask`` ends the task as cancelled.

OpenTelemetry (when its API is installed; nothing of it is imported otherwise): a ``Client`` call
made while a span is active sends that span's context (``traceparent`` metadata, through the
global propagator), so the server links the tasks it admits to the caller's trace. A ``Worker``
runs each attempt inside a ``cronoq.task`` span (attributes ``task.id``, ``task.pool``,
``task.kind``, ``task.attempt``; error status when the attempt fails) parented to the lease's
``traceparent`` tag, on the application's global tracer provider; when the application set none,
attempts get no span at all.
"""

from __future__ import annotations

try:
    import grpc  # without the client extra, fail here with a message naming it
    import grpc.aio  # noqa: F401

    from cronoq.proto import cronoq_pb2  # noqa: F401
except ImportError as _missing:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "cronoq.client needs grpcio and protobuf; install the client extra: pip install 'cronoq[client]'"
    ) from _missing

from cronoq._client.client import Client
from cronoq._client.common import MAX_REDIRECTS as MAX_REDIRECTS  # public, not in __all__ (as published)
from cronoq._client.common import PROTOCOL_VERSION
from cronoq._client.common import Payload as Payload
from cronoq._client.common import TaskRef as TaskRef
from cronoq._client.common import log as log
from cronoq._client.encoding import task
from cronoq._client.errors import CancelTask, ClientError, Reject
from cronoq._client.results import (
    Event,
    Lease,
    PoolSnapshot,
    RecurringInfo,
    Result,
    Snapshot,
    Submitted,
    TaskInfo,
    TaskPage,
    Totals,
    WorkerGroup,
    WorkerInfo,
)
from cronoq._client.results import Handler as Handler
from cronoq._client.worker import Worker
from cronoq.grpc_transport import prefer_poller_endpoints as prefer_poller_endpoints  # workers may opt in

__all__ = [
    "PROTOCOL_VERSION",
    "CancelTask",
    "Client",
    "ClientError",
    "Event",
    "Lease",
    "PoolSnapshot",
    "RecurringInfo",
    "Reject",
    "Result",
    "Snapshot",
    "Submitted",
    "TaskInfo",
    "TaskPage",
    "Totals",
    "Worker",
    "WorkerGroup",
    "WorkerInfo",
    "task",
]
