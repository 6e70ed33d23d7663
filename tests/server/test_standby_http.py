"""A standby's HTTP listener lets each connection go about a second after accepting it (as its
gRPC listener does), so a client behind a load balancer that retries reaches another replica;
the leader keeps its keep-alive connections."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import pytest

from cronoq.proto import cronoq_pb2_grpc as pbg
from tests.federation.conftest import free_port
from tests.server.harness import CLIENT_TOKEN, ServerProcess

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


class Pair:
    """A leader and a standby sharing one SQLite store, with their HTTP ports."""

    def __init__(self) -> None:
        self.servers: dict[str, ServerProcess] = {}
        self.ports = {"leader": free_port(), "standby": free_port()}


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    pair = Pair()
    ports = pair.ports
    try:
        for name in ("leader", "standby"):
            config = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
http_addr = "127.0.0.1:{ports[name]}"
shutdown_grace_s = 1

[store]
kind = "sqlite"
path = "{tmp_path / "state.db"}"

[[auth.tokens]]
token = "{CLIENT_TOKEN}"
role = "client"

[[pools]]
name = "default"
"""
            server = pair.servers[name] = ServerProcess(tmp_path, config, name=name)
            server.start(expect="listening" if name == "leader" else "standby")
        yield pair
    finally:
        for server in pair.servers.values():
            server.signal(signal.SIGCONT)
            server.kill()


@pytest.fixture
def leader_and_standby(pair: Pair) -> tuple[int, int]:
    return pair.ports["leader"], pair.ports["standby"]


def _response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


def test_a_standby_lets_http1_connections_go_and_the_leader_keeps_them(leader_and_standby: tuple[int, int]) -> None:
    leader_port, standby_port = leader_and_standby
    with socket.create_connection(("127.0.0.1", standby_port), timeout=10) as standby, \
            socket.create_connection(("127.0.0.1", leader_port), timeout=10) as leader:  # fmt: skip
        standby.sendall(HEALTHZ)
        leader.sendall(HEALTHZ)
        assert _response(standby).startswith(b"HTTP/1.1 200")
        assert _response(leader).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert _closed_within(standby, 15), "the standby kept the connection open"
        assert time.monotonic() - started < 10
        # One more connection the standby lets go proves a whole linger passed once more; the
        # leader's connection, older than both, is still usable.
        with socket.create_connection(("127.0.0.1", standby_port), timeout=10) as again:
            again.sendall(HEALTHZ)
            assert _response(again).startswith(b"HTTP/1.1 200")
            assert _closed_within(again, 15), "the standby kept the connection open"
        leader.sendall(HEALTHZ)
        assert _response(leader).startswith(b"HTTP/1.1 200")


def test_a_standby_sends_goaway_to_http2_clients(leader_and_standby: tuple[int, int]) -> None:
    _, standby_port = leader_and_standby
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    with socket.create_connection(("127.0.0.1", standby_port), timeout=10) as sock:
        sock.sendall(connection.data_to_send())
        sock.settimeout(15)
        deadline = time.monotonic() + 15
        events: list[object] = []
        while time.monotonic() < deadline and not any(isinstance(e, h2.events.ConnectionTerminated) for e in events):
            data = sock.recv(65536)
            if not data:
                break
            events += connection.receive_data(data)
            sock.sendall(connection.data_to_send())
        assert any(isinstance(e, h2.events.ConnectionTerminated) for e in events) or not data


def test_a_leader_that_steps_down_lets_its_http_connections_go(pair: Pair) -> None:
    """The leader is paused past its SQLite lease; the standby takes over; once resumed the old
    leader finds it lost the lease, steps down, and lets its keep-alive clients go."""
    leader, standby = pair.servers["leader"], pair.servers["standby"]
    with socket.create_connection(("127.0.0.1", pair.ports["leader"]), timeout=10) as sock:
        sock.sendall(HEALTHZ)
        assert _response(sock).startswith(b"HTTP/1.1 200")
        leader.signal(signal.SIGSTOP)
        try:
            standby.wait_for("listening", timeout=60)  # the lease ran out: the standby leads
        finally:
            leader.signal(signal.SIGCONT)
        assert _closed_within(sock, 30), "the old leader kept its HTTP connection open"


async def test_a_standby_refuses_forward_streams_and_the_leader_opens_them(pair: Pair) -> None:
    """Other nodes' Forward streams follow the gRPC listener's rule: a standby refuses them as it
    refuses every call (UNAVAILABLE, not the leader), so forwarding nodes look for the leader."""
    metadata = (("authorization", f"Bearer {CLIENT_TOKEN}"),)
    async with grpc.aio.insecure_channel(pair.servers["standby"].address) as channel:
        refused = pbg.PeersStub(channel).Forward(metadata=metadata)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await refused.read()
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE and "leader" in (error.value.details() or "")
    async with grpc.aio.insecure_channel(pair.servers["leader"].address) as channel:
        opened = pbg.PeersStub(channel).Forward(metadata=metadata)
        await asyncio.wait_for(opened.initial_metadata(), 10)
        assert not opened.done()
        opened.cancel()
