"""Moving pools between shards, as one server takes part (``docs/pool-moves.md``).

The source's leader records the move (``draining``) and lets the pool's running attempts end
there while it starts no new one (the app's ``_drain``); once none runs, the move is ``requested``.
On Postgres the leader then hands the pool over while it leads (``hand_over``, after its engine let
go of the pool), and the target's leader, told by the handover's commit (``watch``), reads the
pool's rows (``rows``) and adds the pool to its running engine. Where that is not possible (SQLite,
a failure half-way, a leader that died), the source's leader steps down and whichever replica leads
the source next carries the move out before recovering its store (``carry_out``); the target's
leader then steps down too, and its next leadership serves the pool.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Callable

from cronoq.engine.actions import Recovered
from cronoq.stores.base import Store
from cronoq.stores.placements import placement_watch
from cronoq.stores.pool_moves import (
    ACTIVE,
    MoveRefused,
    MoveRow,
    forwarded_to,
    read_moves,
    recover_pool,
    request_move,
    set_move_phase,
    transfer,
)

__all__ = ["ABORTABLE", "PLACEMENT_POLL_S", "PoolMoves"]

log = logging.getLogger("cronoq.server")

PLACEMENT_POLL_S = 0.2
"""How often a leader reads its shard's placements to notice a pool handed to it (SQLite)."""
NOTIFIED_POLL_S = 5.0
"""The same on Postgres, where each change is notified: a fallback only."""
ABORTABLE = ("draining", "requested")
"""The phases a move can be aborted in: nothing has reached the target yet."""
HANDOVER_PAUSE_S = 3 * PLACEMENT_POLL_S
"""How long the source waits after a handover before it leads again (see ``carry_out``)."""
NOTIFIED_HANDOVER_PAUSE_S = 0.1
"""The same on Postgres, where the target's leader is notified by the handover's commit."""


def template_pool(spec_text: object) -> str | None:
    """The pool of a stored schedule's template (its ``spec`` column: a JSON object whose
    ``template`` holds the template's fields)."""
    try:
        data = json.loads(spec_text) if isinstance(spec_text, str | bytes) else None
    except ValueError:
        return None
    template = data.get("template") if isinstance(data, dict) else None
    pool = template.get("pool") if isinstance(template, dict) else None
    return pool if isinstance(pool, str) else None


