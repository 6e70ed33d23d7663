"""Forwarding between real nodes over ``Peers/Forward``: each forwarded call is answered as the same
call made directly to the owning shard, is authenticated by itself, and the stream follows its
shard through a freeze and a restart."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.federation.conftest import P2_CLIENT_TOKEN, Federation
from tests.server.harness import CLIENT_TOKEN, SCOPED_CLIENT_TOKEN, WORKER_TOKEN, ServerProcess

SHARD_BITS = 56
SUBMIT = "/cronoq.v1.Tasks/Submit"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def logged(node: ServerProcess, text: str, count: int = 1, timeout: float = 10.0) -> None:
    """Wait until the node's log (stderr) has ``count`` lines with ``text``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while node.stderr().count(text) < count:
        assert asyncio.get_running_loop().time() < deadline, f"{node.name} never logged {text!r} {count} times"
        await asyncio.sleep(0.05)


def cronoq_metadata(metadata: Any) -> dict[str, str]:
    return {key: value for key, value in metadata or () if key.startswith("cronoq-")}


async def outcome(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str, dict[str, str]]:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or "", cronoq_metadata(exc.trailing_metadata())
    return grpc.StatusCode.OK, "", {}


async def test_forwarded_calls_travel_in_the_stream_and_answer_as_direct_calls(federation: Federation) -> None:
    async with grpc.aio.insecure_channel(federation["s1"].address) as via, \
            grpc.aio.insecure_channel(federation["s2"].address) as direct:  # fmt: skip
        forwarded, owner = pbg.TasksStub(via), pbg.TasksStub(direct)
        first = await forwarded.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2")), metadata=bearer(CLIENT_TOKEN))
        assert first.id >> SHARD_BITS == 2
        await logged(federation["s1"], "forward stream to shard s2 open")

        key = f"fw-{uuid.uuid4().hex[:8]}"
        submitted = await forwarded.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2", key=key)),
                                           metadata=bearer(P2_CLIENT_TOKEN))  # fmt: skip
        info = await forwarded.Get(pb.GetRequest(task=pb.TaskRef(id=submitted.id)), metadata=bearer(CLIENT_TOKEN))
        assert (info.id, info.pool, info.key) == (submitted.id, "p2", key)

        # What the owning shard refuses comes back with its status, message and cronoq-* metadata.
        cases: list[Callable[[pbg.TasksStub], Awaitable[Any]]] = [
            lambda stub: stub.Submit(  # an unknown dependency
                pb.SubmitRequest(task=pb.TaskSpec(pool="p2", deps=[pb.Dep(target=pb.TaskRef(key="no-such-key"))])),
                metadata=bearer(CLIENT_TOKEN)),
            lambda stub: stub.Get(pb.GetRequest(task=pb.TaskRef(id=(2 << SHARD_BITS) + 999_999_999)),
                                  metadata=bearer(CLIENT_TOKEN)),
            lambda stub: stub.Submit(  # a retry policy the owner refuses
                pb.SubmitRequest(task=pb.TaskSpec(pool="p2", retry=pb.RetryPolicy(multiplier=0.5))),
                metadata=bearer(CLIENT_TOKEN)),
            # A Wait that runs out of time at the owner: DEADLINE_EXCEEDED, not "shard unavailable".
            lambda stub: stub.Wait(pb.WaitRequest(task=pb.TaskRef(id=submitted.id), timeout_s=0.2),
                                   metadata=bearer(CLIENT_TOKEN)),
        ]  # fmt: skip
        for case in cases:
            answer = await outcome(case(forwarded))
            assert answer[0] != grpc.StatusCode.OK
            assert answer == await outcome(case(owner))
        waited = await outcome(cases[-1](forwarded))
        assert waited[0] == grpc.StatusCode.DEADLINE_EXCEEDED

        cancelled = await forwarded.Cancel(pb.CancelRequest(task=pb.TaskRef(id=submitted.id)),
                                           metadata=bearer(CLIENT_TOKEN))  # fmt: skip
        assert cancelled.cancelled
    # Every one of those calls used the one stream.
    assert federation["s1"].stderr().count("forward stream to shard s2 open") == 1


