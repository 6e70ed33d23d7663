"""``SqliteStore``: durable state in one SQLite file, with a lease row for leadership.

Threading: every database call runs on one dedicated thread that owns the only connection; the
asyncio side submits work to it and awaits the result. Calls are therefore serialised, which is
also what SQLite wants (one writer).

Leadership: row 1 of ``cronoq_leader`` holds the epoch, the holder's identity and the lease
expiry (wall-clock Unix nanoseconds, which processes on one host share). A free or expired lease
is taken in a ``BEGIN IMMEDIATE`` transaction that increments the epoch. The leader renews it every
``lease_renew``; standbys retry every ``lock_poll``; ``release_leadership`` frees it at once
(the loop, expiry and step-down are ``_lease.LeaseKeeper``'s, shared with Postgres). Every write
(commit, prune, quarantine) opens with ``BEGIN IMMEDIATE`` and checks epoch and holder before
writing, so a leader that was paused past its lease and replaced gets ``Fenced``; one whose lease
ran out on its own clock refuses to write before asking the database.

Files: the database file is created with mode 0600; SQLite gives its ``-wal`` and ``-shm``
journals the mode of the database file, and the store tightens them too when it created the file.
WAL journal mode; ``synchronous=FULL`` with ``full_sync`` (the default), else ``NORMAL``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from cronoq.engine.actions import Mutation, Recovered, RecoveredTask
from cronoq.engine.types import NS_PER_S
from cronoq.engine.views import TaskInfo, TaskQuery

from . import _row_decode as D
from . import _rows as R
from . import _schema as S
from . import history as H
from ._lease import LeaseKeeper
from ._prepared import PreparedSteps
from .base import (
    DEFAULT_CODEC,
    Codec,
    Corrupt,
    Fenced,
    SchemaTooNew,
    ShardMismatch,
    StoreError,
    Unavailable,
    check_seconds,
)

__all__ = ["SqliteStore", "apply_migrations"]

log = logging.getLogger("cronoq.stores.sqlite")

T = TypeVar("T")

_TASK_COLS = ", ".join(R.TASK_COLUMNS)
_READ_COLS = ", ".join(R.READ_COLUMNS)
_INSERT_TASK = (
    f"INSERT INTO cronoq_tasks ({_TASK_COLS}) VALUES ({', '.join('?' * len(R.TASK_COLUMNS))}) "
    "ON CONFLICT (id) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in R.TASK_COLUMNS if c != "id")
)
_UPDATE_STATUS = (
    "UPDATE cronoq_tasks SET status = ?2, attempt = ?3, message = ?4, "
    "started_at = COALESCE(?5, started_at), finished_at = ?6, retry_at = ?7, "
    "output = ?8, has_output = ?9 WHERE id = ?1"
)
_UPSERT_RECURRING = (
    f"INSERT INTO cronoq_recurring ({', '.join(R.RECURRING_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(R.RECURRING_COLUMNS))}) "
    "ON CONFLICT (name) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in R.RECURRING_COLUMNS if c != "name")
)

_HISTORY = H.SqlHistory(
    "cronoq_tasks",
    lambda n: f"?{n}",
    binary="",  # SQLite compares text byte by byte unless told otherwise
    starts_with=lambda column, prefix: f"substr({column}, 1, length({prefix})) = {prefix}",
)
_TRANSITIONS = (
    "SELECT status, attempt, message, started_at, finished_at, retry_at FROM cronoq_task_transitions"
    " WHERE task_id = ? ORDER BY seq"
)

_TRANSIENT = (
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_IOERR",
    "SQLITE_FULL",
    "SQLITE_INTERRUPT",
    "SQLITE_CANTOPEN",
    "SQLITE_PROTOCOL",
)


def _map_error(exc: sqlite3.Error, doing: str) -> StoreError:
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = f"sqlite {doing} failed: {exc}"
    if name.startswith(_TRANSIENT) or (not name and isinstance(exc, sqlite3.OperationalError)):
        return Unavailable(text)
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")):
        return Corrupt(text)
    return StoreError(text)


def _table_exists(conn: sqlite3.Connection, name: str) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    return row is not None


def apply_migrations(conn: sqlite3.Connection, *, target: int | None = None) -> int:
    """Bring the file up to ``target`` (default: the latest version); return the version reached.

    Runs in one ``BEGIN IMMEDIATE`` transaction, so concurrent openers migrate one at a time.
    Raises ``SchemaTooNew`` for a file written by a newer build.
    """
    goal = S.LATEST if target is None else target
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(S.SQLITE_VERSION_TABLE_DDL)
        current = conn.execute("SELECT coalesce(max(version), 0) FROM cronoq_schema_version").fetchone()[0]
        if current > S.LATEST:
            raise SchemaTooNew(
                f"the database is at schema version {current}, this build knows up to {S.LATEST}; upgrade cronoq"
            )
        for version in range(current + 1, goal + 1):
            migration = S.SQLITE_MIGRATIONS[version - 1]
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO cronoq_schema_version (version, description, applied_at) VALUES (?, ?, ?)",
                (version, migration.description, time.time_ns()),
            )
            log.info("sqlite schema migrated to version %d (%s)", version, migration.description)
        conn.execute("COMMIT")
        return int(max(current, goal))
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _check_shard(conn: sqlite3.Connection, shard: str | None) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT shard FROM cronoq_shard WHERE id = 1").fetchone()
        if row is None:
            conn.execute("INSERT INTO cronoq_shard (id, shard) VALUES (1, ?)", (shard,))
        elif row[0] != shard:
            used = conn.execute(
                "SELECT (SELECT id_high_water FROM cronoq_meta WHERE id = 1) IS NOT NULL"
                " OR EXISTS (SELECT 1 FROM cronoq_tasks) OR EXISTS (SELECT 1 FROM cronoq_recurring)"
            ).fetchone()[0]
            if used:
                raise ShardMismatch(S.shard_conflict(row[0], shard))
            conn.execute("UPDATE cronoq_shard SET shard = ? WHERE id = 1", (shard,))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _create_private(path: Path) -> bool:
    """Create the database file owner-only if it does not exist; True when this call created it."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, 0o600)  # whatever the umask was
    finally:
        os.close(fd)
    return True


