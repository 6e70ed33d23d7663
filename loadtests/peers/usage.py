"""CPU seconds of each part of a system under test, read from /proc between two samples.

Parts: ``server`` (cronoq-server), ``workers`` (the worker processes and everything they forked),
``client`` (the driver process: the load generator, plus the whole application for an in-process
system), ``postgres`` (the backends connected to the case's own database, plus the shared WAL
writer, checkpointer and background writer of that Postgres instance, which other databases'
writes also wake) and ``redis`` (the local ``redis-server``, shared with anything else using it).
A process that exits between the samples takes its CPU with it (its parent is not sampled), so
short-lived connections are undercounted; the benchmark keeps its connections open.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server_bench import machine_ticks, process_cpu_s  # the shared /proc accounting

CLIENT_BACKEND = re.compile(r"^postgres: (?:\S+: )?\S+ (\S+) (?:\S+\(\d+\)|\[local\])")
SHARED_POSTGRES_WORK = ("walwriter", "checkpointer", "background writer")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                out[int(entry)] = int(fields[1])
    return out


def descendants(roots: list[int], parents: dict[int, int]) -> set[int]:
    """``roots`` and every process below them."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, stack = set(), list(roots)
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def postgres_processes(postmaster: int, database: str, parents: dict[int, int]) -> list[int]:
    """Backends of ``database`` under ``postmaster``, plus the instance's shared writers."""
    pids = []
    for pid, parent in parents.items():
        if parent != postmaster:
            continue
        title = _cmdline(pid)
        backend = CLIENT_BACKEND.match(title)
        if backend is not None:
            if backend.group(1) == database:
                pids.append(pid)
        elif any(word in title for word in SHARED_POSTGRES_WORK) or f"autovacuum worker {database}" in title:
            pids.append(pid)
    return pids


def redis_server_pid() -> int | None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == "redis-server":
                        return int(entry)
            except OSError:
                continue
    return None


@dataclass
class Parts:
    """Which processes make up each part of the system under test."""

    workers: list[int] = field(default_factory=list)
    server: int | None = None
    postmaster: int | None = None
    database: str = ""
    redis: bool = False


class Usage:
    """CPU of each part between ``start()`` and ``stop()``."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self.redis_pid = redis_server_pid() if parts.redis else None

    def _sample(self) -> dict[str, Any]:
        parents = _parents()
        own = resource.getrusage(resource.RUSAGE_SELF)
        sample: dict[str, Any] = {"client": own.ru_utime + own.ru_stime, "machine": machine_ticks()}
        if self.parts.workers:
            sample["workers"] = {pid: process_cpu_s(pid) for pid in descendants(self.parts.workers, parents)}
        if self.parts.server is not None:
            sample["server"] = {pid: process_cpu_s(pid) for pid in descendants([self.parts.server], parents)}
        if self.parts.postmaster is not None:
            pids = postgres_processes(self.parts.postmaster, self.parts.database, parents)
            sample["postgres"] = {pid: process_cpu_s(pid) for pid in pids}
        if self.redis_pid is not None:
            sample["redis"] = {self.redis_pid: process_cpu_s(self.redis_pid)}
        return sample

    def start(self) -> None:
        self.before = self._sample()

    def stop(self) -> dict[str, float]:
        """CPU seconds per part (``<part>_cpu_s``) and ``machine_busy_pct``."""
        after, before = self._sample(), self.before
        out = {"client_cpu_s": round(after["client"] - before["client"], 3)}
        for part in ("server", "workers", "postgres", "redis"):
            if part in after:
                # A process that started meanwhile counts from zero.
                spent = sum(cpu - before.get(part, {}).get(pid, 0.0) for pid, cpu in after[part].items())
                out[f"{part}_cpu_s"] = round(spent, 3)
        busy = after["machine"][0] - before["machine"][0]
        total = after["machine"][1] - before["machine"][1]
        out["machine_busy_pct"] = round(100.0 * busy / max(total, 1), 1)
        return out


def per_task(cpu: dict[str, float], tasks: int) -> dict[str, float]:
    """``<part>_cpu_us_per_task`` for each ``<part>_cpu_s``, and their sum as ``total_cpu_us_per_task``."""
    out = {}
    total = 0.0
    for name, seconds in cpu.items():
        if name.endswith("_cpu_s"):
            out[name.replace("_cpu_s", "_cpu_us_per_task")] = round(seconds / max(tasks, 1) * 1e6, 1)
            total += seconds
    out["total_cpu_us_per_task"] = round(total / max(tasks, 1) * 1e6, 1)
    return out
