"""A shard's single endpoint in front of its replicas, the way a Kubernetes Service with a
readiness probe does it.

``LeaderWatch`` asks every replica's ``/readyz`` about twice a second; only the leader answers
200. ``LeaderProxy`` accepts TCP connections on the shard's endpoint port and pumps each one,
byte for byte in both directions, to the replica that leads when the connection arrives. Existing
connections stay where they are (a server that stops leading closes its own connections); new
ones go to the new leader after a failover. Without a leader, a new connection waits a few
seconds for one and is closed if none appears, so the client retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .background import BackgroundLoop
from .layout import HOST
from .probe import http_status
from .replica import Replica

__all__ = ["LeaderProxy", "LeaderWatch", "bind_listener"]

log = logging.getLogger("cronoq.cluster")

POLL_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 1.0
WAIT_FOR_LEADER_S = 5.0
_CHUNK = 256 * 1024


def bind_listener(port: int, host: str = HOST) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port); OSError says why it cannot bind."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(512)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass(slots=True)
class ReplicaRole:
    replica: Replica
    role: str = "starting"  # "leader", "standby", "down" or "starting"


class LeaderWatch(BackgroundLoop):
    """Which replica of one shard leads, from their ``/readyz``; ``on_change(old, new)`` is called
    with replica names (or None) whenever that changes."""

    def __init__(
        self, shard: str, replicas: Sequence[Replica], on_change: Callable[[str | None, str | None], None] | None = None
    ) -> None:
        self.shard = shard
        self.roles = [ReplicaRole(replica) for replica in replicas]
        self.leader: Replica | None = None
        self._on_change = on_change
        self._changed = asyncio.Event()

    async def _run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(POLL_INTERVAL_S)

    async def poll(self) -> None:
        """Probe every replica once and update the leader."""
        answers = await asyncio.gather(*(self._probe(entry.replica) for entry in self.roles))
        for entry, role in zip(self.roles, answers, strict=True):
            entry.role = role
        leaders = [entry.replica for entry in self.roles if entry.role == "leader"]
        # Two "leaders" can only be a moment of overlap in a takeover: keep the current one.
        new = self.leader if self.leader in leaders else (leaders[0] if leaders else None)
        if new is not self.leader:
            old = self.leader
            self.leader = new
            self._changed.set()
            self._changed = asyncio.Event()
            if self._on_change is not None:
                self._on_change(None if old is None else old.name, None if new is None else new.name)

    @staticmethod
    async def _probe(replica: Replica) -> str:
        if not replica.alive:
            return "down"
        status = await http_status(replica.host, replica.http_port, "/readyz", PROBE_TIMEOUT_S)
        if status == 200:
            return "leader"
        return "standby" if status is not None else "starting"

    async def wait_leader(self, timeout: float) -> Replica | None:
        """The leader, waiting up to ``timeout`` seconds for one to appear."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.leader is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return self.leader


class LeaderProxy:
    """Forward connections on ``sock`` to the leading replica's port (``port_of(replica)``)."""

    def __init__(self, name: str, sock: socket.socket, watch: LeaderWatch, port_of: Callable[[Replica], int]) -> None:
        self.name = name
        self.sock = sock
        self.port = int(sock.getsockname()[1])
        self._watch = watch
        self._port_of = port_of
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self._links: dict[asyncio.StreamWriter, tuple[int, asyncio.StreamWriter]] = {}
        self.connections = 0
        self.refuse: Callable[[int], bool] | None = None
        """A partition (chaos drills): connections from a loopback port it returns True for are
        closed at once. ``cut`` ends the ones already open."""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, sock=self.sock)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    def cut(self, refuse: Callable[[int], bool]) -> int:
        """Close the open connections whose client's loopback port ``refuse`` picks; how many."""
        victims = [(client, upstream) for client, (port, upstream) in self._links.items() if refuse(port)]
        for client, upstream in victims:
            client.close()
            upstream.close()
        return len(victims)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        peer = writer.get_extra_info("peername")
        peer_port = int(peer[1]) if peer else 0
        if self.refuse is not None and self.refuse(peer_port):
            writer.close()
            return
        _no_delay(writer)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        leader = await self._watch.wait_leader(WAIT_FOR_LEADER_S)
        if leader is not None:
            try:
                upstream = await asyncio.open_connection(leader.host, self._port_of(leader))
            except OSError as exc:
                log.info("%s: cannot reach %s (%s); closing the connection", self.name, leader.name, exc)
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        _no_delay(up_writer)
        self._links[writer] = (peer_port, up_writer)
        tasks = [asyncio.ensure_future(_pump(reader, up_writer)), asyncio.ensure_future(_pump(up_reader, writer))]
        for task in tasks:
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._links.pop(writer, None)
            for end in (writer, up_writer):
                end.close()


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until end of stream, then half-close the other side; on an error close it outright."""
    try:
        while True:
            data = await source.read(_CHUNK)
            if not data:
                break
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except (OSError, RuntimeError):
        sink.close()
    except asyncio.CancelledError:
        sink.close()
        raise
