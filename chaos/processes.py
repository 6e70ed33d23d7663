"""The drill's own child processes (workers and producers) and the leader monitor."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cronoq.cluster.background import BackgroundLoop
from cronoq.cluster.launcher import RunningShard
from cronoq.cluster.probe import http_status

__all__ = ["ChildProcess", "LeaderMonitor"]

MONITOR_INTERVAL_S = 0.1
MONITOR_TIMEOUT_S = 0.5


class ChildProcess:
    """``python -m MODULE ARGS`` with the bearer token in its environment (never on the command line)."""

    def __init__(self, name: str, module: str, args: Sequence[str], *, token: str, log: Path) -> None:
        self.name = name
        self.module = module
        self.args = list(args)
        self.token = token
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        env = {**os.environ, "CRONOQ_TOKEN": self.token, "PYTHONUNBUFFERED": "1"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.starts += 1

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    async def wait(self, timeout: float | None = None) -> int | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.proc is not None and self.proc.poll() is None:
            if deadline is not None and loop.time() >= deadline:
                return None
            await asyncio.sleep(0.05)
        return None if self.proc is None else self.proc.returncode

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGCONT (it may be paused), SIGTERM, then SIGKILL after ``timeout``."""
        if not self.alive:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if await self.wait(timeout) is None:
            self.signal(signal.SIGKILL)
            await self.wait()


class LeaderMonitor(BackgroundLoop):
    """Ask every replica's ``/readyz`` ten times a second; record each change of who serves each
    shard as (shard, time, leader names or None). A paused or dead server does not answer."""

    def __init__(self, shards: Sequence[RunningShard]) -> None:
        self.shards = list(shards)
        self.changes: list[tuple[str, float, str | None]] = []
        self.current: dict[str, str | None] = {}
        self._changed = asyncio.Event()

    async def _run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(MONITOR_INTERVAL_S)

    async def poll(self) -> None:
        replicas = [(shard.name, replica) for shard in self.shards for replica in shard.replicas]

        async def serving(host: str, port: int, alive: bool) -> bool:
            if not alive:
                return False
            return await http_status(host, port, "/readyz", MONITOR_TIMEOUT_S) == 200

        answers = await asyncio.gather(*(serving(r.host, r.http_port, r.alive) for _, r in replicas))
        now = time.time()
        leaders: dict[str, list[str]] = {shard.name: [] for shard in self.shards}
        for (shard, replica), yes in zip(replicas, answers, strict=True):
            if yes:
                leaders[shard].append(replica.name)
        for shard, names in leaders.items():
            value = ",".join(names) or None
            if shard not in self.current or self.current[shard] != value:
                self.current[shard] = value
                self.changes.append((shard, now, value))
                self._changed.set()
                self._changed = asyncio.Event()

    async def wait_for(self, shard: str, predicate: object, timeout: float) -> bool:
        """Wait until ``predicate(current leader names or None)`` holds for ``shard``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(self.current.get(shard)):  # type: ignore[operator]
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True
