"""``cronoq``: the command-line client of cronoq-server (console script ``cronoq = cronoq.cli:main``).

``main(argv)`` parses the arguments, connects over gRPC and runs one command, returning its exit
code (see ``cronoq --help`` and ``cronoq.cli.exits``). ``cronoq cluster ...`` hands its arguments to
the local cluster launcher, ``cronoq chaos ...`` to the failover drills, ``cronoq top`` opens the
live view.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .exits import CliError, Exit

__all__ = ["Exit", "main"]


def _cluster(args: Sequence[str]) -> int:
    try:
        from cronoq.cluster import launcher  # only this command needs it
    except ImportError as e:
        print(f"cronoq cluster: the cluster launcher is not available in this build ({e})", file=sys.stderr)
        return int(Exit.ERROR)
    try:
        return int(launcher.main(list(args)))
    except SystemExit as e:  # the launcher's own argparse (--help, bad usage)
        return e.code if isinstance(e.code, int) else int(Exit.USAGE)


def _chaos(args: Sequence[str]) -> int:
    try:
        from cronoq.chaos import cli  # only this command needs it
    except ImportError as e:
        print(f"cronoq chaos: the failover drills are not available in this build ({e})", file=sys.stderr)
        return int(Exit.ERROR)
    return int(cli.main(list(args)))


def _refuse_token_flag(argv: Sequence[str]) -> None:
    for arg in argv:
        if arg == "--":
            return
        if arg == "--token" or arg.startswith("--token="):
            raise CliError(
                Exit.USAGE,
                "there is no --token flag (a command line is visible to other users): set CRONOQ_TOKEN instead",
            )


def _run(args: argparse.Namespace) -> Exit:
    from . import commands  # keeps `cronoq --help` and `cronoq cluster` light
    from .connection import Connection, TlsFiles, resolve
    from .text import Out

    out = Out()
    settings = resolve(args.addr, TlsFiles(ca=args.ca, cert=args.cert, key=args.key_file))
    for warning in settings.warnings:
        out.warn(warning)
    with Connection(settings) as conn:
        if args.command == "top":
            from .top import run_top  # rich is only needed here

            return run_top(args, conn, out)
        if args.command == "admin":
            from . import admin

            return {"topology": admin.topology, "move-pool": admin.move_pool}[args.admin_command](args, conn, out)
        name = f"schedule {args.schedule_command}" if args.command == "schedule" else args.command
        return commands.COMMANDS[name](args, conn, out)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``cronoq`` command with ``argv`` (default: the process arguments); return the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["cluster"]:
        return _cluster(arguments[1:])
    if arguments[:1] == ["chaos"]:
        return _chaos(arguments[1:])
    from .parser import build

    try:
        _refuse_token_flag(arguments)
        parser = build()
        try:
            args = parser.parse_args(arguments)
        except SystemExit as e:  # argparse exits with 2 on bad usage and 0 for --help
            return int(e.code) if isinstance(e.code, int) else int(Exit.USAGE)
        if args.command == "cluster":
            return _cluster(args.cluster_args)
        if args.command == "chaos":
            return _chaos(args.chaos_args)
        return int(_run(args))
    except CliError as e:
        _report(f"cronoq: {e.message}")
        return int(e.code)
    except KeyboardInterrupt:
        print("cronoq: interrupted", file=sys.stderr)
        return int(Exit.INTERRUPTED)
    except BrokenPipeError:
        # The reader went away (`cronoq tasks | head`): point stdout at /dev/null so the final
        # flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return int(Exit.OK)


def _report(message: str) -> None:
    """An error for the person at the terminal; server text in it cannot drive the terminal."""
    from .text import escape_controls

    if sys.stderr.isatty():
        message = escape_controls(message, keep_lines=True)
    print(message, file=sys.stderr)
