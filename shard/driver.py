"""The engine driver: runs one shard's engine on an asyncio loop with group commit.

Commands from callers (submissions, cancellations, reports from executors and workers) queue up
while a step is in progress. One step applies every queued command to the engine, fires its timers,
commits everything the step changed in one store transaction, and only then resolves the callers'
futures, hands out dispatches and publishes events. Nothing in the driver creates an asyncio task
per engine task; executors are the sink's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from cronoq.engine import (
    Abort,
    Core,
    CoreConfig,
    Dispatch,
    EngineError,
    EngineFault,
    Mutation,
    Recovered,
    Resolve,
    Scale,
    StatusEvent,
    StepOutput,
)
from cronoq.engine.types import NS_PER_S
from cronoq.stores.base import Fenced, Store, StoreError, Unavailable, Unstorable

from .faults import LOGGED_REJECTS, MAX_CONSECUTIVE_FAULTS, Command, Rebuild, creator, culprit_message, names_culprit
from .gc_tuning import GcTuning

log = logging.getLogger("cronoq.shard")

T = TypeVar("T")


# Run the next step while the previous commit is in flight only when this much work is queued
# (commands), or when the step in flight was itself busy (mutations): one command may carry a
# thousand submissions or every report of a burst of completions, so under load the command
# count alone would keep the engine waiting for each commit, and the store for each step.
PIPELINE_MIN_COMMANDS = 64
PIPELINE_MIN_MUTATIONS = 64


class NotLeader(Exception):
    """This driver does not (or no longer) lead its shard: retry at the leader."""


class ShuttingDown(Exception):
    """The driver stopped admitting work."""


class StoreUnavailable(Exception):
    """The store stayed unreachable past ``max_store_outage``; the operation was not made durable."""


class Sink(Protocol):
    """Where the driver sends what a committed step produced."""

    def dispatch(self, leases: Sequence[Dispatch]) -> None: ...

    def abort(self, aborts: Sequence[Abort]) -> None: ...

    def resolve(self, results: Sequence[Resolve]) -> None: ...

    def publish(self, events: Sequence[StatusEvent]) -> None: ...

    def scale(self, scales: Sequence[Scale]) -> None: ...

    def space_available(self, pools: Sequence[str | None]) -> None: ...


class Role(enum.Enum):
    STANDBY = "standby"
    LEADER = "leader"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(slots=True)
class StoreTrouble:
    """Store failures seen by the drivers of one process. A server process outlives its
    leaderships (it stands by again after losing one), so these counts are kept outside any one
    driver and exported with the metrics whenever the process leads."""

    commit_errors: int = 0
    """Commit attempts the store refused as unavailable (every retry counts)."""
    fenced_commits: int = 0
    """Commits refused because another leader had taken over (each ends a leadership)."""


@dataclass(frozen=True)
class DriverOptions:
    max_store_outage: float = 300.0
    commit_backoff_initial: float = 0.05
    commit_backoff_max: float = 2.0
    keep_finished_s: float | None = 7 * 86400.0  # finished rows are pruned from the store after this
    prune_interval_s: float = 60.0
    # While leading, the cyclic garbage collector's youngest generation holds this many objects
    # before a collection (None: leave the interpreter's setting alone). See ``GcTuning``.
    gc_young_threshold: int | None = 20_000
    # Where commit failures are counted (None: not counted).
    trouble: StoreTrouble | None = None
    # Called once leadership is taken, with the epoch, before the store is recovered: the engine
    # configuration to lead with, or None to keep the given one (the server builds its pools
    # from the shard's durable placements here, so that recovery knows every pool it owns).
    configure: Callable[[int], Awaitable[CoreConfig | None]] | None = None


def wall_clock() -> int:
    return time.time_ns()


class Driver:
    """Leads one shard: acquires leadership, recovers, then steps the engine until stopped."""

    def __init__(
        self,
        config: CoreConfig,
        sink: Sink,
        *,
        store: Store | None = None,
        clock: Callable[[], int] = wall_clock,
        options: DriverOptions | None = None,
    ) -> None:
        self._config = config
        self._sink = sink
        self._store = store
        self._clock = clock
        self._options = options or DriverOptions()
        self.core: Core | None = None
        self.role = Role.STANDBY
        self.epoch: int | None = None
        self._queue: list[tuple[Command, asyncio.Future[Any] | None]] = []
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._admitting = True
        self._stop_requested = False
        self._helpers: list[asyncio.Task[None]] = []
        # The commit in flight, which ``_notice_lost`` cancels once leadership is lost under it.
        self._commit_task: asyncio.Task[None] | None = None
        self._lost_commit = False
        self._stepped_down: asyncio.Event | None = None
        self.stop_reason: str | None = None
        self.on_step_down: Callable[[str], None] | None = None
        self._gc_tuned = False
        self._leading_config = config
        self._consecutive_faults = 0
        # Commands that already ran in a step that faulted (kept alive so their ids stay theirs).
        self._retried: dict[int, Command] = {}
        self.pools_away: set[str] = set()
        """Pools released from the engine for a live move whose rows may still be in the store
        (docs/pool-moves.md): an engine rebuilt from the store now would not know them."""

    # ------------------------------------------------------------------------------------------
    # Lifecycle

    async def lead(self) -> None:
        """Wait for leadership, recover the shard's state and start stepping the engine."""
        self._wake = asyncio.Event()
        self._stepped_down = asyncio.Event()
        store = self._store
        epoch = 1
        if store is not None:
            epoch = await store.acquire_leadership()
        self.epoch = epoch
        if self._options.configure is not None:
            replacement = await self._options.configure(epoch)
            if replacement is not None:
                self._config = replacement
        config = _with_epoch(self._config, epoch, persist=store is not None)
        self._leading_config = config
        now = self._clock()
        core = Core(config, now=now)
        if store is not None:
            # Recovery allocates hundreds of thousands of objects at once; the collector's passes
            # over them would double the takeover time and free nothing.
            collecting = gc.isenabled()
            gc.disable()
            try:
                started = time.monotonic()
                recovered = await store.recover(now, config.retention)
                read = time.monotonic()
                # In a thread: restoring a large backlog takes seconds, during which the event
                # loop must go on renewing the store's lease (or lose leadership at once).
                core = await asyncio.to_thread(
                    self._restored, config, now, recovered, {}, set(), count_quarantined=True
                )
                if recovered.tasks and collecting:
                    GcTuning.freeze()
            finally:
                if collecting:
                    gc.enable()
            log.info("recovered %d tasks in %.3f s, restored in %.3f s", len(recovered.tasks), read - started,
                     time.monotonic() - read)  # fmt: skip
        self.core = core
        self.role = Role.LEADER
        self._gc_tuned = True
        GcTuning.acquire(self._options.gc_young_threshold)
        log.info("leading with epoch %d", epoch)
        loop = asyncio.get_running_loop()
        self._commit_task, self._lost_commit = None, False
        self._loop_task = loop.create_task(self._run(), name="cronoq-driver")
        if store is not None:
            self._helpers = [
                loop.create_task(self._notice_lost(store), name="cronoq-driver-lost"),
                loop.create_task(self._prune(store), name="cronoq-driver-prune"),
            ]
        self._wake.set()

    @property
    def leading(self) -> bool:
        return self.role is Role.LEADER

    def reconfigured(self, config: CoreConfig) -> None:
        """The running engine's pools changed (a pool joined or left it in a live move): rebuilds
        and the rest of this leadership use ``config``."""
        self._config = self._leading_config = config

    async def _notice_lost(self, store: Store) -> None:
        """An idle driver steps down as soon as the store reports lost leadership."""
        await store.lost.wait()
        commit = self._commit_task
        if commit is not None and not commit.done():
            self._lost_commit = True
            commit.cancel()
        self._poke()

    async def _prune(self, store: Store) -> None:
        """Delete finished rows older than ``keep_finished_s`` now and then (the id high-water
        mark survives, so ids are never reused)."""
        keep = self._options.keep_finished_s
        if keep is None:
            return
        while True:
            await asyncio.sleep(self._options.prune_interval_s)
            if self.role is not Role.LEADER:
                return
            try:
                removed = await store.prune(self._clock() - round(keep * NS_PER_S))
            except StoreError as error:
                log.warning("pruning finished tasks failed: %s", error)
                continue
            if removed:
                log.info("pruned %d finished tasks", removed)

    def _cancel_helpers(self) -> list[asyncio.Task[None]]:
        """Cancel the leader's helper tasks; the caller awaits their end (``_ended``)."""
        helpers, self._helpers = self._helpers, []
        current = asyncio.current_task()
        stopping = [task for task in helpers if task is not current]
        for task in stopping:
            task.cancel()
        return stopping

    async def wait_stepped_down(self) -> str:
        assert self._stepped_down is not None
        await self._stepped_down.wait()
        return self.stop_reason or "stopped"

    async def shutdown(self, grace: float) -> None:
        """Stop admitting, give running attempts ``grace`` seconds, abort the rest, step down."""
        if self.role is not Role.LEADER or self.core is None:
            self.role = Role.STOPPED
            return
        self._admitting = False
        self.role = Role.STOPPING
        core = self.core
        core.dispatch_enabled = False
        deadline = asyncio.get_running_loop().time() + grace
        while core.running and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        running = [Abort(lease_id, task_id, "shutting down") for lease_id, task_id in core.active_leases()]
        if running:
            self._sink.abort(running)
        await self._stop_loop("shutdown")
        if self._store is not None:
            with contextlib.suppress(StoreError):
                await self._store.release_leadership()

    async def _stop_loop(self, reason: str) -> None:
        """Ask the step loop to finish (its commit in flight is delivered first) and wait for it."""
        self.stop_reason = self.stop_reason or reason
        helpers = self._cancel_helpers()
        task = self._loop_task
        self._loop_task = None
        self._stop_requested = True
        self._poke()
        if task is not None and task is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await _ended(helpers)
        self._fail_queued(NotLeader(f"not the leader ({reason})"))
        self.role = Role.STOPPED
        self._untune_gc()
        if self._stepped_down is not None:
            self._stepped_down.set()

    def _untune_gc(self) -> None:
        if self._gc_tuned:
            self._gc_tuned = False
            GcTuning.release()

    def _fail_queued(self, error: Exception) -> None:
        queue = self._queue
        self._queue = []
        for _, future in queue:
            if future is not None and not future.done():
                future.set_exception(error)

    # ------------------------------------------------------------------------------------------
    # Commands

    def call(self, command: Command) -> asyncio.Future[Any]:
        """Queue a command; its future resolves with the result once the step is durable."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.role is not Role.LEADER:
            future.set_exception(NotLeader("not the leader (standby or shutting down)"))
            return future
        if not self._admitting:
            future.set_exception(ShuttingDown("the scheduler is shutting down"))
            return future
        self._queue.append((command, future))
        self._poke()
        return future

    def post(self, command: Command) -> None:
        """Queue a command nobody waits for (reports, heartbeats, capacity changes)."""
        if self.role is Role.LEADER or self.role is Role.STOPPING:
            self._queue.append((command, None))
            self._poke()

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None and not wake.is_set():
            wake.set()

    # ------------------------------------------------------------------------------------------
    # The step loop

    async def _run(self) -> None:
        """Step the engine until stopped; after an internal error, rebuild it from the store."""
        while True:
            try:
                await self._steps()
                return
            except Rebuild as request:
                if not await self._rebuild(request):
                    return

    async def _steps(self) -> None:
        """Step the engine. The commit of one step overlaps the engine work of the next: what a
        step produced is released (acks, dispatches, events) only once its own commit and every
        earlier one are durable, and commits happen strictly in step order."""
        assert self.core is not None and self._wake is not None
        core = self.core
        wake = self._wake
        clock = self._clock
        store = self._store
        lost = store.lost if store is not None else None
        # The store's optional hook to encode a step ahead of its commit (see Store.commit).
        prepare: Callable[[Sequence[Mutation]], None] | None = getattr(store, "prepare", None)
        inflight: _Step | None = None
        try:
            while True:
                if self._stop_requested:
                    if inflight is not None:
                        await self._release(inflight)
                        inflight = None
                    return
                if inflight is not None:
                    assert inflight.commit is not None
                    pending = not inflight.commit.done()
                    busy = len(inflight.mutations) >= PIPELINE_MIN_MUTATIONS
                    if pending and busy and not self._queue and not (lost is not None and lost.is_set()):
                        # Wait for whichever comes first: the commit (its completion pokes the
                        # loop), or a command to work on while it is in flight.
                        wake.clear()
                        await wake.wait()
                        continue
                    if not (pending and self._queue and (busy or len(self._queue) >= PIPELINE_MIN_COMMANDS)):
                        # Committed already, or little to do meanwhile: let commands accumulate
                        # while the commit finishes, so the next step (and its commit) carries more.
                        await self._release(inflight)
                        inflight = None
                        continue
                    # Otherwise step now, while the commit is in flight (released right after).
                if not self._queue:
                    wake.clear()
                    due = core.next_wakeup()
                    if due is None:
                        await wake.wait()
                    else:
                        delay = (due - clock()) / NS_PER_S
                        if delay > 0:
                            with contextlib.suppress(TimeoutError):
                                async with asyncio.timeout(delay):
                                    await wake.wait()
                        else:
                            await asyncio.sleep(0)  # due already: step, but never starve the loop
                    if self._stop_requested:
                        continue
                else:
                    # Back-to-back steps still give the event loop a turn (I/O, listeners, timers).
                    await asyncio.sleep(0)
                if lost is not None and lost.is_set():
                    if inflight is not None:
                        inflight.fail(NotLeader("not the leader (leadership lost)"))
                    await self._step_down("leadership lost")
                    return
                try:
                    step = self._step(core, clock())
                except Rebuild:
                    if inflight is not None:
                        await self._release(inflight)  # an earlier, sound step: deliver it first
                        inflight = None
                    raise
                if inflight is not None:
                    if step.mutations and prepare is not None:
                        prepare(step.mutations)  # encode it while the earlier commit is in flight
                    try:
                        await self._release(inflight)
                    except Rebuild as request:
                        # This step was computed on top of the refused one: it is void too.
                        step.fail(request.error)
                        raise
                    except _Fatal as fatal:
                        # Fenced or out of store time: this step will never be committed either,
                        # and its callers must hear so now (not when the listener closes).
                        step.fail(StoreUnavailable(str(fatal)) if fatal.unavailable else NotLeader(str(fatal)))
                        raise
                    inflight = None
                if step.mutations:
                    step.commit = asyncio.get_running_loop().create_task(self._commit(step.mutations))
                    self._commit_task = step.commit
                    step.commit.add_done_callback(self._committed)
                    inflight = step
                else:
                    self._deliver(step)
        except asyncio.CancelledError:
            if inflight is not None and inflight.commit is not None:
                inflight.commit.cancel()
                await _ended([inflight.commit])
            raise
        except _Fatal as fatal:
            if inflight is not None:
                inflight.fail(StoreUnavailable(str(fatal)) if fatal.unavailable else NotLeader(str(fatal)))
            await self._step_down(str(fatal))
        except Rebuild:
            if inflight is not None and inflight.commit is not None:
                inflight.commit.cancel()
                await _ended([inflight.commit])  # before the rebuild reads the store back
            raise
        except Exception as error:
            # The engine moved ahead of what the store holds: the only safe move is to stop.
            log.exception("engine step failed; stepping down")
            if inflight is not None:
                inflight.fail(NotLeader(f"not the leader (internal error: {error})"))
            await self._step_down("internal error")

    def _committed(self, _commit: asyncio.Task[None]) -> None:
        self._poke()  # the loop may be waiting for this commit or for a command, whichever first

    def _step(self, core: Core, now: int) -> _Step:
        """Apply every queued command, fire timers and dispatch: one engine step.

        A command refused by the engine (``EngineError``: admission errors, unknown tasks, ...)
        changed nothing; the caller gets the error. Any other exception is an internal error that
        may have left the engine half-updated (see ``_fault``).
        """
        batch = self._queue
        self._queue = []
        done: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        # The last task id before each command: the tasks a command created have the ids above
        # its mark (and up to the next one).
        marks: list[int] = []
        for index, (command, future) in enumerate(batch):
            last_id = core.last_id
            marks.append(last_id)
            try:
                result = command(core, now)
            except EngineError as refused:  # the caller's error; the engine is unchanged
                if future is not None:
                    done.append((future, None, refused))
                else:
                    log.warning("a posted command was refused: %s", refused)
                continue
            except Exception as error:
                self._fault(core, now, error, batch, index, last_id)
                if future is not None:
                    done.append((future, None, error))
                continue
            if future is not None:
                done.append((future, result, None))
        for _ in range(MAX_CONSECUTIVE_FAULTS):
            try:
                core.tick(now)
                break
            except Exception as error:
                self._fault(core, now, error, batch, creator(error, marks, core.last_id))
        else:
            raise _Fatal("repeated internal errors in the engine")
        self._consecutive_faults = 0
        if self._retried:
            self._retried.clear()
        return _Step(done, core.drain())

    def _fault(self, core: Core, now: int, error: Exception, batch: list[tuple[Command, asyncio.Future[Any] | None]],
               index: int | None, last_id: int | None = None) -> None:  # fmt: skip
        """Contain an internal error raised by ``batch[index]`` (``None``: by the timers and dispatch).

        The engine may be half-updated, so its culprit (the task or schedule an ``EngineFault``
        names) is taken out of play. With a store, the engine is rebuilt from the store with the
        culprit dead-lettered (``Rebuild``): the step's commands run again on the new engine,
        except the failing one, which runs again only once and only if the fault named a culprit.
        Without a store, the culprit is dead-lettered in place, with every task the failing command
        created (ids above ``last_id``: its caller gets the error, so none of them may run), and
        the engine goes on only if its invariants still hold. Returns normally only then.
        """
        self._note_fault(core, error, "in a command" if index is not None else "while firing timers or dispatching")
        self._consecutive_faults += 1
        if self._consecutive_faults > MAX_CONSECUTIVE_FAULTS:
            raise _Fatal("repeated internal errors in the engine") from error
        if self._store is not None:
            requeue = []
            for position, (command, future) in enumerate(batch):
                if position == index:
                    if not names_culprit(error) or id(command) in self._retried:
                        if future is not None and not future.done():
                            future.set_exception(error)
                        continue
                    self._retried[id(command)] = command
                requeue.append((command, future))
            raise Rebuild(error, requeue)
        try:
            message = culprit_message(error)
            if isinstance(error, EngineFault):
                if error.task_id is not None:
                    core.dead_letter(now, error.task_id, message)
                elif error.schedule is not None:
                    core.suspend_recurring(error.schedule)
            if last_id is not None:
                for task_id in range(last_id + 1, core.last_id + 1):
                    core.dead_letter(now, task_id, message)
            core.check_invariants()
        except Exception as broken:
            log.error("the engine is inconsistent after an internal error: %s", broken, exc_info=broken)
            raise _Fatal("the engine is inconsistent after an internal error") from broken

    def _note_fault(self, core: Core | None, error: BaseException, context: str) -> None:
        if core is not None:
            core.note_engine_errors(1)
        log.error("internal error in the engine %s: %s", context, error, exc_info=error)

    def _restored(self, config: CoreConfig, now: int, recovered: Recovered, dead: dict[int, str],
                  suspended: set[str], *, count_quarantined: bool) -> Core:  # fmt: skip
        """A fresh engine with ``recovered`` restored. A task (or schedule) whose restoring raises
        is dead-lettered (suspended) and the restore starts over without it, so one bad row never
        keeps the shard from leading."""
        faults = 0
        while True:
            core = Core(config, now=now)
            try:
                rejected = core.restore(now, recovered, dead=dead, suspended=suspended)
            except EngineFault as fault:
                faults += 1
                self._note_fault(None, fault, "while restoring")
                if fault.task_id is not None and fault.task_id not in dead:
                    dead[fault.task_id] = culprit_message(fault)
                elif fault.schedule is not None and fault.schedule not in suspended:
                    suspended.add(fault.schedule)
                else:
                    raise
                continue
            for task_id, message in rejected[:LOGGED_REJECTS]:
                log.error("recovered task %d dead-lettered: %s", task_id, message)
            if len(rejected) > LOGGED_REJECTS:
                log.error("%d more recovered tasks dead-lettered for values out of range",
                          len(rejected) - LOGGED_REJECTS)  # fmt: skip
            core.note_engine_errors(faults + (recovered.quarantined if count_quarantined else 0))
            return core

    async def _rebuild(self, request: Rebuild) -> bool:
        """Replace a possibly half-updated engine by one restored from the store, with the culprit
        of ``request`` dead-lettered, and queue the commands to run again. False if the driver
        stepped down instead (the store failed, or the new engine would not restore)."""
        old = self.core
        store = self._store
        assert old is not None and store is not None
        if self.pools_away:
            # Restoring the store now would find the rows of a pool the engine no longer runs and
            # end them as "no longer configured"; the next leadership resumes the move instead.
            await self._step_down(f"internal error while pools {sorted(self.pools_away)} are being handed over")
            return False
        running = [Abort(lease_id, task_id, "engine rebuilt after an internal error")
                   for lease_id, task_id in old.active_leases()]  # fmt: skip
        if running:
            self._sink.abort(running)  # the rebuilt engine counts these attempts as interrupted
        dead: dict[int, str] = {}
        suspended: set[str] = set()
        error = request.error
        if isinstance(error, EngineFault):
            if error.task_id is not None:
                dead[error.task_id] = culprit_message(error)
            elif error.schedule is not None:
                suspended.add(error.schedule)
        elif isinstance(error, Unstorable) and error.task_id is not None:
            dead[error.task_id] = culprit_message(error)
        now = self._clock()
        try:
            recovered = await store.recover(now, self._config.retention)
            # What ``recovered`` quarantined was counted when this leadership began.
            core = await asyncio.to_thread(
                self._restored, self._leading_config, now, recovered, dead, suspended, count_quarantined=False
            )
        except Exception as failure:
            log.error("rebuilding the engine failed: %s", failure, exc_info=failure)
            await self._step_down(f"rebuilding the engine after an internal error failed: {failure}")
            return False
        core.adopt(old, now)
        self.core = core
        self._queue[:0] = request.requeue
        log.warning("engine rebuilt from the store after an internal error; %d commands run again",
                    len(request.requeue))  # fmt: skip
        self._poke()
        return True

    async def _release(self, step: _Step) -> None:
        """Wait for a step's commit, then deliver what it produced."""
        assert step.commit is not None
        try:
            try:
                await step.commit
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if not self._lost_commit or (current is not None and current.cancelling()):
                    raise
                # ``_notice_lost`` cancelled a commit that hung past the lease (Postgres unreachable
                # with no reset): stop leading now, not when the commit gives up, so /readyz stops
                # sending clients here. Its outcome is unknown to the callers, as after a crash; a
                # newer epoch fences it if it ever reaches the database.
                raise _Fatal("leadership lost while a commit was in flight") from None
        except _Fatal as fatal:
            step.fail(StoreUnavailable(str(fatal)) if fatal.unavailable else NotLeader(str(fatal)))
            raise
        except (ValueError, TypeError) as refused:
            # The store could not encode the step: the engine holds what was never stored.
            self._note_fault(self.core, refused, "while storing a step")
            step.fail(refused)
            self._consecutive_faults += 1
            if self._consecutive_faults > MAX_CONSECUTIVE_FAULTS:
                raise _Fatal("repeated internal errors in the engine") from refused
            raise Rebuild(refused, []) from refused
        self._deliver(step)

    def _deliver(self, step: _Step) -> None:
        for future, result, error in step.done:
            if future.done():
                continue
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)
        if step.output:
            self._route(step.output)

    async def _commit(self, mutations: list[Mutation]) -> None:
        store = self._store
        assert store is not None and self.epoch is not None
        options = self._options
        backoff = options.commit_backoff_initial
        started = time.monotonic()
        while True:
            try:
                await store.commit(self.epoch, mutations)
                if time.monotonic() - started > 1.0:
                    log.warning("store reachable again after %.1fs", time.monotonic() - started)
                return
            except Fenced as fenced:
                if options.trouble is not None:
                    options.trouble.fenced_commits += 1
                raise _Fatal(f"fenced: {fenced}") from fenced
            except Unavailable as unavailable:
                if options.trouble is not None:
                    options.trouble.commit_errors += 1
                elapsed = time.monotonic() - started
                if elapsed >= options.max_store_outage:
                    raise _Fatal(f"store unavailable for {elapsed:.0f}s: {unavailable}", unavailable=True) from None
                if backoff == options.commit_backoff_initial:
                    log.warning("store unavailable, retrying the commit: %s", unavailable)
                await asyncio.sleep(min(backoff, options.max_store_outage - elapsed))
                backoff = min(backoff * 2, options.commit_backoff_max)

    def _route(self, output: StepOutput) -> None:
        sink = self._sink
        if output.aborts:
            sink.abort(output.aborts)
        if output.resolves:
            sink.resolve(output.resolves)
        if output.events:
            sink.publish(output.events)
        if output.scales:
            sink.scale(output.scales)
        if output.space:
            sink.space_available(output.space)
        if output.dispatches:
            sink.dispatch(output.dispatches)

    async def _step_down(self, reason: str) -> None:
        if self.role is Role.STOPPED:
            return
        log.warning("stepping down: %s", reason)
        self.stop_reason = reason
        helpers = self._cancel_helpers()
        core = self.core
        if core is not None:
            core.dispatch_enabled = False
            running = [Abort(lease_id, task_id, "leadership lost") for lease_id, task_id in core.active_leases()]
            if running:
                self._sink.abort(running)
        self._fail_queued(NotLeader(f"not the leader ({reason})"))
        self.role = Role.STOPPED
        self._untune_gc()
        self._loop_task = None
        if self._stepped_down is not None:
            self._stepped_down.set()
        if self.on_step_down is not None:
            self.on_step_down(reason)
        # Told at once, as above; the step loop (this task) ends only after its helpers.
        await _ended(helpers)


async def _ended(tasks: list[asyncio.Task[None]]) -> None:
    """Wait until each of the cancelled ``tasks`` has ended, so none outlives its driver's
    leadership (a task still pending when its loop closes is destroyed half-way)."""
    if tasks:
        await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.warning("driver task %s failed", task.get_name(), exc_info=task.exception())


class _Step:
    """What one engine step produced, held back until its commit is durable."""

    __slots__ = ("commit", "done", "mutations", "output")

    def __init__(self, done: list[tuple[asyncio.Future[Any], Any, BaseException | None]], output: StepOutput) -> None:
        self.done = done
        self.output = output
        self.mutations: list[Mutation] = output.mutations
        self.commit: asyncio.Task[None] | None = None

    def fail(self, error: Exception) -> None:
        for future, _, _ in self.done:
            if not future.done():
                future.set_exception(error)


class _Fatal(Exception):
    def __init__(self, message: str, unavailable: bool = False) -> None:
        super().__init__(message)
        self.unavailable = unavailable


def _with_epoch(config: CoreConfig, epoch: int, persist: bool) -> CoreConfig:
    from dataclasses import replace

    return replace(config, id_epoch=epoch & 0xFFFF, persist=persist)
