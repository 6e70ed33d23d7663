"""Work streams over a worker link (``cronoq._linkwire``): the same protocol, without grpc-aio.

A ``cronoq.client.Worker`` opening a gRPC Work stream with ``cronoq-worker-link: 1`` in its
metadata says it can move to a link. The leader then checks its credentials and its Register as
usual, answers with its link port in the initial metadata and ends the stream before registering
anything; the worker connects to that port, sends the preface and a hello frame carrying its
``authorization``, and the Work stream runs there: ``GrpcServices.Work`` itself, reading
``WorkerMessage`` frames and writing ``ServerMessage`` frames through ``WorkerLinkStream``, which
stands in for the gRPC call's context. Every rule of the Work protocol (Register first, leases and
outcomes, Shutdown, disconnects failing leases as retryable) is the gRPC one; a link's end carries
the same status and metadata a gRPC stream would.

Frames from the worker start with ``HELLO`` (then the authorization), ``MESSAGE`` (then a
``WorkerMessage``) or ``HALF_CLOSE``; frames from the server with ``MESSAGE`` (a ``ServerMessage``)
or ``STATUS`` (then a status), after which the server closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from cronoq._linkwire import HALF_CLOSE, HELLO, MESSAGE, STATUS, WORKER_LINK_KEY, Inbox, WriteGate, encode_status, frame
from cronoq.proto import cronoq_pb2 as pb

__all__ = ["HALF_CLOSE", "HELLO", "MESSAGE", "STATUS", "WORKER_LINK_KEY", "WorkerLinkStream"]

log = logging.getLogger("cronoq.server")

_MESSAGE = bytes([MESSAGE])


class _Aborted(Exception):
    """Raised by ``abort``, as grpc's context does, once the final status is out."""


class WorkerLinkStream:
    """One Work stream on a link: the part of a grpc.aio servicer context the Work handler uses."""

    def __init__(self, transport: asyncio.Transport, authorization: str | None) -> None:
        self._transport = transport
        self._metadata = (("authorization", authorization),) if authorization else ()
        self._inbox = Inbox()
        self.gate = WriteGate()
        self.finished = False

    # ---------------------------------------------------------------- what Work calls

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}  # a link carries a token; client certificates stay on gRPC

    async def read(self) -> Any:
        message = await self._inbox.get()
        return grpc.aio.EOF if message is None else message

    async def write(self, message: Any) -> None:
        if self.finished or self._transport.is_closing():
            raise ConnectionError("the worker link is closed")
        self._transport.write(frame(_MESSAGE + message.SerializeToString()))
        await self.gate.wait()

    async def send_initial_metadata(self, metadata: Any) -> None:
        pass  # nothing travels ahead of the first message on a link

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        self.finish(code, details, tuple(trailing_metadata or ()))
        raise _Aborted

    # ---------------------------------------------------------------- the connection's side

    def finish(self, code: grpc.StatusCode, details: str = "", metadata: tuple[tuple[str, str], ...] = ()) -> None:
        """Send the final status (once) and close the connection after it."""
        if self.finished:
            return
        self.finished = True
        if not self._transport.is_closing():
            self._transport.write(frame(bytes([STATUS]) + encode_status(code.value[0], details, metadata)))
            self._transport.close()

    def deliver(self, body: bytes) -> None:
        """A frame from the worker after its hello; ValueError when it is not one of ours."""
        kind = body[0] if body else 0
        if kind == MESSAGE:
            try:
                self._inbox.put(pb.WorkerMessage.FromString(body[1:]))
            except DecodeError:
                raise ValueError("malformed WorkerMessage") from None
        elif kind == HALF_CLOSE:
            self._inbox.close()
        else:
            raise ValueError(f"unexpected frame kind {kind}")

    def lost(self) -> None:
        self.finished = True
        self._inbox.close()
        self.gate.resume()


async def serve_work(work: Callable[[Any, Any], Any], stream: WorkerLinkStream) -> None:
    """Run the Work handler on ``stream`` and send its final status."""
    try:
        await work(None, stream)
    except _Aborted:
        return
    except asyncio.CancelledError:
        stream.finish(grpc.StatusCode.CANCELLED, "cancelled")
        raise
    except Exception:
        log.exception("worker link stream failed")
        stream.finish(grpc.StatusCode.INTERNAL, "internal error")
        return
    with contextlib.suppress(Exception):
        stream.finish(grpc.StatusCode.OK)
