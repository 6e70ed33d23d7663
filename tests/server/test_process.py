"""The cronoq-server process: --check, --print-proto, busy ports, standby and failover."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest

from cronoq.client import Client, ClientError, Lease, Worker
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN, WORKER_TOKEN, ServerProcess, run_cli

VALID = f"""
[server]
grpc_addr = "127.0.0.1:7070"

[[auth.tokens]]
token = "{CLIENT_TOKEN}"
role = "client"

[[pools]]
name = "default"
max = 4
"""

INVALID = """
[server]
grpc_addr = "0.0.0.0:7070"
shutdown_grace_s = -1
surprise = 1

[[pools]]
name = "a"
min = 5
max = 2
"""


def test_check_accepts_a_valid_configuration(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(VALID)
    done = run_cli("--config", str(path), "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "configuration is valid" in done.stdout
    defaults = run_cli("--check")
    assert defaults.returncode == 0 and "configuration is valid" in defaults.stdout


def test_check_reports_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(INVALID)
    done = run_cli("--config", str(path), "--check")
    assert done.returncode != 0
    assert "configuration is valid" not in done.stdout
    for fragment in ("surprise", "shutdown_grace_s", "pools[0]"):
        assert fragment in done.stdout, done.stdout
    env_path = tmp_path / "env.toml"
    env_path.write_text('[[auth.tokens]]\ntoken_env = "CRONOQ_TEST_UNSET_TOKEN"\nrole = "admin"\n')
    # --check does not need the secrets; starting does.
    assert run_cli("--config", str(env_path), "--check").returncode == 0
    started = run_cli("--config", str(env_path), env={"CRONOQ_TEST_UNSET_TOKEN": ""})
    assert started.returncode != 0 and "CRONOQ_TEST_UNSET_TOKEN" in started.stderr


def test_print_proto() -> None:
    done = run_cli("--print-proto")
    assert done.returncode == 0
    assert "package cronoq.v1;" in done.stdout and "service Workers" in done.stdout


def test_non_loopback_without_credentials_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "open.toml"
    path.write_text('[server]\ngrpc_addr = "0.0.0.0:0"\n')
    refused = run_cli("--config", str(path))
    assert refused.returncode != 0 and "loopback" in refused.stderr


def test_a_busy_port_exits_with_a_clear_message(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        path = tmp_path / "busy.toml"
        path.write_text(f'[server]\ngrpc_addr = "127.0.0.1:{port}"\n')
        done = run_cli("--config", str(path), timeout=30)
    assert done.returncode != 0
    assert "Address already in use" in done.stderr


async def test_a_standby_answers_unavailable_and_takes_over(tmp_path: Path) -> None:
    config = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
shutdown_grace_s = 1

[store]
kind = "sqlite"
path = "{tmp_path / "state.db"}"

[[auth.tokens]]
token = "{CLIENT_TOKEN}"
role = "client"

[[auth.tokens]]
token = "{WORKER_TOKEN}"
role = "worker"

[[auth.tokens]]
token = "{ADMIN_TOKEN}"
role = "admin"

[[pools]]
name = "default"

[[pools]]
name = "later"
"""
    leader = ServerProcess(tmp_path, config, name="leader").start()
    standby = ServerProcess(tmp_path, config, name="standby")
    try:
        standby.start(expect="standby")
        async with Client(leader.address, token=CLIENT_TOKEN) as client:
            kept = await client.submit(b"survives", pool="later", key="kept")
        async with Client(standby.address, token=CLIENT_TOKEN) as client:
            with pytest.raises(ClientError) as err:
                await client.submit(b"")
            assert err.value.code == "unavailable" and err.value.retryable
            assert "not the leader" in err.value.message
            with pytest.raises(ClientError) as snap:
                await client.get(kept.id)
            assert snap.value.code == "unavailable"
        async with Client(standby.address, token="not-a-configured-token-xyz") as stranger:
            with pytest.raises(ClientError) as denied:
                await stranger.submit(b"")
            assert denied.value.code == "unauthenticated"  # credentials are checked first

        # The standby closes each connection about a second after accepting it.
        async with grpc.aio.insecure_channel(standby.address) as channel:
            await asyncio.wait_for(channel.channel_ready(), 5)
            state = channel.get_state()
            for _ in range(60):
                await asyncio.sleep(0.1)
                state = channel.get_state()
                if state != grpc.ChannelConnectivity.READY:
                    break
            assert state != grpc.ChannelConnectivity.READY

        # A worker on the leader is told to go when the leader stops; the standby takes over.
        async def run(lease: Lease) -> bytes:
            return b"ran on " + lease.key.encode()

        worker = Worker(leader.address, "default", run, token=WORKER_TOKEN, reconnect=False)
        serving = asyncio.ensure_future(worker.run())
        await worker.wait_registered(10)
        assert await asyncio.to_thread(leader.stop) == 0
        with pytest.raises(ClientError):
            await asyncio.wait_for(serving, 10)
        assert worker.last_shutdown == "shutting down"

        await asyncio.to_thread(standby.wait_for, "listening", 30)
        async with Client(standby.address, token=CLIENT_TOKEN) as client:
            info = await client.get("kept")
            assert info.id == kept.id and info.status == "ready"
            takeover = Worker(standby.address, "later", run, token=WORKER_TOKEN)
            serving = asyncio.ensure_future(takeover.run())
            result = await client.wait(kept.id, timeout=10)
            assert result.status == "succeeded" and result.output == b"ran on kept"
            fresh = await client.submit(b"", pool="later", key="after-failover", wait=True, wait_timeout=10)
            assert fresh.id > kept.id and fresh.result is not None and fresh.result.ok
            await takeover.stop(1)
            await serving
    finally:
        leader.kill()
        standby.stop()
