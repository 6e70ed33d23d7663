"""``PostgresStore``: durable state in one Postgres schema, on asyncpg.

Leadership: a session-level advisory lock on a dedicated connection (the lock session), waited
for in turns of ``lock_poll`` (so a dead leader's lock passes on at once), plus a lease row
(``cronoq_lease``) that the leader renews over that session every ``lease_renew`` and that lasts
``lease_ttl`` by the database's clock (see ``_pg_lease``; the loop, expiry and step-down are
``_lease.LeaseKeeper``'s, shared with SQLite).
The lock key is derived from the schema name, so every instance configured with the same schema
competes for the same lock, and different schemas are independent clusters. On success the epoch
in ``cronoq_leader`` is incremented. A lock session that fails (a database restart, a broken
connection) is replaced: the leader takes the lock back on a new session if it is still free and
its lease is still its own, so a short outage costs no failover. Leadership is lost (``lost`` is
set) when the lease cannot be renewed before it runs out (on this process's clock, which errs on
the early side), when another instance holds the lock, or when the lease moved on. A standby
that finds the lock held but the lease expired (a frozen leader, whose sessions the kernel keeps
alive) ends the holder's sessions and takes over. The lock session also asks the server for TCP
keepalives derived from ``session_timeout``, so the server drops the session (and its lock) of a
leader that vanished.

Commits: a step travels as ONE SQL statement (one round trip, atomic on its own). Its first
common table expression locks the leader row ``FOR SHARE`` where the epoch still equals the
caller's; every write in the statement is guarded by that row's presence, and the statement
returns whether it was found. A stale epoch therefore writes nothing and raises ``Fenced``; a new
leader's epoch increment waits for an in-flight commit of the old one, so recovery sees it. Task
rows travel as one array of the table's own row type (binary, nothing for the server to parse),
status rows as one JSON text, schedule rows as arrays (``unnest``): one data-modifying expression
per kind of row, whatever the number of tasks. New task rows go in with
a plain INSERT; only a step committed again (a retry after an unknown outcome), whose tasks exist
already, takes a second statement that upserts them (see ``_CommitSql``).

Status changes of tasks stored by earlier steps are appended to the event log
``cronoq_task_events`` rather than applied to the task rows (see ``_pg_events``): the leader folds
the log into the rows in the background once ``compact_after`` events piled up, and before each
``prune``; recovery and ``load_output`` read the log on top of the rows.

Schema: every table lives in ``schema`` (created if missing). Migrations run on open inside one
transaction holding a transaction-level advisory lock; tables named ``cronoq_*`` in the schema
must belong to the connecting role.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg
from cronoq.engine.actions import Mutation, Recovered, RecoveredTask
from cronoq.engine.types import NS_PER_S
from cronoq.engine.views import TaskInfo, TaskQuery

from . import _pg_events as E
from . import _pg_recovery as P
from . import _row_decode as D
from . import _rows as R
from . import _schema as S
from . import history as H
from ._lease import LeaseKeeper
from ._pg_errors import PG_FAILURES as _PG_FAILURES
from ._pg_errors import map_error as _map_error
from ._pg_lease import PgLease
from ._prepared import PreparedSteps
from .base import (
    DEFAULT_CODEC,
    Codec,
    Fenced,
    SchemaTooNew,
    ShardMismatch,
    StoreError,
    Unavailable,
    check_seconds,
)

__all__ = ["PostgresStore", "apply_migrations", "lock_key", "quote_schema"]

log = logging.getLogger("cronoq.stores.postgres")

# A standby waits for the lock at most this long at a time: below Postgres's default
# deadlock_timeout (1 s), after which a waiting session would run a deadlock check.
_LOCK_WAIT_MAX = 0.9

_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_]{1,63}")

_STATUS_TYPES = E.EVENT_TYPES
_RECURRING_TYPES = ("text", "text", "text", "bytea", "bigint", "bigint", "boolean")
assert len(_RECURRING_TYPES) == len(R.RECURRING_COLUMNS)
assert len(_STATUS_TYPES) == len(R.STATUS_COLUMNS)


def quote_schema(schema: str) -> str:
    if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError(f"invalid schema name {schema!r}: use 1 to 63 letters, digits or underscores")
    return f'"{schema}"'


def lock_key(schema: str, purpose: str = "leader") -> int:
    """The advisory lock key (a signed 64-bit integer) of ``purpose`` for ``schema``."""
    digest = hashlib.sha256(f"cronoq/{purpose}/{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def _init_session(conn: Any) -> None:
    """Set up each pooled connection.

    asyncpg prepares each commit statement once, and after a few runs Postgres keeps one generic
    plan for it. A plan made while the task table was small scans the table sequentially, and goes
    on doing so as the table grows: a full scan per commit, each row checked against every id of
    the step. Every statement the store runs has a primary-key or index path, so sequential scans
    are ruled out for these sessions. Recovery too reads the table through its primary key: rows
    come in id order from the first one on, so they can be decoded while the rest are read, where
    a sequential scan would have to be sorted (on disk, for a large backlog) before the first row.
    (A plain SET rather than a startup parameter, which connection poolers such as PgBouncer
    refuse.)

    JIT compilation is switched off too: ruling out sequential scans gives any plan that still
    needs one a huge cost estimate, which would make the server compile it with LLVM, tens of
    milliseconds per statement, far more than a step's commit costs.
    """
    await conn.execute("SET enable_seqscan = off; SET jit = off")


async def _keep_session(conn: Any) -> None:
    """Pool reset hook. The store changes no session state on pooled connections after
    ``_init_session``, so the default reset query (an extra round trip after every commit, which
    would also undo ``_init_session``) is skipped; asyncpg still rolls back a transaction left
    open."""


async def _check_owners(conn: Any, schema: str) -> None:
    rows = await conn.fetch(
        """SELECT c.relname, pg_get_userbyid(c.relowner) AS owner
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = $1 AND c.relname LIKE 'cronoq\\_%'
             AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
             AND c.relowner <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
           ORDER BY c.relname""",
        schema,
    )
    if rows:
        found = ", ".join(f"{r['relname']} (owned by {r['owner']})" for r in rows)
        raise StoreError(
            f"schema {schema!r} holds cronoq tables that belong to another role: {found}; "
            "refusing to use them (connect as their owner or choose another schema)"
        )


async def apply_migrations(conn: Any, schema: str, *, target: int | None = None) -> int:
    """Create ``schema`` if needed and migrate it to ``target`` (default: latest).

    Runs in one transaction holding a transaction-level advisory lock, so instances starting
    together migrate one after the other. Returns the version reached.
    """
    s = quote_schema(schema)
    goal = S.LATEST if target is None else target
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(schema, "migrate"))
        if not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema):
            await conn.execute(f"CREATE SCHEMA {s}")
        await _check_owners(conn, schema)
        if await conn.fetchval("SELECT to_regclass($1)", f"{s}.cronoq_schema_version") is None:
            await conn.execute(S.PG_VERSION_TABLE_DDL.format(s=s))
        current = await conn.fetchval(f"SELECT coalesce(max(version), 0) FROM {s}.cronoq_schema_version")
        if current > S.LATEST:
            raise SchemaTooNew(
                f"schema {schema!r} is at version {current}, this build knows up to {S.LATEST}; upgrade cronoq"
            )
        for version in range(current + 1, goal + 1):
            migration = S.PG_MIGRATIONS[version - 1]
            for statement in migration.statements:
                await conn.execute(statement.format(s=s))
            await conn.execute(
                f"INSERT INTO {s}.cronoq_schema_version (version, description) VALUES ($1, $2)",
                version,
                migration.description,
            )
            log.info("postgres schema %s migrated to version %d (%s)", schema, version, migration.description)
        return int(max(current, goal))


async def _check_shard(conn: Any, schema: str, shard: str | None) -> None:
    s = quote_schema(schema)
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key(schema, "migrate"))
        row = await conn.fetchrow(f"SELECT shard FROM {s}.cronoq_shard WHERE id = 1")
        if row is None:
            await conn.execute(f"INSERT INTO {s}.cronoq_shard (id, shard) VALUES (1, $1)", shard)
        elif row["shard"] != shard:
            used = await conn.fetchval(
                f"SELECT (SELECT id_high_water FROM {s}.cronoq_meta WHERE id = 1) IS NOT NULL"
                f" OR EXISTS (SELECT 1 FROM {s}.cronoq_tasks) OR EXISTS (SELECT 1 FROM {s}.cronoq_recurring)"
            )
            if used:
                raise ShardMismatch(S.shard_conflict(row["shard"], shard))
            await conn.execute(f"UPDATE {s}.cronoq_shard SET shard = $1 WHERE id = 1", shard)


def fence_sql(s: str) -> str:
    """The leader row if epoch ``$1`` held by ``$2`` still leads, locked ``FOR SHARE``: a new
    leader's epoch increment waits for the transaction that read it, and then it finds nothing."""
    return f"SELECT epoch FROM {s}.cronoq_leader WHERE id = 1 AND epoch = $1 AND holder = $2 FOR SHARE"


