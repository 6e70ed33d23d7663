"""``cronoq top`` in a pseudo-terminal: the panes while a workload runs, keys, roles, and a restart."""

from __future__ import annotations

import uuid
from pathlib import Path

from tests.cli.conftest import CONFIG, WORKER_NAME, Cli, EchoWorker, cli_env
from tests.cli.screen import Screen
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN, METRICS_TOKEN, ServerProcess


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
        top.wait_frame(lambda f: f.count("unavailable") >= 3, "the panes reporting the server as unavailable",
                       since=seen)  # fmt: skip
        # The same address comes back (as a new leader would), now with one more pool.
        server.config_template = CONFIG + '\n[[pools]]\nname = "reborn"\n'
        server._spawn()
        server.wait_for("listening")
        seen = len(top.frames())
        frame = top.wait_frame(lambda f: "│ reborn " in f and "unavailable" not in f and "stream connected" in f,
                               "every pane recovered, with the new pool", since=seen)  # fmt: skip
        assert "│ watched " in frame
        top.child.send("q")
        assert top.finish() == 0
    finally:
        top.kill()
        server.stop()
