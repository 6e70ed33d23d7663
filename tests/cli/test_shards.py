"""Two shards behind one address: listings cover both, and a missing shard is named in the output."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from cronoq.cli.exits import Exit
from tests.cli.conftest import Cli
from tests.server.harness import TOKENS_TOML, ServerProcess


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(shard: str, grpc_ports: dict[str, int]) -> str:
    # Pool "other" exists because the shared test credentials include tokens scoped to it.
    shards = "".join(
        f'\n[[shards]]\nname = "{name}"\nnumber = {number}\npools = {pools}\n'
        f'endpoint = "http://127.0.0.1:{grpc_ports[name]}"\n'
        for number, (name, pools) in enumerate((("s1", '["a", "other"]'), ("s2", '["b"]')), start=1)
    )
    return f"""
[server]
grpc_addr = "127.0.0.1:{grpc_ports[shard]}"
http_addr = "127.0.0.1:{_free_port()}"
shard = "{shard}"
shutdown_grace_s = 0.5
{TOKENS_TOML}
{shards}
[[pools]]
name = "a"

[[pools]]
name = "b"

[[pools]]
name = "other"
"""


def test_two_shards_and_a_missing_one(tmp_path: Path) -> None:
    ports = {"s1": _free_port(), "s2": _free_port()}
    servers = [ServerProcess(tmp_path, _config(name, ports), name=name).start() for name in ("s1", "s2")]
    try:
        cli = Cli(f"127.0.0.1:{ports['s1']}")
        in_a = cli.ok("submit", "x", "--pool", "a", "--key", "on-s1").strip()
        in_b = cli.ok("submit", "y", "--pool", "b", "--key", "on-s2").strip()  # forwarded to s2
        assert int(in_a) >> 56 == 1 and int(in_b) >> 56 == 2  # the shard number tops the id
        listed = cli.json("tasks", "--all")
        assert [t["id"] for t in listed["tasks"]] == [in_a, in_b] and "unavailable_shards" not in listed
        assert cli.json("snapshot")["unavailable_shards"] == []

        servers[1].kill()
        runs = cli.many(("tasks", "--all", "-o", "json"), ("tasks",), ("snapshot", "-o", "json"),
                        ("workers", "-o", "json"), ("schedules", "-o", "json"), ("get", "--key", "on-s1", "-o", "json"),
                        ("get", "--key", "on-s1"), ("get", "--key", "on-s2"))  # fmt: skip
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
