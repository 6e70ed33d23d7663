"""``cronoq top``: a full-screen live view that refreshes every ``--interval``.

The main thread reads keys (the terminal in cbreak mode: one key at a time, no echo, Ctrl-C
still works) and redraws when the feed has news or once a second for the clocks; two feed
threads do the network calls, so a slow server never freezes the keyboard.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections.abc import Iterator

from rich.console import Console
from rich.layout import Layout
from rich.live import Live

from .. import spec
from ..commands import pool_names
from ..connection import Connection
from ..exits import CliError, Exit
from ..text import Out
from .feed import Feed
from .view import screen

KEY_POLL_S = 0.1
REDRAW_EVERY_S = 1.0


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Single keys without Enter and without echo; the terminal's settings come back afterwards."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def read_key(fd: int, timeout: float) -> str:
    """The characters typed within ``timeout`` seconds ('' when none)."""
    ready, _, _ = select.select([fd], [], [], timeout)
    if not ready:
        return ""
    data = os.read(fd, 64)
    if not data:
        raise EOFError
    return data.decode("utf-8", errors="replace")


def run_top(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    interval = spec.seconds(args.interval, "--interval")
    if interval < 0.1:
        raise spec.usage("--interval must be at least 0.1 s")
    if args.tasks < 1:
        raise spec.usage("--tasks must be at least 1")
    if not (sys.stdin.isatty() and out.stdout_tty):
        raise CliError(Exit.USAGE, "cronoq top needs a terminal (use snapshot, tasks or watch in scripts)")
    pools = pool_names(args.pool)
    feed = Feed(conn, pools=pools, task_limit=args.tasks, interval=interval)
    console = Console(highlight=False)
    fd = sys.stdin.fileno()

    def draw() -> Layout:
        return screen(
            feed.view(), address=conn.settings.target.url, interval=interval, pools=pools, task_limit=args.tasks
        )

    feed.start()
    try:
        with cbreak(fd), Live(draw(), console=console, screen=True, auto_refresh=False) as live:
            shown, drawn_at = -1, 0.0
            while True:
                keys = read_key(fd, KEY_POLL_S)
                if "q" in keys or "Q" in keys:
                    break
                if "r" in keys or "R" in keys:
                    feed.refresh()
                if feed.version != shown or time.monotonic() - drawn_at >= REDRAW_EVERY_S:
                    shown, drawn_at = feed.version, time.monotonic()
                    live.update(draw(), refresh=True)
    except (KeyboardInterrupt, EOFError):
        pass  # Ctrl-C or a closed terminal ends the view like q does
    finally:
        feed.stop()
    return Exit.OK
