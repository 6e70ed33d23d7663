"""One ``cronoq-server`` process of a local cluster: its ports, log, start and stop.

Every replica of a cluster reads the same configuration file; its own listeners are given with
``--grpc-addr`` / ``--http-addr`` and its shard with ``--shard``. A replica listens on ports of
its own (picked free by binding port 0). Between picking a port and the server binding it another
process may take it; the server then exits with "Address already in use", and the replica is
started again on new ports. A restart (see ``supervisor.py``) first tries the ports it had, so
its address stays the same.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from .layout import HOST
from .probe import process_start_ticks

__all__ = ["Replica", "ReplicaError", "free_port"]

PORT_ATTEMPTS = 6
_ADDRESS_IN_USE = "Address already in use"
_STARTED_MARKERS = ("cronoq-server standby grpc=", "cronoq-server listening grpc=")


class ReplicaError(RuntimeError):
    """A replica could not be started; the message ends with the tail of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


class Replica:
    """Replica ``index`` of ``shard``, run as ``cronoq-server --config CONFIG --shard SHARD``."""

    def __init__(
        self,
        shard: str,
        index: int,
        *,
        config_path: Path,
        log_dir: Path,
        env: Mapping[str, str],
        fixed_ports: tuple[int, int] | None = None,
        host: str = HOST,
        prefix: Sequence[str] = (),
    ) -> None:
        self.shard = shard
        self.index = index
        self.name = f"{shard}-r{index}"
        self.config_path = config_path
        self.log_path = log_dir / f"{self.name}.log"
        self._env = dict(env)
        self.host = host
        """The address both listeners bind (127.0.0.1 unless the replica runs in a namespace)."""
        self._prefix = list(prefix)
        self._fixed_ports = fixed_ports
        """Listen exactly here (a shard without proxy: the endpoint is the server); no retries."""
        self.grpc_port = 0
        self.http_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.start_ticks: int | None = None
        self._log_offset = 0
        self.spawned_at = 0.0
        """``time.monotonic()`` when the current process was started."""
        self.restarts = 0
        """How many times the supervisor started this replica again after it died."""
        self.stop_requested = False
        """Set by ``stop()``: an exit after it is no crash, and the supervisor does not restart."""

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _log_since_spawn(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def command(self) -> list[str]:
        """The server's command line for the current ports."""
        return [
            *self._prefix,
            sys.executable, "-m", "cronoq.server.main",
            "--config", str(self.config_path),
            "--shard", self.shard,
            "--grpc-addr", f"{self.host}:{self.grpc_port}",
            "--http-addr", f"{self.host}:{self.http_port}",
        ]  # fmt: skip

    def _pick_ports(self) -> None:
        if self._fixed_ports is not None:
            self.grpc_port, self.http_port = self._fixed_ports
            return
        self.grpc_port, self.http_port = free_port(), free_port()
        while self.http_port == self.grpc_port:
            self.http_port = free_port()

    def _spawn(self) -> None:
        command = self.command()
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            again = f" (restart #{self.restarts})" if self.restarts else ""
            where = f"grpc {self.host}:{self.grpc_port} http {self.host}:{self.http_port}"
            log.write(f"--- starting {self.name}{again}: {where}\n".encode())
            log.flush()
            # A session of its own: Ctrl-C in the terminal reaches the launcher only, which then
            # stops the servers in order instead of all processes dying at once.
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
                start_new_session=True,
            )
        self.start_ticks = process_start_ticks(self.proc.pid)
        self.spawned_at = time.monotonic()

    async def start(self, timeout: float = 60.0, *, same_ports: bool = False) -> None:
        """Start the server and wait until its gRPC listener is bound (as standby or leader).

        ``same_ports``: first try the ports of the previous process (a restart), then new ones."""
        self.stop_requested = False
        for attempt in range(PORT_ATTEMPTS):
            if not (same_ports and attempt == 0 and self.grpc_port and self.http_port):
                self._pick_ports()
            self._spawn()
            if await self._wait_started(timeout):
                return
            if _ADDRESS_IN_USE in self._log_since_spawn() and self._fixed_ports is None:
                continue
            await self._terminate(timeout=15.0)
            raise ReplicaError(
                f"{self.name} did not start (exit code {self.returncode}); log {self.log_path}:\n{self.log_tail()}"
            )
        raise ReplicaError(f"{self.name}: no free ports found in {PORT_ATTEMPTS} attempts")

    async def _wait_started(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if any(marker in self._log_since_spawn() for marker in _STARTED_MARKERS):
                return True
            if not self.alive:
                return False
            await asyncio.sleep(0.05)
        return False

    async def stop(self, timeout: float = 15.0) -> int | None:
        """Stop on purpose (no restart follows): SIGTERM, then SIGKILL if the server has not
        exited after ``timeout`` seconds."""
        self.stop_requested = True
        return await self._terminate(timeout)

    async def _terminate(self, timeout: float) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while proc.poll() is None and loop.time() < deadline:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                while proc.poll() is None:
                    await asyncio.sleep(0.05)
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL at once, as a crash would (chaos drills and tests): the supervisor restarts the
        replica if the cluster's restarts are on."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
