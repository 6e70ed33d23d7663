"""``cronoq top`` in a pseudo-terminal: the panes while a workload runs, keys, roles, and a restart."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

from tests.cli.conftest import CONFIG, WORKER_NAME, Cli, EchoWorker, cli_env, free_port, shard_config
from tests.cli.screen import Screen
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN, METRICS_TOKEN, ROOT, ServerProcess


def lines_with(frame: str, *words: str) -> list[str]:
    return [line for line in frame.splitlines() if all(word in line for word in words)]


def test_top_shows_pools_workers_tasks_and_events_and_quits_with_q(cli: Cli, worker: EchoWorker) -> None:
    tag = uuid.uuid4().hex[:8]
    held = f"top-held-{tag}"
    cli.ok("submit", f'{{"hold": "{held}"}}', "--json", "--key", held)
    name = f"top-sched-{tag}"
    cli.ok("schedule", "add", name, "0 0 3 * * *", "x", "--pool", "idle")
    top = Screen(["top", "--interval", "0.3"], cli_env(cli.address, ADMIN_TOKEN))
    try:
        frame = top.wait_frame(
            lambda f: bool(lines_with(f, held, "running")) and WORKER_NAME in f and name in f and "CAPACITY" in f,
            "the held task running, the worker, the schedule and the pools",
        )
        assert lines_with(frame, "default", "zone=test")  # the worker's pool and labels
        assert lines_with(frame, name, "0 0 3 * * *", "idle")
        pool_rows = lines_with(frame, "│ default ")
        assert pool_rows, frame
        worker.release(held)
        top.wait_frame(lambda f: bool(lines_with(f, held, "succeeded")), "the held task's success event")
        top.child.send("q")
        assert top.finish() == 0
    finally:
        top.kill()
        cli("schedule", "remove", name)


def test_r_refreshes_at_once(cli: Cli) -> None:
    top = Screen(["top", "--interval", "10m", "--pool", "idle"], cli_env(cli.address, ADMIN_TOKEN))
    try:
        first = top.wait_frame(lambda f: "Live tasks" in f and "refreshed" in f, "the first refresh")
        key = f"top-refresh-{uuid.uuid4().hex[:8]}"
        assert key not in first
        cli.ok("submit", "x", "--pool", "idle", "--key", key)
        seen = len(top.frames())
        top.child.send("r")
        # With a ten-minute interval, only the key press can bring the new task onto the screen.
        top.wait_frame(lambda f: bool(lines_with(f, key, "ready")), "the new task after r", timeout=60, since=seen)
        top.child.send("q")
        assert top.finish() == 0
    finally:
        top.kill()


def test_panes_say_which_role_they_need(cli: Cli) -> None:
    metrics_only = Screen(["top", "--interval", "0.3"], cli_env(cli.address, METRICS_TOKEN))
    try:
        frame = metrics_only.wait_frame(
            lambda f: f.count("needs the client role") >= 2 and "CAPACITY" in f and "idle" in f,
            "the task and event panes asking for the client role",
        )
        assert "needs the metrics role" not in frame
        metrics_only.child.send("q")
        assert metrics_only.finish() == 0
    finally:
        metrics_only.kill()
    client_only = Screen(["top", "--interval", "0.3"], cli_env(cli.address, CLIENT_TOKEN))
    try:
        frame = client_only.wait_frame(
            lambda f: f.count("needs the metrics role") >= 3 and "stream connected" in f,
            "the pool, worker and schedule panes asking for the metrics role",
        )
        assert "needs the client role" not in frame
        client_only.child.send("q")
        assert client_only.finish() == 0
    finally:
        client_only.kill()


def test_top_shows_errors_while_the_server_is_away_and_recovers(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path, CONFIG, name="restarting").start()
    top = Screen(["top", "--interval", "0.3"], cli_env(server.address, ADMIN_TOKEN))
    try:
        top.wait_frame(lambda f: "│ watched " in f and "unavailable" not in f, "the pools of the first server")
        server.kill()
        seen = len(top.frames())
        top.wait_frame(
            lambda f: f.count("unavailable") >= 3, "the panes reporting the server as unavailable", since=seen
        )
        # The same address comes back (as a new leader would), now with one more pool.
        server.config_template = CONFIG + '\n[[pools]]\nname = "reborn"\n'
        server._spawn()
        server.wait_for("listening")
        seen = len(top.frames())
        frame = top.wait_frame(
            lambda f: "│ reborn " in f and "unavailable" not in f and "stream connected" in f,
            "every pane recovered, with the new pool",
            since=seen,
        )
        assert "│ watched " in frame
        top.child.send("q")
        assert top.finish() == 0
    finally:
        top.kill()
        server.stop()


def _cells(line: str) -> list[str]:
    return line.replace("│", " ").split()


def _pool_row(frame: str, pool: str) -> list[str] | None:
    """POOL CAPACITY BUSY PENDING WAIT_P50 WAIT_P90 UTIL SUCCEEDED FAILED of ``pool``'s row."""
    for line in frame.splitlines():
        if re.match(rf"│ {re.escape(pool)} +\d", line):
            return _cells(line)
    return None


def _succeeded(frame: str, pool: str) -> int | None:
    row = _pool_row(frame, pool)
    return int(row[7]) if row is not None else None


def _task_rows(frame: str, prefix: str, status: str, pool: str) -> list[list[str]]:
    """Rows of the live task pane (ID STATUS POOL PRIO ATT KEY AGE) of the producer's tasks."""
    pattern = re.compile(rf"│ \d+ +{status} +{pool} +\w+ +\d+ +{re.escape(prefix)}-\d+ ")
    return [_cells(line) for line in frame.splitlines() if pattern.match(line)]


