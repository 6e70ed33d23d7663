"""One shard as a service: the calls a server (or router) makes, on domain types.

``ShardService`` owns the driver of the shard's engine, the connected remote workers, the output
cache, result waiters and watch subscriptions. The gRPC and HTTP layers in ``cronoq.server`` turn
protobuf/JSON into these calls and back; the router forwards to other shards' services.

Worker sessions end by the shard's own rules too (``SessionEnd``): a worker that stops reading
its stream, and a worker one of whose leases expires while its stream is still open. The latter
stopped heartbeating: its process is frozen, stuck or cut off in a way TCP has not noticed yet,
and it would otherwise keep its free slot and be offered the very retry of the attempt it just
lost. So it is disconnected at once: the retry goes to another worker, its other leases fail as
retryable, and a worker that is merely slow reconnects on its own.

The store's codec must store ``Blob`` values (``BlobCodec``): payloads and outputs are blobs here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cronoq.engine import (
    Abort,
    AbortReason,
    AdmissionError,
    CancelledByExecutor,
    Core,
    CoreConfig,
    Dispatch,
    Failure,
    Outcome,
    RecurringInfo,
    RecurringSpec,
    Resolve,
    Scale,
    Snapshot,
    StatusEvent,
    Success,
    TaskInfo,
    TaskRef,
    TaskSpec,
    TaskStatus,
    UnknownTask,
)
from cronoq.engine.actions import Recovered, RecoveredTask
from cronoq.engine.config import PoolConfig
from cronoq.engine.handover import Adopted, Released
from cronoq.engine.views import TaskQuery
from cronoq.stores.base import Store
from cronoq.stores.history import HistoryRead, Transition, clamp_cursor, info_of

from .blob import Blob
from .driver import Driver, DriverOptions, NotLeader
from .workers import AbortOut, SessionEnd, ShutdownOut, WorkerGone, WorkerRegistry, WorkerSession

log = logging.getLogger("cronoq.shard")

PROTOCOL_VERSION = 3
CANCELLED_BY_WORKER = CancelledByExecutor("cancelled by the worker")
"""The outcome of a lease whose worker reported it cancelled (immutable: one instance serves all)."""


class WaitTimeout(Exception):
    """The task did not finish within the wait; it keeps running."""


class DataLoss(Exception):
    """A watch subscriber fell too far behind and was dropped."""


class WorkerRefused(Exception):
    """A worker's registration or message broke the protocol."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Result:
    id: int
    status: TaskStatus
    output: Blob | None
    output_available: bool
    message: str


@dataclass(slots=True)
class ServiceOptions:
    output_cache_entries: int = 1024
    output_cache_bytes: int = 64 * 1024 * 1024
    watch_buffer: int = 4096
    max_slots_per_worker: int = 256
    driver: DriverOptions = field(default_factory=DriverOptions)


class Subscription:
    """A watch: status events matching a filter, bounded; a slow reader is cut off."""

    def __init__(
        self,
        service: ShardService,
        pools: set[str] | None,
        ids: set[int],
        keys: set[str],
        all_transitions: bool,
        capacity: int,
    ) -> None:
        self._service = service
        self.pools = pools
        self.ids = ids
        self.keys = keys
        self.all_transitions = all_transitions
        self._buffer: deque[StatusEvent] = deque()
        self._capacity = capacity
        self._waiter: asyncio.Future[None] | None = None
        self.error: Exception | None = None

    def matches(self, event: StatusEvent) -> bool:
        if self.pools is not None and event.pool not in self.pools:
            return False
        if (self.ids or self.keys) and event.id not in self.ids and (event.key is None or event.key not in self.keys):
            return False
        return self.all_transitions or event.status.terminal

    def push(self, event: StatusEvent) -> None:
        if self.error is not None:
            return
        if len(self._buffer) >= self._capacity:
            self._end(DataLoss("watch consumer fell too far behind"))
            return
        self._buffer.append(event)
        self._wake()

    def _end(self, error: Exception) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next(self) -> StatusEvent:
        while True:
            if self._buffer:
                return self._buffer.popleft()
            if self.error is not None:
                raise self.error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        self._service._subscriptions.discard(self)
        if self.all_transitions:
            self._service._sync_transitions()


