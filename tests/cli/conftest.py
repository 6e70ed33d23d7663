"""A real cronoq-server, a real worker, and the ``cronoq`` command run as a subprocess.

The worker (``worker_child.py``, a ``cronoq.client.Worker`` in a process of its own) serves pool
``default``; its docstring says how payloads steer it. This test process itself never loads gRPC.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.server.harness import ADMIN_TOKEN, ROOT, TOKENS_TOML, WORKER_TOKEN, ServerProcess

WORKER_NAME = "cli-test-worker"

CONFIG = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
shutdown_grace_s = 0.5

[limits]
max_wait_s = 5
max_list = 5

{TOKENS_TOML}

[[pools]]
name = "default"
retry = {{ max_attempts = 1 }}

[[pools]]
name = "idle"

[[pools]]
name = "other"

[[pools]]
name = "watched"
"""


class EchoWorker:
    """The test worker (``worker_child.py``) in a process of its own."""

    def __init__(self, address: str, pool: str = "default", name: str = WORKER_NAME) -> None:
        script = Path(__file__).with_name("worker_child.py")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), address, pool, WORKER_TOKEN, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

    def start(self) -> EchoWorker:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "registered", f"worker child said {line!r} (exit {self.proc.poll()})"
        return self

    def release(self, name: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"release {name}\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def shard_config(shard: str, grpc_ports: Mapping[str, int], pools: Mapping[str, Sequence[str]]) -> str:
    """The configuration of server ``shard`` of a cluster with one shard per entry of ``pools``
    (shard name -> its pools, numbered from 1 in that order), each at ``127.0.0.1:grpc_ports[name]``."""
    shards = "".join(
        f'\n[[shards]]\nname = "{name}"\nnumber = {number}\npools = {json.dumps(list(names))}\n'
        f'endpoint = "http://127.0.0.1:{grpc_ports[name]}"\n'
        for number, (name, names) in enumerate(pools.items(), start=1)
    )
    every_pool = "".join(f'\n[[pools]]\nname = "{name}"\n' for names in pools.values() for name in names)
    return f"""
[server]
grpc_addr = "127.0.0.1:{grpc_ports[shard]}"
http_addr = "127.0.0.1:{free_port()}"
shard = "{shard}"
shutdown_grace_s = 0.5
{TOKENS_TOML}
{shards}
{every_pool}
"""


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("cli"), CONFIG, name="cli").start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def worker(server: ServerProcess) -> Iterator[EchoWorker]:
    echo = EchoWorker(server.address).start()
    try:
        yield echo
    finally:
        echo.stop()


def cli_env(address: str | None, token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    if address is not None:
        env["CRONOQ_ADDR"] = f"http://{address}"
    if token is not None:
        env["CRONOQ_TOKEN"] = token
    return env


class Cli:
    """Runs ``python -m cronoq.cli`` against one server with a token (admin unless told otherwise)."""

    def __init__(self, address: str) -> None:
        self.address = address

    def __call__(
        self,
        *args: str,
        token: str | None = ADMIN_TOKEN,
        stdin: bytes | None = None,
        address: str | None = None,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [sys.executable, "-m", "cronoq.cli", *args],
            input=stdin,
            capture_output=True,
            cwd=ROOT,
            env=cli_env(address or self.address, token),
            timeout=timeout,
        )

    def many(
        self, *commands: Sequence[str], token: str | None = ADMIN_TOKEN, tokens: Sequence[str | None] | None = None
    ) -> list[subprocess.CompletedProcess[bytes]]:
        """Run independent commands side by side (no input), with ``token`` or one of ``tokens`` each."""
        chosen = list(tokens) if tokens is not None else [token] * len(commands)
        procs = [
            (
                args,
                subprocess.Popen(
                    [sys.executable, "-m", "cronoq.cli", *args],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=ROOT,
                    env=cli_env(self.address, each),
                ),
            )
            for args, each in zip(commands, chosen, strict=True)
        ]
        done = []
        for args, proc in procs:
            out, err = proc.communicate(timeout=60)
            done.append(subprocess.CompletedProcess(list(args), proc.returncode, out, err))
        return done

    def ok(self, *args: str, **kw: Any) -> str:
        """Run, expect exit 0, return standard output as text."""
        done = self(*args, **kw)
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        return done.stdout.decode()

    def json(self, *args: str, **kw: Any) -> Any:
        return json.loads(self.ok(*args, "-o", "json", **kw))


@pytest.fixture(scope="session")
def cli(server: ServerProcess) -> Cli:
    return Cli(server.address)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