def _event_rows(frame: str, prefix: str, pool: str) -> list[list[str]]:
    """Rows of the event pane (TIME ID STATUS POOL ATT KEY MESSAGE) of the producer's tasks."""
    pattern = re.compile(rf"│ \d\d:\d\d:\d\d\.\d{{3}} +\d+ +\w+ +{pool} +\d+ +{re.escape(prefix)}-\d+")
    return [_cells(line) for line in frame.splitlines() if pattern.match(line)]


def test_top_on_a_busy_two_shard_cluster_shows_both_shards(tmp_path: Path) -> None:
    ports = {"s1": free_port(), "s2": free_port()}
    # Pool "other" exists because the shared test credentials include tokens scoped to it.
    shard_pools = {"s1": ["alpha", "other"], "s2": ["beta"]}
    servers = [
        ServerProcess(tmp_path, shard_config(name, ports, shard_pools), name=name).start() for name in shard_pools
    ]
    node = f"127.0.0.1:{ports['s1']}"
    workers: list[EchoWorker] = []
    producer: subprocess.Popen[str] | None = None
    top: Screen | None = None
    prefix = f"busy-{uuid.uuid4().hex[:8]}"
    try:
        # Each worker serves its pool on its own shard; top and the producer only talk to s1.
        workers += [
            EchoWorker(f"127.0.0.1:{ports['s1']}", "alpha", name="top-worker-alpha").start(),
            EchoWorker(f"127.0.0.1:{ports['s2']}", "beta", name="top-worker-beta").start(),
        ]
        top = Screen(["top", "--interval", "0.5"], cli_env(node, ADMIN_TOKEN))
        top.wait_frame(lambda f: _pool_row(f, "beta") is not None, "the pools of both shards")
        script = Path(__file__).with_name("producer_child.py")
        producer = subprocess.Popen(
            [sys.executable, str(script), node, ADMIN_TOKEN, prefix, "0.3", "alpha", "beta"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )

        def both_shards_busy(frame: str) -> bool:
            return (
                all(_event_rows(frame, prefix, pool) for pool in ("alpha", "beta"))
                and all(_task_rows(frame, prefix, "running", pool) for pool in ("alpha", "beta"))
                and "stream connected" in frame
            )

        first = top.wait_frame(both_shards_busy, "running tasks and events of both shards' pools", timeout=90)
        assert "unavailable" not in first, first
        for pool in ("alpha", "beta", "other"):
            assert _pool_row(first, pool) is not None, (pool, first)
        # Workers of both shards, with their pools and slots.
        assert lines_with(first, "top-worker-alpha", "alpha", "/4", "zone=test"), first
        assert lines_with(first, "top-worker-beta", "beta", "/4", "zone=test"), first
        # Task ids carry their shard's number in the top 8 bits: the panes hold tasks of both shards.
        for pool, shard_number in (("alpha", 1), ("beta", 2)):
            assert {int(row[0]) >> 56 for row in _task_rows(first, prefix, "running", pool)} == {shard_number}
        assert {int(row[1]) >> 56 for row in _event_rows(first, prefix, "beta")} == {2}

        # The counters move on both shards while the workload runs.
        before = {pool: _succeeded(first, pool) for pool in ("alpha", "beta")}
        seen = len(top.frames())
        top.wait_frame(
            lambda f: all(_succeeded(f, pool) not in (None, before[pool]) for pool in before),
            f"the succeeded counts of both pools changing from {before}",
            timeout=60,
            since=seen,
        )
        # Newer events replace older ones at the top of the event pane.
        newest = {pool: _event_rows(first, prefix, pool)[0][1] for pool in ("alpha", "beta")}
        seen = len(top.frames())
        top.wait_frame(
            lambda f: all(
                _event_rows(f, prefix, pool) and _event_rows(f, prefix, pool)[0][1] != newest[pool] for pool in newest
            ),
            "newer events of both pools",
            timeout=60,
            since=seen,
        )

        # Shard s2 goes away: the header and the event pane name it, and shard s1's pools and events
        # keep coming.
        servers[1].kill()
        seen = len(top.frames())
        gone = top.wait_frame(
            lambda f: (
                "shards unavailable: s2" in f
                and _pool_row(f, "beta") is None
                and "stream connected; no events from s2" in f
            ),
            "shard s2 named as unavailable",
            since=seen,
        )
        last_beta = max((int(row[1]) for row in _event_rows(gone, prefix, "beta")), default=0)
        seen = len(top.frames())
        top.wait_frame(
            lambda f: bool(_event_rows(f, prefix, "alpha")) and "shards unavailable: s2" in f,
            "events of shard s1 while s2 is away",
            since=seen,
        )
        # It comes back at the same address: its pools, workers and events return without a key press.
        servers[1]._spawn()
        servers[1].wait_for("listening")
        seen = len(top.frames())

        def s2_back(frame: str) -> bool:
            fresh = [row for row in _event_rows(frame, prefix, "beta") if int(row[1]) > last_beta]
            return bool(fresh) and "unavailable" not in frame and lines_with(frame, "top-worker-beta", "beta") != []

        top.wait_frame(s2_back, "new events of shard s2 after it came back", timeout=90, since=seen)
        top.child.send("q")
        assert top.finish() == 0
    finally:
        if top is not None:
            top.kill()
        if producer is not None:
            assert producer.stdin is not None
            producer.stdin.close()
            try:
                producer.wait(20)
            except subprocess.TimeoutExpired:
                producer.kill()
                producer.wait(5)
        for worker in workers:
            worker.stop()
        for server in servers:
            server.stop()
