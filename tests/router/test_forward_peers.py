"""The forwarding side of ``Peers/Forward`` against peers that are not cronoq servers of this
version (real gRPC servers on loopback): one without the method (an older version) is reached with
unary calls, and a stream refused for one caller's credentials is opened again with the next
caller's own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from cronoq.config import Config, Role
from cronoq.router import Router
from cronoq.router.errors import RouteError

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from cronoq.server.auth import Principal

SHARD_BITS = 56


class OlderNode(pbg.TasksServicer):
    """A node of a version without the Peers service: it answers unary Submits only."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []

    async def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        self.metadata.append(dict(context.invocation_metadata() or ()))
        return pb.SubmitResponse(id=(2 << SHARD_BITS) + len(self.metadata))


@dataclass
class PickyNode(pbg.PeersServicer):
    """Opens Forward streams for one token only and answers every call in them with an id."""

    accepted: str
    opened_with: list[str] = field(default_factory=list)

    async def Forward(self, request_iterator: Any, context: Any) -> None:
        authorization = dict(context.invocation_metadata() or ()).get("authorization", "")
        self.opened_with.append(authorization)
        if authorization != self.accepted:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
        await context.send_initial_metadata(())
        async for message in request_iterator:
            replies = [pb.ForwardedReply(id=call.id, response=pb.SubmitResponse(id=(2 << SHARD_BITS) + call.id)
                                         .SerializeToString()) for call in message.calls]  # fmt: skip
            await context.write(pb.ForwardResponse(replies=replies))


@pytest.fixture
async def peer() -> AsyncIterator[tuple[grpc.aio.Server, int]]:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    yield server, port
    await server.stop(0)


def router(port: int) -> Router:
    config = Config.parse(f"""
[[pools]]
name = "default"

[[pools]]
name = "p2"

[[shards]]
name = "s1"
number = 1
pools = ["default"]
endpoint = "http://127.0.0.1:1"

[[shards]]
name = "s2"
number = 2
pools = ["p2"]
endpoint = "http://127.0.0.1:{port}"
""", shard_override="s1")  # fmt: skip
    return Router(config, _NoLocalCalls())


class _NoLocalCalls:
    """This node's API: every call of these tests is for the other shard."""

    default_pool = "default"


def caller(token: str) -> Principal:
    return Principal(Role.CLIENT, name=token, authorization=f"Bearer {token}")


def submit() -> pb.SubmitRequest:
    return pb.SubmitRequest(task=pb.TaskSpec(pool="p2"))


async def test_a_peer_without_the_forward_stream_gets_unary_calls(peer: tuple[grpc.aio.Server, int]) -> None:
    server, port = peer
    older = OlderNode()
    pbg.add_TasksServicer_to_server(older, server)  # type: ignore[no-untyped-call]
    await server.start()
    routing = router(port)
    try:
        for expected in (1, 2):
            answer = await routing.submit(caller("alice"), submit())
            assert answer.id == (2 << SHARD_BITS) + expected
        assert not routing.calls.streams.supported("s2")  # not asked again for a while
        assert [(m["authorization"], m["cronoq-forwarded"]) for m in older.metadata] == [("Bearer alice", "1")] * 2
    finally:
        await routing.close()


async def test_a_stream_refused_for_one_callers_token_opens_with_the_next_ones(
    peer: tuple[grpc.aio.Server, int],
) -> None:
    server, port = peer
    picky = PickyNode(accepted="Bearer bob")
    pbg.add_PeersServicer_to_server(picky, server)  # type: ignore[no-untyped-call]
    await server.start()
    routing = router(port)
    try:
        # Bob's call waits for the stream Mallory's call is opening, and is not refused for her token.
        calls = routing.submit(caller("mallory"), submit()), routing.submit(caller("bob"), submit())
        refused, answer = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(refused, RouteError) and refused.code == grpc.StatusCode.UNAUTHENTICATED
        assert isinstance(answer, pb.SubmitResponse) and answer.id >> SHARD_BITS == 2
        assert picky.opened_with == ["Bearer mallory", "Bearer bob"]
        # The open stream carries later calls, whoever makes them (each with its own token).
        await routing.submit(caller("carol"), submit())
        assert picky.opened_with == ["Bearer mallory", "Bearer bob"]
    finally:
        await routing.close()
