"""Two shards behind one address: listings cover both, and a missing shard is named in the output."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import IO

from cronoq.cli.exits import Exit
from tests.cli.conftest import Cli, EchoWorker, cli_env, free_port, shard_config
from tests.server.harness import ADMIN_TOKEN, ROOT, ServerProcess


def test_two_shards_and_a_missing_one(tmp_path: Path) -> None:
    ports = {"s1": free_port(), "s2": free_port()}
    # Pool "other" exists because the shared test credentials include tokens scoped to it.
    pools = {"s1": ["a", "other"], "s2": ["b"]}
    servers = [ServerProcess(tmp_path, shard_config(name, ports, pools), name=name).start() for name in pools]
    try:
        cli = Cli(f"127.0.0.1:{ports['s1']}")
        in_a = cli.ok("submit", "x", "--pool", "a", "--key", "on-s1").strip()
        in_b = cli.ok("submit", "y", "--pool", "b", "--key", "on-s2").strip()  # forwarded to s2
        assert int(in_a) >> 56 == 1 and int(in_b) >> 56 == 2  # the shard number tops the id
        listed = cli.json("tasks", "--all")
        assert [t["id"] for t in listed["tasks"]] == [in_a, in_b] and "unavailable_shards" not in listed
        assert cli.json("snapshot")["unavailable_shards"] == []

        servers[1].kill()
        runs = cli.many(
            ("tasks", "--all", "-o", "json"),
            ("tasks",),
            ("snapshot", "-o", "json"),
            ("workers", "-o", "json"),
            ("schedules", "-o", "json"),
            ("get", "--key", "on-s1", "-o", "json"),
            ("get", "--key", "on-s1"),
            ("get", "--key", "on-s2"),
        )
        partial, table, snapshot, workers, schedules, found, shown, missing = runs
        assert all(done.returncode == 0 for done in runs[:-1]), [done.stderr for done in runs]
        listing = json.loads(partial.stdout)
        assert [t["id"] for t in listing["tasks"]] == [in_a] and listing["unavailable_shards"] == ["s2"]
        assert b"shards not reachable: s2" in table.stderr and in_a.encode() in table.stdout
        for done in (snapshot, workers, schedules):
            assert json.loads(done.stdout)["unavailable_shards"] == ["s2"], done.args
        # By key every shard is asked: a hit names the shard that could not be, and so does a miss.
        hit = json.loads(found.stdout)
        assert hit["id"] == in_a and hit["unavailable_shards"] == ["s2"]
        assert b"shards not reachable: s2" in shown.stderr
        assert missing.returncode == Exit.UNAVAILABLE and b"s2" in missing.stderr
    finally:
        for server in servers:
            server.stop()


def test_every_command_works_from_either_node(tmp_path: Path) -> None:
    ports = {"s1": free_port(), "s2": free_port()}
    pools = {"s1": ["a", "other"], "s2": ["b"]}
    servers = [ServerProcess(tmp_path, shard_config(name, ports, pools), name=name).start() for name in pools]
    nodes = {name: Cli(f"127.0.0.1:{port}") for name, port in ports.items()}
    workers: list[EchoWorker] = []
    watcher: subprocess.Popen[bytes] | None = None
    try:
        workers += [
            EchoWorker(f"127.0.0.1:{ports['s1']}", "a", name="worker-a").start(),
            EchoWorker(f"127.0.0.1:{ports['s2']}", "b", name="worker-b").start(),
        ]
        # Events of both shards, merged by the node the watcher talks to.
        watcher = subprocess.Popen(
            [sys.executable, "-m", "cronoq.cli", "watch", "-o", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=cli_env(f"127.0.0.1:{ports['s1']}", ADMIN_TOKEN),
        )
        for here, there, pool in (("s1", "s2", "b"), ("s2", "s1", "a")):
            cli, tag = nodes[here], f"{here}-{uuid.uuid4().hex[:8]}"
            # A task of the other shard, submitted, waited for, looked up and listed from this node.
            waited = cli("submit", '{"from": "elsewhere"}', "--json", "--pool", pool, "--key", f"{tag}-wait", "--wait")
            assert waited.returncode == 0 and waited.stdout == b'{"from": "elsewhere"}', waited.stderr
            task_id = cli.ok("submit", "echo me", "--pool", pool, "--key", f"{tag}-echo").strip()
            assert int(task_id) >> 56 == (2 if there == "s2" else 1)
            assert cli("wait", task_id, "--timeout", "30").stdout == b"echo me"
            assert cli.json("wait", "--key", f"{tag}-echo", "--timeout", "30")["id"] == task_id
            assert cli.json("get", task_id)["status"] == "succeeded"
            assert cli.json("get", "--key", f"{tag}-echo")["id"] == task_id
            listed = cli.json("tasks", "--pool", pool, "--status", "succeeded", "--all")
            assert task_id in [t["id"] for t in listed["tasks"]] and "unavailable_shards" not in listed
            # A running task of the other shard, cancelled by its key from this node.
            held = cli.ok("submit", '{"hold": "never"}', "--json", "--pool", pool, "--key", f"{tag}-held").strip()
            assert cli.ok("cancel", "--key", f"{tag}-held").strip() == f"cancelled task with key '{tag}-held'"
            assert cli("wait", held, "--timeout", "30").returncode == Exit.TASK_FAILED
            # Workers and schedules of both shards; a schedule for the other shard's pool.
            names = {w["name"] for w in cli.json("workers")["workers"]}
            assert {"worker-a", "worker-b"} <= names
            cli.ok("schedule", "add", f"{tag}-nightly", "0 0 3 * * *", "x", "--pool", pool)
            listed_schedules = cli.json("schedules")
            assert [s["pool"] for s in listed_schedules["schedules"] if s["name"] == f"{tag}-nightly"] == [pool]
            assert f"{tag}-nightly" in nodes[there].ok("schedules")
            cli.ok("schedule", "remove", f"{tag}-nightly")
            assert f"{tag}-nightly" not in nodes[there].ok("schedules")
            snapshot = cli.json("snapshot")
            assert {p["name"] for p in snapshot["pools"]} == {"a", "b", "other"}
            assert snapshot["unavailable_shards"] == []

        # The watcher sees both shards' tasks finish (it may have opened after the first ones).
        assert watcher.stdout is not None and watcher.stderr is not None
        output = _Lines(watcher.stdout, watcher.stderr)

        def watched(pools: set[str], via: Cli, what: str) -> None:
            """Submit to ``pools`` until the watcher prints a success of each."""
            tag, seen = f"late-{uuid.uuid4().hex[:8]}", set()
            deadline = time.monotonic() + 60
            while pools - seen:
                assert time.monotonic() < deadline, (what, seen, output.stderr)
                for pool in pools - seen:
                    via.ok("submit", "late", "--pool", pool, "--key", f"{tag}-{uuid.uuid4().hex[:8]}")
                for line in output.read(2.0):
                    event = json.loads(line)
                    if event["status"] == "succeeded" and event.get("key", "").startswith(tag):
                        seen.add(event["pool"])
            assert watcher.poll() is None, (what, output.stderr)

        watched({"a", "b"}, nodes["s1"], "events of both shards")
        # Shard s2 fails under the open stream: the watcher says so and goes on with s1's events.
        servers[1].kill()
        output.wait_stderr("shards not reachable: s2")
        watched({"a"}, nodes["s1"], "events of shard s1 while s2 is away")
        # s2 comes back at the same address: the watcher takes it in again by itself.
        servers[1]._spawn()
        servers[1].wait_for("listening")
        output.wait_stderr("shards back: s2")
        watched({"a", "b"}, nodes["s1"], "events of both shards once s2 is back")
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(20) == Exit.OK
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.kill()
            watcher.wait(5)
        for worker in workers:
            worker.stop()
        for server in servers:
            server.stop()


class _Lines:
    """Complete lines of a child's standard output, and its standard error, read without blocking."""

    def __init__(self, stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.fds = {stdout.fileno(): b"", stderr.fileno(): b""}
        self.out_fd, self.err_fd = stdout.fileno(), stderr.fileno()
        self.stderr = ""

    def read(self, wait: float) -> list[str]:
        """The stdout lines that arrive within ``wait`` seconds (stderr is collected meanwhile)."""
        lines: list[str] = []
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(self.fds), [], [], left)
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return lines
                self.fds[fd] += chunk
                *complete, self.fds[fd] = self.fds[fd].split(b"\n")
                if fd == self.out_fd:
                    lines += [line.decode() for line in complete]
                else:
                    self.stderr += "".join(line.decode() + "\n" for line in complete)
        return lines

    def wait_stderr(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stderr:
            assert time.monotonic() < deadline, f"{text!r} never on stderr: {self.stderr}"
            self.read(0.5)
