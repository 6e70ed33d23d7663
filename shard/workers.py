"""Remote worker sessions of one shard: registration, slots per label group, lease routing.

A worker stream registers for one pool with some slots and labels. Workers of a pool that carry
exactly the same labels form a group, and the engine's capacity for that group is the sum of
their slots. The engine dispatches an attempt to a (pool, group); the registry picks the worker of
that group with the most free slots and queues the lease on its bounded outbound queue.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from cronoq.engine import Dispatch

LabelKey = frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class LeaseOut:
    """An attempt for the worker to run."""

    lease: Dispatch


@dataclass(frozen=True, slots=True)
class AbortOut:
    lease_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class ShutdownOut:
    reason: str
    not_leader: bool


@dataclass(frozen=True, slots=True)
class ClosedOut:
    """Wakes the stream writer of a session that was closed: nothing to send."""


Outbound = LeaseOut | AbortOut | ShutdownOut | ClosedOut


class WorkerGone(Exception):
    """The worker's outbound queue overflowed or it disconnected."""


class SessionEnd(Enum):
    """Why the shard itself ended a worker's session (its value is what the worker is told)."""

    STOPPED_READING = "worker stopped reading its stream"
    """Its outbound queue overflowed: it does not read what it is sent."""
    LEASE_EXPIRED = "a lease expired without a heartbeat"
    """Its process is frozen, stuck or cut off in a way TCP has not noticed yet."""


@dataclass(eq=False)
class WorkerSession:
    id: int
    pool: str
    name: str
    labels: Mapping[str, str]
    slots: int
    connected_at: int
    protocol: int
    key: LabelKey = field(init=False)
    running: dict[int, Dispatch] = field(default_factory=dict)
    outbound: asyncio.Queue[Outbound] = field(init=False)
    closed: bool = False
    ended_by: SessionEnd | None = None
    """Set when the shard ended the session (rather than the worker or its stream)."""

    def __post_init__(self) -> None:
        self.key = frozenset(self.labels.items())
        # About one lease and one abort per slot, plus a shutdown: a worker that stops reading is
        # disconnected rather than allowed to hold leases it cannot see.
        self.outbound = asyncio.Queue(maxsize=2 * max(self.slots, 1) + 4)

    @property
    def free(self) -> int:
        return self.slots - len(self.running)

    def send(self, message: Outbound) -> None:
        if self.closed:
            raise WorkerGone("worker is disconnected")
        try:
            self.outbound.put_nowait(message)
        except asyncio.QueueFull:
            raise WorkerGone("worker stopped reading its stream") from None

    def close(self) -> None:
        """Mark the session disconnected. A stream writer waiting on the empty queue is woken by a
        ``ClosedOut`` (it sends nothing for it); a writer with messages left sees ``closed`` once
        it has drained them."""
        if self.closed:
            return
        self.closed = True
        if self.outbound.empty():
            self.outbound.put_nowait(ClosedOut())


class WorkerRegistry:
    """Connected workers of one shard."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.sessions: dict[int, WorkerSession] = {}
        self._by_group: dict[tuple[str, LabelKey], list[WorkerSession]] = {}
        self.lease_owner: dict[int, WorkerSession] = {}

    def add(
        self, pool: str, slots: int, name: str, labels: Mapping[str, str], now: int, protocol: int
    ) -> WorkerSession:
        session = WorkerSession(next(self._ids), pool, name, dict(labels), slots, now, protocol)
        self.sessions[session.id] = session
        self._by_group.setdefault((pool, session.key), []).append(session)
        return session

    def remove(self, session: WorkerSession) -> list[Dispatch]:
        """Forget a session; returns the leases it still held."""
        session.close()
        self.sessions.pop(session.id, None)
        group = self._by_group.get((session.pool, session.key))
        if group is not None and session in group:
            group.remove(session)
            if not group:
                del self._by_group[(session.pool, session.key)]
        held = list(session.running.values())
        for lease in held:
            self.lease_owner.pop(lease.id, None)
        session.running.clear()
        return held

    def group_slots(self, pool: str, key: LabelKey) -> int:
        return sum(s.slots for s in self._by_group.get((pool, key), ()))

    def pick(self, lease: Dispatch, exclude: WorkerSession | None = None) -> WorkerSession | None:
        """The worker of the lease's group with the most free slots (None when all are full)."""
        key: LabelKey = frozenset(lease.group.items())
        best: WorkerSession | None = None
        for session in self._by_group.get((lease.pool, key), ()):
            if session is exclude or session.closed:
                continue
            if session.free > 0 and (best is None or session.free > best.free):
                best = session
        return best

    def assign(self, session: WorkerSession, lease: Dispatch) -> None:
        session.running[lease.id] = lease
        self.lease_owner[lease.id] = session
        session.send(LeaseOut(lease))

    def release(self, lease_id: int) -> WorkerSession | None:
        """The lease ended (reported, aborted, expired): free its slot on the worker."""
        session = self.lease_owner.pop(lease_id, None)
        if session is not None:
            session.running.pop(lease_id, None)
        return session

    def release_from(self, session: WorkerSession, lease_id: int) -> None:
        """``session`` reported on the lease: free its slot if the lease is still that session's
        (one dictionary pop on the usual path, where it is)."""
        owner = self.lease_owner.pop(lease_id, None)
        if owner is session:
            session.running.pop(lease_id, None)
        elif owner is not None:
            self.lease_owner[lease_id] = owner  # another session's now (re-offered): leave it

    def in_pools(self, pools: set[str] | None) -> list[WorkerSession]:
        return [s for s in self.sessions.values() if pools is None or s.pool in pools]
