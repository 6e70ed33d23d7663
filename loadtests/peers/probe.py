"""What every system's task handler reports, the same way for all of them.

Worker side: a handler calls ``PROBE.started(stamp)`` when it begins and ``PROBE.finished()`` when
it is done. A daemon thread writes the counts as one JSON line to file descriptor 1 every
``FLUSH_S`` (a raw ``os.write`` of less than ``PIPE_BUF`` bytes, so lines of forked children that
share the pipe never interleave, and a library that replaces ``sys.stdout`` does not swallow
them). ``stamp`` is the submitter's ``time.time()`` when it sent the task, or 0 when the task is
not a latency sample; the probe keeps ``time.time() - stamp`` (same machine, same clock).

Driver side: ``ProbeReader`` reads those lines from the worker processes' stdout and sums them.

Counting in the handler instead of asking each library for its own completion counts costs every
system the same (an integer increment and a clock read per task) and needs no result backend.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections import deque

FLUSH_S = 0.02
MAX_SAMPLES_PER_LINE = 200  # ~9 bytes each: a line stays far below PIPE_BUF (4096)
PREFIX = '{"probe"'
# What each workload's task does besides reporting: await (or, where tasks are not coroutines,
# sleep) this many seconds.
TASK_SECONDS = {"noop": 0.0, "sleep10": 0.01}


class Probe:
    """Counts of one process; the reporter thread starts lazily so forked children get their own."""

    def __init__(self, report: bool = True) -> None:
        self._report = report
        self._pid = 0
        self.done = 0
        self.first = 0.0
        self.last = 0.0
        self._latencies: deque[float] = deque()
        self._reported = -1

    def _ensure_thread(self) -> None:
        pid = os.getpid()
        if pid != self._pid:  # first use in this process (or a fork of the process that used it)
            self._pid = pid
            self.done, self.first, self.last, self._reported = 0, 0.0, 0.0, -1
            self._latencies.clear()
            if self._report:
                threading.Thread(target=self._report_forever, name="probe", daemon=True).start()

    def started(self, stamp: float) -> None:
        if self._pid != os.getpid():
            self._ensure_thread()
        if stamp:
            self._latencies.append(time.time() - stamp)

    def finished(self) -> None:
        now = time.time()
        if not self.done:
            self.first = now
        self.done += 1
        self.last = now

    def take_latencies_ms(self) -> list[float]:
        """The samples not reported yet (for a probe that does not report: an in-process system)."""
        taken = [round(x * 1000, 3) for x in self._latencies]
        self._latencies.clear()
        return taken

    async def run(self, stamp: float, seconds: float) -> None:
        """The benchmark task: started, ``await asyncio.sleep(seconds)`` unless 0, finished."""
        self.started(stamp)
        if seconds:
            await asyncio.sleep(seconds)
        self.finished()

    def run_blocking(self, stamp: float, seconds: float) -> None:
        """The benchmark task for a system whose tasks are plain functions."""
        self.started(stamp)
        if seconds:
            time.sleep(seconds)
        self.finished()

    def _report_forever(self) -> None:
        while True:
            time.sleep(FLUSH_S)
            self.flush()

    def flush(self) -> None:
        if self.done == self._reported and not self._latencies:
            return
        samples: list[float] = []
        while self._latencies and len(samples) < MAX_SAMPLES_PER_LINE:
            samples.append(round(self._latencies.popleft() * 1000, 3))
        self._reported = self.done
        line = {"probe": self._pid, "done": self.done, "first": self.first, "last": self.last, "lat_ms": samples}
        os.write(1, (json.dumps(line, separators=(",", ":")) + "\n").encode())


PROBE = Probe()


class ProbeReader:
    """Sums the probe lines of worker processes (and their forked children) as they arrive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[int, int] = {}
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self.latencies_ms: list[float] = []
        self.other_lines: deque[str] = deque(maxlen=60)
        self.changed = threading.Event()

    def follow(self, proc: subprocess.Popen[str]) -> None:
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(PREFIX):
                report = json.loads(line)
                pid = report["probe"]
                with self._lock:
                    self._done[pid] = report["done"]
                    self._first[pid] = report["first"]
                    self._last[pid] = report["last"]
                    self.latencies_ms.extend(report["lat_ms"])
                self.changed.set()
            else:
                self.other_lines.append(line.rstrip("\n"))

    def done(self) -> int:
        with self._lock:
            return sum(self._done.values())

    def processes(self) -> int:
        """How many processes have run at least one task."""
        with self._lock:
            return sum(1 for n in self._done.values() if n)

    def span(self) -> tuple[float, float]:
        """(first, last) completion time (``time.time()``) over all processes."""
        with self._lock:
            firsts = [t for t in self._first.values() if t]
            return (min(firsts) if firsts else 0.0), max(self._last.values(), default=0.0)

    def take_latencies(self) -> list[float]:
        with self._lock:
            taken, self.latencies_ms = self.latencies_ms, []
            return taken