class RawForward:
    """A hand-driven Forward stream to one node."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
        self.call = pbg.PeersStub(channel).Forward(metadata=metadata)
        self.ids = iter(range(1, 1 << 30))

    async def ask(self, method: str, request: bytes, authorization: str = "") -> pb.ForwardedReply:
        call_id = next(self.ids)
        forwarded = pb.ForwardedCall(id=call_id, method=method, request=request, authorization=authorization,
                                     timeout_s=5)  # fmt: skip
        await self.call.write(pb.ForwardRequest(calls=[forwarded]))
        response = await asyncio.wait_for(self.call.read(), 10)
        assert [reply.id for reply in response.replies] == [call_id]
        return response.replies[0]  # type: ignore[no-any-return]


def submit_bytes(pool: str) -> bytes:
    return pb.SubmitRequest(task=pb.TaskSpec(pool=pool)).SerializeToString()


async def test_each_call_in_a_stream_is_authenticated_and_answered_by_itself(federation: Federation) -> None:
    async with grpc.aio.insecure_channel(federation["s2"].address) as channel:
        stream = RawForward(channel, bearer(CLIENT_TOKEN))
        p2 = submit_bytes("p2")
        assert (await stream.ask(SUBMIT, p2)).code == grpc.StatusCode.UNAUTHENTICATED.value[0]
        wrong = await stream.ask(SUBMIT, p2, "Bearer not-a-token-of-this-cluster")
        assert wrong.code == grpc.StatusCode.UNAUTHENTICATED.value[0]
        worker = await stream.ask(SUBMIT, p2, f"Bearer {WORKER_TOKEN}")
        assert worker.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
        scoped = await stream.ask(SUBMIT, p2, f"Bearer {SCOPED_CLIENT_TOKEN}")
        assert scoped.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
        # A forwarded call is answered by this shard itself, never forwarded again.
        elsewhere = await stream.ask(SUBMIT, submit_bytes("other"), f"Bearer {CLIENT_TOKEN}")
        assert elsewhere.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
        assert elsewhere.metadata["cronoq-shard"] == "s1"
        ok = await stream.ask(SUBMIT, p2, f"Bearer {P2_CLIENT_TOKEN}")
        assert ok.code == 0 and pb.SubmitResponse.FromString(ok.response).id >> SHARD_BITS == 2
        malformed = await stream.ask(SUBMIT, b"\xff\xff\xff\xff", f"Bearer {CLIENT_TOKEN}")
        assert malformed.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "malformed" in malformed.message
        unknown = await stream.ask("/cronoq.v1.Workers/Work", b"", f"Bearer {CLIENT_TOKEN}")
        assert unknown.code == grpc.StatusCode.UNIMPLEMENTED.value[0]
        stream.call.cancel()

        # The stream itself needs valid credentials.
        for metadata in ((), bearer("not-a-token-of-this-cluster")):
            refused = pbg.PeersStub(channel).Forward(metadata=metadata)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await refused.read()
            assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_many_calls_at_once_are_each_answered_once(federation: Federation) -> None:
    """More calls in one message than a stream may hold open (MAX_OPEN_CALLS): every one is
    answered exactly once (accepted, or refused by the per-credential in-flight limit), the
    answers of calls finishing together sharing messages."""
    from cronoq.server.forward import MAX_OPEN_CALLS

    count = MAX_OPEN_CALLS + 44
    async with grpc.aio.insecure_channel(federation["s2"].address) as channel:
        call = pbg.PeersStub(channel).Forward(metadata=bearer(CLIENT_TOKEN))
        keys = {n: f"many-{uuid.uuid4().hex[:8]}-{n}" for n in range(1, count + 1)}
        calls = [
            pb.ForwardedCall(id=n, method=SUBMIT, timeout_s=10, authorization=f"Bearer {P2_CLIENT_TOKEN}",
                             request=pb.SubmitRequest(task=pb.TaskSpec(pool="p2", key=key)).SerializeToString())
            for n, key in keys.items()
        ]  # fmt: skip
        await call.write(pb.ForwardRequest(calls=calls))
        answered: dict[int, pb.ForwardedReply] = {}
        messages = 0
        while len(answered) < count:
            response = await asyncio.wait_for(call.read(), 30)
            messages += 1
            for reply in response.replies:
                assert reply.id not in answered, f"call {reply.id} answered twice"
                answered[reply.id] = reply
        call.cancel()
    assert set(answered) == set(keys) and messages < count
    accepted = {n: pb.SubmitResponse.FromString(reply.response).id for n, reply in answered.items() if reply.code == 0}
    refused = {reply.code for reply in answered.values() if reply.code != 0}
    assert accepted and refused <= {grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]}
    async with grpc.aio.insecure_channel(federation["s2"].address) as channel:
        tasks = pbg.TasksStub(channel)
        for n, task_id in accepted.items():
            info = await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)), metadata=bearer(CLIENT_TOKEN))
            assert info.key == keys[n]


async def test_a_caller_that_gives_up_stops_its_call_and_the_stream_goes_on(federation: Federation) -> None:
    async with grpc.aio.insecure_channel(federation["s2"].address) as channel:
        stream = RawForward(channel, bearer(CLIENT_TOKEN))
        ok = await stream.ask(SUBMIT, submit_bytes("p2"), f"Bearer {CLIENT_TOKEN}")
        task = pb.SubmitResponse.FromString(ok.response).id  # nobody works on p2: a Wait for it blocks
        wait = pb.WaitRequest(task=pb.TaskRef(id=task), timeout_s=5).SerializeToString()
        await stream.call.write(pb.ForwardRequest(calls=[
            pb.ForwardedCall(id=1000, method="/cronoq.v1.Tasks/Wait", request=wait,
                             authorization=f"Bearer {CLIENT_TOKEN}", timeout_s=6),
        ]))  # fmt: skip
        await stream.call.write(pb.ForwardRequest(calls=[pb.ForwardedCall(id=1000, cancel=True)]))
        # The Wait is gone without an answer: the next answer is the next call's.
        again = await stream.ask(SUBMIT, submit_bytes("p2"), f"Bearer {CLIENT_TOKEN}")
        assert again.code == 0
        stream.call.cancel()


# ------------------------------------------------------------------ a shard frozen or restarted


def sqlite_cluster(directory: Path, limits: str = "") -> Federation:
    cluster = Federation(directory, f'[store]\nkind = "sqlite"\npath = "{directory}/{{shard}}.db"')
    for node in cluster.nodes.values():
        assert node.config_template is not None
        node.config_template = node.config_template.replace("[limits]\n", f"[limits]\n{limits}", 1)
    return cluster.start()


@contextlib.asynccontextmanager
async def tasks_of(node: ServerProcess) -> AsyncIterator[pbg.TasksStub]:
    async with grpc.aio.insecure_channel(node.address) as channel:
        yield pbg.TasksStub(channel)


async def submit_p2(tasks: pbg.TasksStub) -> int:
    request = pb.SubmitRequest(task=pb.TaskSpec(pool="p2"))
    return int((await tasks.Submit(request, metadata=bearer(CLIENT_TOKEN), timeout=15)).id)


async def test_a_silent_shard_times_out_and_a_restarted_one_gets_a_new_stream(tmp_path: Path) -> None:
    cluster = sqlite_cluster(tmp_path, "request_timeout_s = 1\n")
    s1, s2 = cluster["s1"], cluster["s2"]
    try:
        async with tasks_of(s1) as tasks:
            assert await submit_p2(tasks) >> SHARD_BITS == 2
            s2.signal(signal.SIGSTOP)  # alive to the kernel, silent to the stream
            try:
                with pytest.raises(grpc.aio.AioRpcError) as silent:
                    await submit_p2(tasks)
                # As a direct call with that deadline: DEADLINE_EXCEEDED, naming the shard.
                assert silent.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                assert "s2" in (silent.value.details() or "")
                await logged(s1, "forward stream to shard s2 closed")
            finally:
                s2.signal(signal.SIGCONT)
            assert await submit_p2(tasks) >> SHARD_BITS == 2
            await logged(s1, "forward stream to shard s2 open", count=2)

            s2.kill()
            with pytest.raises(grpc.aio.AioRpcError) as down:
                await submit_p2(tasks)
            assert down.value.code() == grpc.StatusCode.UNAVAILABLE and "s2" in (down.value.details() or "")
            s2.start()
            deadline = asyncio.get_running_loop().time() + 15
            while True:
                try:
                    assert await submit_p2(tasks) >> SHARD_BITS == 2
                    break
                except grpc.aio.AioRpcError as exc:  # the channel reconnects with a short backoff
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE
                    assert asyncio.get_running_loop().time() < deadline, "s2 never reached again"
                    await asyncio.sleep(0.2)
            await logged(s1, "forward stream to shard s2 open", count=3)
    finally:
        cluster.stop()
