"""The Postgres side of the leader lease (``_lease.LeaseBackend`` for ``PostgresStore``).

Two things make a Postgres leader: the session-level advisory lock, held by a dedicated lock
session, and the lease row ``cronoq_lease`` (epoch, holder, the holder's session tag, expiry).
The lock alone cannot tell a dead leader from a frozen one: a process stopped by SIGSTOP (or a
frozen VM, a long pause) keeps its sessions, and the lock with them, because its kernel still
answers TCP keepalives. The lease can: it is renewed over the lock session every
``lease_renew`` and lasts ``lease_ttl``, both measured by the database's clock
(``clock_timestamp()``), so skew between the hosts does not matter.

A standby that finds the lock held and the lease expired ends every session of the stale holder:
its lock session and its pooled data connections, found by ``application_name``, which carries
the holder's tag (``cronoq-lock/<tag>``, ``cronoq/<tag>``). The expiry is checked in the same
statement that ends them, so a lease renewed or taken over in between is left alone, and another
holder's sessions (another tag) are never touched. The lock is then free; the standby takes it
and increments the epoch, which fences whatever the old leader still tries to write.

Between two looks at the lease a standby does not sleep: it waits in the lock's queue for up to
``lock_wait`` (``lock_timeout``), so the lock passes to it the moment a dead leader's session
ends, instead of at its next poll (half a poll later on average).

Ending sessions needs the right to signal them: the same role (all replicas normally connect as
one role), or membership in ``pg_signal_backend``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg

from ._pg_errors import PG_FAILURES, map_error

__all__ = ["LeaseSql", "PgLease"]

log = logging.getLogger("cronoq.stores.postgres")

_TERMINATE_WAITS_FROM = 14  # pg_terminate_backend(pid, timeout) exists from Postgres 14


class LeaseSql:
    """The statements of the lease, for one schema (``s`` quoted)."""

    def __init__(self, s: str) -> None:
        self.bump = (
            f"UPDATE {s}.cronoq_leader SET epoch = epoch + 1, holder = $1, acquired_at = now()"
            " WHERE id = 1 RETURNING epoch"
        )
        self.take = (
            f"INSERT INTO {s}.cronoq_lease AS l (id, epoch, holder, tag, expires_at)"
            " VALUES (1, $1, $2, $3, clock_timestamp() + make_interval(secs => $4))"
            " ON CONFLICT (id) DO UPDATE SET epoch = EXCLUDED.epoch, holder = EXCLUDED.holder,"
            " tag = EXCLUDED.tag, expires_at = EXCLUDED.expires_at"
        )
        self.renew = (
            f"UPDATE {s}.cronoq_lease SET expires_at = clock_timestamp() + make_interval(secs => $3)"
            " WHERE id = 1 AND epoch = $1 AND holder = $2 AND expires_at > clock_timestamp() RETURNING 1"
        )
        # Ends the sessions of an expired holder, the expiry checked by the same statement: the
        # tag, how many sessions were found, how many were ended.
        stale = (
            f"WITH stale AS (SELECT holder, tag FROM {s}.cronoq_lease"
            " WHERE id = 1 AND expires_at <= clock_timestamp()),"
            " victims AS (SELECT a.pid FROM pg_stat_activity a, stale WHERE a.pid <> pg_backend_pid()"
            " AND a.application_name IN ('cronoq/' || stale.tag, 'cronoq-lock/' || stale.tag))"
            " SELECT (SELECT holder FROM stale), (SELECT count(*) FROM victims),"
        )
        self.end_stale_waiting = stale + " (SELECT count(*) FROM victims WHERE pg_terminate_backend(pid, $1))"
        self.end_stale = stale + " (SELECT count(*) FROM victims WHERE pg_terminate_backend(pid))"


class PgLease:
    """Claims, renews and gives back the lease of one Postgres schema, and owns the lock session
    (see the module docstring). ``s`` is the quoted schema name, ``key`` the advisory lock key;
    ``session_timeout`` bounds each statement and derives the lock session's TCP keepalives."""

    def __init__(
        self,
        *,
        dsn: str,
        schema: str,
        s: str,
        key: int,
        holder: str,
        tag: str,
        lease_ttl: float,
        session_timeout: float,
        lock_wait: float = 0.0,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.key = key
        self.holder = holder
        self.tag = tag
        self.lease_ttl = lease_ttl
        self.session_timeout = session_timeout
        self.lock_wait = lock_wait
        self.sql = LeaseSql(s)
        self.conn: Any = None  # the lock session

    # -- the lock session ------------------------------------------------------------------------

    def settings(self) -> dict[str, str]:
        timeout = max(self.session_timeout, 1.0)
        return {
            "application_name": f"cronoq-lock/{self.tag}",
            "tcp_keepalives_idle": str(max(1, round(timeout / 2))),
            "tcp_keepalives_interval": str(max(1, round(timeout / 6))),
            "tcp_keepalives_count": "3",
            "tcp_user_timeout": str(round(timeout * 1000)),
        }

    @property
    def pid(self) -> int | None:
        """Server process id of the lock session."""
        conn = self.conn
        if conn is None or conn.is_closed():
            return None
        return int(conn.get_server_pid())

    async def session(self) -> Any:
        conn = self.conn
        if conn is None or conn.is_closed():
            conn = self.conn = await asyncpg.connect(
                self.dsn, timeout=self.session_timeout, server_settings=self.settings()
            )
        return conn

    def drop(self) -> None:
        """End the lock session at once, and with it the advisory lock (no I/O to wait for)."""
        conn, self.conn = self.conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    async def close(self) -> None:
        """Close the lock session politely (which frees the lock), or end it if that hangs."""
        conn, self.conn = self.conn, None
        if conn is not None and not conn.is_closed():
            try:
                await asyncio.wait_for(conn.close(), timeout=self.session_timeout)
            except (TimeoutError, *PG_FAILURES):
                conn.terminate()

    # -- LeaseBackend ----------------------------------------------------------------------------

    async def claim(self) -> int | None:
        try:
            conn = await self.session()
            got = await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key, timeout=self.session_timeout)
            if not got and await self._end_expired_holder(conn):
                got = await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key, timeout=self.session_timeout)
            if not got and self.lock_wait > 0:
                got = await self._wait_for_lock(conn)
            if not got:
                return None
            async with conn.transaction():
                epoch = await conn.fetchval(self.sql.bump, self.holder, timeout=self.session_timeout)
                await conn.execute(
                    self.sql.take, epoch, self.holder, self.tag, self.lease_ttl, timeout=self.session_timeout
                )
        except PG_FAILURES as exc:
            self.drop()
            raise map_error(exc, "leader election") from exc
        except BaseException:
            self.drop()
            raise
        return int(epoch)

    async def _wait_for_lock(self, conn: Any) -> bool:
        """Wait up to ``lock_wait`` in the lock's queue; True once the lock is this session's.

        A session-level advisory lock stays with the session after its transaction ends; the
        transaction only bounds the ``lock_timeout``, and the wait stays below the server's
        ``deadlock_timeout`` (1 s by default), so that a waiting standby costs no deadlock check.
        """
        wait_ms = max(1, round(self.lock_wait * 1000))
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {wait_ms}", timeout=self.session_timeout)
                await conn.execute(
                    "SELECT pg_advisory_lock($1)", self.key, timeout=self.session_timeout + self.lock_wait
                )
        except asyncpg.LockNotAvailableError:
            return False
        return True

    async def _end_expired_holder(self, conn: Any) -> bool:
        """End the sessions of a holder whose lease expired; True if any were ended."""
        wait_ms = round(min(self.session_timeout, 5.0) * 1000)
        if conn.get_server_version().major >= _TERMINATE_WAITS_FROM:
            row = await conn.fetchrow(self.sql.end_stale_waiting, wait_ms, timeout=self.session_timeout + 1)
        else:
            row = await conn.fetchrow(self.sql.end_stale, timeout=self.session_timeout)
        holder, found, ended = row[0], int(row[1]), int(row[2])
        if holder is None:
            return False
        if found == 0:
            log.debug("the lease of %s on schema %s expired, but none of its sessions is left", holder, self.schema)
            return False
        log.warning(
            "the lease of %s on schema %s expired while it held the leader lock (a frozen or paused process?);"
            " ended %d of its %d database sessions to take over",
            holder,
            self.schema,
            ended,
            found,
        )
        return ended > 0

    async def renew(self, epoch: int) -> bool:
        conn = self.conn
        try:
            if conn is None or conn.is_closed():
                conn = await self._reclaim()
                if conn is None:
                    return False
            renewed = await conn.fetchval(
                self.sql.renew, epoch, self.holder, self.lease_ttl, timeout=self.session_timeout
            )
        except PG_FAILURES as exc:
            if conn is not None and conn.is_closed():
                self.conn = None
            raise map_error(exc, "lease renewal") from exc
        return bool(renewed)

    async def _reclaim(self) -> Any:
        """A new lock session holding the lock again, or None when another session holds it.
        (The renewal that follows checks that the epoch and the lease are still ours: then
        nobody led in between, and a short outage cost no failover.)"""
        self.conn = None
        conn = await self.session()
        got = await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.key, timeout=self.session_timeout)
        if not got:
            self.drop()
            return None
        log.warning("postgres lock session of schema %s restored", self.schema)
        return conn

    async def release(self, epoch: int) -> None:
        """Closing the lock session (``close``, which the store calls) frees the lock; the row
        needs nothing."""

    def dropped(self, epoch: int) -> None:
        self.drop()
