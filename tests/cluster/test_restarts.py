"""The launcher restarts replicas that die (unless told not to), with backoff, as standbys."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from cronoq.cluster.launcher import Cluster
from cronoq.cluster.layout import ClusterOptions
from cronoq.cluster.probe import http_status, same_process
from cronoq.cluster.replica import Replica
from cronoq.cluster.supervisor import Backoff, RestartPolicy, describe_exit

from .helpers import UpProcess, cli, wait_until


async def _eventually(predicate: object, what: str, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def _readyz(replica: Replica) -> int | None:
    return await http_status("127.0.0.1", replica.http_port, "/readyz")


def test_backoff_doubles_up_to_the_cap_and_resets_after_a_healthy_run() -> None:
    backoff = Backoff(RestartPolicy(first_delay_s=0.5, max_delay_s=30.0, stable_s=30.0))
    delays = [backoff.next_delay(1.0) for _ in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert backoff.next_delay(0.0) == 30.0  # a failed start keeps backing off
    assert backoff.next_delay(31.0) == 0.5  # a run of 31 s was healthy: start over
    assert backoff.next_delay(2.0) == 1.0


def test_exits_are_described_by_code_or_signal() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(0) == "exit code 0"


async def test_a_killed_replica_comes_back_as_a_standby_and_can_lead(tmp_path: Path) -> None:
    lines: list[str] = []
    cluster = Cluster(ClusterOptions(shards=1, replicas=2, state=tmp_path, base_port=0), say=lines.append)
    await cluster.start()
    try:
        shard = cluster.shard("s1")
        leader = shard.leader
        assert leader is not None
        standby = next(replica for replica in shard.replicas if replica is not leader)
        old_pid, ports = standby.pid, (standby.grpc_port, standby.http_port)

        standby.kill()  # kill -9, as a crash
        await _eventually(
            lambda: any(f"{standby.name} restarted as pid" in line for line in lines),
            "the killed standby to be restarted",
        )
        assert standby.restarts == 1 and standby.alive
        assert standby.pid != old_pid
        assert (standby.grpc_port, standby.http_port) == ports  # same address as before
        # It rejoins as a standby: the leader keeps leading.
        assert await _readyz(standby) != 200
        assert shard.leader is leader and leader.restarts == 0
        assert any(f"{standby.name} (pid {old_pid}) exited unexpectedly (killed by SIGKILL)" in line for line in lines)
        assert any(f"{standby.name} restarted as pid {standby.pid} (restart #1)" in line for line in lines)
        assert f"{standby.name} pid {standby.pid} standby (restarted 1x)" in cluster.table()

        # The leader is stopped on purpose (as `down` would): not restarted, and the restarted
        # replica takes over the shard.
        await leader.stop()
        await _eventually(lambda: shard.leader is standby, "the restarted replica to lead", timeout=90)
        assert await _readyz(standby) == 200
        assert not leader.alive and leader.restarts == 0
        assert not any(f"{leader.name} (pid" in line and "exited unexpectedly" in line for line in lines)
    finally:
        await cluster.stop()
    assert not any(replica.alive for replica in cluster.replicas)
    assert not any("exited unexpectedly" in line and "SIGTERM" in line for line in lines)


def test_with_no_restart_a_killed_replica_stays_dead(tmp_path: Path, launched: list[UpProcess]) -> None:
    state_dir = tmp_path / "state"
    up = UpProcess(state_dir, "--shards", "1", "--replicas", "2", "--no-restart")
    launched.append(up)
    up.wait_for("cluster is up")
    assert any("stays down (--no-restart)" in line for line in up.output)
    state = up.state_file()
    victim = state.shards[0].replicas[0]
    os.kill(victim.pid, signal.SIGKILL)
    up.wait_for(f"{victim.name} (pid {victim.pid}) exited unexpectedly (killed by SIGKILL)")

    def row() -> str:
        status = cli("status", "--state", str(state_dir))
        return next(line for line in status.stdout.splitlines() if line.startswith("s1 "))

    # The other replica leads (it may have to wait for the dead one's lease); the dead one is not
    # started again: `status` still names its old pid, not running.
    wait_until(lambda: "LEADER" in row(), "the other replica to lead", timeout=60)
    assert f"{victim.name} pid {victim.pid} not running" in row()
    assert not same_process(victim.pid, victim.start_ticks)
    assert up.state_file().shards[0].replicas[0].pid == victim.pid
    up.proc.send_signal(signal.SIGTERM)
    assert up.proc.wait(40) == 0
    # A supervisor with restarts on announces "restarting ..." right after the death line; the
    # whole output of this launcher has no such line.
    while (line := up.lines.get(timeout=10)) is not None:
        up.output.append(line)
    assert "stopped" in up.output[-1]
    assert not any("restarting" in line or "restarted as" in line for line in up.output), up.output


async def test_a_restart_that_fails_is_retried_with_growing_delays(tmp_path: Path) -> None:
    lines: list[str] = []
    cluster = Cluster(ClusterOptions(shards=1, replicas=1, state=tmp_path, base_port=0), say=lines.append)
    await cluster.start()
    try:
        replica = cluster.shard("s1").replicas[0]
        good_config = cluster.config_path.read_text()
        # Break the shared configuration, then crash the replica: its restarts fail until the
        # file is fixed, each one announced with a longer delay than the one before.
        cluster.config_path.write_text(good_config + "\n[server]\nno_such_key = 1\n")
        replica.kill()
        await _eventually(
            lambda: sum("restart #" in line and "failed" in line for line in lines) >= 2, "two failed restarts"
        )
        delays = [float(line.split(" in ")[1].split("s ")[0]) for line in lines if "restarting s1-r1 in" in line]
        assert delays[:3] == [0.5, 1.0, 2.0][: len(delays[:3])] and len(delays) >= 2
        failure = next(line for line in lines if "failed" in line)
        assert "s1-r1 did not start (exit code 1)" in failure
        cluster.config_path.write_text(good_config)
        await _eventually(lambda: any("s1-r1 restarted as pid" in line for line in lines), "a restart to succeed")
        await _eventually(lambda: cluster.shard("s1").leader is replica, "the restarted replica to lead", timeout=90)
        assert replica.restarts >= 3
    finally:
        await cluster.stop()
    assert not replica.alive
