"""Child shard processes for crash drills, with their stdout lines collected as they come."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

CHILD = Path(__file__).with_name("shard_child.py")


class ShardProcess:
    def __init__(self, *args: str) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _drain(self) -> bool:
        """Move queued lines into ``lines``; False once the process closed its stdout."""
        alive = True
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                return alive
            if line is None:
                alive = False
            else:
                self.lines.append(line)

    def wait_for(self, predicate: Callable[[list[str]], bool], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            alive = self._drain()
            if predicate(self.lines):
                return
            if not alive:
                break
            time.sleep(0.02)
        stderr = ""
        if self.proc.poll() is not None and self.proc.stderr is not None:
            stderr = self.proc.stderr.read()[-3000:]
        raise AssertionError(f"condition not reached; output so far: {self.lines[-20:]}\n{stderr}")

    def acked(self) -> list[int]:
        self._drain()
        return [int(line.split()[1]) for line in self.lines if line.startswith("ACK ")]

    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)


def log_lines(path: Path) -> list[tuple[str, int, int, int]]:
    """(event, task id, attempt, pid) for every line the executors wrote."""
    out = []
    for line in path.read_text().splitlines():
        event, task_id, attempt, pid = line.split()
        out.append((event, int(task_id), int(attempt), int(pid)))
    return out