class ShardService:
    def __init__(
        self,
        config: CoreConfig,
        *,
        store: Store | None = None,
        options: ServiceOptions | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.config = config
        self.options = options or ServiceOptions()
        self.store = store
        self.clock = clock
        self.driver = Driver(config, self, store=store, clock=clock, options=self.options.driver)
        self.workers = WorkerRegistry()
        self._waiters: dict[int, list[asyncio.Future[Result]]] = {}
        self._outputs: OrderedDict[int, Blob | None] = OrderedDict()
        self._output_bytes = 0
        self._subscriptions: set[Subscription] = set()
        self.desired: dict[str, int] = {}
        self.on_scale: Callable[[str, int], None] | None = None
        self.on_step_down: Callable[[str], None] | None = None
        self._space: dict[str | None, asyncio.Event] = {}
        self.stepped_down = False

    # ------------------------------------------------------------------------------------------
    # Leadership

    async def lead(self) -> None:
        await self.driver.lead()
        self.driver.on_step_down = self._stepped_down
        core = self.driver.core
        assert core is not None
        for pool in core.pools:
            # Server pools get their capacity from connected workers only.
            core.set_capacity(self.clock(), pool, 0)
            self.desired[pool] = core.snapshot(self.clock()).pool(pool).desired  # type: ignore[union-attr]

    @property
    def leading(self) -> bool:
        return self.driver.leading

    def _stepped_down(self, reason: str) -> None:
        self.stepped_down = True
        self._end_everything(NotLeader(f"not the leader ({reason})"), not_leader=True, reason=reason)
        if self.on_step_down is not None:
            self.on_step_down(reason)

    def _end_everything(self, error: Exception, *, not_leader: bool, reason: str) -> None:
        for futures in self._waiters.values():
            for future in futures:
                if not future.done():
                    future.set_exception(error)
        self._waiters.clear()
        for sub in list(self._subscriptions):
            sub._end(error)
        self._subscriptions.clear()
        for session in list(self.workers.sessions.values()):
            with contextlib.suppress(WorkerGone):
                session.send(ShutdownOut(reason, not_leader))
            self.workers.remove(session)

    async def shutdown(self, grace: float) -> None:
        """Stop admitting; running attempts get ``grace`` seconds; then workers get Shutdown."""
        await self.driver.shutdown(grace)
        self._end_everything(NotLeader("not the leader (shutting down)"), not_leader=False, reason="shutting down")

    # ------------------------------------------------------------------------------------------
    # Calls

    async def _call(self, command: Callable[[Core, int], Any]) -> Any:
        return await self.driver.call(command)

    async def submit(self, spec: TaskSpec) -> tuple[int, bool]:
        while True:
            try:
                result = await self._call(lambda core, now: core.submit(now, spec))
                return result.id, result.duplicate
            except AdmissionError as err:
                if err.code.value != "full":
                    raise
            await self._wait_space(spec.pool)

    async def submit_batch(self, specs: Sequence[TaskSpec]) -> list[tuple[int, bool]]:
        while True:
            try:
                results = await self._call(lambda core, now: core.submit_batch(now, specs))
                return [(r.id, r.duplicate) for r in results]
            except AdmissionError as err:
                if err.code.value != "full":
                    raise
            await self._wait_space(specs[0].pool if specs else None)

    async def _wait_space(self, pool: str | None) -> None:
        event = self._space.setdefault(pool, asyncio.Event())
        event.clear()
        await event.wait()

    async def get(self, ref: TaskRef) -> tuple[TaskInfo, bool] | None:
        """The task and whether its output can be read; a task the engine no longer holds is
        looked up by id in the store's history (by key it is not: keys follow the retention rule)."""
        info: TaskInfo | None = await self._call(lambda core, now: core.get(ref))
        if info is None:
            info = await self._from_history(ref)
            if info is None:
                return None
        return info, await self._output_available(info)

    async def _from_history(self, ref: TaskRef) -> TaskInfo | None:
        stored = await self.stored_task(ref)
        return None if stored is None else info_of(stored)

    async def stored_task(self, ref: TaskRef) -> RecoveredTask | None:
        """The task's row in the store (its spec included), by id; None without a history."""
        history = self._history
        if history is None or not isinstance(ref, int):
            return None
        return await history.history_task(ref)

    @property
    def _history(self) -> HistoryRead | None:
        store = self.store
        return store if isinstance(store, HistoryRead) else None

    async def _output_available(self, info: TaskInfo) -> bool:
        if info.status is not TaskStatus.SUCCEEDED or not info.has_output:
            return False
        if info.id in self._outputs:
            return True
        if self.store is not None:
            found, _ = await self.store.load_output(info.id)
            return found
        return False

    async def cancel(self, ref: TaskRef) -> bool:
        try:
            result: bool = await self._call(lambda core, now: core.cancel(now, ref))
        except UnknownTask:
            if await self._from_history(ref) is not None:
                return False  # finished long ago: nothing to cancel
            raise
        return result

    async def wait(self, ref: TaskRef, timeout: float | None) -> Result:
        """The task's result once it is terminal; WaitTimeout after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result] = loop.create_future()

        def attach(core: Core, now: int) -> TaskInfo | None:
            info = core.get(ref)
            if info is not None and not info.status.terminal:
                self._waiters.setdefault(info.id, []).append(future)
            return info

        info = await self._call(attach)
        if info is None:
            info = await self._from_history(ref)
        if info is None:
            raise UnknownTask(f"unknown task {ref!r}")
        if info.status.terminal:
            return await self._finished_result(info)
        try:
            if timeout is None:
                return await asyncio.shield(future)
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            raise WaitTimeout(f"task {info.id} is still {info.status.value}") from None
        finally:
            futures = self._waiters.get(info.id)
            if futures is not None and future in futures and not future.done():
                futures.remove(future)
                if not futures:
                    del self._waiters[info.id]

    async def _finished_result(self, info: TaskInfo) -> Result:
        output: Blob | None = None
        available = False
        if info.status is TaskStatus.SUCCEEDED and info.has_output:
            if info.id in self._outputs:
                output, available = self._outputs[info.id], True
            elif self.store is not None:
                found, value = await self.store.load_output(info.id)
                if found:
                    output, available = _as_blob(value), True
        return Result(info.id, info.status, output, available, info.message or "")

    async def list_tasks(
        self, pools: Iterable[str] | None, statuses: Iterable[TaskStatus] | None, after: int, limit: int
    ) -> tuple[list[TaskInfo], int | None]:
        query = TaskQuery(pools=frozenset(pools) if pools else None, statuses=frozenset(statuses) if statuses else None)
        return await self.list_page(query, after, limit)

    async def list_page(self, query: TaskQuery, after: int, limit: int,
                        descending: bool = False) -> tuple[list[TaskInfo], int | None]:  # fmt: skip
        """One page of tasks in id order (newest first with ``descending``) and the cursor of the
        next page (None on the last): the engine's live and retained tasks merged with the
        finished ones of the store's history (see ``merge_history``)."""
        live: list[TaskInfo] = await self._call(
            lambda core, now: core.list_tasks(after=after, limit=limit + 1, query=query, descending=descending)
        )
        history = self._history
        cursor = clamp_cursor(after, descending, self.config.id_shard or 0)
        if history is None or cursor is None:
            return merge_history(live, [], limit, descending)
        stored = await history.history(query, cursor, limit + 1, descending)
        return merge_history(live, stored, limit, descending)

    async def transitions(self, task_id: int) -> list[Transition]:
        """The status changes of a task as its store recorded them (none without a history)."""
        history = self._history
        return [] if history is None else await history.transitions(task_id)

    def watch(
        self, pools: set[str] | None, ids: Iterable[int], keys: Iterable[str], all_transitions: bool
    ) -> Subscription:
        if not self.leading:
            raise NotLeader("not the leader (standby or shutting down)")
        sub = Subscription(self, pools, set(ids), set(keys), all_transitions, self.options.watch_buffer)
        self._subscriptions.add(sub)
        if all_transitions:
            self._sync_transitions()
        return sub

    def _sync_transitions(self) -> None:
        """Intermediate transitions cost work on every step: produce them only while a watcher
        asks for them (or the configuration always wants them)."""
        core = self.driver.core
        if core is not None:
            wanted = self.config.emit_transitions or any(s.all_transitions for s in self._subscriptions)
            core.emit_transitions = wanted

    async def snapshot(self) -> Snapshot:
        snap: Snapshot = await self._call(lambda core, now: core.snapshot(now))
        return snap

    async def add_recurring(self, spec: RecurringSpec) -> None:
        await self._call(lambda core, now: core.add_recurring(now, spec))

    async def remove_recurring(self, name: str) -> bool:
        result: bool = await self._call(lambda core, now: core.remove_recurring(now, name))
        return result

    async def pause_recurring(self, name: str, paused: bool) -> bool:
        """Pause or resume schedule ``name``; False if there is none (see ``Core.pause_recurring``)."""
        result: bool = await self._call(lambda core, now: core.pause_recurring(now, name, paused))
        return result

    async def withhold(self, pool: str, withheld: bool = True) -> None:
        """Start no attempt of ``pool`` while ``withheld`` (see ``Core.withhold``)."""
        await self._call(lambda core, now: core.withhold(pool, withheld))

    async def release_pool(self, pool: str) -> Released:
        """Let go of a drained pool handed to another shard (see ``Core.release_pool``). Returns
        once every step before it is committed, so the store then holds all the pool's rows."""

        def release(core: Core, now: int) -> Released:
            released = core.release_pool(pool)
            self.driver.pools_away.add(pool)
            self.driver.reconfigured(core.config)
            return released

        released: Released = await self._call(release)
        # Whoever waits here for one of its tasks asks again, and is sent to the pool's new shard.
        moved = NotLeader(f"not the leader of pool {pool!r} any more (it moved to another shard)")
        for task_id in released.ids:
            for future in self._waiters.pop(task_id, ()):
                if not future.done():
                    future.set_exception(moved)
        for session in self.workers.in_pools({pool}):
            with contextlib.suppress(WorkerGone):
                session.send(ShutdownOut(f"pool {pool!r} moved to another shard", True))
            self.workers.remove(session)  # it holds no lease (drained); the engine has no group of it now
        return released

    async def join_pool(self, config: PoolConfig, recovered: Recovered) -> Adopted:
        """Add a pool handed over to this shard, with its stored rows, to the running engine."""

        def join(core: Core, now: int) -> Adopted:
            adopted = core.join_pool(now, config, recovered)
            self.driver.pools_away.discard(config.name)
            self.driver.reconfigured(core.config)
            return adopted

        adopted: Adopted = await self._call(join)
        return adopted

    async def running_in(self, pool: str) -> int:
        """How many attempts of ``pool`` are running."""
        result: int = await self._call(lambda core, now: core.running_in(pool))
        return result

    async def list_recurring(self) -> list[RecurringInfo]:
        result: list[RecurringInfo] = await self._call(lambda core, now: core.list_recurring())
        return result

    # ------------------------------------------------------------------------------------------
    # Workers

    def register_worker(
        self, pool: str, slots: int, name: str, labels: Mapping[str, str], protocol: int
    ) -> WorkerSession:
        core = self.driver.core
        if not self.leading or core is None:
            raise NotLeader("not the leader (standby or shutting down)")
        if protocol < PROTOCOL_VERSION:
            raise WorkerRefused(
                "failed_precondition", f"worker protocol {protocol} is too old; this server speaks {PROTOCOL_VERSION}"
            )
        if pool not in core.pools:
            raise WorkerRefused("not_found", f"unknown pool {pool!r}")
        if slots < 1:
            raise WorkerRefused("invalid_argument", "a worker needs at least one slot")
        granted = min(slots, self.options.max_slots_per_worker)
        session = self.workers.add(pool, granted, name, labels, self.clock(), protocol)
        self._sync_group(pool, session.key)
        log.info("worker %d (%s) registered for pool %s with %d slots", session.id, name or "-", pool, granted)
        return session

    def unregister_worker(self, session: WorkerSession, reason: str = "worker disconnected") -> None:
        if session.id not in self.workers.sessions:
            return
        held = self.workers.remove(session)
        self._sync_group(session.pool, session.key)
        if held:
            reports = [(lease.id, Failure(reason, False)) for lease in held]
            self.driver.post(lambda core, now: _apply(core, now, reports))
        log.info("worker %d disconnected (%s); %d leases returned", session.id, reason, len(held))

    def end_session(self, session: WorkerSession, why: SessionEnd) -> None:
        """The shard ends ``session`` by its own rule; its stream reports ``why``."""
        if session.ended_by is None:
            session.ended_by = why
        self.unregister_worker(session, why.value)

    def set_worker_slots(self, session: WorkerSession, slots: int) -> None:
        session.slots = min(max(slots, 0), self.options.max_slots_per_worker)
        self._sync_group(session.pool, session.key)

    def _sync_group(self, pool: str, key: frozenset[tuple[str, str]]) -> None:
        total = self.workers.group_slots(pool, key)
        labels = dict(key)
        if self.driver.role.value in ("leader", "stopping"):
            self.driver.post(lambda core, now: core.set_group_capacity(now, pool, labels, total))

    def _owned(self, session: WorkerSession, lease_id: int) -> bool:
        return lease_id in session.running

    def worker_complete(self, session: WorkerSession, lease_id: int, output: Blob) -> None:
        self.workers.release_from(session, lease_id)
        self.driver.post(lambda core, now: core.complete(now, lease_id, Success(output)))

    def worker_fail(
        self, session: WorkerSession, lease_id: int, message: str, permanent: bool, retry_after: int | None
    ) -> None:
        self.workers.release_from(session, lease_id)
        outcome = Failure(message, permanent, retry_after)
        self.driver.post(lambda core, now: core.complete(now, lease_id, outcome))

    def worker_cancelled(self, session: WorkerSession, lease_id: int) -> None:
        self.workers.release_from(session, lease_id)
        self.driver.post(lambda core, now: core.complete(now, lease_id, CANCELLED_BY_WORKER))

    def worker_reports(self, session: WorkerSession, reports: list[tuple[int, Outcome]]) -> None:
        """The outcomes one worker message carried, in its order, as ONE driver command: a busy
        stream's message carries dozens, and a command per outcome cost a closure and a turn of
        the step loop each. A lease the session no longer holds is skipped, as one by one."""
        running, release = session.running, self.workers.release_from
        owned: list[tuple[int, Outcome]] = []
        for report in reports:
            lease_id = report[0]
            if lease_id in running:  # counts only while the stream holds it (and only once)
                release(session, lease_id)
                owned.append(report)
        if owned:
            self.driver.post(lambda core, now: core.complete_many(now, owned))

    def worker_heartbeat(self, session: WorkerSession, lease_id: int) -> None:
        self.driver.post(lambda core, now: core.heartbeat(now, lease_id))

    def worker_nack(self, session: WorkerSession, lease_id: int, reason: str) -> None:
        """Give a lease back unrun: re-offer it (same attempt) to another worker of its group."""
        if self.workers.lease_owner.get(lease_id) is not session:
            return
        lease = session.running.get(lease_id)
        self.workers.release(lease_id)
        if lease is None:
            return
        other = self.workers.pick(lease, exclude=session)
        if other is not None:
            try:
                self.workers.assign(other, lease)
                return
            except WorkerGone:
                self.workers.release(lease_id)
                self.end_session(other, SessionEnd.STOPPED_READING)
        message = "no other worker could take the lease" + (f" ({reason})" if reason else "")
        self.driver.post(lambda core, now: core.complete(now, lease_id, Failure(message, False)))

    def workers_in(self, pools: set[str] | None) -> list[WorkerSession]:
        return self.workers.in_pools(pools)

    # ------------------------------------------------------------------------------------------
    # Sink (called by the driver once a step is durable)

    def dispatch(self, leases: Sequence[Dispatch]) -> None:
        unplaced = []
        for lease in leases:
            session = self.workers.pick(lease)
            if session is None:
                unplaced.append(lease)
                continue
            try:
                self.workers.assign(session, lease)
            except WorkerGone:
                self.workers.release(lease.id)
                self.end_session(session, SessionEnd.STOPPED_READING)
                unplaced.append(lease)
        if unplaced:
            reports = [(lease.id, Failure("no connected worker could take the lease", False)) for lease in unplaced]
            self.driver.post(lambda core, now: _apply(core, now, reports))

    def abort(self, aborts: Sequence[Abort]) -> None:
        stalled: list[WorkerSession] = []
        for abort in aborts:
            session = self.workers.release(abort.lease_id)
            if session is None:
                continue
            if abort.reason is AbortReason.LEASE_EXPIRED and session not in stalled:
                stalled.append(session)
            try:
                session.send(AbortOut(abort.lease_id, abort.reason))
            except WorkerGone:
                self.end_session(session, SessionEnd.STOPPED_READING)
        # Before anything of this step is dispatched: the expired lease's retry must not go back
        # to the worker that let it expire.
        for session in stalled:
            self.end_session(session, SessionEnd.LEASE_EXPIRED)

    def resolve(self, results: Sequence[Resolve]) -> None:
        outputs = self._outputs
        for result in results:
            if result.has_output:
                blob = _as_blob(result.output)
                outputs[result.id] = blob
                self._output_bytes += len(blob.data) if blob is not None else 0
                self._trim_outputs()
            futures = self._waiters.pop(result.id, None)
            if futures:
                res = Result(
                    result.id,
                    result.status,
                    _as_blob(result.output) if result.has_output else None,
                    result.has_output,
                    result.message or "",
                )
                for future in futures:
                    if not future.done():
                        future.set_result(res)
            if self._subscriptions:
                event = result.event
                for sub in list(self._subscriptions):
                    if sub.matches(event):
                        sub.push(event)

    def _trim_outputs(self) -> None:
        outputs = self._outputs
        opts = self.options
        while outputs and (len(outputs) > opts.output_cache_entries or self._output_bytes > opts.output_cache_bytes):
            _, old = outputs.popitem(last=False)
            self._output_bytes -= len(old.data) if old is not None else 0

    def publish(self, events: Sequence[StatusEvent]) -> None:
        for event in events:
            for sub in list(self._subscriptions):
                if sub.matches(event):
                    sub.push(event)

    def scale(self, scales: Sequence[Scale]) -> None:
        for scale in scales:
            self.desired[scale.pool] = scale.desired
            if self.on_scale is not None:
                self.on_scale(scale.pool, scale.desired)

    def space_available(self, pools: Sequence[str | None]) -> None:
        for pool in pools:
            waiting = (
                list(self._space.values())
                if pool is None
                else [e for e in (self._space.get(pool), self._space.get(None)) if e is not None]
            )
            for event in waiting:
                event.set()


def merge_history(live: list[TaskInfo], stored: list[TaskInfo], limit: int,
                  descending: bool) -> tuple[list[TaskInfo], int | None]:  # fmt: skip
    """Merge the engine's page with the store's (each asked for ``limit + 1`` tasks, so a full
    one means more may follow). The engine's answer wins for a task both hold. Where a full page
    ends, the other page's tasks past that end are left for the next page: they may be missing
    tasks that only the full side would have listed there."""
    ends = [page[-1].id for page in (live, stored) if len(page) > limit]
    first = {info.id: info for info in stored}
    first.update((info.id, info) for info in live)
    rows = sorted(first.values(), key=lambda info: info.id, reverse=descending)
    if ends:
        end = max(ends) if descending else min(ends)
        rows = [info for info in rows if (info.id >= end if descending else info.id <= end)]
    more = bool(ends) or len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].id if more and rows else None)


def _apply(core: Core, now: int, reports: Sequence[tuple[int, Failure]]) -> None:
    for lease_id, outcome in reports:
        core.complete(now, lease_id, outcome)


def _as_blob(value: object) -> Blob | None:
    if value is None or isinstance(value, Blob):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return Blob(bytes(value), "application/octet-stream")
    import json

    return Blob(json.dumps(value).encode(), "application/json")
