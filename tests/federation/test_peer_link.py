"""Peer links between real nodes: forwarded calls move from gRPC to the link the owning leader
advertises, answer exactly as over gRPC, and every call on a link is authenticated by itself."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import ssl
import struct
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from cronoq.router.link import LINK_KEY, METHOD_NUMBER, PREFACE, LinkBroken, LinkClient, frame_limit

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.federation.conftest import P2_CLIENT_TOKEN, Federation
from tests.server.harness import CLIENT_TOKEN, SCOPED_CLIENT_TOKEN, WORKER_TOKEN, ServerProcess
from tests.server.test_tls import make_certificates

SHARD_BITS = 56


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
async def tasks_on_s1(federation: Federation) -> AsyncIterator[pbg.TasksStub]:
    async with grpc.aio.insecure_channel(federation["s1"].address) as channel:
        yield pbg.TasksStub(channel)


async def logged(node: ServerProcess, text: str, timeout: float = 10.0) -> None:
    """Wait until the node's log (stderr) has a line with ``text``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while text not in node.stderr():
        assert asyncio.get_running_loop().time() < deadline, f"{node.name} never logged {text!r}"
        await asyncio.sleep(0.05)


async def s2_link_port(federation: Federation) -> int:
    """The port s2 names to a node forwarding to it (a forwarded call made by hand)."""
    async with grpc.aio.insecure_channel(federation["s2"].address) as channel:
        call = pbg.TasksStub(channel).Submit(
            pb.SubmitRequest(task=pb.TaskSpec(pool="p2")),
            metadata=(*bearer(CLIENT_TOKEN), ("cronoq-forwarded", "1")),
        )
        await call
        ports = [value for key, value in await call.trailing_metadata() if key == LINK_KEY]
    assert len(ports) == 1 and str(ports[0]).isdigit()
    return int(ports[0])


async def open_link(port: int) -> LinkClient:
    return await LinkClient.open("s2", "127.0.0.1", port, ssl=None, server_hostname=None,
                                 limit=frame_limit(4 << 20), on_lost=lambda link: None)  # fmt: skip