class PoolMoves:
    """One server's part in pool moves: its shard's store, its name, and how to reach the stores
    of other shards (``namespace_of``: a shard's SQLite path or Postgres schema)."""

    def __init__(self, store: Store, shard: str, namespace_of: Callable[[str], str],
                 clock: Callable[[], int] = time.time_ns) -> None:  # fmt: skip
        self.store = store
        self.shard = shard
        self.namespace_of = namespace_of
        self.clock = clock
        from cronoq.stores.postgres import PostgresStore

        self.notified = isinstance(store, PostgresStore)
        """Whether the target's leader is notified of a handover (Postgres), or polls (SQLite)."""

    async def carry_out(self, epoch: int) -> None:
        """Carry out the moves requested of this shard (the store is led with ``epoch`` and no
        engine runs). A refused move is marked so, with the reason; other failures raise, and the
        shard does not lead until the move is done."""
        for move in (await read_moves(self.store)).values():
            # A move still ``draining`` lost its leader: the attempts that were running ended with
            # it (a new leader counts them as used, as in any failover), so it can go on now.
            if move.phase not in ACTIVE:
                continue
            log.info("moving pool %r to shard %r (move %s, version %d)", move.pool, move.target, move.move_id,
                     move.version)  # fmt: skip
            try:
                done = await transfer(self.store, epoch, move, self.shard, self.namespace_of(move.target),
                                      template_pool)  # fmt: skip
            except MoveRefused as refused:
                log.warning("move of pool %r refused: %s", move.pool, refused)
                await set_move_phase(self.store, epoch, move.pool, move.move_id, "refused", str(refused), self.clock())
                continue
            log.info("pool %r handed to shard %r: %d tasks, %d schedules", move.pool, move.target, done.tasks,
                     done.schedules)  # fmt: skip
            # Give the target's leader time to notice (``watch``) before this shard starts sending
            # the pool's callers and workers there: until it does, it would send them back.
            await asyncio.sleep(NOTIFIED_HANDOVER_PAUSE_S if self.notified else HANDOVER_PAUSE_S)

    @property
    def live(self) -> bool:
        """Whether moves are carried out while both leaders run (Postgres: the handover is one
        transaction and the target is notified by its commit); otherwise in a takeover."""
        return self.notified

    async def fold(self) -> None:
        """Fold the store's status event log into its task rows now (Postgres), so that the
        handover, which folds it first thing, finds little left to fold."""
        compact = getattr(self.store, "compact", None)
        if compact is not None:
            await compact()

    async def hand_over(self, epoch: int, move: MoveRow) -> bool:
        """Carry out ``move`` under a running leadership whose engine has let go of the pool: the
        same fenced transaction as ``carry_out``. False if a check refused it (marked so, with the
        reason: the pool stays here). Other failures raise; the move stays ``requested`` and the
        next leadership of this shard carries it out."""
        try:
            done = await transfer(self.store, epoch, move, self.shard, self.namespace_of(move.target), template_pool)
        except MoveRefused as refused:
            log.warning("move of pool %r refused: %s", move.pool, refused)
            await set_move_phase(self.store, epoch, move.pool, move.move_id, "refused", str(refused), self.clock())
            return False
        log.info("pool %r handed to shard %r while leading: %d tasks, %d schedules", move.pool, move.target,
                 done.tasks, done.schedules)  # fmt: skip
        return True

    async def rows(self, pool: str, now: int, retention: int) -> Recovered:
        """The stored rows of ``pool`` in this shard's store, as a pool joining the engine needs."""
        return await recover_pool(self.store, pool, now, retention, template_pool)

    async def request(self, epoch: int, pool: str, target: str, version: int) -> tuple[MoveRow, bool]:
        """Record a move of ``pool`` (fenced by ``epoch``); the move and whether it is new (False:
        one was already requested, and is returned)."""
        row = MoveRow(pool, uuid.uuid4().hex, target, version, "draining", "", self.clock())
        recorded = await request_move(self.store, epoch, row)
        return recorded, recorded.move_id == row.move_id

    async def drained(self, epoch: int, move: MoveRow) -> bool:
        """``move``'s pool has no running attempt left: the move is ``requested`` (fenced); False
        if it is no longer draining (aborted)."""
        return await set_move_phase(self.store, epoch, move.pool, move.move_id, "requested", "", self.clock(),
                                    ("draining",))  # fmt: skip

    async def latest(self, pool: str) -> MoveRow | None:
        return (await read_moves(self.store)).get(pool)

    async def abort(self, epoch: int, move: MoveRow) -> bool:
        """Abandon ``move`` if it is still in a phase of ``ABORTABLE`` (fenced); whether it was."""
        return await set_move_phase(self.store, epoch, move.pool, move.move_id, "aborted", "aborted by an admin",
                                    self.clock(), ABORTABLE)  # fmt: skip

    async def forwarded(self, task_id: int) -> tuple[str, str, int] | None:
        return await forwarded_to(self.store, task_id)

    async def watch(self, serving: Callable[[], frozenset[str]], known: frozenset[str],
                    changed: Callable[[frozenset[str], dict[str, tuple[str, int]]], bool]) -> None:  # fmt: skip
        """Until cancelled: call ``changed`` with the pools of ``known`` the shard's record places
        on it and the record, whenever they are other than ``serving()`` (a pool handed to it, or
        given away); it answers whether to keep watching. On Postgres the commit that changes the record
        notifies; the record is read again at once, and every ``NOTIFIED_POLL_S`` in case a
        notification was missed."""
        while True:
            try:
                async with placement_watch(self.store) as watch:
                    every = NOTIFIED_POLL_S if watch.notified else PLACEMENT_POLL_S
                    while True:
                        placements = await watch.read()
                        placed = frozenset(pool for pool, (shard, _) in placements.items()
                                           if shard == self.shard and pool in known)  # fmt: skip
                        if placements and placed != serving() and not changed(placed, dict(placements)):
                            return
                        await watch.wait(every)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store's own troubles are noticed by the driver
                log.debug("reading the placements: %s", exc)
                await asyncio.sleep(PLACEMENT_POLL_S)