class SqliteStore:
    """Durable store in one SQLite file (see the module docstring).

    Durations are float seconds. ``busy_timeout`` is how long a call waits for another process's
    write lock before failing with ``Unavailable``; ``commit_timeout`` bounds a whole commit.
    ``retention`` is the default window of ``recover``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lease_ttl: float = 10.0,
        lease_renew: float = 2.0,
        lock_poll: float = 0.5,
        retention: float = 3600.0,
        full_sync: bool = True,
        busy_timeout: float = 5.0,
        commit_timeout: float = 30.0,
        shard: str | None = None,
        codec: Codec | None = None,
    ) -> None:
        check_seconds("commit_timeout", commit_timeout)
        check_seconds("busy_timeout", busy_timeout, positive=False)
        check_seconds("retention", retention, positive=False)
        if shard is not None:
            R.check_text(shard, "shard name")
        self.path = Path(path)
        self.lease_ttl = lease_ttl
        self.lease_renew = lease_renew
        self.lock_poll = lock_poll
        self.retention = round(retention * NS_PER_S)
        self.full_sync = full_sync
        self.busy_timeout = busy_timeout
        self.commit_timeout = commit_timeout
        self.shard = shard
        self.codec: Codec = codec if codec is not None else DEFAULT_CODEC
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"

        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cronoq-sqlite")
        self._conn: sqlite3.Connection | None = None  # touched only on the executor thread
        self._inflight: object | None = None  # the commit the thread is running, for interrupts
        self._abandoned: object | None = None  # a commit whose caller gave up waiting
        self._inflight_lock = threading.Lock()
        self._open_lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()
        # Steps folded ahead by ``prepare``, oldest first, with the mutation list they came from.
        self._prepared: PreparedSteps[R.Batch] = PreparedSteps(lambda mutations: R.fold(mutations, self.codec))
        self._opened = False
        self._closed = False
        self._lease = LeaseKeeper(
            _SqliteLease(self),
            lease_ttl=lease_ttl,
            lease_renew=lease_renew,
            lock_poll=lock_poll,
            what=f"sqlite file {self.path}",
            log=log,
        )
        self.lost = self._lease.lost

    # -- plumbing ------------------------------------------------------------------------------

    async def _call(self, doing: str, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreError("the store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except sqlite3.Error as exc:
            raise _map_error(exc, doing) from exc
        except OSError as exc:  # creating the file: missing directory, permissions
            raise StoreError(f"sqlite {doing} failed: {exc}") from exc

    def _db(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            raise StoreError("the store is not open")
        return conn

    @property
    def epoch(self) -> int | None:
        return self._lease.epoch

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        if self._opened:
            return
        async with self._open_lock:
            if self._opened:
                return
            await self._call("open", self._open_sync)
            self._opened = True

    def _open_sync(self) -> None:
        created = _create_private(self.path)
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=True)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot use the WAL journal (got {mode!r})")
            conn.execute(f"PRAGMA synchronous = {'FULL' if self.full_sync else 'NORMAL'}")
            apply_migrations(conn)
            _check_shard(conn, self.shard)
        except BaseException:
            conn.close()
            raise
        if created:
            for suffix in ("-wal", "-shm"):
                journal = Path(f"{self.path}{suffix}")
                try:
                    if stat.S_IMODE(journal.stat().st_mode) & 0o077:
                        journal.chmod(0o600)
                except FileNotFoundError:
                    pass
        self._conn = conn

    async def close(self) -> None:
        if self._closed:
            return
        try:
            if self._opened:
                await self.release_leadership()
        except StoreError as exc:
            log.warning("releasing the lease on close failed: %s", exc)
        finally:
            if self._conn is not None:
                await asyncio.get_running_loop().run_in_executor(self._executor, self._close_sync)
            self._closed = True
            self._executor.shutdown(wait=False)

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def __aenter__(self) -> SqliteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- leadership ----------------------------------------------------------------------------

    async def acquire_leadership(self) -> int:
        await self.open()
        epoch = await self._lease.acquire()
        log.info("sqlite lease taken by %s with epoch %d", self.holder, epoch)
        return epoch

    def _take_sync(self) -> tuple[int, int] | None:
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            epoch, holder, expires = conn.execute(
                "SELECT epoch, holder, expires_at FROM cronoq_leader WHERE id = 1"
            ).fetchone()
            now = time.time_ns()
            if holder is not None and holder != self.holder and expires > now:
                conn.execute("ROLLBACK")
                return None
            epoch += 1
            until = now + round(self.lease_ttl * NS_PER_S)
            conn.execute(
                "UPDATE cronoq_leader SET epoch = ?, holder = ?, expires_at = ? WHERE id = 1",
                (epoch, self.holder, until),
            )
            conn.execute("COMMIT")
            return epoch, until
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _renew_sync(self, epoch: int, until: int) -> bool:
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            cur = conn.execute(
                "UPDATE cronoq_leader SET expires_at = ? WHERE id = 1 AND epoch = ? AND holder = ?",
                (until, epoch, self.holder),
            )
            conn.execute("COMMIT")
            return cur.rowcount == 1
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _lose(self, epoch: int, why: str) -> None:
        self._lease.lose(epoch, why)

    async def release_leadership(self) -> None:
        self._prepared.clear()
        epoch = await self._lease.release()
        if epoch is not None:
            log.info("sqlite lease released (epoch %d)", epoch)

    def _release_sync(self, epoch: int) -> None:
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "UPDATE cronoq_leader SET holder = NULL, expires_at = 0 WHERE id = 1 AND epoch = ? AND holder = ?",
                (epoch, self.holder),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _check_holder(self, conn: sqlite3.Connection, epoch: int) -> None:
        """Inside a write transaction: raise ``Fenced`` unless the lease row still names this
        holder with ``epoch`` (a leader paused past its lease and replaced gets here)."""
        current, holder = conn.execute("SELECT epoch, holder FROM cronoq_leader WHERE id = 1").fetchone()
        if current != epoch or holder != self.holder:
            raise Fenced(f"epoch {epoch} is stale: the lease is at epoch {current}, held by {holder}")

    # -- writes --------------------------------------------------------------------------------

    def prepare(self, mutations: Sequence[Mutation]) -> None:
        """Fold a step now, for its ``commit`` to use (see ``Store``): the driver calls this while
        the previous commit runs on the database thread, so that this one gets there sooner.
        Writes nothing; what cannot be stored is left for ``commit`` to refuse."""
        self._prepared.add(mutations)

    async def commit(self, epoch: int, mutations: Sequence[Mutation]) -> None:
        await self.open()
        self._lease.check(epoch)
        batch = self._prepared.take(mutations)
        if batch is None:
            batch = R.fold(mutations, self.codec)
        token = object()
        async with self._commit_lock:
            try:
                async with asyncio.timeout(self.commit_timeout):
                    await self._call("commit", self._commit_sync, epoch, batch, token)
            except TimeoutError:
                self._interrupt(token)
                raise Unavailable(f"sqlite commit took longer than {self.commit_timeout} s") from None
            except Fenced as exc:
                self._lose(epoch, str(exc))
                raise

    def _interrupt(self, token: object) -> None:
        """Stop a commit whose caller timed out: a running statement is interrupted, and a commit
        still waiting for the write lock rolls back once it gets it (SQLite's busy wait cannot be
        interrupted). One that already reached COMMIT stays committed: the outcome of an
        Unavailable commit is unknown, and a retry rewrites the same rows."""
        with self._inflight_lock:
            self._abandoned = token
            if self._inflight is token and self._conn is not None:
                self._conn.interrupt()

    def _check_abandoned(self, token: object) -> None:
        with self._inflight_lock:
            if self._abandoned is token:
                raise Unavailable("sqlite commit abandoned after its timeout")

    def _commit_sync(self, epoch: int, batch: R.Batch, token: object) -> None:
        with self._inflight_lock:
            self._inflight = token
        conn = self._db()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                self._check_abandoned(token)
                self._check_holder(conn, epoch)
                if batch.tasks:
                    conn.executemany(_INSERT_TASK, batch.tasks)
                if batch.statuses:
                    conn.executemany(_UPDATE_STATUS, batch.statuses)
                if batch.recurring:
                    conn.executemany(_UPSERT_RECURRING, batch.recurring)
                if batch.deleted:
                    conn.executemany("DELETE FROM cronoq_recurring WHERE name = ?", [(n,) for n in batch.deleted])
                if batch.max_id is not None:
                    conn.execute(
                        "UPDATE cronoq_meta SET id_high_water = ?1 WHERE id = 1"
                        " AND (id_high_water IS NULL OR id_high_water < ?1)",
                        (batch.max_id,),
                    )
                self._check_abandoned(token)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        finally:
            with self._inflight_lock:
                self._inflight = None

    async def prune(self, before: int) -> int:
        """Delete finished rows older than ``before``. Only the leader prunes (``Fenced``
        otherwise), checked in the same transaction as the delete."""
        await self.open()
        epoch = self._lease.epoch
        if epoch is None:
            raise Fenced("only the leader prunes")
        self._lease.check(epoch)
        try:
            return await self._call("prune", self._prune_sync, epoch, before)
        except Fenced as exc:
            self._lose(epoch, str(exc))
            raise

    def _prune_sync(self, epoch: int, before: int) -> int:
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._check_holder(conn, epoch)
            cur = conn.execute("DELETE FROM cronoq_tasks WHERE finished_at IS NOT NULL AND finished_at < ?", (before,))
            conn.execute("COMMIT")
            return cur.rowcount
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # -- reads ---------------------------------------------------------------------------------

    async def recover(self, now: int, retention: int | None = None) -> Recovered:
        await self.open()
        cutoff = now - (self.retention if retention is None else retention)
        rec = D.Recovery(self.codec, now)
        with D.gc_paused():
            rows, rec_rows, high = await self._call("recovery", self._recover_sync, cutoff)
            # In a thread: decoding a large backlog takes seconds, during which the event loop
            # must go on renewing the lease.
            await asyncio.to_thread(rec.add_rows, rows)
            del rows
        ids, keys = rec.missing_parents()
        if ids or keys:
            parents = await self._call("recovery", self._parents_sync, ids, keys)
            rec.add_parents(parents, ids, keys)
        if rec.quarantined:
            for db_id, message in rec.quarantined:
                log.error("task %d quarantined: %s", R.from_db_id(db_id), message)
            # A leader's mark is fenced like its commits; a store that does not lead (a reader)
            # marks the rows unconditionally, as the marks only repeat what any reader concludes.
            epoch = self._lease.epoch
            if epoch is not None:
                self._lease.check(epoch)
            try:
                await self._call("quarantine", self._quarantine_sync, epoch, rec.quarantined, now)
            except Fenced as exc:
                if epoch is not None:
                    self._lose(epoch, str(exc))
                raise
        result = Recovered(tasks=rec.ordered(), quarantined=len(rec.quarantined))
        D.add_recurring(result, rec_rows, self.codec)
        high_id = R.from_db_id(high) if high is not None else 0
        result.id_high_water = max([high_id, *(t.record.id for t in result.tasks)])
        return result

    def _recover_sync(self, cutoff: int) -> tuple[list[Any], list[Any], int | None]:
        conn = self._db()
        conn.execute("BEGIN")  # one consistent snapshot for the three reads
        try:
            rows = conn.execute(
                f"SELECT {_READ_COLS} FROM cronoq_tasks WHERE finished_at IS NULL OR finished_at >= ? ORDER BY id",
                (cutoff,),
            ).fetchall()
            rec_rows = conn.execute(
                f"SELECT {', '.join(R.RECURRING_COLUMNS)} FROM cronoq_recurring ORDER BY name"
            ).fetchall()
            high = conn.execute("SELECT id_high_water FROM cronoq_meta WHERE id = 1").fetchone()[0]
        finally:
            conn.execute("COMMIT")
        return rows, rec_rows, high

    def _parents_sync(self, ids: list[int], keys: list[str]) -> list[Any]:
        return (
            self._db()
            .execute(
                f"SELECT {_READ_COLS} FROM cronoq_tasks"
                " WHERE id IN (SELECT value FROM json_each(?)) OR key IN (SELECT value FROM json_each(?))",
                (json.dumps(ids), json.dumps(keys)),
            )
            .fetchall()
        )

    def _quarantine_sync(self, epoch: int | None, bad: list[tuple[int, str]], now: int) -> None:
        conn = self._db()
        conn.execute("BEGIN IMMEDIATE")
        try:
            if epoch is not None:
                self._check_holder(conn, epoch)
            conn.executemany(
                "UPDATE cronoq_tasks SET status = 'dead_lettered', message = ?, retry_at = NULL,"
                " finished_at = CASE WHEN typeof(finished_at) = 'integer' THEN finished_at ELSE ? END WHERE id = ?",
                [(message, now, db_id) for db_id, message in bad],
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # -- history (see history.py) ------------------------------------------------------------

    async def _rows(self, doing: str, sql: str, args: Sequence[Any]) -> list[Any]:
        await self.open()
        return await self._call(doing, lambda: self._db().execute(sql, args).fetchall())

    async def history(self, query: TaskQuery, after: int, limit: int, descending: bool = False) -> list[TaskInfo]:
        async def run(sql: str, args: list[Any]) -> list[Any]:
            return await self._rows("history read", sql, args)

        return await H.read_page(run, _HISTORY, self.codec, query, after, limit, descending, time.time_ns())

    async def history_task(self, task_id: int) -> RecoveredTask | None:
        rows = await self._rows("history read", _HISTORY.one(), (R.to_db_id(task_id),))
        return H.decode_row(rows[0], self.codec, time.time_ns()) if rows else None

    async def transitions(self, task_id: int) -> list[H.Transition]:
        rows = await self._rows("transitions read", _TRANSITIONS, (R.to_db_id(task_id),))
        found = (H.transition_of(*row) for row in rows)
        return [transition for transition in found if transition is not None]

    async def load_output(self, task_id: int) -> tuple[bool, object]:
        await self.open()
        row = await self._call(
            "output lookup",
            lambda: (
                self._db()
                .execute("SELECT has_output, output FROM cronoq_tasks WHERE id = ?", (R.to_db_id(task_id),))
                .fetchone()
            ),
        )
        if row is None or not row[0]:
            return False, None
        return True, D.decode_output(self.codec, row[1])


class _SqliteLease:
    """The lease row of a SQLite file (``LeaseBackend``): claimed and renewed on the store's
    database thread, expiry in wall-clock nanoseconds (processes on one host share the clock)."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store

    async def claim(self) -> int | None:
        taken = await self.store._call("lease acquisition", self.store._take_sync)
        return None if taken is None else taken[0]

    async def renew(self, epoch: int) -> bool:
        until = time.time_ns() + round(self.store.lease_ttl * NS_PER_S)
        return await self.store._call("lease renewal", self.store._renew_sync, epoch, until)

    async def release(self, epoch: int) -> None:
        if self.store._conn is not None:
            await self.store._call("lease release", self.store._release_sync, epoch)

    def dropped(self, epoch: int) -> None:
        """Nothing holds a SQLite lease but the row, which the next holder overwrites."""