async def test_forwarded_calls_move_to_the_link_and_answer_as_over_grpc(
    federation: Federation, tasks_on_s1: pbg.TasksStub
) -> None:
    first = await tasks_on_s1.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2")), metadata=bearer(CLIENT_TOKEN))
    assert first.id >> SHARD_BITS == 2
    await logged(federation["s1"], "peer link to shard s2 open")

    key = f"linked-{uuid.uuid4().hex[:8]}"
    submitted = await tasks_on_s1.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2", key=key, payload=b"x")),
                                         metadata=bearer(P2_CLIENT_TOKEN))  # fmt: skip
    assert submitted.id >> SHARD_BITS == 2
    info = await tasks_on_s1.Get(pb.GetRequest(task=pb.TaskRef(id=submitted.id)), metadata=bearer(CLIENT_TOKEN))
    assert (info.id, info.pool, info.key) == (submitted.id, "p2", key)

    # The owner's refusals come back with their own status and message.
    dependent = pb.SubmitRequest(task=pb.TaskSpec(pool="p2", deps=[pb.Dep(target=pb.TaskRef(key="no-such-key"))]))
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await tasks_on_s1.Submit(dependent, metadata=bearer(CLIENT_TOKEN))
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND and "no-such-key" in (unknown.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await tasks_on_s1.Get(pb.GetRequest(task=pb.TaskRef(id=(2 << SHARD_BITS) + 999_999_999)),
                              metadata=bearer(CLIENT_TOKEN))  # fmt: skip
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    # A Wait that runs out of time at the owner says so (it is not "shard unavailable").
    with pytest.raises(grpc.aio.AioRpcError) as waited:
        await tasks_on_s1.Wait(pb.WaitRequest(task=pb.TaskRef(id=submitted.id), timeout_s=0.2),
                               metadata=bearer(CLIENT_TOKEN))  # fmt: skip
    assert waited.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, waited.value.details()

    cancelled = await tasks_on_s1.Cancel(pb.CancelRequest(task=pb.TaskRef(id=submitted.id)),
                                         metadata=bearer(CLIENT_TOKEN))  # fmt: skip
    assert cancelled.cancelled
    info = await tasks_on_s1.Get(pb.GetRequest(task=pb.TaskRef(key=key)), metadata=bearer(CLIENT_TOKEN))
    assert info.status == pb.TASK_STATUS_CANCELLED


class NotProtobuf:
    """Bytes that no protobuf message parses (an invalid field tag)."""

    def SerializeToString(self) -> bytes:
        return b"\xff\xff\xff\xff"


async def test_each_call_on_a_link_is_authenticated_by_itself(federation: Federation) -> None:
    link = await open_link(await s2_link_port(federation))
    try:
        submit = METHOD_NUMBER[("tasks", "Submit")]
        request = pb.SubmitRequest(task=pb.TaskSpec(pool="p2"))
        anonymous = await link.call(submit, request, None, 5)
        assert anonymous.status == grpc.StatusCode.UNAUTHENTICATED
        wrong = await link.call(submit, request, "Bearer not-a-token-of-this-cluster", 5)
        assert wrong.status == grpc.StatusCode.UNAUTHENTICATED
        worker = await link.call(submit, request, f"Bearer {WORKER_TOKEN}", 5)
        assert worker.status == grpc.StatusCode.PERMISSION_DENIED
        scoped = await link.call(submit, request, f"Bearer {SCOPED_CLIENT_TOKEN}", 5)
        assert scoped.status == grpc.StatusCode.PERMISSION_DENIED
        # A call on a link is answered by the shard itself, never forwarded on.
        other = pb.SubmitRequest(task=pb.TaskSpec(pool="other"))
        elsewhere = await link.call(submit, other, f"Bearer {CLIENT_TOKEN}", 5)
        assert elsewhere.status == grpc.StatusCode.FAILED_PRECONDITION, elsewhere
        assert ("cronoq-shard", "s1") in elsewhere.metadata
        ok = await link.call(submit, request, f"Bearer {P2_CLIENT_TOKEN}", 5)
        assert ok.status == grpc.StatusCode.OK
        assert pb.SubmitResponse.FromString(ok.body).id >> SHARD_BITS == 2
        malformed = await link.call(submit, NotProtobuf(), f"Bearer {CLIENT_TOKEN}", 5)
        assert malformed.status == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in malformed.message
    finally:
        link.close()


async def test_a_link_that_breaks_the_protocol_is_closed(federation: Federation) -> None:
    port = await s2_link_port(federation)
    # Not the preface: the connection is closed without an answer.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    # A frame larger than any message: closed before it is read.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(PREFACE)
    assert await asyncio.wait_for(reader.readexactly(len(PREFACE)), 5) == PREFACE
    writer.write(struct.pack(">I", frame_limit(4 << 20) * 4))
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    # Calls in flight on a link that is lost fail as "outcome unknown", never as an answer.
    link = await open_link(port)
    submit, wait = METHOD_NUMBER[("tasks", "Submit")], METHOD_NUMBER[("tasks", "Wait")]
    ok = await link.call(submit, pb.SubmitRequest(task=pb.TaskSpec(pool="p2")), f"Bearer {CLIENT_TOKEN}", 5)
    task_id = pb.SubmitResponse.FromString(ok.body).id  # nobody works on p2: waiting for it blocks
    request = pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=5)
    pending = asyncio.ensure_future(link.call(wait, request, f"Bearer {CLIENT_TOKEN}", 10))
    await asyncio.sleep(0.2)
    link.close()
    with pytest.raises(LinkBroken):
        await pending


# ------------------------------------------------------------------ lifecycle and configuration


def sqlite_cluster(directory: Path, edit: Callable[[str], str]) -> Federation:
    """A started two-shard cluster on SQLite whose configuration ``edit`` changed."""
    cluster = Federation(directory, f'[store]\nkind = "sqlite"\npath = "{directory}/{{shard}}.db"')
    for node in cluster.nodes.values():
        assert node.config_template is not None
        node.config_template = edit(node.config_template)
    return cluster.start()


async def submit_p2(target: str, credentials: grpc.ChannelCredentials | None = None) -> int:
    channel = grpc.aio.secure_channel(target, credentials) if credentials else grpc.aio.insecure_channel(target)
    async with channel:
        response = await pbg.TasksStub(channel).Submit(
            pb.SubmitRequest(task=pb.TaskSpec(pool="p2")), metadata=bearer(CLIENT_TOKEN), timeout=15
        )
    return int(response.id)