_rows_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _rows_param(rows: list[list[Any]], blobs: tuple[int, ...]) -> str:
    """Rows as one compact JSON array of arrays, with the bytea columns ``blobs`` in hex.

    The rows are the commit's own (folded for this call), so they are edited in place.
    """
    for row in rows:
        for i in blobs:
            data = row[i]
            if data is not None:
                row[i] = data.hex()
    return _rows_json(rows)


_STATUS_BLOBS = tuple(i for i, t in enumerate(_STATUS_TYPES) if t == "bytea")
assert R.STATUS_COLUMNS[7] == "output" and _STATUS_BLOBS == (7,)


# A step ready to commit: its folded rows, the task rows as the parameter asyncpg takes (None
# without any) and the status rows as the JSON text of the event log (None without any).
_EncodedStep = tuple[R.Batch, list[tuple[Any, ...]] | None, str | None]


def _encode(mutations: Sequence[Mutation], codec: Codec) -> _EncodedStep:
    """Fold and encode a step (raises ValueError/TypeError for what cannot be stored)."""
    batch = R.fold(mutations, codec)
    # Tuples: asyncpg takes a list inside the array for another dimension, a tuple for a row.
    task_rows = list(map(tuple, batch.tasks)) if batch.tasks else None
    status_text = _rows_param(batch.statuses, _STATUS_BLOBS) if batch.statuses else None
    return batch, task_rows, status_text


