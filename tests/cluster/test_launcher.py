"""``cronoq cluster up | status | down`` with real server processes on SQLite and Postgres."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from cronoq.cluster.probe import http_status, same_process
from cronoq.cluster.state import STATE_FILE, ClusterState
from cronoq.cluster.tokens import read_tokens

from cronoq.client import Client, ClientError

from .helpers import ROOT, UpProcess, child_env, cli, wait_until


def _leader(state: ClusterState, shard: str) -> tuple[str, int] | None:
    """(replica name, pid) of the replica of ``shard`` whose /readyz answers 200."""
    for entry in state.shards:
        if entry.name != shard:
            continue
        for replica in entry.replicas:
            if (
                same_process(replica.pid, replica.start_ticks)
                and asyncio.run(http_status("127.0.0.1", replica.http_port, "/readyz")) == 200
            ):
                return replica.name, replica.pid
    return None


async def _submit_until_accepted(endpoint: str, token: str, pool: str, attempts: int = 60) -> int:
    """Submit through ``endpoint``; UNAVAILABLE (no leader behind the proxy yet) is retried."""
    async with Client(endpoint, token=token) as client:
        for _ in range(attempts):
            try:
                return (await client.submit({"probe": True}, pool=pool, call_timeout=10)).id
            except ClientError as exc:
                if exc.code != "unavailable":
                    raise
            await asyncio.sleep(0.5)
    raise AssertionError(f"no submission through {endpoint} was accepted")


def _all_pids(state: ClusterState) -> list[tuple[int, int | None]]:
    pids = [(state.pid, state.start_ticks)]
    pids += [(r.pid, r.start_ticks) for shard in state.shards for r in shard.replicas]
    return pids


def test_up_status_failover_and_down_on_sqlite(tmp_path: Path, launched: list[UpProcess]) -> None:
    state_dir = tmp_path / "state"
    up = UpProcess(state_dir, "--shards", "2", "--replicas", "2")
    launched.append(up)
    up.wait_for("cluster is up")
    state = up.state_file()
    assert [s.name for s in state.shards] == ["s1", "s2"]
    assert [s.pools for s in state.shards] == [("default",), ("pool2",)]
    assert all(len(s.replicas) == 2 for s in state.shards)
    assert (state_dir / "s1.db").exists() and (state_dir / "s2.db").exists()

    # The tokens file: owner-only, one token per role, and what the servers authenticate with.
    tokens_path = state_dir / "tokens.env"
    assert os.stat(tokens_path).st_mode & 0o777 == 0o600
    tokens = read_tokens(tokens_path)
    assert sorted(tokens) == sorted(f"CRONOQ_{r}_TOKEN" for r in ("CLIENT", "WORKER", "METRICS", "ADMIN"))
    checked = subprocess.run(
        [sys.executable, "-m", "cronoq.server.main", "--check", "-c", state.config, "--shard", "s2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env(),
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    status = cli("status", "--state", str(state_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    assert "every shard has a leader" in status.stdout
    for shard in ("s1", "s2"):
        row = next(line for line in status.stdout.splitlines() if line.startswith(f"{shard} "))
        assert row.count("LEADER") == 1 and row.count("standby") == 1, status.stdout

    s1 = state.shards[0]
    client_token = tokens["CRONOQ_CLIENT_TOKEN"]
    with pytest.raises(ClientError) as refused:
        asyncio.run(_submit_until_accepted(s1.endpoint, "not-a-token-of-this-cluster", "default"))
    assert refused.value.code == "unauthenticated"
    first = asyncio.run(_submit_until_accepted(s1.endpoint, client_token, "default"))
    assert first >> 56 == 1

    # SIGKILL s1's leader: another replica takes over once the lease runs out, the proxy follows
    # it, and a client using the same endpoint is served again. The launcher starts the killed
    # replica again (restarts are on by default) on its old ports; once the dead leader's lease has
    # run out, the new leader is either the old standby or the restarted replica, whichever claims
    # the lease first.
    leader = _leader(state, "s1")
    assert leader is not None
    os.kill(leader[1], signal.SIGKILL)
    up.wait_for(f"{leader[0]} (pid {leader[1]}) exited unexpectedly (killed by SIGKILL)")
    restarted = up.wait_for(f"{leader[0]} restarted as pid")
    new_pid = int(restarted.split("restarted as pid ")[1].split()[0])
    assert new_pid != leader[1]
    wait_until(
        lambda: (found := _leader(up.state_file(), "s1")) is not None and found[1] != leader[1],
        "a replica of s1 to lead again",
        timeout=60,
    )
    if not any("leads now" in line for line in up.output):
        up.wait_for("leads now")
    second = asyncio.run(_submit_until_accepted(s1.endpoint, client_token, "default"))
    assert second >> 56 == 1 and second != first
    # The shard's HTTP endpoint follows the leader too: its /readyz is the new leader's.
    http_port = int(s1.http.rsplit(":", 1)[1])
    assert asyncio.run(http_status("127.0.0.1", http_port, "/readyz")) == 200

    # The new leader recovered the task the dead one accepted.
    async def get_first() -> str:
        async with Client(s1.endpoint, token=client_token) as client:
            return (await client.get(first)).status

    assert asyncio.run(get_first()) in ("pending", "ready")  # no worker runs it

    # `status` shows the restarted process (its new pid, recorded in the state file) with its
    # restart count, and one leader.
    status = cli("status", "--state", str(state_dir))
    assert status.returncode == 0, status.stdout + status.stderr
    row = next(line for line in status.stdout.splitlines() if line.startswith("s1 "))
    assert re.search(rf"{leader[0]} pid {new_pid} (LEADER|standby) \(restarted 1x\)", row), row
    assert row.count("LEADER") == 1 and "not running" not in row, row
    state = up.state_file()
    assert (leader[0], new_pid) in {(r.name, r.pid) for r in state.shards[0].replicas}

    down = cli("down", "--state", str(state_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped" in down.stdout
    assert up.proc.wait(30) == 0
    wait_until(
        lambda: not any(same_process(pid, ticks) for pid, ticks in _all_pids(state)),
        "every process to exit",
        timeout=10,
    )
    assert not (state_dir / STATE_FILE).exists()

    after = cli("status", "--state", str(state_dir))
    assert after.returncode == 1 and "no cluster is running" in after.stdout
    again = cli("down", "--state", str(state_dir))
    assert again.returncode == 0 and "nothing to stop" in again.stdout


async def _drop_schemas(dsn: str, prefix: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        names = await conn.fetch("SELECT nspname FROM pg_namespace WHERE nspname LIKE $1", prefix + "%")
        for row in names:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{row["nspname"]}" CASCADE')
    finally:
        await conn.close()


async def _schemas(dsn: str, prefix: str) -> list[str]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT nspname FROM pg_namespace WHERE nspname LIKE $1 ORDER BY 1", prefix + "%")
        return [row["nspname"] for row in rows]
    finally:
        await conn.close()


def test_up_on_postgres_one_schema_per_shard(tmp_path: Path, postgres_dsn: str, launched: list[UpProcess]) -> None:
    prefix = f"ct_{uuid.uuid4().hex[:10]}_"
    state_dir = tmp_path / "pg"
    try:
        up = UpProcess(state_dir, "--shards", "2", "--replicas", "2", "--dsn", postgres_dsn, "--schema-prefix", prefix)
        launched.append(up)
        up.wait_for("cluster is up")
        state = up.state_file()
        assert state.store == "postgres"
        assert asyncio.run(_schemas(postgres_dsn, prefix)) == [f"{prefix}s1", f"{prefix}s2"]
        assert not list(state_dir.glob("*.db"))
        status = cli("status", "--state", str(state_dir))
        assert status.returncode == 0 and "every shard has a leader" in status.stdout, status.stdout
        tokens = read_tokens(state_dir / "tokens.env")

        async def submit_through_s1() -> tuple[int, int]:
            async with Client(state.shards[0].endpoint, token=tokens["CRONOQ_CLIENT_TOKEN"]) as client:
                local = (await client.submit({"n": 1}, pool="default")).id
                try:
                    other = (await client.submit({"n": 2}, pool="pool2")).id
                except ClientError as exc:  # a build without the router refuses with s2's endpoint
                    assert exc.code == "failed_precondition" and state.shards[1].endpoint in str(exc)
                    other = -1
                return local, other

        local, other = asyncio.run(submit_through_s1())
        assert local >> 56 == 1
        assert other == -1 or other >> 56 == 2
        up.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert up.proc.wait(40) == 0
        assert not any(same_process(pid, ticks) for pid, ticks in _all_pids(state))
        assert not (state_dir / STATE_FILE).exists()
    finally:
        asyncio.run(_drop_schemas(postgres_dsn, prefix))


def test_bad_options_and_busy_ports_are_explained(tmp_path: Path) -> None:
    bad = cli("up", "--state", str(tmp_path), "--shards", "0", "--replicas", "99")
    assert bad.returncode == 2
    assert "--shards must be between 1 and 255" in bad.stderr and "--replicas must be between 1 and 16" in bad.stderr
    bad_dsn = cli("up", "--state", str(tmp_path), "--dsn", "mysql://x")
    assert bad_dsn.returncode == 2 and "postgres://" in bad_dsn.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = cli("up", "--state", str(tmp_path / "busy"), "--shards", "1", "--base-port", str(port))
    assert busy.returncode == 1
    assert re.search(rf"cannot listen on 127\.0\.0\.1:{port} for shard s1", busy.stderr), busy.stderr
    assert "--base-port" in busy.stderr
    assert not (tmp_path / "busy" / STATE_FILE).exists()

    nothing = cli("status", "--state", str(tmp_path / "none"))
    assert nothing.returncode == 1 and "no cluster is running" in nothing.stdout


def test_a_second_up_on_the_same_state_is_refused(tmp_path: Path, launched: list[UpProcess]) -> None:
    state_dir = tmp_path / "one"
    up = UpProcess(state_dir, "--shards", "1", "--replicas", "1")
    launched.append(up)
    up.wait_for("cluster is up")
    second = cli("up", "--state", str(state_dir), "--base-port", "0", timeout=60)
    assert second.returncode == 1
    assert f"a cluster is already running from {state_dir.resolve()}" in second.stderr
    # The refused launcher touched nothing: the first one still serves and stops cleanly.
    assert cli("status", "--state", str(state_dir)).returncode == 0
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(40) == 0
