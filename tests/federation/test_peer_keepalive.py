"""A node drops its connection to a peer shard that stopped answering (SIGSTOP: the kernel still
answers TCP, nothing else does) once a keepalive ping goes unanswered for
``limits.keepalive_timeout_s``, so calls it forwards there stop waiting on a dead connection.

grpcio waits for a ping's answer ``grpc.http2.ping_timeout_ms`` (60 s by default), not
``keepalive_timeout_ms``, and stops pinging a stream that sends no data after two pings; without
the peer channel's own settings the connection outlived the bound below by far."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import grpc

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.federation.conftest import Federation
from tests.federation.test_routing import bearer
from tests.server.harness import CLIENT_TOKEN, tcp_sockets

PING_INTERVAL_S = 6.0  # the least a peer channel pings at (keepalive_interval_s below is 1)
PING_TIMEOUT_S = 2.0
LIMITS = f"keepalive_interval_s = 1\nkeepalive_timeout_s = {PING_TIMEOUT_S}"
BOUND_S = 3 * (PING_INTERVAL_S + PING_TIMEOUT_S)


def established_ports(pid: int, remote_port: int) -> set[int]:
    """Local ports of the process's ESTABLISHED TCP connections to ``remote_port``."""
    return {local for state, local, remote in tcp_sockets(pid) if state == "01" and remote == remote_port}


async def test_a_node_drops_its_connection_to_a_frozen_peer(tmp_path: Path) -> None:
    store = f'[store]\nkind = "sqlite"\npath = "{tmp_path}/{{shard}}.db"'
    cluster = Federation(tmp_path, store, limits=LIMITS).start()
    s1, s2 = cluster["s1"], cluster["s2"]
    try:
        assert s1.proc is not None
        async with grpc.aio.insecure_channel(s1.address) as channel:
            tasks = pbg.TasksStub(channel)
            # Forwarded to s2: s1 opens its Forward stream there, which stays open.
            await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="p2")), metadata=bearer(CLIENT_TOKEN))
        before = established_ports(s1.proc.pid, s2.port)
        assert before, "s1 holds no connection to s2 after forwarding a call"
        s2.signal(signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BOUND_S
        while before & established_ports(s1.proc.pid, s2.port):
            assert loop.time() < deadline, f"s1 still holds its connection to the frozen s2 after {BOUND_S} s"
            await asyncio.sleep(0.2)
    finally:
        s2.signal(signal.SIGCONT)
        cluster.stop()
