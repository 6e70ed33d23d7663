"""A call forwarded to another shard carries what is left of its caller's deadline, against a real
two-shard cluster: the shard answering it stops the call when the caller stops waiting, on its
own, even when the forwarding node can no longer tell it so (frozen here with SIGSTOP).

How the owner is seen to stop: it allows one call in flight per credential
(``max_concurrent_requests_per_caller = 1``), so while the forwarded Wait runs there, the same
credential's direct Get is RESOURCE_EXHAUSTED, and once it has stopped the Get is answered.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.federation.conftest import Federation
from tests.server.harness import CLIENT_TOKEN

CLIENT = (("authorization", f"Bearer {CLIENT_TOKEN}"),)

PATIENCE_S = 30.0
"""How long the test waits for an outcome before it is declared broken (never a pass criterion)."""

CALLER_DEADLINE_S = 3.0
WAIT_S = 200.0
"""The Wait asks for far longer than the caller waits: only the carried deadline ends it in time."""


def _start(tmp_path: Path) -> Federation:
    """The cluster, on ports found free just before (tried again if another process took one)."""
    store = f'[store]\nkind = "sqlite"\npath = "{tmp_path}/{{shard}}.db"'
    for attempt in range(3):
        federation = Federation(tmp_path, store)
        for node in federation.nodes.values():
            assert node.config_template is not None
            node.config_template = node.config_template.replace(
                "max_wait_s = 5", "max_wait_s = 300\nmax_concurrent_requests_per_caller = 1"
            )
        try:
            return federation.start()
        except RuntimeError as exc:
            federation.stop()
            if "Address already in use" not in str(exc) or attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Federation]:
    federation = _start(tmp_path)
    try:
        yield federation
    finally:
        for node in federation.nodes.values():
            if node.proc is not None and node.proc.poll() is None:
                os.kill(node.proc.pid, signal.SIGCONT)
        federation.stop()


async def get_code(owner: pbg.TasksStub, task_id: int) -> grpc.StatusCode:
    try:
        await owner.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)), metadata=CLIENT, timeout=PATIENCE_S)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def test_the_owner_stops_a_forwarded_wait_when_its_caller_stops_waiting(cluster: Federation) -> None:
    forwarder, owner_node = cluster["s1"], cluster["s2"]
    assert forwarder.proc is not None
    async with grpc.aio.insecure_channel(forwarder.address) as via, \
            grpc.aio.insecure_channel(owner_node.address) as direct:  # fmt: skip
        owner = pbg.TasksStub(direct)
        submitted = await owner.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2", payload=b"{}")),
                                       metadata=CLIENT, timeout=PATIENCE_S)  # fmt: skip
        task_id = int(submitted.id)  # no worker serves p2: the task stays pending
        for _attempt in range(5):
            wait = asyncio.ensure_future(pbg.TasksStub(via).Wait(
                pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=WAIT_S), metadata=CLIENT,
                timeout=CALLER_DEADLINE_S))  # fmt: skip
            # The forwarded Wait runs on the owner once the credential's one slot there is taken.
            while not wait.done() and await get_code(owner, task_id) is grpc.StatusCode.OK:
                await asyncio.sleep(0.01)
            if not wait.done():
                break
            # A probing Get held the slot just as the Wait arrived, which was refused: again.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await wait
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
        else:
            pytest.fail("the forwarded Wait never ran on the owner")
        # The forwarding node can no longer cancel anything on the owner's behalf.
        os.kill(forwarder.proc.pid, signal.SIGSTOP)
        with pytest.raises(grpc.aio.AioRpcError) as expired:
            await wait
        assert expired.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED, expired.value
        # The owner ends the call by itself at the deadline it was given (long before WAIT_S).
        async with asyncio.timeout(PATIENCE_S):
            while (code := await get_code(owner, task_id)) is not grpc.StatusCode.OK:
                assert code is grpc.StatusCode.RESOURCE_EXHAUSTED, code
                await asyncio.sleep(0.05)
        os.kill(forwarder.proc.pid, signal.SIGCONT)
