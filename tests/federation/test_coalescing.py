"""Many concurrent Submits forwarded to one shard: the router may send them together, yet every
caller gets the answer its own Submit would have got."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.federation.conftest import Federation
from tests.server.harness import CLIENT_TOKEN

SHARD_BITS = 56
AUTH = (("authorization", f"Bearer {CLIENT_TOKEN}"),)


@pytest.fixture
async def tasks_on_s1(federation: Federation) -> AsyncIterator[pbg.TasksStub]:
    async with grpc.aio.insecure_channel(federation["s1"].address) as channel:
        yield pbg.TasksStub(channel)


async def outcome(stub: pbg.TasksStub, spec: pb.TaskSpec) -> pb.SubmitResponse | grpc.aio.AioRpcError:
    try:
        response: pb.SubmitResponse = await stub.Submit(pb.SubmitRequest(task=spec), metadata=AUTH)
        return response
    except grpc.aio.AioRpcError as exc:
        return exc


async def test_concurrent_forwarded_submits_each_get_their_own_answer(tasks_on_s1: pbg.TasksStub) -> None:
    run = uuid.uuid4().hex[:8]
    specs = []
    for index in range(240):
        if index % 40 == 7:
            specs.append(pb.TaskSpec(pool="p2", kind="bad\0kind"))  # refused on its own
        elif index % 40 == 9:
            specs.append(pb.TaskSpec(pool="p2", key=f"{run}-shared", payload=b"same key"))
        else:
            specs.append(pb.TaskSpec(pool="p2", key=f"{run}-{index}", payload=str(index).encode()))
    answers = await asyncio.gather(*(outcome(tasks_on_s1, spec) for spec in specs))

    ids = []
    shared = set()
    for spec, answer in zip(specs, answers, strict=True):
        if spec.kind:
            assert isinstance(answer, grpc.aio.AioRpcError)
            assert answer.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "NUL" in (answer.details() or "")
            assert not (answer.details() or "").startswith("task ")  # not a batch's message
            continue
        assert isinstance(answer, pb.SubmitResponse), answer
        assert answer.id >> SHARD_BITS == 2
        if spec.key.endswith("-shared"):
            shared.add(answer.id)
        else:
            ids.append(answer.id)
    assert len(shared) == 1  # one task for the key, whoever came first
    assert len(set(ids)) == len(ids) == 240 - 12

    # Every acknowledged task is really there, under its own key, with its own payload.
    for spec in specs[:40]:
        if spec.kind or spec.key.endswith("-shared"):
            continue
        info = await tasks_on_s1.Get(pb.GetRequest(task=pb.TaskRef(key=spec.key)), metadata=AUTH)
        assert info.pool == "p2" and info.id in ids


async def test_a_refused_forwarded_submit_does_not_hold_back_the_others(
    federation: Federation, tasks_on_s1: pbg.TasksStub
) -> None:
    """A submission naming an unknown dependency fails alone; its neighbours are admitted."""
    missing = (2 << SHARD_BITS) + 987_654_321
    specs = [pb.TaskSpec(pool="p2", deps=[pb.Dep(target=pb.TaskRef(id=missing))]) if i % 5 == 0
             else pb.TaskSpec(pool="p2") for i in range(60)]  # fmt: skip
    answers = await asyncio.gather(*(outcome(tasks_on_s1, spec) for spec in specs))
    refused = [answer for answer in answers if isinstance(answer, grpc.aio.AioRpcError)]
    admitted = [answer for answer in answers if isinstance(answer, pb.SubmitResponse)]
    assert len(refused) == 12 and len(admitted) == 48
    for answer in refused:
        assert (answer.details() or "").startswith("unknown dependency id")  # its own answer, not a batch's
    assert len({answer.id for answer in admitted}) == 48
