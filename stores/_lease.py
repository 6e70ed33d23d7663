"""``LeaseKeeper``: the leadership lifecycle both SQL stores share.

A store leads while it holds a lease in its database: a row naming the epoch, the holder and an
expiry. What differs between databases is how the lease is claimed, renewed and given back (the
SQL, and for Postgres the advisory-lock session beside the row); that lives behind
``LeaseBackend``. Everything else lives here, once:

* acquisition: ``claim`` every ``lock_poll`` (counted from the start of each attempt) until it
  returns an epoch;
* renewal: every ``lease_renew``, each attempt bounded by what is left of the lease;
* expiry, measured on this process's monotonic clock from the moment the claim or the last
  successful renewal was *sent*: the database computes its own expiry from a later instant, so
  this process always believes its lease ended no later than the database does;
* step-down: when a renewal finds the lease taken (``renew`` returns False), or when the lease
  ran out before it could be renewed. The latter also covers a process that was frozen (SIGSTOP,
  a stalled VM, a long pause): on waking, ``check`` refuses every write before the renewal loop
  even ran, so a woken leader writes nothing once its lease is over.

``lost`` is set when leadership ends without ``release`` being called, as ``Store`` requires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from .base import Fenced, StoreError, check_seconds

__all__ = ["LeaseBackend", "LeaseKeeper"]


class LeaseBackend(Protocol):
    """The database side of a lease (see the module docstring)."""

    async def claim(self) -> int | None:
        """Try once to take leadership: the new epoch, or None while another holder's lease is
        live. Raises ``StoreError`` (usually ``Unavailable``) when the attempt failed."""
        ...

    async def renew(self, epoch: int) -> bool:
        """Extend the lease of ``epoch`` by the ttl. False when it is no longer this holder's
        (taken over, or expired in the database); raises ``StoreError`` when the attempt failed
        and may be retried."""
        ...

    async def release(self, epoch: int) -> None:
        """Give the lease back so that a standby takes over at once."""
        ...

    def dropped(self, epoch: int) -> None:
        """Leadership of ``epoch`` was lost: free at once whatever still holds it (no I/O)."""
        ...


class LeaseKeeper:
    """Acquires, renews and loses one store's lease (see the module docstring).

    ``what`` names the store in log lines (``"sqlite file /x.db"``).
    """

    def __init__(
        self,
        backend: LeaseBackend,
        *,
        lease_ttl: float,
        lease_renew: float,
        lock_poll: float,
        what: str,
        log: logging.Logger,
    ) -> None:
        for name, value in (("lease_ttl", lease_ttl), ("lease_renew", lease_renew), ("lock_poll", lock_poll)):
            check_seconds(name, value)
        if not lease_renew < lease_ttl:
            raise ValueError(f"lease_renew ({lease_renew} s) must be shorter than lease_ttl ({lease_ttl} s)")
        self.backend = backend
        self.lease_ttl = lease_ttl
        self.lease_renew = lease_renew
        self.lock_poll = lock_poll
        self.what = what
        self.log = log
        self.lost = asyncio.Event()
        self._epoch: int | None = None
        self._deadline = 0.0  # monotonic instant at which the lease is over, for this process
        self._task: asyncio.Task[None] | None = None

    @property
    def epoch(self) -> int | None:
        return self._epoch

    @property
    def remaining(self) -> float:
        """Seconds of lease left (0 when not leading)."""
        if self._epoch is None:
            return 0.0
        return max(self._deadline - time.monotonic(), 0.0)

    async def acquire(self) -> int:
        """Wait until this store leads; return the new epoch."""
        if self._epoch is not None:
            raise StoreError("this store already leads; release leadership first")
        failures = 0
        while True:
            sent = time.monotonic()
            try:
                epoch = await self.backend.claim()
                failures = 0
            except StoreError as exc:
                failures += 1
                (self.log.warning if failures % 20 == 1 else self.log.debug)(
                    "waiting for the leadership of %s: %s", self.what, exc
                )
                epoch = None
            if epoch is not None:
                self._start(epoch, sent)
                return epoch
            # Every ``lock_poll`` from the start of the last attempt: a backend that waited for
            # the lock during its attempt (Postgres) tries again at once.
            await asyncio.sleep(max(self.lock_poll - (time.monotonic() - sent), 0.0))

    def _start(self, epoch: int, sent: float) -> None:
        self._epoch = epoch
        self._deadline = sent + self.lease_ttl
        self.lost.clear()
        self._task = asyncio.get_running_loop().create_task(self._keep(epoch), name=f"cronoq-lease-{epoch}")

    def check(self, epoch: int) -> None:
        """Raise ``Fenced`` unless this store leads with ``epoch`` and its lease is still running.
        Every write path calls this before it writes; a lease found over ends leadership here."""
        if self._epoch is None or epoch != self._epoch:
            raise Fenced(f"epoch {epoch} is not held by this store (current: {self._epoch})")
        if time.monotonic() >= self._deadline:
            self.lose(epoch, "its lease ran out before it was renewed (was the process paused?)")
            raise Fenced(f"the lease of epoch {epoch} is over")

    async def _keep(self, epoch: int) -> None:
        next_try = time.monotonic() + self.lease_renew
        while self._epoch == epoch:
            await asyncio.sleep(max(min(next_try, self._deadline) - time.monotonic(), 0.0))
            if self._epoch != epoch:
                return
            sent = time.monotonic()
            left = self._deadline - sent
            if left <= 0:
                self.lose(epoch, "its lease ran out before it could be renewed")
                return
            try:
                async with asyncio.timeout(left):
                    renewed = await self.backend.renew(epoch)
            except (StoreError, TimeoutError) as exc:
                if self._epoch != epoch:
                    return
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if time.monotonic() >= self._deadline:
                    self.lose(epoch, f"its lease ran out while renewals failed ({why})")
                    return
                self.log.warning("renewing the lease of %s failed, retrying: %s", self.what, why)
                next_try = time.monotonic() + min(self.lock_poll, self.lease_renew)
                continue
            if self._epoch != epoch:
                return
            if not renewed:
                self.lose(epoch, "the lease was taken over or ran out in the database")
                return
            self._deadline = sent + self.lease_ttl
            next_try = sent + self.lease_renew

    def lose(self, epoch: int, why: str) -> None:
        """Leadership of ``epoch`` is over without a release: stop, free it, set ``lost``."""
        if self._epoch != epoch:
            return
        self.log.warning("leadership of %s (epoch %d) lost: %s", self.what, epoch, why)
        self._epoch = None
        self._stop_task()
        self.backend.dropped(epoch)
        self.lost.set()

    def _stop_task(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def release(self) -> int | None:
        """Give leadership up (``lost`` stays clear); return the epoch released, if any."""
        epoch, self._epoch = self._epoch, None
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if epoch is not None:
            await self.backend.release(epoch)
        return epoch

    def pause_renewals(self) -> None:
        """Stop renewing without giving anything up, as a frozen process would (tests only)."""
        self._stop_task()
