"""``cronoq cluster`` as the tests run it: a real ``up`` process, and the commands around it."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from cronoq.cluster.probe import same_process
from cronoq.cluster.state import ClusterState

ROOT = Path(__file__).resolve().parents[2]


def child_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name in ("CRONOQ_CONFIG", "CRONOQ_SHARD"):
        env.pop(name, None)
    return env


def cli(*args: str, timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    """``python -m cronoq.cluster ARGS`` to completion."""
    return subprocess.run(
        [sys.executable, "-m", "cronoq.cluster", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(),
        timeout=timeout,
    )


class UpProcess:
    """``python -m cronoq.cluster up`` in the background, its output read line by line."""

    def __init__(self, state: Path, *args: str) -> None:
        self.state = state
        command = [sys.executable, "-m", "cronoq.cluster", "up", "--state", str(state), "--base-port", "0", *args]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=child_env()
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, text: str, timeout: float = 90.0) -> str:
        """The next output line containing ``text``; AssertionError with the output if none comes."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no line with {text!r}; output so far:\n" + "\n".join(self.output))
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(
                    f"`up` exited ({self.proc.wait(10)}) before printing {text!r}:\n" + "\n".join(self.output)
                )
            self.output.append(line)
            if text in line:
                return line

    def state_file(self) -> ClusterState:
        state = ClusterState.read(self.state)
        assert state is not None, f"no state file in {self.state}"
        return state

    def cleanup(self) -> None:
        """Whatever happened in the test: no launcher or server of ours is left running."""
        state = None
        with contextlib.suppress(Exception):
            state = ClusterState.read(self.state)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if state is not None:
            for shard in state.shards:
                for replica in shard.replicas:
                    if same_process(replica.pid, replica.start_ticks):
                        os.kill(replica.pid, signal.SIGKILL)


def wait_until(predicate: object, what: str, timeout: float = 60.0) -> None:
    """Poll ``predicate()`` until it is true; AssertionError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