class _CommitSql:
    """Builds the single statement of a commit; one text per combination of row kinds.

    Task rows, the bulk of every step with the status rows, travel as ONE array of the task
    table's row type (``cronoq_tasks[]``), which asyncpg encodes in binary, row by row in C, and
    the server reads without parsing anything: measured, about half the server's work per row of
    the earlier ``jsonb`` array of row arrays (parsed, then every field extracted and cast), for
    a quarter more on the client (asyncpg's checks of each row). One array per column would cost
    the client far more (asyncpg checks and encodes each element through Python). The row type
    follows the table, so a migration that adds a column to ``cronoq_tasks`` must add it to
    ``TASK_COLUMNS`` too (same order).
    Status rows travel as one compact JSON text (bytea in hex), appended to the event log (see
    ``_pg_events``) under the commit's ``seq`` as they are. The rarer schedule rows keep one
    array per column.

    Task rows are new in all but a repeated commit (a retry of a commit whose outcome was unknown),
    so they go in with a plain INSERT, cheaper for the server than an upsert's speculative
    insertion. ``build`` returns the shape of the statement; ``upsert_text(shape)`` is the same
    statement with ``ON CONFLICT (id) DO UPDATE`` for the task rows, taking the same arguments, for
    when the plain one hits a task that exists already.
    """

    def __init__(self, s: str) -> None:
        self.s = s
        self._cache: dict[tuple[bool, ...], str] = {}

    def upsert_text(self, shape: tuple[bool, ...]) -> str:
        return self._sql((*shape[:5], True))

    def _sql(self, shape: tuple[bool, ...]) -> str:
        sql = self._cache.get(shape)
        if sql is None:
            sql = self._cache[shape] = self._text(shape)
        return sql

    def build(self, epoch: int, holder: str, step: _EncodedStep, seq: int) -> tuple[str, list[Any], tuple[bool, ...]]:
        batch, task_rows, status_text = step
        shape = (
            task_rows is not None,
            status_text is not None,
            bool(batch.recurring),
            bool(batch.deleted),
            batch.max_id is not None,
            False,  # upsert task rows
        )
        args: list[Any] = [epoch, holder]
        if task_rows is not None:
            args.append(task_rows)
        if status_text is not None:
            args.append(seq)
            args.append(status_text)
        if batch.recurring:
            args.extend(list(col) for col in zip(*batch.recurring, strict=True))
        if batch.deleted:
            args.append(batch.deleted)
        if batch.max_id is not None:
            args.append(batch.max_id)
        return self._sql(shape), args, shape

    def _text(self, shape: tuple[bool, ...]) -> str:
        s = self.s
        has_tasks, has_statuses, has_recurring, has_deleted, has_high, upsert = shape
        n = 2  # $1 is the epoch, $2 the holder
        guard = "EXISTS (SELECT 1 FROM fence)"

        def params(types: Sequence[str]) -> str:
            nonlocal n
            out = ", ".join(f"${n + 1 + i}::{t}[]" for i, t in enumerate(types))
            n += len(types)
            return out

        parts = [f"fence AS ({fence_sql(s)})"]
        if has_tasks:
            n += 1
            sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in R.TASK_COLUMNS if c != "id")
            cols = ", ".join(R.TASK_COLUMNS)
            parts.append(
                f"ins AS (INSERT INTO {s}.cronoq_tasks ({cols})"
                f" SELECT {cols} FROM unnest(${n}::{s}.cronoq_tasks[])"
                f" WHERE {guard}{f' ON CONFLICT (id) DO UPDATE SET {sets}' if upsert else ''})"
            )
        if has_statuses:
            n += 2  # $n - 1 is the commit's seq
            # Appended as one row, not applied: the task rows are left alone (no join for the
            # planner to get wrong either) and the text is not even parsed; the store folds the
            # log into the task rows in bulk later.
            parts.append(
                f"ev AS (INSERT INTO {s}.cronoq_task_events (seq, statuses)"
                f" SELECT ${n - 1}::bigint, ${n}::text WHERE {guard})"
            )
        if has_recurring:
            sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in R.RECURRING_COLUMNS if c != "name")
            parts.append(
                f"rput AS (INSERT INTO {s}.cronoq_recurring ({', '.join(R.RECURRING_COLUMNS)})"
                f" SELECT * FROM unnest({params(_RECURRING_TYPES)}) WHERE {guard}"
                f" ON CONFLICT (name) DO UPDATE SET {sets})"
            )
        if has_deleted:
            n += 1
            parts.append(f"rdel AS (DELETE FROM {s}.cronoq_recurring WHERE name = ANY(${n}::text[]) AND {guard})")
        if has_high:
            n += 1
            parts.append(
                f"hw AS (UPDATE {s}.cronoq_meta SET id_high_water = ${n}::bigint WHERE id = 1"
                f" AND (id_high_water IS NULL OR id_high_water < ${n}::bigint) AND {guard})"
            )
        return "WITH " + ", ".join(parts) + " SELECT count(*) FROM fence"


