"""Every ``cronoq`` command against a real server, run as a subprocess: output, ``-o json`` and exit codes."""

from __future__ import annotations

import base64
import json
import select
import signal
import subprocess
import sys
import time
import uuid

from cronoq.cli.exits import Exit
from tests.cli.conftest import WORKER_NAME, Cli, EchoWorker, cli_env
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN, METRICS_TOKEN, ROOT, ServerProcess


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_submit_with_every_option_then_get_by_id_and_by_key(cli: Cli) -> None:
    key = unique("doc")
    task_id = cli.ok(
        "submit",
        '{"doc": 42}',
        "--json",
        "--pool",
        "idle",
        "--priority",
        "high",
        "--kind",
        "ocr",
        "--key",
        key,
        "--tenant",
        "acme",
        "--label",
        "gpu=a100",
        "--tag",
        "team=search",
        "--deadline-in",
        "30",
        "--start-in",
        "0",
        "--timeout",
        "1m",
        "--content-type",
        "application/vnd.test+json",
    ).strip()
    assert task_id.isdigit()
    info = cli.json("get", task_id)
    assert info["id"] == task_id and isinstance(info["created_unix_ns"], str)
    assert (info["pool"], info["key"], info["kind"], info["priority"], info["tenant"]) == (
        "idle",
        key,
        "ocr",
        "high",
        "acme",
    )
    assert cli.json("get", "--key", key)["id"] == task_id
    # --after by key and by id: the child waits for both parents (which never run in pool idle).
    child = cli.ok("submit", "child", "--pool", "idle", "--after", key, "--after", task_id).strip()
    assert cli.json("get", child)["status"] == "blocked"
    table = cli.ok("get", "--key", key)
    assert f"id        {task_id}" in table and f"key       {key}" in table and "priority  high" in table
    # The same key again: the existing task, reported as a duplicate.
    again = cli("submit", "other", "--pool", "idle", "--key", key)
    assert again.returncode == 0 and again.stdout.decode().strip() == task_id
    assert b"key already used" in again.stderr
    assert cli.json("submit", "other", "--pool", "idle", "--key", key) == {"id": task_id, "duplicate": True}


def test_submit_wait_writes_the_output_unchanged_to_a_pipe(cli: Cli, worker: EchoWorker) -> None:
    payload = b"\x1b[31mred\x1b[0m\x00\xff\xfe binary\r\n"
    done = cli("submit", "--file", "-", "--wait", stdin=payload)
    assert done.returncode == 0, done.stderr
    assert done.stdout == payload
    text = cli("submit", "caf\u00e9 \x07 bell", "--wait")
    assert text.returncode == 0 and text.stdout == "caf\u00e9 \x07 bell".encode()


def test_wait_prints_the_output_and_json_mirrors_the_http_result(cli: Cli, worker: EchoWorker) -> None:
    task_id = cli.ok("submit", '{"answer": 42}', "--json").strip()
    assert cli("wait", task_id, "--timeout", "20").stdout == b'{"answer": 42}'
    result = cli.json("wait", task_id)
    assert result == {
        "id": task_id,
        "status": "succeeded",
        "output_available": True,
        "output": {"answer": 42},
        "output_b64": base64.b64encode(b'{"answer": 42}').decode(),
    }
    waited = cli.json("submit", "plain", "--wait")
    assert waited["duplicate"] is False and waited["result"]["status"] == "succeeded"
    assert base64.b64decode(waited["result"]["output_b64"]) == b"plain" and "output" not in waited["result"]


def test_a_failed_task_exits_with_task_failed(cli: Cli, worker: EchoWorker) -> None:
    failed = cli("submit", '{"fail": "asked to fail"}', "--json", "--wait")
    assert failed.returncode == Exit.TASK_FAILED
    assert failed.stdout == b"" and b"failed: asked to fail" in failed.stderr
    task_id = cli.ok("submit", '{"fail": "again"}', "--json").strip()
    waited = cli("wait", task_id, "--timeout", "20")
    assert waited.returncode == Exit.TASK_FAILED and b"again" in waited.stderr
    as_json = cli("wait", task_id, "-o", "json")
    assert as_json.returncode == Exit.TASK_FAILED
    assert json.loads(as_json.stdout) == {
        "id": task_id,
        "status": "failed",
        "output_available": False,
        "message": "again",
    }


def test_waiting_too_long_exits_with_timeout(cli: Cli) -> None:
    task_id = cli.ok("submit", "never served", "--pool", "idle").strip()
    waited = cli("wait", task_id, "--timeout", "0.3")
    assert waited.returncode == Exit.TIMEOUT and b"still running" in waited.stderr
    submitted = cli("submit", "never served", "--pool", "idle", "--wait", "--wait-timeout", "0.2")
    assert submitted.returncode == Exit.TIMEOUT
    assert cli.json("get", task_id)["status"] == "ready"  # the task itself is untouched