async def test_a_link_follows_its_shard_through_a_restart(sqlite_federation: Federation) -> None:
    s1, s2 = sqlite_federation["s1"], sqlite_federation["s2"]
    assert await submit_p2(s1.address) >> SHARD_BITS == 2
    await logged(s1, "peer link to shard s2 open")
    s2.kill()
    await logged(s1, "peer link to shard s2 closed")
    with pytest.raises(grpc.aio.AioRpcError) as down:
        await submit_p2(s1.address)
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    s2.start()
    # Over gRPC first, which names the new leader's link port; then over the new link.
    for _ in range(3):
        assert await submit_p2(s1.address) >> SHARD_BITS == 2
    deadline = asyncio.get_running_loop().time() + 10
    while s1.stderr().count("peer link to shard s2 open") < 2:
        assert asyncio.get_running_loop().time() < deadline, "no second link"
        await submit_p2(s1.address)
        await asyncio.sleep(0.1)


async def test_without_peer_links_forwarding_stays_on_grpc(tmp_path: Path) -> None:
    cluster = sqlite_cluster(tmp_path, lambda text: text.replace("[server]\n", "[server]\nlinks = false\n", 1))
    try:
        for _ in range(5):
            assert await submit_p2(cluster["s1"].address) >> SHARD_BITS == 2
        await asyncio.sleep(0.3)
        for node in cluster.nodes.values():
            assert "peer link" not in node.stderr()
    finally:
        cluster.stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_links_between_https_shards_use_tls(tmp_path: Path) -> None:
    make_certificates(tmp_path)
    tls = (
        "[server.tls]\n"
        f'cert = "{tmp_path}/server.pem"\nkey = "{tmp_path}/server.key"\nclient_ca = "{tmp_path}/ca.pem"\n\n'
        "[server.peer_tls]\n"
        f'ca = "{tmp_path}/ca.pem"\ncert = "{tmp_path}/client.pem"\nkey = "{tmp_path}/client.key"\n\n'
        "[limits]\n"
    )
    cluster = sqlite_cluster(
        tmp_path, lambda text: text.replace("[limits]\n", tls, 1).replace("http://127.0.0.1", "https://127.0.0.1")
    )
    try:
        credentials = grpc.ssl_channel_credentials(
            (tmp_path / "ca.pem").read_bytes(), (tmp_path / "client.key").read_bytes(),
            (tmp_path / "client.pem").read_bytes(),
        )  # fmt: skip
        s1, s2 = cluster["s1"], cluster["s2"]
        assert await submit_p2(s1.address, credentials) >> SHARD_BITS == 2
        await logged(s1, "peer link to shard s2 open")
        for _ in range(3):
            assert await submit_p2(s1.address, credentials) >> SHARD_BITS == 2
        # The link port speaks TLS only, and wants a client certificate as the gRPC port does.
        port = int(s2.stderr().split("listening (links) port ")[1].split()[0])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(PREFACE)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            writer.write(PREFACE)
            await asyncio.wait_for(reader.readexactly(len(PREFACE)), 5)
    finally:
        cluster.stop()


async def test_a_link_that_stays_silent_is_dropped(tmp_path: Path) -> None:
    cluster = sqlite_cluster(tmp_path, lambda text: text.replace("[limits]\n", "[limits]\nrequest_timeout_s = 1\n", 1))
    s1, s2 = cluster["s1"], cluster["s2"]
    try:
        assert await submit_p2(s1.address) >> SHARD_BITS == 2
        await logged(s1, "peer link to shard s2 open")
        s2.signal(signal.SIGSTOP)  # alive to the kernel, silent to the link
        try:
            with pytest.raises(grpc.aio.AioRpcError) as silent:
                await submit_p2(s1.address)
            assert silent.value.code() == grpc.StatusCode.UNAVAILABLE
            await logged(s1, "peer link to shard s2 closed")
        finally:
            s2.signal(signal.SIGCONT)
        deadline = asyncio.get_running_loop().time() + 15
        while s1.stderr().count("peer link to shard s2 open") < 2:
            assert asyncio.get_running_loop().time() < deadline, "no new link after the shard came back"
            with contextlib.suppress(grpc.aio.AioRpcError):
                await submit_p2(s1.address)
            await asyncio.sleep(0.2)
        assert await submit_p2(s1.address) >> SHARD_BITS == 2
    finally:
        cluster.stop()
