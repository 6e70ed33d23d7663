"""``cronoq-server --grpc-addr / --http-addr / --metrics-addr``: they replace the configuration's
``[server]`` addresses and go through the same validation as the file's values; the listening line
reports the addresses bound (port 0: the OS's choice)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cronoq.client import Client
from tests.server.harness import CLIENT_TOKEN, ROOT, bound_ports, run_cli

CLIENT_TOKEN_TOML = f'[[auth.tokens]]\ntoken = "{CLIENT_TOKEN}"\nrole = "client"\n'


def _held_listener() -> socket.socket:
    """A port this test keeps bound, so a server that ignored an override could not start on it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


async def _http_status(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        return int((await reader.readline()).split()[1])
    finally:
        writer.close()


@pytest.fixture
def held_ports() -> Iterator[tuple[int, int]]:
    grpc_sock, http_sock = _held_listener(), _held_listener()
    try:
        yield grpc_sock.getsockname()[1], http_sock.getsockname()[1]
    finally:
        grpc_sock.close()
        http_sock.close()


def _start_server(config: Path, *flags: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("CRONOQ_CONFIG", None)
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cronoq.server.main", "--config", str(config), *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, text: str, timeout: float = 60.0) -> str:
    """The first line of the log containing ``text``; AssertionError if the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exited = proc.poll() is not None
        for line in log.read_text(errors="replace").splitlines():
            if text in line:
                return line
        if exited:
            break
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} within {timeout}s:\n{log.read_text(errors='replace')[-3000:]}")


def test_a_server_listens_where_the_flags_say(tmp_path: Path, held_ports: tuple[int, int]) -> None:
    file_grpc, file_http = held_ports
    config = tmp_path / "server.toml"
    config.write_text(
        f'[server]\ngrpc_addr = "127.0.0.1:{file_grpc}"\nhttp_addr = "127.0.0.1:{file_http}"\n'
        f"shutdown_grace_s = 1\n\n{CLIENT_TOKEN_TOML}"
    )
    log = tmp_path / "server.log"
    # Port 0 everywhere: had the server kept a file address, it could not have bound the held port.
    flags = ("--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
    proc = _start_server(config, *flags, log=log)
    try:
        ports = bound_ports(_wait_for_line(proc, log, "cronoq-server listening"))
        grpc_port, http_port, metrics_port = ports["grpc"], ports["http"], ports["metrics"]
        assert len({grpc_port, http_port, metrics_port, file_grpc, file_http}) == 5, ports

        async def exercise() -> None:
            async with Client(f"127.0.0.1:{grpc_port}", token=CLIENT_TOKEN) as client:
                submitted = await client.submit({"hello": 1})
                assert (await client.get(submitted.id)).status in ("pending", "ready")
            assert await _http_status(http_port, "/healthz") == 200
            assert await _http_status(http_port, "/metrics") == 401  # the gateway's /metrics wants a token
            assert await _http_status(metrics_port, "/metrics") == 200  # the metrics listener does not

        asyncio.run(exercise())
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, log.read_text(errors="replace")


def test_check_validates_the_overridden_addresses(tmp_path: Path) -> None:
    bad = run_cli("--check", "--grpc-addr", "localhost:7070")
    assert bad.returncode == 1
    assert "--grpc-addr (server.grpc_addr): invalid address 'localhost:7070'" in bad.stdout, bad.stdout
    assert "IP literal" in bad.stdout

    # No credentials: the loopback-only rule holds for a flag as for the file.
    public = run_cli("--check", "--http-addr", "0.0.0.0:7071")
    assert public.returncode == 1
    assert "--http-addr (server.http_addr): 0.0.0.0:7071 is not a loopback address" in public.stdout, public.stdout
    allowed = run_cli("--check", "--http-addr", "0.0.0.0:7071", "--insecure-no-auth")
    assert allowed.returncode == 0, allowed.stdout
    assert "authentication is off and 0.0.0.0:7071 is not a loopback address" in allowed.stdout

    clash = run_cli("--check", "--grpc-addr", "127.0.0.1:7300", "--metrics-addr", "127.0.0.1:7300")
    assert clash.returncode == 1
    assert "--metrics-addr (server.metrics_addr): 127.0.0.1:7300 is already used by server.grpc_addr" in clash.stdout

    # A flag replaces the file's address: the file alone is refused, with the flag it is valid.
    config = tmp_path / "public.toml"
    config.write_text('[server]\ngrpc_addr = "0.0.0.0:7070"\n')
    refused = run_cli("--check", "-c", str(config))
    assert refused.returncode == 1 and "server.grpc_addr: 0.0.0.0:7070 is not a loopback address" in refused.stdout
    fixed = run_cli("--check", "-c", str(config), "--grpc-addr", "127.0.0.1:7070")
    assert fixed.returncode == 0 and "configuration is valid" in fixed.stdout, fixed.stdout

    # A mistyped value in the file is still reported, as the file's (not the flag's) problem.
    typo = tmp_path / "typo.toml"
    typo.write_text("[server]\ngrpc_addr = 7070\n")
    mistyped = run_cli("--check", "-c", str(typo), "--grpc-addr", "127.0.0.1:7070")
    assert mistyped.returncode == 1
    problem = next(line.strip() for line in mistyped.stdout.splitlines() if "grpc_addr" in line)
    assert problem.startswith("server.grpc_addr:"), mistyped.stdout

    # With credentials a public address is fine.
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(CLIENT_TOKEN_TOML)
    assert run_cli("--check", "-c", str(tokens), "--grpc-addr", "0.0.0.0:7070").returncode == 0


def test_serving_with_a_bad_address_fails_before_binding_anything() -> None:
    refused = run_cli("--grpc-addr", "192.0.2.1:7070", "--http-addr", "127.0.0.1:0")
    assert refused.returncode == 1
    assert "--grpc-addr (server.grpc_addr): 192.0.2.1:7070 is not a loopback address" in refused.stderr, refused.stderr