def test_unknown_tasks_are_not_found_and_bad_ids_are_usage_errors(cli: Cli) -> None:
    missing = [("get", "999999"), ("wait", "999999"), ("cancel", "999999"), ("get", "--key", unique("nokey"))]
    for done in cli.many(*missing):
        assert done.returncode == Exit.NOT_FOUND, (done.args, done.stderr)
        assert b"not_found" in done.stderr
    wrong = [
        ("get", "abc"),
        ("get",),
        ("get", "1", "--key", "k"),
        ("tasks", "--status", "bogus"),
        ("submit",),
        ("submit", "{oops", "--json"),
        ("submit", "x", "--label", "novalue"),
        ("tasks", "--limit", "0"),
        ("submit", "x", "--deadline-in", "soon"),
        ("submit", "x", "--priority", "urgent"),
        ("frobnicate",),
        ("submit", "x", "--file", "/nonexistent/payload"),
        ("submit", "[NaN]", "--json"),
    ]
    for done in cli.many(*wrong):
        assert done.returncode == Exit.USAGE, (done.args, done.stderr)
        assert done.stderr, done.args


def test_cancel_then_get_wait_and_cancel_again(cli: Cli) -> None:
    key = unique("cancel")
    task_id = cli.ok("submit", "x", "--pool", "idle", "--key", key).strip()
    assert cli.ok("cancel", task_id).strip() == f"cancelled task {task_id}"
    assert cli.json("get", task_id)["status"] == "cancelled"
    assert cli("wait", task_id).returncode == Exit.TASK_FAILED
    assert "already finished" in cli.ok("cancel", "--key", key)
    assert cli.json("cancel", task_id) == {"cancelled": False}


def test_tasks_lists_one_page_or_every_page(cli: Cli) -> None:
    submitted = cli.many(*[("submit", f"page {i}", "--pool", "other") for i in range(7)])
    pool_ids = sorted((done.stdout.decode().strip() for done in submitted), key=int)
    assert len(pool_ids) == 7 and all(done.returncode == 0 for done in submitted)
    first = cli.json("tasks", "--pool", "other", "--limit", "3")
    assert [t["id"] for t in first["tasks"]] == pool_ids[:3] and first["next_after"] == pool_ids[2]
    second = cli.json("tasks", "--pool", "other", "--limit", "3", "--after", first["next_after"])
    assert [t["id"] for t in second["tasks"]] == pool_ids[3:6]
    everything = cli.json("tasks", "--pool", "other", "--all")
    assert [t["id"] for t in everything["tasks"]] == pool_ids and "next_after" not in everything
    table = cli("tasks", "--pool", "other")
    lines = table.stdout.decode().splitlines()
    assert lines[0].split()[:3] == ["ID", "STATUS", "POOL"] and len(lines) == 1 + 5  # max_list = 5
    assert b"--all" in table.stderr  # says that more pages follow
    cli.ok("cancel", pool_ids[0])
    cancelled = cli.json("tasks", "--pool", "other", "--status", "cancelled", "--status", "succeeded")
    assert [t["id"] for t in cancelled["tasks"]] == [pool_ids[0]]


def test_workers_schedules_and_snapshot(cli: Cli, worker: EchoWorker) -> None:
    runs = cli.many(
        ("workers",), ("workers", "-o", "json"), ("snapshot", "-o", "json"), ("snapshot",), token=METRICS_TOKEN
    )
    assert all(done.returncode == 0 for done in runs), [done.stderr for done in runs]
    table, listed, snapshot, text = (done.stdout.decode() for done in runs)
    assert table.splitlines()[0].split() == ["ID", "NAME", "POOL", "BUSY/SLOTS", "LABELS", "CONNECTED"]
    assert any(WORKER_NAME in line and "zone=test" in line and "/4" in line for line in table.splitlines())
    mine = [w for w in json.loads(listed)["workers"] if w["name"] == WORKER_NAME]
    assert mine and isinstance(mine[0]["id"], str) and isinstance(mine[0]["connected_unix_ns"], str)
    shown = json.loads(snapshot)
    assert shown["unavailable_shards"] == []
    assert {p["name"] for p in shown["pools"]} >= {"default", "idle", "other"}
    assert "submitted" in shown["totals"]
    assert "POOL" in text and "CAPACITY" in text and "totals:" in text and "idle" in text

    name = unique("nightly")
    added = cli.ok(
        "schedule",
        "add",
        name,
        "0 0 3 * * *",
        '{"report": "daily"}',
        "--json",
        "--tz",
        "Europe/Berlin",
        "--overlap",
        "queue",
        "--pool",
        "idle",
        "--key",
        name,
    )
    assert added.strip() == f"schedule {name} added"
    schedules = cli.json("schedules", token=METRICS_TOKEN)["schedules"]
    mine_s = [s for s in schedules if s["name"] == name]
    assert mine_s and mine_s[0]["tz"] == "Europe/Berlin" and mine_s[0]["overlap"] == "queue"
    assert isinstance(mine_s[0]["next_unix_ns"], str)
    assert any(line.startswith(name) and "Europe/Berlin" in line for line in cli.ok("schedules").splitlines())
    assert cli("schedule", "add", name, "0 0 3 * * *", "x", token=CLIENT_TOKEN).returncode == Exit.DENIED
    assert cli("schedule", "add", unique("bad"), "not a cron", "x").returncode == Exit.USAGE
    assert cli.ok("schedule", "remove", name).strip() == f"schedule {name} removed"
    gone = cli("schedule", "remove", name)
    assert gone.returncode == Exit.NOT_FOUND and b"no schedule" in gone.stderr


