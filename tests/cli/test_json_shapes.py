"""``-o json``: the HTTP API's own shapes, printed without loading the HTTP server's dependencies."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
import uuid
from typing import Any

from tests.cli.conftest import Cli, EchoWorker, cli_env
from tests.server.harness import ADMIN_TOKEN, ROOT, ServerProcess

# Runs several commands with -o json in one interpreter, then reports what they printed, their exit
# codes and whether aiohttp (the HTTP gateway's dependency) was ever imported.
_IN_ONE_PROCESS = """
import contextlib, io, json, sys
from cronoq.cli import main

runs = []
for args in json.loads(sys.argv[1]):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([*args, "-o", "json"])
    runs.append({"args": args, "code": code, "stdout": printed.getvalue()})
print(json.dumps({"runs": runs, "aiohttp": sorted(m for m in sys.modules if m.split(".")[0] == "aiohttp"),
                  "gateway": "cronoq.server.http" in sys.modules}))
"""


def test_json_output_does_not_import_aiohttp(cli: Cli, worker: EchoWorker) -> None:
    key = f"light-{uuid.uuid4().hex[:8]}"
    task_id = cli.ok("submit", '{"light": true}', "--json", "--key", key).strip()
    commands = [
        ["submit", "x", "--pool", "idle"],
        ["wait", task_id, "--timeout", "30"],
        ["get", "--key", key],
        ["tasks", "--pool", "default"],
        ["snapshot"],
        ["workers"],
        ["schedules"],
    ]
    done = subprocess.run(
        [sys.executable, "-c", _IN_ONE_PROCESS, json.dumps(commands)],
        capture_output=True,
        cwd=ROOT,
        env=cli_env(cli.address, ADMIN_TOKEN),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    report = json.loads(done.stdout.decode().splitlines()[-1])
    for run in report["runs"]:
        assert run["code"] == 0, run
        assert isinstance(json.loads(run["stdout"]), dict), run  # real JSON was printed
    printed = {tuple(run["args"][:1]): json.loads(run["stdout"]) for run in report["runs"]}
    assert printed[("wait",)]["output"] == {"light": True} and printed[("get",)]["id"] == task_id
    assert "pools" in printed[("snapshot",)] and "workers" in printed[("workers",)]
    assert report["aiohttp"] == [] and report["gateway"] is False, report


def _http_address(server: ServerProcess) -> str:
    return f"127.0.0.1:{server.http_port}"


def _http_get(server: ServerProcess, path: str) -> Any:
    request = urllib.request.Request(
        f"http://{_http_address(server)}{path}", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_json_output_is_what_the_http_gateway_answers(server: ServerProcess, cli: Cli, worker: EchoWorker) -> None:
    key = f"same-{uuid.uuid4().hex[:8]}"
    task_id = cli.ok(
        "submit", '{"same": [1, 2]}', "--json", "--key", key, "--priority", "high", "--tenant", "acme"
    ).strip()
    waited = cli.json("wait", task_id, "--timeout", "30")
    assert waited == _http_get(server, f"/v1/tasks/{task_id}/result")
    assert cli.json("get", task_id) == _http_get(server, f"/v1/tasks/{task_id}")
    assert cli.json("get", "--key", key) == _http_get(server, f"/v1/tasks/by-key/{key}")
    # Finished tasks of one pool do not change between the two reads.
    listed = cli.json("tasks", "--pool", "default", "--status", "succeeded", "--limit", "3")
    assert listed == _http_get(server, "/v1/tasks?pool=default&status=succeeded&limit=3")
    name = f"shape-{uuid.uuid4().hex[:8]}"
    cli.ok("schedule", "add", name, "0 0 3 * * *", "x", "--pool", "idle", "--tz", "Europe/Berlin")
    try:
        mine = [s for s in cli.json("schedules")["schedules"] if s["name"] == name]
        over_http = [s for s in _http_get(server, "/v1/recurring")["schedules"] if s["name"] == name]
        assert mine == over_http and len(mine) == 1
    finally:
        cli.ok("schedule", "remove", name)
    # Live counters move between two reads; the documents still have the same shape.
    snapshot, over_http = cli.json("snapshot"), _http_get(server, "/v1/snapshot")
    assert snapshot.keys() == over_http.keys() and snapshot["unavailable_shards"] == []
    assert [p["name"] for p in snapshot["pools"]] == [p["name"] for p in over_http["pools"]]
    assert snapshot["pools"][0].keys() == over_http["pools"][0].keys()
    workers, over_http = cli.json("workers"), _http_get(server, "/v1/workers")
    assert {w["id"]: w["connected_unix_ns"] for w in workers["workers"]} == {
        w["id"]: w["connected_unix_ns"] for w in over_http["workers"]
    }
