"""The drill's own record of what happened, kept apart from the cluster's store.

One SQLite file per run, written by several processes at once (WAL; each write is its own short
transaction, so a process killed mid-run loses nothing it has written):

* ``submissions``: one row per task a producer meant to submit: its key, the id it got back, whether
  the submission was acknowledged, how many tries it took;
* ``client_errors``: every failed try of a producer (time and gRPC code), for the UNAVAILABLE window;
* ``executions``: one row per ``(task id, attempt)`` a worker started, with the lease's epoch, and
  when it finished. The primary key makes a second start of the same attempt fail at once; the
  worker then records it in ``repeats``;
* ``faults``: what the drill did and when; ``leadership``: which replica of each shard served, as
  the drill's monitor saw it; ``stored_tasks``: every task the cluster listed after the drain.

With all of it in one file, ``cronoq chaos check LEDGER`` judges a kept run again offline.

Times are wall-clock seconds (``time.time()``): every process runs on this machine, one clock.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["KEEPALIVE", "Ledger", "Submission", "epoch_of"]

KEEPALIVE = (
    ("grpc.keepalive_time_ms", 6000),
    ("grpc.keepalive_timeout_ms", 3000),
    ("grpc.http2.ping_timeout_ms", 3000),  # what grpcio 1.85 waits for a ping's answer (60 s unset)
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
"""Channel options of the drills' producers and workers: HTTP/2 pings find a server that is frozen
(its kernel still answers TCP) within about 9 s, and the channel reconnects (through the shard's
proxy, to the new leader). Without them a client stays with a frozen server until it wakes. The
servers accept a ping every 5 s (``grpc.http2.min_ping_interval_without_data_ms``)."""

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS submissions (
        producer TEXT NOT NULL,
        seq INTEGER NOT NULL,
        key TEXT NOT NULL,
        pool TEXT NOT NULL,
        parent_key TEXT,
        task_id INTEGER,
        acked INTEGER NOT NULL,
        duplicate INTEGER NOT NULL DEFAULT 0,
        tries INTEGER NOT NULL,
        sent_at REAL NOT NULL,
        acked_at REAL,
        error TEXT,
        PRIMARY KEY (producer, seq))""",
    "CREATE TABLE IF NOT EXISTS client_errors (producer TEXT NOT NULL, at REAL NOT NULL, code TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS executions (
        task_id INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        worker TEXT NOT NULL,
        lease INTEGER NOT NULL,
        epoch INTEGER NOT NULL,
        key TEXT NOT NULL,
        started_at REAL NOT NULL,
        finished_at REAL,
        outcome TEXT,
        PRIMARY KEY (task_id, attempt))""",
    """CREATE TABLE IF NOT EXISTS repeats (
        task_id INTEGER NOT NULL, attempt INTEGER NOT NULL, worker TEXT NOT NULL, lease INTEGER NOT NULL,
        epoch INTEGER NOT NULL, started_at REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS faults (
        seq INTEGER PRIMARY KEY, name TEXT NOT NULL, target TEXT NOT NULL, shard TEXT,
        started_at REAL NOT NULL, ended_at REAL, detail TEXT NOT NULL DEFAULT '')""",
    "CREATE TABLE IF NOT EXISTS leadership (shard TEXT NOT NULL, at REAL NOT NULL, leader TEXT)",
    # A pool move the drill asked for: when, and when the target was first seen owning the pool
    # at ``version`` (NULL: never); ``fault`` is what the drill broke meanwhile ('' for nothing).
    """CREATE TABLE IF NOT EXISTS moves (
        pool TEXT NOT NULL, version INTEGER NOT NULL, source TEXT NOT NULL, target TEXT NOT NULL,
        requested_at REAL NOT NULL, done_at REAL, fault TEXT NOT NULL DEFAULT '')""",
    """CREATE TABLE IF NOT EXISTS stored_tasks (
        id INTEGER PRIMARY KEY, key TEXT, status TEXT NOT NULL, attempt INTEGER NOT NULL,
        max_attempts INTEGER NOT NULL, submitted_at REAL NOT NULL, output BLOB)""",
)


def epoch_of(ident: int) -> int:
    """The leader epoch carried in a task or lease id (``engine/ids.py``: sharded ids keep the shard
    number in the top 8 bits and the epoch in the next 16; unsharded ones the epoch on top)."""
    if ident >> 56:
        return (ident >> 40) & 0xFFFF
    return (ident >> 48) & 0xFFFF


@dataclass(frozen=True, slots=True)
class Submission:
    producer: str
    seq: int
    key: str
    pool: str
    parent_key: str | None
    task_id: int | None
    acked: bool
    duplicate: bool
    tries: int
    sent_at: float
    acked_at: float | None
    error: str | None


class Ledger:
    """A connection to a run's ledger file; the first to open it creates the tables."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        # A killed process must not lose what it wrote; a power cut may (the file is throwaway).
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        for statement in _SCHEMA:
            self._conn.execute(statement)

    def close(self) -> None:
        self._conn.close()

    # ---------------------------------------------------------------------------------- writers

    def add_submissions(self, rows: Sequence[Submission]) -> None:
        if not rows:
            return
        with self._conn:
            self._conn.executemany(
                "INSERT OR REPLACE INTO submissions VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        r.producer,
                        r.seq,
                        r.key,
                        r.pool,
                        r.parent_key,
                        r.task_id,
                        int(r.acked),
                        int(r.duplicate),
                        r.tries,
                        r.sent_at,
                        r.acked_at,
                        r.error,
                    )
                    for r in rows
                ],
            )

    def add_client_errors(self, rows: Iterable[tuple[str, float, str]]) -> None:
        rows = list(rows)
        if rows:
            with self._conn:
                self._conn.executemany("INSERT INTO client_errors VALUES (?,?,?)", rows)

    def start_execution(self, task_id: int, attempt: int, worker: str, lease: int, key: str) -> bool:
        """Record the start of an attempt; False (and a row in ``repeats``) when it ran before."""
        now = time.time()
        try:
            self._conn.execute(
                "INSERT INTO executions (task_id, attempt, worker, lease, epoch, key, started_at)"
                " VALUES (?,?,?,?,?,?,?)",
                (task_id, attempt, worker, lease, epoch_of(lease), key, now),
            )
        except sqlite3.IntegrityError:
            self._conn.execute(
                "INSERT INTO repeats VALUES (?,?,?,?,?,?)", (task_id, attempt, worker, lease, epoch_of(lease), now)
            )
            return False
        return True

    def finish_execution(self, task_id: int, attempt: int, lease: int, outcome: str) -> None:
        self._conn.execute(
            "UPDATE executions SET finished_at = ?, outcome = ? WHERE task_id = ? AND attempt = ? AND lease = ?",
            (time.time(), outcome, task_id, attempt, lease),
        )

    def fault_started(self, name: str, target: str, shard: str | None, detail: str = "") -> int:
        cursor = self._conn.execute(
            "INSERT INTO faults (name, target, shard, started_at, detail) VALUES (?,?,?,?,?)",
            (name, target, shard, time.time(), detail),
        )
        return int(cursor.lastrowid or 0)

    def fault_ended(self, seq: int) -> None:
        self._conn.execute("UPDATE faults SET ended_at = ? WHERE seq = ?", (time.time(), seq))

    def add_leadership(self, rows: Iterable[tuple[str, float, str | None]]) -> None:
        rows = list(rows)
        if rows:
            with self._conn:
                self._conn.executemany("INSERT INTO leadership VALUES (?,?,?)", rows)

    def add_move(self, pool: str, version: int, source: str, target: str, requested_at: float,
                 done_at: float | None, fault: str) -> None:  # fmt: skip
        self._conn.execute(
            "INSERT INTO moves VALUES (?,?,?,?,?,?,?)", (pool, version, source, target, requested_at, done_at, fault)
        )

    def add_stored(self, rows: Iterable[tuple[int, str | None, str, int, int, float, bytes | None]]) -> None:
        with self._conn:
            self._conn.executemany("INSERT OR REPLACE INTO stored_tasks VALUES (?,?,?,?,?,?,?)", list(rows))

    # ---------------------------------------------------------------------------------- readers

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return list(self._conn.execute(sql, params))

    def acked_ids(self) -> set[int]:
        return {int(row[0]) for row in self._conn.execute("SELECT task_id FROM submissions WHERE acked = 1")}

    def finished_ids(self) -> set[int]:
        return {int(row[0]) for row in self._conn.execute("SELECT task_id FROM executions WHERE outcome = 'succeeded'")}
