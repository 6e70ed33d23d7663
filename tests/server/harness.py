"""Real ``cronoq-server`` processes for the server tests.

``ServerProcess`` writes a configuration, starts ``python -m cronoq.server.main`` and waits for
the line the server prints once it listens. ``{port}``, ``{http_port}`` and ``{metrics_port}`` in
the configuration become port 0, so the OS picks free ports as the server binds (parallel runs
cannot collide), and the ports are read back from that line (``grpc=... http=... metrics=...``).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CLIENT_TOKEN = "client-token-0123456789abcdef"
WORKER_TOKEN = "worker-token-0123456789abcdef"
METRICS_TOKEN = "metrics-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
SCOPED_CLIENT_TOKEN = "scoped-client-0123456789abcdef"
SCOPED_METRICS_TOKEN = "scoped-metrics-0123456789abcdef"
TENANT_TOKEN = "tenant-a-token-0123456789abcdef"
LABELED_WORKER_TOKEN = "gpu-worker-token-0123456789abcdef"

# One credential per role, plus pool-scoped and tenant-pinned ones, for server configs in tests.
TOKENS_TOML = f"""
[[auth.tokens]]
token = "{CLIENT_TOKEN}"
role = "client"

[[auth.tokens]]
token = "{WORKER_TOKEN}"
role = "worker"

[[auth.tokens]]
token = "{METRICS_TOKEN}"
role = "metrics"

[[auth.tokens]]
token = "{ADMIN_TOKEN}"
role = "admin"

[[auth.tokens]]
token = "{SCOPED_CLIENT_TOKEN}"
role = "client"
pools = ["other"]

[[auth.tokens]]
token = "{SCOPED_METRICS_TOKEN}"
role = "metrics"
pools = ["other"]

[[auth.tokens]]
token = "{TENANT_TOKEN}"
role = "client"
tenant = "a"
"""


def bound_ports(line: str) -> dict[str, int]:
    """The ports of ``grpc=host:port http=... metrics=...`` in a server's listening line."""
    ports: dict[str, int] = {}
    for word in line.split():
        name, _, address = word.partition("=")
        if name in ("grpc", "http", "metrics") and ":" in address:
            ports[name] = int(address.rsplit(":", 1)[1])
    return ports


class ServerProcess:
    def __init__(
        self,
        directory: Path,
        config: str | None,
        *,
        name: str = "server",
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.directory = directory
        self.config_template = config
        self.name = name
        self.args = args
        self.env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.port = 0
        self.http_port = 0
        self.metrics_port = 0
        self.stderr_path = directory / f"{name}.stderr"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, expect: str = "listening", timeout: float = 30.0) -> ServerProcess:
        self.port = 0
        self._spawn()
        self.learn_ports(self.wait_for(expect, timeout))
        self.seen.clear()  # later waits look for lines printed after the start
        return self

    def learn_ports(self, line: str) -> None:
        """Take the ports the server reports in its listening (or standby) ``line``."""
        ports = bound_ports(line)
        self.port = ports.get("grpc", self.port)
        self.http_port = ports.get("http", self.http_port)
        self.metrics_port = ports.get("metrics", self.metrics_port)

    def _spawn(self) -> None:
        cmd = [sys.executable, "-m", "cronoq.server.main", *self.args]
        if self.config_template is not None:
            path = self.directory / f"{self.name}.toml"
            text = self.config_template.replace("{port}", str(self.port))
            text = text.replace("{http_port}", "0").replace("{metrics_port}", "0")
            if "http_addr" not in text and "[server]" in text:
                # The HTTP gateway needs a port of its own (the default 7071 would collide).
                text = text.replace("[server]", '[server]\nhttp_addr = "127.0.0.1:0"', 1)
            path.write_text(text)
            cmd += ["--config", str(path)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env.pop("CRONOQ_CONFIG", None)
        stderr = open(self.stderr_path, "w")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT, env=env)
        stderr.close()
        self.lines = queue.Queue()
        self.seen = []
        threading.Thread(target=self._pump, args=(self.proc, self.lines), daemon=True).start()

    @staticmethod
    def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def wait_for(self, word: str, timeout: float = 30.0) -> str:
        """The next stdout line containing ``word``; RuntimeError if the process ends first."""
        deadline = time.monotonic() + timeout
        for line in self.seen:
            if word in line:
                self.seen.remove(line)
                return line
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.signal(signal.SIGUSR1)  # the server dumps its stacks to stderr
                time.sleep(0.5)
                raise RuntimeError(f"{self.name}: no line with {word!r} within {timeout}s\n{self.stderr()[-6000:]}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                assert self.proc is not None
                self.proc.wait(5)
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}\n{self.stderr()[-3000:]}")
            if word in line:
                return line
            self.seen.append(line)

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then wait; SIGKILL if it does not exit."""
        if self.proc is None:
            return None
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("CRONOQ_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "cronoq.server.main", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=full_env,
        timeout=timeout,
    )


class ChildWorker:
    """A ``cronoq.client.Worker`` in its own process (``worker_child.py``) whose handler hangs,
    so tests can kill or freeze a worker that holds a lease."""

    def __init__(self, target: str, pool: str, token: str) -> None:
        script = Path(__file__).with_name("worker_child.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), target, pool, token],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=ServerProcess._pump, args=(self.proc, self.lines), daemon=True).start()

    def wait_for(self, word: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"worker child printed no {word!r}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"worker child exited with {self.proc.wait(5)}")
            if word in line:
                return line

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)


def tcp_sockets(pid: int) -> list[tuple[str, int, int]]:
    """The TCP sockets process ``pid`` holds, IPv4 and IPv6 (grpcio maps IPv4 into IPv6), as
    (state in /proc/net/tcp's hex, e.g. "01" ESTABLISHED or "0A" LISTEN, local port, remote port)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    sockets = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as rows:
            next(rows)
            for line in rows:
                fields = line.split()
                if fields[9] in inodes:
                    local, remote = (int(address.rsplit(":", 1)[1], 16) for address in fields[1:3])
                    sockets.append((fields[3], local, remote))
    return sockets