class PostgresStore:
    """Durable store in one Postgres schema (see the module docstring).

    Durations are float seconds. ``max_connections`` sizes the pool used for commits and reads
    (the lock session is one more connection). ``retention`` is the default window of
    ``recover``. ``compact_after``: once commits appended this many status events, the leader
    folds the log into the task rows in the background (``prune`` folds whatever is left first).
    Leadership: standbys wait for the lock, looking at the lease every ``lock_poll``; the leader's
    lease lasts ``lease_ttl`` and is renewed every ``lease_renew`` (default: ``keepalive``, the
    older name of that interval), which must be shorter; ``session_timeout`` bounds each
    leadership statement and sets the lock session's TCP keepalives.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        lock_poll: float = 0.5,
        keepalive: float = 1.0,
        session_timeout: float = 10.0,
        lease_ttl: float = 8.0,
        lease_renew: float | None = None,
        commit_timeout: float = 30.0,
        retention: float = 3600.0,
        shard: str | None = None,
        codec: Codec | None = None,
        max_connections: int = 4,
        compact_after: int = 10_000,
    ) -> None:
        self._s = quote_schema(schema)
        for what, value in (("lock_poll", lock_poll), ("keepalive", keepalive), ("session_timeout", session_timeout),
                            ("commit_timeout", commit_timeout)):  # fmt: skip
            check_seconds(what, value)
        check_seconds("retention", retention, positive=False)
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if compact_after < 1:
            raise ValueError("compact_after must be at least 1")
        if shard is not None:
            R.check_text(shard, "shard name")
        self.dsn = dsn
        self.schema = schema
        self.lock_poll = lock_poll
        self.keepalive = keepalive
        self.session_timeout = session_timeout
        self.commit_timeout = commit_timeout
        self.retention = round(retention * NS_PER_S)
        self.shard = shard
        self.codec: Codec = codec if codec is not None else DEFAULT_CODEC
        self.max_connections = max_connections
        self.compact_after = compact_after
        # The tag names this instance's sessions (application_name), so that a standby can end
        # them all once this instance's lease expired (see ``_pg_lease``).
        self.tag = uuid.uuid4().hex[:16]
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{self.tag}"
        self.lease_ttl = lease_ttl
        self.lease_renew = keepalive if lease_renew is None else lease_renew
        self._pool_app = f"cronoq/{self.tag}"
        self._lock = PgLease(
            dsn=dsn,
            schema=schema,
            s=self._s,
            key=lock_key(schema),
            holder=self.holder,
            tag=self.tag,
            lease_ttl=lease_ttl,
            session_timeout=session_timeout,
            lock_wait=min(lock_poll, _LOCK_WAIT_MAX),
        )
        self._lease = LeaseKeeper(
            self._lock,
            lease_ttl=lease_ttl,
            lease_renew=self.lease_renew,
            lock_poll=lock_poll,
            what=f"postgres schema {schema}",
            log=log,
        )
        self.lost = self._lease.lost

        self._sql = _CommitSql(self._s)
        self._history = H.SqlHistory(
            f"{self._s}.cronoq_tasks",
            lambda n: f"${n}",
            binary=' COLLATE "C"',
            starts_with=lambda column, prefix: f"starts_with({column}, {prefix})",
            array=lambda placeholder, kind: f"{placeholder}::{kind}[]",
        )
        self._pool: Any = None
        self._open_lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()
        self._closed = False
        self._commits = 0  # commits under the current epoch: the low bits of their seq
        self._last_seq: int | None = None  # seq of the last commit that succeeded
        self._unfolded = 0  # events appended since the last compaction started
        # Wall time of the oldest event appended since then (0: unknown, as after a takeover).
        self._unfolded_since: int | None = None
        self._compactor: asyncio.Task[None] | None = None
        # Steps encoded ahead by ``prepare``, oldest first, with the mutation list they came from.
        self._prepared: PreparedSteps[_EncodedStep] = PreparedSteps(lambda mutations: _encode(mutations, self.codec))

    @property
    def epoch(self) -> int | None:
        return self._lease.epoch

    @property
    def lock_session_pid(self) -> int | None:
        """Server process id of the lock session (for operators and failover tests)."""
        return self._lock.pid

    # -- lifecycle -----------------------------------------------------------------------------

    async def open(self) -> None:
        if self._pool is not None:
            return
        if self._closed:
            raise StoreError("the store is closed")
        async with self._open_lock:
            if self._pool is not None:
                return
            try:
                pool = await asyncpg.create_pool(
                    self.dsn,
                    min_size=1,
                    max_size=self.max_connections,
                    timeout=self.session_timeout,
                    server_settings={"application_name": self._pool_app},
                    init=_init_session,
                    reset=_keep_session,
                )
            except _PG_FAILURES as exc:
                raise _map_error(exc, "connect") from exc
            try:
                async with pool.acquire() as conn:
                    version = await apply_migrations(conn, self.schema)
                    if version >= S.SHARD_TABLE_VERSION:
                        await _check_shard(conn, self.schema, self.shard)
            except BaseException as exc:
                await pool.close()
                if isinstance(exc, _PG_FAILURES):
                    raise _map_error(exc, "migration") from exc
                raise
            self._pool = pool

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.release_leadership()
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), timeout=self.session_timeout)
            except (TimeoutError, *_PG_FAILURES):
                pool.terminate()

    async def __aenter__(self) -> PostgresStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- leadership ----------------------------------------------------------------------------

    async def acquire_leadership(self) -> int:
        while True:
            try:
                await self.open()
                break
            except Unavailable as exc:
                log.warning("waiting for postgres schema %s: %s", self.schema, exc)
                await asyncio.sleep(self.lock_poll)
        epoch = await self._lease.acquire()
        self._commits = 0
        self._last_seq = None
        self._unfolded = 0
        self._unfolded_since = 0  # the log may hold events of earlier leaders
        log.info("postgres leadership of schema %s taken by %s with epoch %d", self.schema, self.holder, epoch)
        return epoch

    def _lose(self, epoch: int, why: str) -> None:
        self._lease.lose(epoch, why)

    async def release_leadership(self) -> None:
        self._prepared.clear()
        compactor, self._compactor = self._compactor, None
        if compactor is not None:
            compactor.cancel()  # its statement is atomic: cancelled, it folds nothing
            await asyncio.gather(compactor, return_exceptions=True)
        epoch = await self._lease.release()
        await self._lock.close()
        if epoch is not None:
            log.info("postgres leadership of schema %s released (epoch %d)", self.schema, epoch)

    # -- writes --------------------------------------------------------------------------------

    def prepare(self, mutations: Sequence[Mutation]) -> None:
        """Encode a step now, for its ``commit`` to use (see ``Store``): the driver calls this
        while the previous step's commit is in flight, when the process has nothing else to do,
        so that the commit of this one starts sooner. Writes nothing; what cannot be encoded is
        left for ``commit`` to refuse."""
        self._prepared.add(mutations)

    async def commit(self, epoch: int, mutations: Sequence[Mutation]) -> None:
        await self.open()
        self._lease.check(epoch)
        step = self._prepared.take(mutations)
        if step is None:
            step = _encode(mutations, self.codec)
        batch = step[0]
        loop = asyncio.get_running_loop()
        async with self._commit_lock:
            # Numbered under the lock, so that the log orders commits as they were applied.
            self._commits += 1
            seq = E.commit_seq(epoch, self._commits)
            sql, args, shape = self._sql.build(epoch, self.holder, step, seq)
            deadline = loop.time() + self.commit_timeout
            try:
                async with self._pool.acquire(timeout=self.commit_timeout) as conn:
                    try:
                        found = await conn.fetchval(sql, *args, timeout=max(deadline - loop.time(), 0.001))
                    except asyncpg.UniqueViolationError:
                        # A task of this step is stored already: the step is being committed again.
                        # Nothing was written; apply it with upserts, which leaves the same rows.
                        found = await conn.fetchval(
                            self._sql.upsert_text(shape), *args, timeout=max(deadline - loop.time(), 0.001)
                        )
            except TimeoutError:
                raise Unavailable(f"postgres commit took longer than {self.commit_timeout} s") from None
            except _PG_FAILURES as exc:
                raise _map_error(exc, "commit") from exc
            if found:
                self._last_seq = seq
        if not found:
            self._lose(epoch, "a commit found a newer epoch")
            raise Fenced(f"epoch {epoch} is stale: another instance leads schema {self.schema!r}")
        if batch.statuses:
            self._unfolded += len(batch.statuses)
            if self._unfolded_since is None:
                self._unfolded_since = time.time_ns()
            if self._unfolded >= self.compact_after and (self._compactor is None or self._compactor.done()):
                self._unfolded = 0
                self._unfolded_since = None
                self._compactor = asyncio.get_running_loop().create_task(
                    self._compact_in_background(epoch, seq), name=f"cronoq-pg-compact-{epoch}"
                )

    # -- the status event log --------------------------------------------------------------------

    async def _compact(self, epoch: int, upto: int) -> int:
        """Fold the events up to commit ``upto`` into the task rows; return how many there were.

        Hash and merge joins are ruled out for the statement: the events would otherwise be
        joined to the task table by reading all of it, where the primary key finds each task.
        """
        self._lease.check(epoch)
        async with self._pool.acquire(timeout=self.commit_timeout) as conn, conn.transaction():
            await conn.execute("SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off")
            row = await conn.fetchrow(E.compact_sql(self._s), epoch, upto, timeout=self.commit_timeout)
        if not row[0]:
            self._lose(epoch, "compacting the event log found a newer epoch")
            raise Fenced(f"epoch {epoch} is stale: another instance leads schema {self.schema!r}")
        return int(row[1])

    async def _compact_in_background(self, epoch: int, upto: int) -> None:
        try:
            folded = await self._compact(epoch, upto)
        except Fenced:
            return  # the next commit reports it
        except (TimeoutError, *_PG_FAILURES) as exc:
            # Nothing is lost: the events stay in the log, and the next compaction folds them.
            log.warning(
                "compacting the status event log of schema %s failed: %s: %s", self.schema, type(exc).__name__, exc
            )
            self._unfolded += self.compact_after // 2  # retry sooner than a full round later
            return
        log.debug("folded %d status events into the task rows of schema %s", folded, self.schema)

    async def compact(self) -> int:
        """Fold every event committed so far into the task rows now; return how many there were.

        Only the leader compacts (``Fenced`` otherwise). Waits for a compaction in progress first.
        """
        await self.open()
        epoch, upto = self._lease.epoch, self._last_seq
        if epoch is None:
            raise Fenced("only the leader compacts the event log")
        running = self._compactor
        if running is not None and not running.done():
            await asyncio.gather(running, return_exceptions=True)
        if upto is None:
            upto = E.commit_seq(epoch, 1) - 1  # events of earlier epochs only
        if upto == self._last_seq:
            self._unfolded_since = None
        try:
            return await self._compact(epoch, upto)
        except TimeoutError:
            raise Unavailable(f"postgres compaction took longer than {self.commit_timeout} s") from None
        except _PG_FAILURES as exc:
            raise _map_error(exc, "compaction") from exc

    async def prune(self, before: int) -> int:
        """Delete finished rows older than ``before``. Only the leader prunes (``Fenced``
        otherwise), fenced by its epoch in the same transaction as the delete."""
        await self.open()
        epoch = self._lease.epoch
        if epoch is None:
            raise Fenced("only the leader prunes")
        await self.compact()  # tasks finished only in the log become prunable
        self._lease.check(epoch)
        try:
            async with self._pool.acquire(timeout=self.commit_timeout) as conn, conn.transaction():
                held = await conn.fetchval(fence_sql(self._s), epoch, self.holder, timeout=self.commit_timeout)
                if held is None:
                    self._lose(epoch, "pruning found a newer epoch")
                    raise Fenced(f"epoch {epoch} is stale: another instance leads schema {self.schema!r}")
                status = await conn.execute(
                    f"DELETE FROM {self._s}.cronoq_tasks WHERE finished_at IS NOT NULL AND finished_at < $1",
                    before,
                    timeout=self.commit_timeout,
                )
        except TimeoutError:
            raise Unavailable(f"postgres prune took longer than {self.commit_timeout} s") from None
        except _PG_FAILURES as exc:
            raise _map_error(exc, "prune") from exc
        return int(status.split()[-1])

    # -- reads ---------------------------------------------------------------------------------

    async def recover(self, now: int, retention: int | None = None) -> Recovered:
        await self.open()
        cutoff = now - (self.retention if retention is None else retention)
        s = self._s
        rec = D.Recovery(self.codec, now)
        try:
            async with self._pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
                await P.read_tasks(conn, s, rec, cutoff)
                rec_rows = await conn.fetch(
                    f"SELECT {', '.join(R.RECURRING_COLUMNS)} FROM {s}.cronoq_recurring ORDER BY name"
                )
                high = await conn.fetchval(f"SELECT id_high_water FROM {s}.cronoq_meta WHERE id = 1")
            if rec.quarantined:
                for db_id, message in rec.quarantined:
                    log.error("task %d quarantined: %s", R.from_db_id(db_id), message)
                await self._quarantine(rec.quarantined, now)
        except _PG_FAILURES as exc:
            raise _map_error(exc, "recovery") from exc
        result = Recovered(tasks=rec.ordered(), quarantined=len(rec.quarantined))
        D.add_recurring(result, rec_rows, self.codec)
        high_id = R.from_db_id(high) if high is not None else 0
        result.id_high_water = max(high_id, result.tasks[-1].record.id) if result.tasks else high_id  # in id order
        return result

    async def _quarantine(self, bad: list[tuple[int, str]], now: int) -> None:
        """Mark corrupt rows dead-lettered. A leader's marks are fenced like its commits; a store
        that does not lead (a reader) marks them unconditionally, as they only repeat what any
        reader of those rows concludes."""
        s = self._s
        epoch = self._lease.epoch
        if epoch is not None:
            self._lease.check(epoch)
        async with self._pool.acquire(timeout=self.commit_timeout) as conn, conn.transaction():
            if epoch is not None and await conn.fetchval(fence_sql(s), epoch, self.holder) is None:
                self._lose(epoch, "marking corrupt rows found a newer epoch")
                raise Fenced(f"epoch {epoch} is stale: another instance leads schema {self.schema!r}")
            # Their statuses leave the log too: folded later, they would overwrite the quarantine.
            await conn.execute(
                f"WITH scrub AS ({E.scrub_sql(s)})"
                f" UPDATE {s}.cronoq_tasks t SET status = 'dead_lettered', message = q.message,"
                " retry_at = NULL, finished_at = COALESCE(t.finished_at, $3)"
                " FROM unnest($1::bigint[], $2::text[]) AS q(id, message) WHERE t.id = q.id",
                [q[0] for q in bad],
                [q[1] for q in bad],
                now,
            )

    # -- history (see history.py) ------------------------------------------------------------

    async def _fold_for_history(self) -> None:
        """History lists finished rows: a task that finished before the retention window must be
        in its row by then, not only in the log. The leader folds the log first when its oldest
        event may be that old (with the default hour of retention, background compaction has
        always done it)."""
        since = self._unfolded_since
        if self._lease.epoch is not None and since is not None and time.time_ns() - since >= self.retention:
            await self.compact()

    async def _fetch(self, doing: str, sql: str, *args: Any) -> list[Any]:
        await self.open()
        try:
            return list(await self._pool.fetch(sql, *args, timeout=self.commit_timeout))
        except TimeoutError:
            raise Unavailable(f"postgres {doing} took longer than {self.commit_timeout} s") from None
        except _PG_FAILURES as exc:
            raise _map_error(exc, doing) from exc

    async def history(self, query: TaskQuery, after: int, limit: int, descending: bool = False) -> list[TaskInfo]:
        await self.open()
        await self._fold_for_history()

        async def run(sql: str, args: list[Any]) -> list[Any]:
            return await self._fetch("history read", sql, *args)

        return await H.read_page(run, self._history, self.codec, query, after, limit, descending, time.time_ns())

    async def history_task(self, task_id: int) -> RecoveredTask | None:
        await self.open()
        await self._fold_for_history()
        rows = await self._fetch("history read", self._history.one(), R.to_db_id(task_id))
        return H.decode_row(rows[0], self.codec, time.time_ns()) if rows else None

    async def transitions(self, task_id: int) -> list[H.Transition]:
        rows = await self._fetch("transitions read", E.transitions_sql(self._s), R.to_db_id(task_id))
        found = (H.transition_of(*row[1:]) for row in rows)
        return [transition for transition in found if transition is not None]

    async def load_output(self, task_id: int) -> tuple[bool, object]:
        await self.open()
        try:
            row = await self._pool.fetchrow(E.output_sql(self._s), R.to_db_id(task_id))
        except _PG_FAILURES as exc:
            raise _map_error(exc, "output lookup") from exc
        if row is None or not row[0]:
            return False, None
        return True, D.decode_output(self.codec, row[1])
