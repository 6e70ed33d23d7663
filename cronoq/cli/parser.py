"""The ``cronoq`` command line: commands, flags and help text (argparse).

Connection and output options are accepted before or after the command name (``cronoq -o json
tasks`` and ``cronoq tasks -o json`` mean the same).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .connection import ADDR_ENV, DEFAULT_ADDR, TOKEN_ENV
from .exits import EXIT_CODES_HELP
from .spec import OVERLAPS, PRIORITIES

DESCRIPTION = f"""\
Talk to a running cronoq-server over gRPC: submit and follow tasks, list workers and schedules,
watch events, or open a live view with `cronoq top`.

The server address comes from --addr or {ADDR_ENV} (default {DEFAULT_ADDR}); the token only
from {TOKEN_ENV} (there is no --token flag: command lines are visible to other users). Task
commands need the client role, workers/schedules/snapshot the metrics role, schedule add and
schedule remove the admin role; an admin token works everywhere.
"""

DEFAULTS = {"addr": None, "output": "table", "ca": None, "cert": None, "key_file": None}


def _connection_options(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    # Sub-parsers use SUPPRESS so an option given before the command is not reset to its default.
    default = None if top_level else argparse.SUPPRESS
    group = parser.add_argument_group("connection and output")
    group.add_argument(
        "--addr",
        metavar="URL",
        default=default,
        help=f"server address, http://host:port or https://host:port (default: ${ADDR_ENV} or {DEFAULT_ADDR})",
    )
    group.add_argument(
        "-o",
        "--output",
        choices=("table", "json"),
        default="table" if top_level else default,
        help="table for people (default) or json shaped like the HTTP API",
    )
    group.add_argument(
        "--ca",
        type=Path,
        metavar="PEM",
        default=default,
        help="CA certificate to verify the server with (https only; default: system roots)",
    )
    group.add_argument(
        "--cert",
        type=Path,
        metavar="PEM",
        default=default,
        help="client certificate for mTLS (https only, with --key-file)",
    )
    group.add_argument(
        "--key-file",
        "--client-key",
        dest="key_file",
        type=Path,
        metavar="PEM",
        default=default,
        help="private key of the client certificate (https only)",
    )


def build() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cronoq",
        description=DESCRIPTION,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    _connection_options(parser, top_level=True)
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    _connection_options(common, top_level=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(
        name: str,
        help_text: str,
        parent: argparse._SubParsersAction | None = None,  # type: ignore[type-arg]
    ) -> argparse.ArgumentParser:
        return (parent or commands).add_parser(
            name,
            help=help_text,
            description=help_text,
            parents=[common],
            epilog=EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            allow_abbrev=False,
        )

    submit = command("submit", "submit a task; prints its id (with --wait: its output)")
    submit.add_argument("value", nargs="?", metavar="VALUE", help="the payload, sent as UTF-8 text (JSON with --json)")
    submit.add_argument("--json", action="store_true", help="the payload is JSON (checked before sending)")
    submit.add_argument("--file", metavar="PATH", help="send the bytes of PATH (- for standard input) as the payload")
    submit.add_argument("--content-type", help="content type the worker sees (default: by payload kind)")
    submit.add_argument("--pool", help="pool to run in (default: the server's default pool)")
    submit.add_argument("--priority", choices=PRIORITIES, help="priority class (default normal)")
    submit.add_argument("--kind", help="task kind, for duration learning and metrics")
    submit.add_argument("--key", help="idempotency key, also a name other tasks can depend on")
    submit.add_argument("--tenant", help="fair-share tenant")
    submit.add_argument("--label", action="append", metavar="K=V", help="required worker label (repeatable)")
    submit.add_argument("--tag", action="append", metavar="K=V", help="free-form tag passed to the worker (repeatable)")
    submit.add_argument("--deadline-in", metavar="DURATION", help="soft deadline from now (30, 1.5, 10m, ...)")
    submit.add_argument("--start-in", metavar="DURATION", help="fixed start from now, with reserved capacity")
    submit.add_argument("--timeout", metavar="DURATION", help="time limit of each attempt")
    submit.add_argument(
        "--after",
        action="append",
        metavar="TASK",
        help="run only after this task (an id or a key) succeeded (repeatable)",
    )
    submit.add_argument(
        "--wait", action="store_true", help="wait for the task and print its output (byte for byte when redirected)"
    )
    submit.add_argument(
        "--wait-timeout",
        metavar="DURATION",
        help="with --wait: give up after this long (exit 5; the task keeps running)",
    )

    get = command("get", "show a task's details")
    get.add_argument("id", nargs="?", metavar="ID")
    get.add_argument("--key", help="look the task up by its key instead of its id")

    wait = command("wait", "wait for a task and print its output (byte for byte when redirected)")
    wait.add_argument("id", nargs="?", metavar="ID")
    wait.add_argument("--key", help="name the task by its key instead of its id")
    wait.add_argument("--timeout", metavar="DURATION", help="give up after this long (exit 5); default: no limit")

    cancel = command("cancel", "cancel a task (succeeds also when it had already finished)")
    cancel.add_argument("id", nargs="?", metavar="ID")
    cancel.add_argument("--key", help="name the task by its key instead of its id")

    tasks = command("tasks", "list tasks in id order, oldest first")
    tasks.add_argument("--pool", action="append", metavar="POOL", help="only these pools (repeatable, or a,b)")
    tasks.add_argument("--status", action="append", metavar="STATUS", help="only these statuses (repeatable)")
    tasks.add_argument("--limit", type=int, metavar="N", help="tasks per page (the server caps it; default 100)")
    tasks.add_argument("--after", metavar="ID", help="start after this task id (the cursor a page ends with)")
    tasks.add_argument("--all", action="store_true", help="follow every page, not only the first")

    command("workers", "list connected workers")
    command("schedules", "list recurring schedules")

    schedule = commands.add_parser(
        "schedule", help="add or remove a recurring schedule (admin role)", allow_abbrev=False
    )
    schedule_commands = schedule.add_subparsers(dest="schedule_command", metavar="ACTION", required=True)
    add = command("add", "add or replace a cron schedule", schedule_commands)
    add.add_argument("name", metavar="NAME")
    add.add_argument("cron", metavar="CRON", help="six fields (seconds first) or five")
    add.add_argument("payload", metavar="PAYLOAD", help="payload of every occurrence (text, or JSON with --json)")
    add.add_argument("--json", action="store_true", help="the payload is JSON (checked before sending)")
    add.add_argument("--tz", help="IANA time zone of the cron expression (default UTC)")
    add.add_argument(
        "--overlap",
        choices=tuple(OVERLAPS),
        default="skip",
        help="when the previous occurrence still runs (default skip)",
    )
    add.add_argument("--pool", help="pool of the occurrences")
    add.add_argument("--kind", help="task kind of the occurrences")
    add.add_argument("--priority", choices=PRIORITIES, help="priority class of the occurrences")
    add.add_argument("--key", help="key prefix: each occurrence's key is KEY@<start time>")
    remove = command("remove", "remove a schedule (exit 3 if there is none of that name)", schedule_commands)
    remove.add_argument("name", metavar="NAME")

    command("snapshot", "pools, waits, utilization and totals")

    admin = commands.add_parser("admin", help="operate a sharded cluster", allow_abbrev=False)
    admin_commands = admin.add_subparsers(dest="admin_command", metavar="ACTION", required=True)
    command(
        "topology",
        "where each shard's durable record places every pool, at which version, and where "
        "shards or files disagree (metrics role)",
        admin_commands,
    )
    move = command(
        "move-pool",
        "move a pool to another shard while the cluster runs (admin role; --status: metrics role)",
        admin_commands,
    )
    move.add_argument("pool", metavar="POOL")
    what = move.add_mutually_exclusive_group(required=True)
    what.add_argument("--to", metavar="SHARD", help="the shard to move the pool to")
    what.add_argument("--status", action="store_true", help="where the pool is and its latest move")
    what.add_argument("--abort", action="store_true", help="abandon a move not carried out yet")
    move.add_argument("--wait", action="store_true", help="with --to: return once the target serves the pool")

    watch = command("watch", "print task events until Ctrl-C (terminal ones unless --all)")
    watch.add_argument("--pool", action="append", metavar="POOL", help="only these pools (repeatable, or a,b)")
    watch.add_argument("--all", action="store_true", help="every transition, not only how tasks ended")

    top = command("top", "full-screen live view of pools, workers, schedules, tasks and events (q quits)")
    top.add_argument("--interval", default="1", metavar="DURATION", help="refresh period (default 1 s)")
    top.add_argument("--tasks", type=int, default=200, metavar="N", help="live tasks to show (default 200)")
    top.add_argument(
        "--pool",
        action="append",
        metavar="POOL",
        help="limit the task and event panes to these pools (repeatable, or a,b)",
    )

    cluster = commands.add_parser("cluster", help="run a local multi-shard cluster (up, down, status)", add_help=False)
    cluster.add_argument("cluster_args", nargs=argparse.REMAINDER)

    chaos = commands.add_parser("chaos", help="failover drills against real clusters (list, run)", add_help=False)
    chaos.add_argument("chaos_args", nargs=argparse.REMAINDER)
    return parser
