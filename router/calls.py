"""Calls on peer shards, as the router makes them: one unary call answered by a peer over its
Forward stream (``forward``) or, to a peer without one, as a plain gRPC call; watches as their own
gRPC calls; forwarded Submits coalesced into SubmitBatch (``coalesce``). Every call carries the
caller's ``authorization`` and trace context, is marked forwarded, and waits no longer than what is
left of the caller's deadline; a peer's failure comes back as a ``RouteError`` that says what a
direct call would have heard (UNAVAILABLE naming the shard when it could not be reached,
DEADLINE_EXCEEDED when it did not answer in time).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import grpc
from cronoq.cluster.peers import Peer, PeerChannels
from cronoq.config import LimitsConfig, Role

from cronoq.proto import console_pb2_grpc as cpbg
from cronoq.proto import cronoq_pb2 as pb

from .coalesce import Route, SubmitCoalescer
from .errors import RouteError
from .forward import (
    FORWARD_METHODS,
    FORWARDED,
    ForwardStreams,
    ForwardUnsupported,
    OpenRefused,
    StreamLost,
    method_path,
    status_code,
)

__all__ = ["MISSING", "PEER_READ_TIMEOUT_S", "Caller", "PeerCalls", "peer_error", "status_of"]

Status = grpc.StatusCode

PEER_READ_TIMEOUT_S = 5.0
"""Longest a fan-out read waits for one shard before naming it unavailable."""
COALESCE_MAX_TASKS = 256
"""Most forwarded Submits sent together as one SubmitBatch (see ``coalesce``)."""
COALESCE_CALLS_PER_LANE = 1
"""Forwarded Submit calls in flight per (shard, credentials) before later ones wait to be batched
(one measured best: more calls in flight make smaller batches, which cost both nodes more CPU)."""
MISSING = frozenset({Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED, Status.CANCELLED})
"""Statuses that mean "this shard could not answer" rather than "it answered no"."""


class Caller(Protocol):
    """What the router needs of an authenticated caller (``cronoq.server.auth.Principal``)."""

    @property
    def authorization(self) -> str | None: ...
    @property
    def certificate(self) -> bool: ...
    @property
    def forwarded(self) -> bool: ...

    def require(self, *roles: Role) -> None: ...
    def sees(self, pool: str) -> bool: ...


def status_of(exc: BaseException) -> grpc.StatusCode | None:
    """The gRPC status an error stands for: ``RouteError``, a peer's ``AioRpcError``, or any error
    with a ``status`` attribute (the server's ``ApiError``)."""
    if isinstance(exc, RouteError):
        return exc.code
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code()
    status = getattr(exc, "status", None)
    return status if isinstance(status, grpc.StatusCode) else None


class PeerCalls:
    """The calls one node makes on its peers (see the module docstring).

    ``traceparent()`` is the trace context of the call being routed (None: none);
    ``time_left()`` what is left of its caller's deadline in seconds (None: no deadline)."""

    def __init__(self, peers: PeerChannels, limits: LimitsConfig, *,
                 traceparent: Callable[[], str | None] | None = None,
                 time_left: Callable[[], float | None] | None = None) -> None:  # fmt: skip
        self.peers = peers
        self.streams = ForwardStreams(limits.max_message_bytes)
        self._traceparent = traceparent
        self._time_left = time_left
        self._console_stubs: dict[int, tuple[Any, Any]] = {}  # per peer channel
        self._coalescer = SubmitCoalescer(
            max_tasks=min(limits.max_tasks_per_batch, COALESCE_MAX_TASKS),
            max_bytes=limits.max_message_bytes // 2,
            status_of=status_of,
            send_one=self._send_submit,
            send_batch=self._send_submit_batch,
            calls_per_lane=COALESCE_CALLS_PER_LANE,
        )

    async def close(self) -> None:
        await self._coalescer.close()
        await self.streams.close()

    def within_deadline(self, timeout: float) -> float:
        left = self._time_left() if self._time_left is not None else None
        return timeout if left is None else min(timeout, left)

    def current_trace(self) -> str | None:
        return self._traceparent() if self._traceparent is not None else None

    def metadata(self, caller: Caller, traceparent: str | None) -> list[tuple[str, str]]:
        """What a gRPC call made for ``caller`` carries: forwarded, its credentials, the trace."""
        metadata = [(FORWARDED, "1")]
        if caller.authorization:
            metadata.append(("authorization", caller.authorization))
        if traceparent:
            metadata.append(("traceparent", traceparent))
        return metadata

    async def call(self, peer: Peer, service: str, method: str, request: Any, caller: Caller,
                   timeout: float, *, callers_deadline: bool = True) -> Any:  # fmt: skip
        """One unary call answered by ``peer``: over its Forward stream, or a unary gRPC call to a
        peer without one (an older version), within what is left of the caller's deadline."""
        if callers_deadline:  # not for the coalescer's calls, which carry several callers' Submits
            timeout = self.within_deadline(timeout)
        traceparent = self.current_trace()
        if service == "console":
            return await self._console(peer, method, request, caller, timeout, traceparent)
        if self.streams.supported(peer.name):
            path = method_path(service, method)
            try:
                reply = await self.streams.call(peer, path, request, caller.authorization, traceparent, timeout)
            except ForwardUnsupported:
                pass  # nothing was sent: the unary call below
            except OpenRefused as refused:
                raise reply_error(peer, refused.code, refused.details, refused.metadata) from None
            except StreamLost as exc:
                raise RouteError(Status.UNAVAILABLE, f"shard {peer.name!r} is unavailable ({exc})") from None
            except TimeoutError:
                raise _no_answer(peer, timeout) from None
            else:
                if reply.code == 0:
                    return FORWARD_METHODS[path].response.FromString(reply.response)
                raise reply_error(peer, status_code(reply.code), reply.message, reply.metadata.items())
        stub = peer.tasks if service == "tasks" else peer.admin
        try:
            return await getattr(stub, method)(request, metadata=self.metadata(caller, traceparent), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is Status.DEADLINE_EXCEEDED and exc.details() in ("", "Deadline Exceeded"):
                raise _no_answer(peer, timeout) from None  # gRPC's own deadline, not the shard's answer
            raise peer_error(peer, exc) from None

    async def _console(self, peer: Peer, method: str, request: Any, caller: Caller, timeout: float,
                       traceparent: str | None) -> Any:  # fmt: skip
        """A ``cronoq.console.v1`` call on ``peer`` (a unary gRPC call: the Forward stream carries cronoq.v1 only)."""
        channel = peer.channel
        stub = self._console_stubs.get(id(channel))
        if stub is None or stub[0] is not channel:
            stub = self._console_stubs[id(channel)] = (channel, cpbg.ConsoleStub(channel))  # type: ignore[no-untyped-call]
        try:
            return await getattr(stub[1], method)(request, metadata=self.metadata(caller, traceparent),
                                                  timeout=timeout)  # fmt: skip
        except grpc.aio.AioRpcError as exc:
            raise peer_error(peer, exc) from None

    async def submit(self, peer: Peer, request: pb.SubmitRequest, caller: Caller, timeout: float) -> pb.SubmitResponse:
        """A Submit answered by ``peer``; one that waits for nothing and continues no trace may share
        a SubmitBatch with other callers' (``coalesce``)."""
        if not request.wait and self.current_trace() is None:
            route = Route(peer.name, caller.authorization, (peer, caller, timeout))
            return await self._coalescer.submit(route, request)
        response: pb.SubmitResponse = await self.call(peer, "tasks", "Submit", request, caller, timeout)
        return response

    async def _send_submit(self, route: Route, request: pb.SubmitRequest) -> pb.SubmitResponse:
        peer, caller, timeout = route.target
        response: pb.SubmitResponse = await self.call(peer, "tasks", "Submit", request, caller, timeout,
                                                      callers_deadline=False)  # fmt: skip
        return response

    async def _send_submit_batch(self, route: Route, batch: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse:
        peer, caller, timeout = route.target
        response: pb.SubmitBatchResponse = await self.call(peer, "tasks", "SubmitBatch", batch, caller, timeout,
                                                           callers_deadline=False)  # fmt: skip
        return response

    async def open_watch(self, peer: Peer, request: pb.WatchRequest, caller: Caller) -> Any:
        """A peer's Watch call once the peer confirmed the subscription (our servers send their
        initial metadata right after subscribing); None when the peer cannot be reached."""
        call = peer.tasks.Watch(request, metadata=self.metadata(caller, self.current_trace()))
        try:
            await asyncio.wait_for(call.initial_metadata(), PEER_READ_TIMEOUT_S)
        except TimeoutError:
            call.cancel()
            return None
        except grpc.aio.AioRpcError as exc:
            if exc.code() in MISSING:
                return None
            raise peer_error(peer, exc) from None
        if call.done():
            code = await call.code()
            if code in MISSING:
                return None
            if code != Status.OK:
                raise RouteError(code, await call.details() or "watch refused")
        return call


async def remote_events(peer: Peer, call: Any) -> AsyncIterator[pb.StatusEvent]:
    """The events of a peer's Watch ``call`` (from ``open_watch``), its failure as a ``RouteError``."""
    try:
        async for event in call:
            yield event
    except grpc.aio.AioRpcError as exc:
        raise peer_error(peer, exc) from None
    finally:
        call.cancel()


def peer_error(peer: Peer, exc: grpc.aio.AioRpcError) -> RouteError:
    """A peer's failure as this node's answer (see ``reply_error``)."""
    return reply_error(peer, exc.code(), exc.details() or "", exc.trailing_metadata() or ())


def _no_answer(peer: Peer, timeout: float) -> RouteError:
    """A forwarded call that ran out of time without the shard's answer: what a direct call with
    that deadline would get."""
    return RouteError(Status.DEADLINE_EXCEEDED, f"shard {peer.name!r} did not answer within {timeout:g} s")


def reply_error(peer: Peer, code: grpc.StatusCode, details: str, metadata: Any) -> RouteError:
    """A peer's failure as this node's answer: its own status and message, or, when it could not
    be reached, UNAVAILABLE naming the shard."""
    shard_metadata = tuple((str(key), value) for key, value in metadata
                           if isinstance(value, str) and key.startswith("cronoq-"))  # fmt: skip
    if code is Status.UNAVAILABLE and not details.startswith("not the leader"):
        return RouteError(Status.UNAVAILABLE, f"shard {peer.name!r} is unavailable ({details or code.name.lower()})",
                          shard_metadata)  # fmt: skip
    return RouteError(code, details or code.name.lower(), shard_metadata)
