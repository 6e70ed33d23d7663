"""The namespaces of ``--net netns``: real namespaces, veth pairs and routes (root only; skipped
where ``ip netns add`` is refused). A cut stops new connections at once and holds established
ones silently (they carry on once healed); the drill's own namespace is never cut; a network
leaves nothing behind, and what a dead process left is swept."""

from __future__ import annotations

import asyncio
import errno
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import pytest
from cronoq.chaos.netns import Network, available, sweep_stale

from tests.waiting import eventually

pytestmark = pytest.mark.skipif(not available(), reason="needs root and iproute2 (`ip netns add`)")

PORT = 7000
ECHO = """
import socket, sys, threading
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
def echo(conn):
    while data := conn.recv(1024):
        conn.sendall(data)
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""
CONNECT_ONCE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20).close()
    print("connected")
except OSError as exc:
    print(f"errno {exc.errno}")
"""
CHATTY_CLIENT = """
import socket, sys
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60)
print("connected", flush=True)
for line in sys.stdin:
    conn.sendall(line.encode())
    print("echo " + conn.recv(1024).decode().strip(), flush=True)
"""


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture
def network() -> Iterator[Network]:
    made = Network(["a", "b"], ["endpoint"])
    try:
        made.create()
        yield made
    finally:
        made.destroy()


@pytest.fixture
async def echo_in_b(network: Network) -> AsyncIterator[None]:
    server = await asyncio.create_subprocess_exec(
        *network.prefix("b"), sys.executable, "-c", ECHO, network.address("b"), str(PORT),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        assert await asyncio.wait_for(server.stdout.readline(), 30) == b"listening\n"
        yield
    finally:
        server.kill()
        await server.wait()


def _connect_from(network: Network, node: str, target: str) -> str:
    command = [*network.prefix(node), sys.executable, "-c", CONNECT_ONCE, network.address(target), str(PORT)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout.strip()


def _unacknowledged(network: Network, node: str, target: str) -> int:
    """Bytes ``node`` has sent to ``target`` that were not acknowledged (its sockets' Send-Q)."""
    out = _ip("netns", "exec", network.namespace(node), "ss", "-Htn", "dst", network.address(target))
    return sum(int(line.split()[2]) for line in out.splitlines() if line.strip())


async def _line(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    return (await asyncio.wait_for(process.stdout.readline(), 60)).decode().strip()


@pytest.mark.usefixtures("echo_in_b")
async def test_a_cut_refuses_new_connections_holds_open_ones_and_heals(network: Network) -> None:
    client = await asyncio.create_subprocess_exec(
        *network.prefix("a"), sys.executable, "-c", CHATTY_CLIENT, network.address("b"), str(PORT),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert client.stdin is not None
    try:
        assert await _line(client) == "connected"
        partition = network.cut(["a"], ["b"])
        assert _connect_from(network, "a", "b") == f"errno {errno.EHOSTUNREACH}"
        # The drill's own namespace (clients, proxies) still reaches both sides.
        reader, writer = await asyncio.open_connection(network.address("b"), PORT)
        writer.write(b"from the hub\n")
        assert await asyncio.wait_for(reader.readline(), 30) == b"from the hub\n"
        writer.close()
        # Sent into the cut: held by TCP's retransmissions, delivered once healed (not reset).
        client.stdin.write(b"held\n")
        await client.stdin.drain()
        await eventually(lambda: _unacknowledged(network, "a", "b") >= len(b"held\n"), limit=30)
        partition.heal()
        assert await _line(client) == "echo held"
        assert _connect_from(network, "a", "b") == "connected"
    finally:
        client.kill()
        await client.wait()


def test_a_node_cut_from_a_hub_address_only_loses_that_address(network: Network) -> None:
    network.cut(["a"], ["endpoint"])
    routes = _ip("-n", network.namespace("a"), "route", "show")
    assert f"unreachable {network.address('endpoint')}" in routes
    assert network.address("b") not in routes
    assert _ip("-n", network.namespace("b"), "route", "show").count("unreachable") == 0


def test_destroy_leaves_nothing_and_stale_names_are_swept() -> None:
    network = Network(["a"])
    network.create()
    namespace = network.namespace("a")
    network.destroy()
    assert namespace not in _ip("netns", "list")
    assert network.tag not in _ip("-o", "link", "show")

    gone = subprocess.Popen(["true"])
    gone.wait()
    stale, ours = f"cq{gone.pid}-1-x", network.tag + "-kept"
    _ip("netns", "add", stale)
    _ip("netns", "add", ours)
    try:
        assert stale in sweep_stale()
        names = _ip("netns", "list")
        assert stale not in names and ours in names
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
        _ip("netns", "del", ours)
