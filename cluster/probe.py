"""Small probes the launcher needs: an HTTP status check and process identity from /proc.

The readiness check is a plain HTTP/1.1 GET over an asyncio stream (no client library), since
it runs every half second per replica and only needs the status code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

__all__ = ["http_status", "pid_alive", "process_start_ticks", "same_process"]


async def http_status(host: str, port: int, path: str, timeout: float = 1.0) -> int | None:
    """The status code of ``GET path``; ``None`` when nothing answered in time."""
    try:
        return await asyncio.wait_for(_get_status(host, port, path), timeout)
    except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
        return None


async def _get_status(host: str, port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.split()
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
        return int(parts[1])
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, from /proc); ``None`` when it does not exist.

    Together with the pid this names one process: a pid reused later has another start time."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # a zombie has exited; only its exit status is left
            return None
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return process_start_ticks(pid) is not None


def same_process(pid: int, start_ticks: int | None) -> bool:
    """Is ``pid`` still the process that was recorded with ``start_ticks``?"""
    if not pid_alive(pid):
        return False
    return start_ticks is None or process_start_ticks(pid) == start_ticks
