"""``MemoryStore``: the store semantics in process memory.

Rows are kept in exactly the shapes the SQL stores write (see ``_rows``), encoded through the
codec, so the memory store validates, folds, recovers and quarantines like the durable ones.
Nothing survives the process. Several ``MemoryStore`` instances may share one ``MemoryState`` to
stand for several processes opening one database (tests use that); leadership is always granted
at once, and taking it fences the previous leader (its ``lost`` event is set).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cronoq.engine.actions import Mutation, Recovered, RecoveredTask
from cronoq.engine.types import NS_PER_S
from cronoq.engine.views import TaskInfo, TaskQuery

from . import _row_decode as D
from . import _rows as R
from . import _schema as S
from . import history as H
from .base import DEFAULT_CODEC, Codec, Corrupt, Fenced, ShardMismatch, StoreError, check_seconds

__all__ = ["MemoryState", "MemoryStore"]

log = logging.getLogger("cronoq.stores")


@dataclass(slots=True)
class MemoryState:
    """The "database" behind one or more MemoryStore instances."""

    tasks: dict[int, list[Any]] = field(default_factory=dict)  # stored id -> full task row
    transitions: dict[int, list[H.Transition]] = field(default_factory=dict)  # stored id -> status changes
    recurring: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    epoch: int = 0
    id_high_water: int | None = None  # stored (signed) id
    shard: str | None = None
    shard_recorded: bool = False
    leader: MemoryStore | None = None


class MemoryStore:
    """In-process store. ``retention`` (seconds) is the default window of ``recover``."""

    def __init__(
        self,
        *,
        codec: Codec | None = None,
        shard: str | None = None,
        retention: float = 3600.0,
        state: MemoryState | None = None,
    ) -> None:
        if shard is not None:
            R.check_text(shard, "shard name")
        check_seconds("retention", retention, positive=False)
        self.codec: Codec = codec if codec is not None else DEFAULT_CODEC
        self.shard = shard
        self.retention = round(retention * NS_PER_S)
        self.state = state if state is not None else MemoryState()
        self.lost = asyncio.Event()
        self._epoch: int | None = None
        self._opened = False
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def epoch(self) -> int | None:
        return self._epoch

    async def open(self) -> None:
        if self._opened:
            return
        st = self.state
        used = bool(st.tasks or st.recurring or st.id_high_water is not None)
        if st.shard_recorded and st.shard != self.shard and used:
            raise ShardMismatch(S.shard_conflict(st.shard, self.shard))
        st.shard, st.shard_recorded = self.shard, True
        self._opened = True

    async def close(self) -> None:
        if self._closed:
            return
        await self.release_leadership()
        self._closed = True

    async def __aenter__(self) -> MemoryStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- leadership ----------------------------------------------------------------------------

    async def acquire_leadership(self) -> int:
        await self.open()
        if self._epoch is not None:
            raise StoreError("this store already leads; release leadership first")
        st = self.state
        previous = st.leader
        st.epoch += 1
        st.leader = self
        if previous is not None and previous is not self and previous._epoch is not None:
            previous._epoch = None
            previous.lost.set()
        self._epoch = st.epoch
        self.lost.clear()
        return st.epoch

    async def release_leadership(self) -> None:
        if self.state.leader is self:
            self.state.leader = None
        self._epoch = None

    def _check_epoch(self, epoch: int) -> None:
        st = self.state
        if self._epoch is None or epoch != self._epoch or st.epoch != epoch or st.leader is not self:
            raise Fenced(f"epoch {epoch} is not the current leader epoch {st.epoch}")

    # -- writes --------------------------------------------------------------------------------

    async def commit(self, epoch: int, mutations: Sequence[Mutation]) -> None:
        await self.open()
        self._check_epoch(epoch)
        batch = R.fold(mutations, self.codec)
        st = self.state
        for row in batch.tasks:
            st.tasks[row[R.T_ID]] = row
        for upd in batch.statuses:
            old = st.tasks.get(upd[0])
            if old is None:
                continue
            row = old
            row[R.T_STATUS], row[R.T_ATTEMPT], row[R.T_MESSAGE] = upd[1], upd[2], upd[3]
            if upd[4] is not None:
                row[R.T_STARTED] = upd[4]
            row[R.T_FINISHED], row[R.T_RETRY_AT] = upd[5], upd[6]
            row[R.T_OUTPUT_FULL], row[R.T_HAS_OUTPUT_FULL] = upd[7], upd[8]
            change = H.transition_of(row[R.T_STATUS], row[R.T_ATTEMPT], row[R.T_MESSAGE], row[R.T_STARTED],
                                     row[R.T_FINISHED], row[R.T_RETRY_AT])  # fmt: skip
            if change is not None:
                st.transitions.setdefault(upd[0], []).append(change)
        for rec in batch.recurring:
            st.recurring[rec[0]] = rec
        for name in batch.deleted:
            st.recurring.pop(name, None)
        if batch.max_id is not None and (st.id_high_water is None or batch.max_id > st.id_high_water):
            st.id_high_water = batch.max_id

    async def prune(self, before: int) -> int:
        await self.open()
        tasks = self.state.tasks
        old = [i for i, row in tasks.items() if row[R.T_FINISHED] is not None and row[R.T_FINISHED] < before]
        for i in old:
            del tasks[i]
            self.state.transitions.pop(i, None)
        return len(old)

    # -- reads ---------------------------------------------------------------------------------

    @staticmethod
    def _read_row(row: list[Any]) -> list[Any]:
        return [*row[: R.T_OUTPUT_FULL], row[R.T_HAS_OUTPUT_FULL]]

    async def recover(self, now: int, retention: int | None = None) -> Recovered:
        await self.open()
        st = self.state
        cutoff = now - (self.retention if retention is None else retention)
        rec = D.Recovery(self.codec, now)
        with D.gc_paused():
            rec.add_rows(
                self._read_row(row)
                for row in st.tasks.values()
                if row[R.T_FINISHED] is None or row[R.T_FINISHED] >= cutoff
            )
        ids, keys = rec.missing_parents()
        if ids or keys:
            wanted_ids, wanted_keys = set(ids), set(keys)
            rec.add_parents(
                [self._read_row(row) for i, row in st.tasks.items() if i in wanted_ids or row[R.T_KEY] in wanted_keys],
                ids,
                keys,
            )
        for db_id, message in rec.quarantined:
            log.error("task %d quarantined: %s", R.from_db_id(db_id), message)
            row = st.tasks[db_id]
            row[R.T_STATUS] = "dead_lettered"
            row[R.T_MESSAGE] = message
            if row[R.T_FINISHED] is None:
                row[R.T_FINISHED] = now
            row[R.T_RETRY_AT] = None
        result = Recovered(tasks=rec.ordered(), quarantined=len(rec.quarantined))
        for name, rrow in sorted(st.recurring.items()):
            try:
                result.recurring.append(D.decode_recurring(rrow, self.codec))
            except Corrupt as exc:
                D.log_bad_recurring(name, exc)
                result.quarantined += 1
        high = R.from_db_id(st.id_high_water) if st.id_high_water is not None else 0
        result.id_high_water = max([high, *(t.record.id for t in result.tasks)])
        return result

    # -- history (see history.py; a scan of every row: the memory store is not for big histories)

    async def history(self, query: TaskQuery, after: int, limit: int, descending: bool = False) -> list[TaskInfo]:
        await self.open()
        now = time.time_ns()
        found: list[TaskInfo] = []
        for row in self.state.tasks.values():
            task_id = R.from_db_id(row[R.T_ID])
            if row[R.T_FINISHED] is None or (after and (task_id >= after if descending else task_id <= after)):
                continue
            info = H.row_info(self._read_row(row), self.codec, now)
            if query.matches(info.pool, info.status, info.kind, info.tenant, info.key, info.created_at):
                found.append(info)
        found.sort(key=lambda info: info.id, reverse=descending)
        return found[:limit]

    async def history_task(self, task_id: int) -> RecoveredTask | None:
        await self.open()
        row = self.state.tasks.get(R.to_db_id(task_id))
        return None if row is None else H.decode_row(self._read_row(row), self.codec, time.time_ns())

    async def transitions(self, task_id: int) -> list[H.Transition]:
        await self.open()
        return list(self.state.transitions.get(R.to_db_id(task_id), ()))

    async def load_output(self, task_id: int) -> tuple[bool, object]:
        await self.open()
        row = self.state.tasks.get(R.to_db_id(task_id))
        if row is None or not row[R.T_HAS_OUTPUT_FULL]:
            return False, None
        return True, D.decode_output(self.codec, row[R.T_OUTPUT_FULL])