def test_watch_prints_events_until_ctrl_c(server: ServerProcess, cli: Cli, worker: EchoWorker) -> None:
    watcher = subprocess.Popen(
        [sys.executable, "-m", "cronoq.cli", "watch", "--pool", "default", "--all", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=cli_env(server.address, CLIENT_TOKEN),
    )
    try:
        assert watcher.stdout is not None
        key = unique("watched")
        seen: dict[str, list[str]] = {}

        def followed_through() -> bool:
            return any({"running", "succeeded"} <= set(statuses) for statuses in seen.values())

        # The stream may open after a submission: submit until one task is seen from running to done.
        deadline = time.monotonic() + 60
        attempt = 0
        while not followed_through() and time.monotonic() < deadline:
            attempt += 1
            cli.ok("submit", "watch me", "--key", f"{key}-{attempt}")
            while not followed_through() and select.select([watcher.stdout], [], [], 2.0)[0]:
                event = json.loads(watcher.stdout.readline())
                assert isinstance(event["id"], str) and isinstance(event["at_unix_ns"], str)
                if event.get("key", "").startswith(key):
                    seen.setdefault(event["key"], []).append(event["status"])
        assert followed_through(), seen
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(20) == Exit.OK
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait(5)


def test_credentials_and_roles(cli: Cli) -> None:
    bad, missing, wrong_role, not_metrics, no_flag = cli.many(
        ("tasks",),
        ("tasks",),
        ("submit", "x", "--pool", "idle"),
        ("snapshot",),
        ("--token", "abc", "tasks"),
        tokens=["not-a-known-token-0123456789", None, METRICS_TOKEN, CLIENT_TOKEN, ADMIN_TOKEN],
    )
    assert bad.returncode == Exit.DENIED and b"unauthenticated" in bad.stderr
    assert missing.returncode == Exit.DENIED
    assert wrong_role.returncode == Exit.DENIED
    assert not_metrics.returncode == Exit.DENIED and b"permission_denied" in not_metrics.stderr
    assert no_flag.returncode == Exit.USAGE and b"CRONOQ_TOKEN" in no_flag.stderr


def test_connection_errors(cli: Cli) -> None:
    down, tls_over_http, bad_scheme, remote, quiet = cli.many(
        ("get", "1", "--addr", "http://127.0.0.1:9"),  # nothing listens on the discard port
        ("tasks", "--ca", "/nonexistent/ca.pem"),
        ("tasks", "--addr", "ftp://example.com"),
        ("get", "1", "--addr", "http://0.0.0.0:9"),  # not loopback: a token in clear text is warned about
        ("get", "1", "--addr", "http://0.0.0.0:9"),
        tokens=[ADMIN_TOKEN, ADMIN_TOKEN, ADMIN_TOKEN, ADMIN_TOKEN, None],
    )
    assert down.returncode == Exit.UNAVAILABLE and b"unavailable" in down.stderr
    assert tls_over_http.returncode == Exit.USAGE and b"https://" in tls_over_http.stderr
    assert bad_scheme.returncode == Exit.USAGE
    assert b"clear text" in remote.stderr and remote.returncode == Exit.UNAVAILABLE
    assert b"clear text" not in quiet.stderr


def test_cluster_hands_its_arguments_to_the_launcher(cli: Cli) -> None:
    done = cli("cluster", "--help")
    try:
        import cronoq.cluster.launcher  # noqa: F401
    except ImportError:
        assert done.returncode == Exit.ERROR and b"launcher is not available" in done.stderr
    else:
        assert done.returncode == 0 and b"up" in done.stdout


def test_help_documents_every_exit_code(cli: Cli) -> None:
    codes = {code.value for code in Exit}
    assert len(codes) == len(Exit)  # one number per outcome
    for args in (("--help",), ("submit", "--help"), ("top", "--help")):
        shown = cli(*args, token=None)
        assert shown.returncode == Exit.OK, shown.stderr
        text = shown.stdout.decode()
        documented = {int(line.split()[0]) for line in text.split("exit codes:")[1].splitlines() if line.strip()}
        assert documented == codes, (args, text)
    assert cli(token=None).returncode == Exit.USAGE  # no command at all
