"""Keeping a local cluster's replicas running: one ``Supervisor`` per replica.

A replica that exits without being asked to (a crash, an operator's ``kill -9`` in a failover
drill) is reported in one line and, when restarts are on, started again after a backoff: as a
fresh process on the same ports and the same store, so it rejoins its shard as a standby. The
delay starts at 0.5 s and doubles up to 30 s while the replica keeps dying soon after starting;
once a run has lasted ``stable_s`` the next death starts from 0.5 s again. A replica stopped on
purpose (``Replica.stop``: the cluster's own stop, ``down``, Ctrl-C) is left alone.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from .background import BackgroundLoop
from .replica import Replica, ReplicaError

__all__ = ["Backoff", "RestartPolicy", "Supervisor", "describe_exit"]

EXIT_POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    first_delay_s: float = 0.5
    max_delay_s: float = 30.0
    stable_s: float = 30.0
    """A run at least this long counts as healthy: the next restart waits ``first_delay_s`` again."""


class Backoff:
    """The delay before each restart of one replica."""

    def __init__(self, policy: RestartPolicy) -> None:
        self._policy = policy
        self._next = policy.first_delay_s

    def next_delay(self, uptime_s: float) -> float:
        """The delay after a run that lasted ``uptime_s`` seconds (0 for a start that failed)."""
        if uptime_s >= self._policy.stable_s:
            self._next = self._policy.first_delay_s
        delay = self._next
        self._next = min(delay * 2, self._policy.max_delay_s)
        return delay


def describe_exit(returncode: int | None) -> str:
    """``exit code 3`` or ``killed by SIGKILL`` (Popen reports a signal as a negative code)."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exit code {returncode}"


class Supervisor(BackgroundLoop):
    """Watch one replica until it is stopped on purpose; report each death and, if ``restart``,
    start it again. ``on_restarted`` runs after each successful restart (to record the new pid)."""

    def __init__(
        self,
        replica: Replica,
        *,
        restart: bool,
        say: Callable[[str], None],
        on_restarted: Callable[[Replica], None],
        policy: RestartPolicy | None = None,
    ) -> None:
        self.replica = replica
        self.restart = restart
        self._say = say
        self._on_restarted = on_restarted
        self._backoff = Backoff(policy or RestartPolicy())

    async def close(self) -> None:
        """Stop watching (a restart in progress is abandoned; the caller stops the process)."""
        await super().close()

    async def _run(self) -> None:
        replica = self.replica
        while True:
            while replica.alive:
                await asyncio.sleep(EXIT_POLL_S)
            if replica.stop_requested:
                return
            uptime = time.monotonic() - replica.spawned_at
            self._say(
                f"!! {replica.name} (pid {replica.pid}) exited unexpectedly ({describe_exit(replica.returncode)}) "
                f"after {uptime:.1f}s; log {replica.log_path}"
            )
            if not self.restart:
                return
            if not await self._restart(self._backoff.next_delay(uptime)):
                return

    async def _restart(self, delay: float) -> bool:
        """Start the replica again after ``delay``, retrying with backoff while starting fails.
        False when it was stopped on purpose meanwhile."""
        replica = self.replica
        while True:
            self._say(f"   restarting {replica.name} in {delay:.1f}s (restart #{replica.restarts + 1})")
            await asyncio.sleep(delay)
            if replica.stop_requested:
                return False
            replica.restarts += 1
            try:
                await replica.start(same_ports=True)
            except ReplicaError as exc:
                first_line = str(exc).splitlines()[0]
                self._say(f"!! restart #{replica.restarts} of {replica.name} failed: {first_line}")
                delay = self._backoff.next_delay(0.0)
                continue
            self._say(
                f"{replica.name} restarted as pid {replica.pid} (restart #{replica.restarts}); "
                "it rejoins its shard as a standby"
            )
            self._on_restarted(replica)
            return True
