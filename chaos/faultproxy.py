"""A TCP fault proxy between the cluster's servers and Postgres.

Each connection is pumped byte for byte, like ``cluster/proxy.py``, but the drill can make it
misbehave: add latency to every chunk, blackhole connections (bytes are held, not delivered, until
the fault ends, as a network that drops packets while TCP keeps retrying), or reset them (an RST,
as a broken link or a middlebox timeout).

Faults pick their victims by what a connection is: the proxy reads the Postgres startup message
for ``application_name`` (the store names its lock session ``cronoq-lock/<tag>`` and its data
pool's sessions ``cronoq/<tag>``) and finds which server process opened the connection (from ``/proc``: the socket's
inode, then the pid holding it), so a drill can cut one replica, or only the lock session, or only
the data connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from cronoq.cluster.layout import HOST

__all__ = ["Connection", "FaultProxy", "owner_pid"]

_SSL_REQUEST = 80877103
_GSS_REQUEST = 80877104
_PROTOCOL_3 = 196608
_CHUNK = 256 * 1024
_MAX_STARTUP = 10_000


def _socket_inode(local_port: int, remote_port: int) -> int | None:
    """The inode of the loopback socket ``127.0.0.1:local_port -> 127.0.0.1:remote_port``: in
    ``/proc/net/tcp``, or in ``tcp6`` as an IPv4-mapped address (gRPC opens dual-stack sockets)."""
    tables = (
        ("/proc/net/tcp", "0100007F"),
        ("/proc/net/tcp6", "0000000000000000FFFF00000100007F"),
    )
    for path, host in tables:
        wanted_local, wanted_remote = f"{host}:{local_port:04X}", f"{host}:{remote_port:04X}"
        try:
            with open(path) as table:
                next(table)
                for line in table:
                    fields = line.split()
                    if fields[1] == wanted_local and fields[2] == wanted_remote:
                        return int(fields[9])
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return None


def owner_pid(local_port: int, remote_port: int, candidates: Mapping[int, str]) -> int | None:
    """Which of the ``candidates`` pids holds the client end of a loopback connection."""
    inode = _socket_inode(local_port, remote_port)
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in candidates:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
    return None


@dataclass(eq=False)
class Connection:
    """One proxied connection: who opened it (``owner``: a name the drill gave a pid) and what it is."""

    owner: str | None = None
    application: str | None = None
    client: asyncio.StreamWriter | None = None
    upstream: asyncio.StreamWriter | None = None
    unblocked: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def lock_session(self) -> bool:
        # The store names its lock session "cronoq-lock/<tag>",
        # as an operator sees it in pg_stat_activity; the drill reads it from the outside too.
        return self.application is not None and self.application.startswith("cronoq-lock/")

    def reset(self) -> None:
        """Close both ends with an RST (linger 0), as a broken link would."""
        for writer in (self.client, self.upstream):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()


Selector = Callable[[Connection], bool]


def everything(_: Connection) -> bool:
    return True


class FaultProxy:
    """Listen on a free loopback port; forward to ``upstream_port``. ``owners()`` maps the pids of
    the processes that may connect to names (asked at each connection: servers restart)."""

    def __init__(self, upstream_port: int, owners: Callable[[], Mapping[int, str]] | None = None) -> None:
        self.upstream_port = upstream_port
        self.owners = owners
        self.port = 0
        self.latency_s = 0.0
        self.connections: set[Connection] = set()
        self.held_chunks = 0
        """Chunks that arrived while their connection was blackholed (held, delivered on heal)."""
        self._blackholes: list[Selector] = []
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for connection in list(self.connections):
            connection.reset()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    # ------------------------------------------------------------------------------- faults

    def blackhole(self, selector: Selector = everything) -> Selector:
        """Hold the bytes of matching connections (present and future) until ``heal(selector)``."""
        self._blackholes.append(selector)
        for connection in self.connections:
            if selector(connection):
                connection.unblocked.clear()
        return selector

    def heal(self, selector: Selector | None = None) -> None:
        """End one blackhole (all when ``selector`` is None)."""
        if selector is None:
            self._blackholes.clear()
        elif selector in self._blackholes:
            self._blackholes.remove(selector)
        for connection in self.connections:
            if not self._held(connection):
                connection.unblocked.set()

    def reset(self, selector: Selector = everything) -> int:
        """Reset matching connections now; how many were cut."""
        victims = [c for c in self.connections if selector(c)]
        for connection in victims:
            connection.reset()
        return len(victims)

    def _held(self, connection: Connection) -> bool:
        return any(selector(connection) for selector in self._blackholes)

    # -------------------------------------------------------------------------------- pumps

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(client=writer)
        peer = writer.get_extra_info("peername")
        if peer is not None and self.owners is not None:
            owners = self.owners()
            pid = owner_pid(int(peer[1]), self.port, owners)
            connection.owner = None if pid is None else owners.get(pid)
        try:
            up_reader, up_writer = await asyncio.open_connection(HOST, self.upstream_port)
        except OSError:
            connection.reset()
            return
        connection.upstream = up_writer
        self.connections.add(connection)
        if not self._held(connection):
            connection.unblocked.set()
        # The server's answers flow from the start: an SSL request's one-byte answer must reach
        # the client before it sends its startup message.
        downstream = asyncio.ensure_future(self._pump(up_reader, writer, connection, b""))
        tasks = [downstream]
        try:
            first = await self._startup(reader, up_writer, connection)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            first = None
        if first is None:
            connection.reset()
        else:
            if self._held(connection):
                connection.unblocked.clear()
            tasks.append(asyncio.ensure_future(self._pump(reader, up_writer, connection, first)))
        for task in tasks:
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self.connections.discard(connection)
            for end in (writer, up_writer):
                end.close()

    async def _startup(
        self, reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, connection: Connection
    ) -> bytes:
        """Read the client's first messages up to the startup message; return the bytes read
        (to be forwarded by the pump). An SSL/GSS request is forwarded at once; the server's
        one-byte answer comes back through the other pump."""
        while True:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            if length == 8 and code in (_SSL_REQUEST, _GSS_REQUEST):
                up_writer.write(head)
                await up_writer.drain()
                continue
            if not 8 <= length <= _MAX_STARTUP:
                raise ValueError("not a Postgres startup message")
            body = await reader.readexactly(length - 8)
            if code == _PROTOCOL_3:
                parts = body.split(b"\x00")
                for name, value in zip(parts[0::2], parts[1::2], strict=False):
                    if name == b"application_name":
                        connection.application = value.decode(errors="replace")
            return head + body

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, connection: Connection, first: bytes
    ) -> None:
        try:
            if first:
                await connection.unblocked.wait()
                sink.write(first)
                await sink.drain()
            while True:
                data = await source.read(_CHUNK)
                if not data:
                    break
                if self.latency_s > 0:
                    await asyncio.sleep(self.latency_s)
                if not connection.unblocked.is_set():
                    self.held_chunks += 1
                    await connection.unblocked.wait()
                sink.write(data)
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()
        except (OSError, RuntimeError):
            sink.close()
        except asyncio.CancelledError:
            sink.close()
            raise
