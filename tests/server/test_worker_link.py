"""Worker links against a real server process: a cronoq Worker's Work stream moves from gRPC to
the link the leader offers and serves there under the same rules; workers or servers that do not
want links stay on gRPC; a link checks credentials and the protocol by itself."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from pathlib import Path

import grpc
import pytest

from cronoq._linkwire import WORKER_PREFACE
from cronoq._worker_link import WorkerLinkCall
from cronoq.client import Client, Lease, Worker
from cronoq.proto import cronoq_pb2 as pb
from tests.server.conftest import SHARED_CONFIG
from tests.server.harness import CLIENT_TOKEN, WORKER_TOKEN, ServerProcess
from tests.server.test_tls import make_certificates

LINKED = "on a worker link"


def link_port(server: ServerProcess) -> int:
    return int(server.stderr().split("listening (links) port ")[1].split()[0])


async def echo(lease: Lease) -> bytes:
    return b"echo:" + lease.payload


async def serve_and_submit(server: ServerProcess, client: Client, tasks: int, **options: object) -> Worker:
    worker = Worker(server.address, "other", echo, slots=4, token=WORKER_TOKEN, **options)  # type: ignore[arg-type]
    running = asyncio.ensure_future(worker.run())
    try:
        await worker.wait_registered(10)
        handles = [await client.submit(f"n{i}".encode(), pool="other") for i in range(tasks)]
        results = [await client.wait(handle.id, timeout=10) for handle in handles]
        assert [result.output for result in results] == [f"echo:n{i}".encode() for i in range(tasks)]
    finally:
        await worker.stop(grace=2)
        await asyncio.wait_for(running, 10)
    return worker


async def test_a_worker_moves_to_the_link_and_serves_there(server: ServerProcess, client: Client) -> None:
    before = server.stderr().count(LINKED)
    worker = await serve_and_submit(server, client, 30)
    assert server.stderr().count(LINKED) == before + 1
    assert worker.connections == 1  # the offer and the stream on the link count once


async def test_a_worker_without_links_stays_on_grpc(server: ServerProcess, client: Client) -> None:
    before = server.stderr().count(LINKED)
    await serve_and_submit(server, client, 5, link=False)
    assert server.stderr().count(LINKED) == before


async def test_a_server_without_links_keeps_workers_on_grpc(tmp_path: Path) -> None:
    config = SHARED_CONFIG.replace("[server]\n", "[server]\nlinks = false\n", 1)
    server = ServerProcess(tmp_path, config, name="no-links").start()
    try:
        async with Client(server.address, token=CLIENT_TOKEN) as c:
            await serve_and_submit(server, c, 5)
        assert "listening (links)" not in server.stderr() and LINKED not in server.stderr()
    finally:
        server.stop()


async def test_a_worker_link_checks_credentials_and_the_protocol_itself(server: ServerProcess) -> None:
    port = link_port(server)
    register = pb.WorkerMessage(register=pb.Register(pool="other", slots=1, protocol_version=3))
    for authorization, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                                (f"Bearer {CLIENT_TOKEN}", grpc.StatusCode.PERMISSION_DENIED)):  # fmt: skip
        call = await WorkerLinkCall.open("127.0.0.1", port, authorization=authorization, ssl_context=None)
        await call.write(register)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(call.read(), 10)
        assert refused.value.code() == code
    # Register comes first on a link as on gRPC.
    call = await WorkerLinkCall.open("127.0.0.1", port, authorization=f"Bearer {WORKER_TOKEN}", ssl_context=None)
    await call.write(pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=1)))
    with pytest.raises(grpc.aio.AioRpcError) as first:
        await asyncio.wait_for(call.read(), 10)
    assert first.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A registered stream gets Registered, and its end when the worker half-closes.
    call = await WorkerLinkCall.open("127.0.0.1", port, authorization=f"Bearer {WORKER_TOKEN}", ssl_context=None)
    await call.write(register)
    registered = await asyncio.wait_for(call.read(), 10)
    assert registered.WhichOneof("msg") == "registered" and registered.registered.slots == 1
    await call.done_writing()
    assert await asyncio.wait_for(call.read(), 10) is grpc.aio.EOF
    # A stream that is not a worker link's: closed without a word.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(WORKER_PREFACE + b"\x00\x00\x00\x01\x09")
    assert await asyncio.wait_for(reader.read(), 5) == WORKER_PREFACE
    writer.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_a_worker_link_speaks_tls_where_the_server_does(tmp_path: Path) -> None:
    make_certificates(tmp_path)
    tls = f'[server.tls]\ncert = "{tmp_path}/server.pem"\nkey = "{tmp_path}/server.key"\n\n[limits]\n'
    server = ServerProcess(tmp_path, SHARED_CONFIG.replace("[limits]\n", tls, 1), name="tls-links").start()
    try:
        port = link_port(server)
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        call = await WorkerLinkCall.open("127.0.0.1", port, authorization=f"Bearer {WORKER_TOKEN}", ssl_context=context)
        await call.write(pb.WorkerMessage(register=pb.Register(pool="other", slots=1, protocol_version=3)))
        registered = await asyncio.wait_for(call.read(), 10)
        assert registered.WhichOneof("msg") == "registered"
        call.cancel()
        with pytest.raises((ConnectionError, TimeoutError, grpc.aio.AioRpcError)):
            await WorkerLinkCall.open("127.0.0.1", port, authorization=f"Bearer {WORKER_TOKEN}", ssl_context=None)
    finally:
        server.stop()
