"""On a terminal, text from other clients is shown with its control characters escaped; in a pipe
it is passed through unchanged."""

from __future__ import annotations

import uuid

from tests.cli.conftest import Cli, EchoWorker, cli_env
from tests.cli.screen import Screen
from tests.server.harness import ADMIN_TOKEN


def test_control_characters_are_escaped_on_a_terminal_only(cli: Cli, worker: EchoWorker) -> None:
    key = f"evil\x1b[2J-{uuid.uuid4().hex[:8]}"
    payload = "\x1b[31mred\x1b[0m\nsecond line\u202e"
    task_id = cli.ok("submit", payload, "--key", key).strip()
    assert cli("wait", task_id, "--timeout", "20").stdout == payload.encode()  # a pipe: unchanged
    assert key in cli.ok("get", task_id)

    env = cli_env(cli.address, ADMIN_TOKEN)
    waited = Screen(["wait", task_id], env)
    assert waited.finish() == 0
    assert "\\u{1b}[31mred\\u{1b}[0m" in waited.raw and "second line\\u{202e}" in waited.raw
    assert "\x1b" not in waited.raw and "\u202e" not in waited.raw

    shown = Screen(["get", task_id], env)
    assert shown.finish() == 0
    assert "evil\\u{1b}[2J-" in shown.raw and "\x1b" not in shown.raw

    listed = Screen(["tasks", "--pool", "default", "--all", "--status", "succeeded"], env)
    assert listed.finish() == 0
    assert "evil\\u{1b}[2J-" in listed.raw and "\x1b" not in listed.raw
