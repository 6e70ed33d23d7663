"""The embedded scheduler: the engine and its driver on the caller's asyncio loop.

Each attempt runs in its own asyncio task (a plain function runs in the loop's default thread
pool, awaited from such a task). Cancelling a task, a timeout or a lost lease cancels that
asyncio task. Reports of finished attempts are batched into one driver command per loop turn.

The ``Scheduler`` is here; its parts are beside it: ``_scheduler_attempts`` (``TaskContext``,
running an executor), ``_scheduler_results`` (``TaskHandle``, stored payloads and outputs),
``_scheduler_events`` (``StatusEvent``, ``EventStream``) and ``_scheduler_checks`` (arguments).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from cronoq.engine import (
    Abort,
    AdmissionError,
    CancelledByExecutor,
    ConfigError,
    Core,
    CoreConfig,
    Dispatch,
    EngineFault,
    Failure,
    Outcome,
    PoolConfig,
    RecurringSpec,
    Resolve,
    Scale,
    Snapshot,
    SubmitCode,
    Success,
    TaskStatus,
    UnknownTask,
)
from cronoq.engine import StatusEvent as EngineEvent
from cronoq.engine.types import NS_PER_S
from cronoq.shard.driver import Driver, NotLeader, ShuttingDown, StoreUnavailable
from cronoq.stores.base import Codec, JsonCodec, Store, Unstorable, json_bytes

from . import _otel
from ._keywords import keyword_signature, refuse_unknown
from ._options import (
    TASK_OPTIONS,
    Pool,
    PriorityLike,
    Resource,
    RetryPolicy,
    Task,
    TaskOptions,
    TaskRefLike,
    build_spec,
    plain_spec,
    seconds_to_ns,
)
from ._scheduler_attempts import (
    TaskContext,
    abort_attempt,
    invoke,
    is_async,
    lease_of,
    retry_after_ns,
    set_task,
    spawn,
)
from ._scheduler_checks import capacity_slots, check_ref, schedule_policies
from ._scheduler_events import EventHub, EventStream, StatusEvent
from ._scheduler_results import UNSTORED, Encoded, StoreCodec, TaskHandle, Unstored, fail
from .errors import (
    CronoqError,
    InvalidTaskOption,
    Permanent,
    Retryable,
    SchedulerError,
    SubmitError,
    TaskFailed,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger("cronoq")

OUTPUT_CACHE = 1024
"""Outputs of recently finished tasks kept in memory for late handles (``handle()``, duplicates)."""

SHUTDOWN_SETTLE = 0.1
"""After shutdown cancels the attempts still running, how long it lets them unwind."""

_FULL = SubmitCode.FULL.value


class Scheduler:
    """The embedded scheduler: pools of executors on the asyncio loop that starts it.

    Use ``async with Scheduler(pools) as sched:`` (or ``await start()`` and ``await
    shutdown()``). Calls before ``start()`` raise ``RuntimeError``; calls after shutdown, or after
    the loop closed, raise ``SchedulerError``. With a ``store`` (``SqliteStore``), submissions
    return once stored, and queued work, schedules and results survive restarts; payloads and
    results are then encoded with ``codec`` (JSON by default).
    """

    def __init__(
        self,
        pools: Sequence[Pool],
        resources: Sequence[Resource] | None = None,
        emit_transitions: bool = False,
        *,
        shutdown_grace: float = 5.0,
        event_capacity: int = 1024,
        store: Store | None = None,
        codec: Codec | Any = None,
    ) -> None:
        pools = list(pools)
        if not pools:
            raise SchedulerError("a scheduler needs at least one pool")
        for pool in pools:
            if not isinstance(pool, Pool):
                raise TypeError("pools must be cronoq.Pool objects")
        self._pools = {pool.name: pool for pool in pools}
        if len(self._pools) != len(pools):
            raise SchedulerError("pool names must be unique")
        self._executors: dict[str, tuple[Callable[..., Any], bool]] = {
            pool.name: (pool.executor, is_async(pool.executor)) for pool in pools
        }
        configs: tuple[PoolConfig, ...] = tuple(pool.to_engine() for pool in pools)
        resources = list(resources or ())
        for resource in resources:
            if not isinstance(resource, Resource):
                raise TypeError("resources must be cronoq.Resource objects")
        self._config = CoreConfig(
            pools=configs,
            resources=tuple(r.to_engine() for r in resources),
            emit_transitions=bool(emit_transitions),
            seed=time.time_ns() & 0xFFFFFFFF,
        )
        try:
            self._config.validate()
        except ConfigError as err:
            raise SchedulerError(str(err)) from None
        self._shutdown_grace = seconds_to_ns(shutdown_grace, "shutdown_grace") / NS_PER_S
        if isinstance(event_capacity, bool) or not isinstance(event_capacity, int) or event_capacity < 1:
            raise ValueError("event_capacity must be a positive int")
        self._event_capacity = event_capacity
        if codec is not None and not all(callable(getattr(codec, name, None)) for name in ("encode", "decode")):
            raise TypeError("codec must have encode(obj) -> bytes and decode(bytes) methods")
        self._store = store
        self._codec: Codec = codec if codec is not None else JsonCodec()
        # The default codec's function called directly (one call less per payload and output).
        self._encode: Callable[[Any], bytes] = json_bytes if type(self._codec) is JsonCodec else self._codec.encode
        # What a finished attempt that returned None reports, built once: executors with nothing
        # to return are the common case. None when a custom codec must encode each None itself.
        self._none_success: Success | None = None
        if store is None:
            self._none_success = Success(None)
        elif type(self._codec) is JsonCodec:
            self._none_success = Success(Encoded(None, json_bytes(None)))
        if store is not None and hasattr(store, "codec"):
            store.codec = StoreCodec(self._codec)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._driver: Driver | None = None
        self._handles: dict[int, list[asyncio.Future[Any]]] = {}
        self._outputs: OrderedDict[int, Any] = OrderedDict()
        self._running: dict[int, TaskContext] = {}  # by lease id
        self._events = EventHub()
        self._space_generation = 0
        self._space_waiters: list[asyncio.Future[None]] = []
        self._done: list[tuple[int, Outcome]] = []
        self._unwinding: list[asyncio.Task[None]] = []  # attempts aborted by shutdown, still unwinding
        self._closing = False  # no new calls (shutdown in progress or done, or the driver stopped)
        self._stopped = False  # the driver stopped: nothing runs any more
        self._shut_down = False  # shutdown() was called
        self._ready = False  # start() completed: this scheduler leads (its store)
        self._otel = _otel.instruments()
        # Submitters' trace context is captured only when an OpenTelemetry SDK is installed
        # (without one no span can be recording, and the lookup costs on every submission).
        self._tracing = self._otel is not None

    # ------------------------------------------------------------------------------------------
    # Properties and lifecycle

    @property
    def started(self) -> bool:
        """Whether the scheduler is running (started, and neither shut down nor orphaned)."""
        driver = self._driver
        loop = self._loop
        return driver is not None and driver.leading and not self._closing and loop is not None and not loop.is_closed()

    @property
    def pools(self) -> list[str]:
        """The names of the pools, in the order given."""
        return list(self._pools)

    @property
    def default_pool(self) -> str:
        """Where tasks without ``pool=`` go: the pool named "default", else the first."""
        return "default" if "default" in self._pools else next(iter(self._pools))

    async def start(self) -> None:
        """Start on the running loop. With a store, first wait until this process leads it."""
        if self._closing:
            raise SchedulerError("the scheduler was shut down or stopped; create a new one")
        if self._driver is not None:
            raise SchedulerError("the scheduler was already started")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        driver = Driver(self._config, _Sink(self), store=self._store)
        self._driver = driver
        try:
            await driver.lead()
        except BaseException:
            self._driver = None
            raise
        driver.on_step_down = self._on_step_down
        self._ready = True

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop admitting work, let running attempts finish for up to ``grace`` seconds, then
        cancel the rest. Queued tasks are not started (with a store they stay queued for the next
        scheduler); handles of unfinished tasks raise ``TaskFailed(status="shutdown")``."""
        if self._shut_down:
            return
        grace = seconds_to_ns(grace, "grace") / NS_PER_S
        self._shut_down = True
        self._closing = True
        driver = self._driver
        if driver is None:
            self._stopped = True
            return
        try:
            if not self._stopped:
                await driver.shutdown(grace)
        except Exception as err:  # a store that failed on the way out must not block shutdown
            log.warning("the scheduler did not stop cleanly: %s", err)
        finally:
            await self._stop()
        if self._store is not None:
            try:
                await self._store.close()
            except Exception as err:
                log.warning("closing the store failed: %s", err)

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *args: object) -> None:
        await self.shutdown(self._shutdown_grace)

    async def _stop(self) -> None:
        cancelled = self._stop_now()
        if cancelled:
            # Let cancelled executors unwind (an executor that ignores cancellation is left alone).
            await asyncio.wait(cancelled, timeout=SHUTDOWN_SETTLE)

    def _stop_now(self) -> list[asyncio.Task[None]]:
        self._closing = True
        self._stopped = True
        self._done.clear()
        cancelled = self._cancel_all_attempts() + [task for task in self._unwinding if not task.done()]
        self._unwinding = []
        self._fail_all_handles()
        self._events.end_all()
        self._wake_space_waiters()
        return cancelled

    def _on_step_down(self, reason: str) -> None:
        log.warning("scheduler stopped: %s", reason)
        self._stop_now()

    def _cancel_all_attempts(self) -> list[asyncio.Task[None]]:
        cancelled = []
        for ctx in list(self._running.values()):
            task = abort_attempt(ctx)
            if task is not None:
                task.cancel()
                cancelled.append(task)
        self._running.clear()
        return cancelled

    def _fail_all_handles(self) -> None:
        handles = self._handles
        self._handles = {}
        for task_id, futures in handles.items():
            for future in futures:
                fail(future, TaskFailed("shutdown", "the scheduler stopped first", task_id))

    def _driver_or_raise(self) -> Driver:
        driver = self._driver
        if self._closing:
            raise SchedulerError("the scheduler is shut down")
        if driver is None or not self._ready:
            raise RuntimeError("the scheduler has not been started (await sched.start() or use async with)")
        loop = self._loop
        if loop is None or loop.is_closed():
            raise SchedulerError("the scheduler's event loop is closed")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not loop:
            raise SchedulerError("the scheduler belongs to the event loop that started it")
        return driver

    async def _call(self, command: Callable[[Core, int], Any]) -> Any:
        driver = self._driver_or_raise()
        try:
            return await driver.call(command)
        except AdmissionError as err:
            raise SubmitError(err.code.value, err.message if err.index is None else str(err)) from None
        except (NotLeader, ShuttingDown, StoreUnavailable) as err:
            raise SchedulerError(str(err)) from None
        except ConfigError as err:
            raise SchedulerError(str(err)) from None
        except (EngineFault, Unstorable) as err:
            raise SchedulerError(f"internal error (logged; the scheduler goes on): {err}") from None

    def _post(self, command: Callable[[Core, int], Any]) -> None:
        # Also while shutting down: completions during the grace period must reach the engine.
        driver = self._driver
        if driver is not None and not self._stopped:
            driver.post(command)

    def _post_threadsafe(self, command: Callable[[Core, int], Any]) -> None:
        """``_post`` from any thread (sync executors run in the default thread pool)."""
        if threading.get_ident() == self._loop_thread:
            self._post(command)
            return
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._post, command)

    # ------------------------------------------------------------------------------------------
    # Submission

    def _check_payload(self, payload: Any) -> Any:
        """With a store, encode now: what it cannot hold is refused (TypeError) before anything
        is stored, and the bytes travel with the task so the store does not encode again."""
        if self._store is None:
            return payload
        return Encoded(payload, self._encode(payload))

    @keyword_signature(TaskOptions)
    async def submit(self, payload: Any, **options: Unpack[TaskOptions]) -> TaskHandle:
        """Submit a task; returns a handle to await its result once the task is admitted.

        Options: ``priority`` ("critical", "high", "normal" (default), "low", an index or
        ``Priority``), ``pool`` (default: ``default_pool``), ``kind`` (for metrics and duration
        learning), ``key`` (idempotent submission; a known key returns that task with
        ``handle.duplicate``), ``deadline_in``/``deadline_at``, ``start_in``/``start_at`` with
        ``tolerance`` and ``on_miss`` (fixed starts), ``duration_hint``, ``timeout`` (per attempt),
        ``retry``, ``after``/``deps`` (dependencies by id or key), ``resources``, ``tags``
        (strings, passed to the executor), ``labels`` (required capacity-group labels) and
        ``tenant`` (fair sharing). Durations are seconds; absolute times are aware datetimes or
        Unix seconds. Bad values raise ``ValueError``; rejections raise ``SubmitError``; with a
        pool's ``overflow="wait"`` a full pool makes this wait for room instead.
        """
        if options:
            refuse_unknown(options, TASK_OPTIONS, "Scheduler.submit")
        self._driver_or_raise()
        loop = self._loop
        stored = self._check_payload(payload)
        spec = build_spec(payload, time.time_ns(), trace=self._tracing, **options)
        spec.payload = stored
        assert loop is not None
        future: asyncio.Future[Any] = loop.create_future()

        def command(core: Core, now: int) -> _Attached:
            submitted = core.submit(now, spec)
            return self._attach(core, submitted.id, submitted.duplicate, future)

        attached: _Attached = await self._admit(command)
        return await self._handle_for(attached, future)

    @keyword_signature(TaskOptions)
    async def enqueue(self, payload: Any, **options: Unpack[TaskOptions]) -> int:
        """Submit a task without a handle (cheaper than ``submit``); returns its id."""
        if options:
            refuse_unknown(options, TASK_OPTIONS, "Scheduler.enqueue")
        self._driver_or_raise()
        stored = self._check_payload(payload)
        spec = build_spec(payload, time.time_ns(), trace=self._tracing, **options)
        spec.payload = stored
        result: int = await self._admit(lambda core, now: core.submit(now, spec).id)
        return result

    async def submit_batch(self, tasks: Sequence[Task]) -> list[TaskHandle]:
        """Admit every task or none; a rejection's message names the offending index.

        Tasks may refer to each other's keys (``after=``, ``deps=``) in any order.
        """
        self._driver_or_raise()
        now = time.time_ns()
        tracing = self._tracing
        check_payload = self._check_payload
        specs = []
        for index, task in enumerate(tasks):
            if not isinstance(task, Task):
                raise TypeError(f"task {index}: submit_batch takes cronoq.Task objects")
            try:
                stored = check_payload(task.payload)
                if task.bare:  # a bare payload: nothing to validate or convert
                    spec = plain_spec(stored, tracing)
                else:
                    spec = task.to_spec(now, trace=tracing)
                    spec.payload = stored
                specs.append(spec)
            except InvalidTaskOption as err:
                raise InvalidTaskOption(f"task {index}: {err.message}") from None
            except TypeError as err:
                raise TypeError(f"task {index}: {err}") from None
        loop = self._loop
        assert loop is not None
        futures = [loop.create_future() for _ in specs]

        def command(core: Core, now: int) -> list[_Attached]:
            results = core.submit_batch(now, specs)
            attach = self._attach
            return [attach(core, r.id, r.duplicate, f) for r, f in zip(results, futures, strict=True)]

        outcomes: list[_Attached] = await self._admit(command)
        handles = []
        for attached, future in zip(outcomes, futures, strict=True):
            if attached[2] is None:  # still live: no output to look up, so no coroutine needed
                handles.append(TaskHandle(self._post, attached[0], attached[1], future))
            else:
                handles.append(await self._handle_for(attached, future))
        return handles

    async def _admit(self, command: Callable[[Core, int], Any]) -> Any:
        """Run a submission; when a pool with overflow 'wait' is full, wait for room and retry."""
        while True:
            generation = self._space_generation
            try:
                return await self._call(command)
            except SubmitError as err:
                if err.code != _FULL:
                    raise
            if generation == self._space_generation:  # no room was made since the attempt
                loop = self._loop
                assert loop is not None
                waiter: asyncio.Future[None] = loop.create_future()
                self._space_waiters.append(waiter)
                await waiter

    def _wake_space_waiters(self) -> None:
        self._space_generation += 1
        waiters = self._space_waiters
        self._space_waiters = []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _attach(self, core: Core, task_id: int, duplicate: bool, future: asyncio.Future[Any]) -> _Attached:
        """Inside the step: register the handle's future, or report how the task already ended."""
        ended = core.ended(task_id)
        if ended is not None:
            return task_id, duplicate, ended[0], ended[1]
        self._handles.setdefault(task_id, []).append(future)
        return task_id, duplicate, None, None

    async def _handle_for(self, attached: _Attached, future: asyncio.Future[Any]) -> TaskHandle:
        task_id, duplicate, status, message = attached
        if status is not None and not future.done():
            if status is not TaskStatus.SUCCEEDED:
                fail(future, TaskFailed(status.value, message or status.value, task_id))
            else:
                found, output = await self._load_output(task_id)
                if found:
                    future.set_result(output)
                else:
                    gone = "the task succeeded but its output is no longer kept"
                    fail(future, TaskFailed("succeeded", gone, task_id))
        return TaskHandle(self._post, task_id, duplicate, future)

    async def _load_output(self, task_id: int) -> tuple[bool, Any]:
        if task_id in self._outputs:
            return True, self._outputs[task_id]
        if self._store is not None:
            try:
                found, output = await self._store.load_output(task_id)
            except Exception as err:  # a corrupt or unreachable row: the result is unavailable
                log.warning("could not load the output of task %d: %s", task_id, err)
                return False, None
            if found and output is not UNSTORED:
                return True, output
        return False, None

    # ------------------------------------------------------------------------------------------
    # Lookups and control

    async def cancel(self, target: TaskRefLike) -> bool:
        """Cancel a task by id or key. False when it already finished or is unknown.

        A queued task is removed; a running attempt's asyncio task is cancelled.
        """
        check_ref(target)
        try:
            result: bool = await self._call(lambda core, now: core.cancel(now, target))
        except UnknownTask:
            return False
        return result

    async def status(self, target: TaskRefLike) -> str | None:
        """The status of a task by id or key (``"ready"``, ``"succeeded"``, ...), None if unknown."""
        check_ref(target)
        info = await self._call(lambda core, now: core.get(target))
        return info.status.value if info is not None else None

    async def handle(self, target: TaskRefLike) -> TaskHandle | None:
        """A handle to an existing task by id or key: live, finished within the retention window,
        or (with a store) finished before a restart. None when no such task is known."""
        check_ref(target)
        self._driver_or_raise()
        loop = self._loop
        assert loop is not None
        future: asyncio.Future[Any] = loop.create_future()

        def command(core: Core, now: int) -> _Attached | None:
            info = core.get(target)
            if info is None:
                return None
            return self._attach(core, info.id, True, future)

        attached: _Attached | None = await self._call(command)
        if attached is None:
            return None
        return await self._handle_for(attached, future)

    async def snapshot(self) -> Snapshot:
        """Per-pool capacity, queues and quality signals, plus totals since start."""
        result: Snapshot = await self._call(lambda core, now: core.snapshot(now))
        return result

    async def set_capacity(self, pool: str, capacity: int) -> None:
        """Set a pool's (unlabelled) capacity. An autoscaled pool's autoscaler may change it again.
        ``ValueError`` for a capacity below 0 (or not below 2**32)."""
        slots = capacity_slots(capacity)
        await self._call(lambda core, now: core.set_capacity(now, pool, slots))

    async def set_group_capacity(self, pool: str, labels: Mapping[str, str], capacity: int) -> None:
        """Set the capacity of a pool's slots that carry ``labels``; tasks submitted with
        ``labels=`` run only on groups that have them (``ctx.group`` says which)."""
        labels = {str(k): str(v) for k, v in labels.items()}
        slots = capacity_slots(capacity)
        await self._call(lambda core, now: core.set_group_capacity(now, pool, labels, slots))

    async def add_recurring(
        self,
        name: str,
        cron: str,
        payload: Any,
        *,
        tz: str | None = None,
        overlap: Literal["skip", "allow", "queue", "queue_on_success"] = "skip",
        tolerance: float = 1.0,
        on_miss: Literal["run_late", "skip", "fail"] = "run_late",
        priority: PriorityLike | None = None,
        pool: str | None = None,
        kind: str | None = None,
        key: str | None = None,
        deadline_in: float | None = None,
        duration_hint: float | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        resources: Mapping[str, int] | None = None,
        tags: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        tenant: str | None = None,
    ) -> None:
        """Add, or replace by name, a cron schedule (5 or 6 fields, optional IANA ``tz``).

        Each occurrence is a fixed-start task built from the options, tagged
        ``cronoq.recurring=<name>``, with key ``<key>@<start>`` when ``key`` is given. A bad option
        value (an unknown ``overlap`` or ``on_miss``, a negative duration, ...) raises
        ``ValueError``; an expression, zone or template the scheduler cannot use raises
        ``SchedulerError``.
        """
        self._driver_or_raise()
        overlap_policy, miss = schedule_policies(name, cron, tz, overlap, on_miss)
        stored = self._check_payload(payload)
        template = build_spec(
            payload, 0, priority=priority, pool=pool, kind=kind, key=key, duration_hint=duration_hint,
            timeout=timeout, retry=retry, resources=resources, tags=tags, labels=labels, tenant=tenant,
            trace=False,
        )  # fmt: skip
        template.payload = stored
        spec = RecurringSpec(
            name=name,
            cron=cron,
            template=template,
            tz=tz,
            overlap=overlap_policy,
            tolerance=seconds_to_ns(tolerance, "tolerance"),
            on_miss=miss,
            deadline_after=seconds_to_ns(deadline_in, "deadline_in") if deadline_in is not None else None,
        )
        try:
            await self._call(lambda core, now: core.add_recurring(now, spec))
        except SubmitError as err:
            raise SchedulerError(str(err)) from None

    async def remove_recurring(self, name: str) -> bool:
        """Remove a schedule; False if there was none by that name."""
        result: bool = await self._call(lambda core, now: core.remove_recurring(now, name))
        return result

    def events(self, on_lag: Literal["skip", "raise"] = "skip") -> EventStream:
        """A new stream of status events: terminal ones, and every transition with
        ``emit_transitions=True``. See ``EventStream``."""
        self._driver_or_raise()
        return self._events.open(self._event_capacity, on_lag)

    # ------------------------------------------------------------------------------------------
    # Running attempts (started by the sink after a driver step)

    def _start_attempts(self, leases: Sequence[Dispatch]) -> None:
        loop = self._loop
        assert loop is not None
        running = self._running
        executors = self._executors
        attempt = self._attempt
        for lease in leases:
            executor, is_async = executors[lease.pool]
            ctx = TaskContext(self._post_threadsafe, lease)
            running[lease.id] = ctx
            # Set after the spawn: an eager start may already have finished (and forgotten) it.
            set_task(ctx, spawn(loop, attempt(ctx, executor, is_async)))

    async def _attempt(self, ctx: TaskContext, executor: Callable[..., Any], is_async: bool) -> None:
        lease = lease_of(ctx)
        payload = lease.payload
        if type(payload) is Encoded:
            payload = payload.value
        otel = self._otel
        try:
            if otel is None:
                if is_async:  # awaited right here: one coroutine less per attempt than _invoke
                    result = await executor(ctx, payload)
                else:
                    result = await invoke(executor, False, ctx, payload)
            else:
                with otel.attempt_span(lease):
                    result = await invoke(executor, is_async, ctx, payload)
        except BaseException as error:
            self._failed(lease.id, error)
            return
        self._finished(lease.id, result)

    def _finished(self, lease_id: int, output: Any) -> None:
        ctx = self._running.pop(lease_id, None)
        if ctx is None or ctx.is_cancelled():
            return  # aborted (timeout, cancellation, lost lease): the engine already moved on
        if output is None and self._none_success is not None:
            self._report(lease_id, self._none_success)
            return
        if self._store is not None:
            try:
                output = Encoded(output, self._encode(output))
            except Exception as err:
                log.warning("the result of task %d cannot be stored (%s); it is not kept across restarts", ctx.id, err)
                output = Unstored(output)
        self._report(lease_id, Success(output))

    def _failed(self, lease_id: int, error: BaseException) -> None:
        ctx = self._running.pop(lease_id, None)
        if ctx is None or ctx.is_cancelled():
            if isinstance(error, KeyboardInterrupt | SystemExit):
                raise error
            return
        if isinstance(error, Retryable):
            outcome: Outcome = Failure(str(error), False, retry_after_ns(error.retry_after))
        elif isinstance(error, Permanent):
            outcome = Failure(str(error) or "permanent failure", True)
        elif isinstance(error, asyncio.CancelledError):
            outcome = CancelledByExecutor("the executor cancelled itself")
        elif isinstance(error, KeyboardInterrupt | SystemExit):
            self._report(lease_id, Failure(f"{type(error).__name__}", False))
            raise error
        else:
            outcome = Failure(f"{type(error).__name__}: {error}", False)
        self._report(lease_id, outcome)

    def _report(self, lease_id: int, outcome: Outcome) -> None:
        done = self._done
        done.append((lease_id, outcome))
        if len(done) == 1:
            self._post(self._apply_reports)

    def _apply_reports(self, core: Core, now: int) -> None:
        done = self._done
        self._done = []
        core.complete_many(now, done)

    # Sink callbacks -------------------------------------------------------------------------------

    def _abort(self, aborts: Sequence[Abort]) -> None:
        for abort in aborts:
            ctx = self._running.pop(abort.lease_id, None)
            if ctx is None:
                continue
            task = abort_attempt(ctx)
            if task is not None:
                task.cancel()
                if self._closing:
                    self._unwinding.append(task)

    def _resolve(self, results: Sequence[Resolve]) -> None:
        outputs = self._outputs
        handles = self._handles
        events = self._events
        otel = self._otel
        for result in results:
            output = result.output
            if type(output) is Encoded or type(output) is Unstored:
                output = output.value
            if result.has_output:
                outputs[result.id] = output
                if len(outputs) > OUTPUT_CACHE:
                    outputs.popitem(last=False)
            if handles:
                futures = handles.pop(result.id, None)
                if futures:
                    succeeded = result.status is TaskStatus.SUCCEEDED
                    for future in futures:
                        if future.done():
                            continue
                        if succeeded:
                            future.set_result(output)
                        else:
                            fail(
                                future,
                                TaskFailed(result.status.value, result.message or result.status.value, result.id),
                            )
            if events:
                events.publish(result)
            if otel is not None:
                otel.task_finished(result)

    def _publish(self, events: Sequence[EngineEvent]) -> None:
        hub = self._events
        if not hub:
            return
        for event in events:
            hub.publish(event)

    def _scale(self, scales: Sequence[Scale]) -> None:
        # In-process pools: capacity follows the autoscaler at once.
        for scale in scales:
            self._post(functools.partial(_apply_capacity, scale.pool, scale.desired))

    def _space_available(self, pools: Sequence[str | None]) -> None:
        self._wake_space_waiters()


_Attached = tuple[int, bool, TaskStatus | None, str | None]
"""(task id, duplicate, terminal status or None while live, final message)."""


class _Sink:
    """Adapts the driver's sink interface to the scheduler."""

    __slots__ = ("abort", "dispatch", "publish", "resolve", "scale", "space_available")

    def __init__(self, sched: Scheduler) -> None:
        self.dispatch = sched._start_attempts
        self.abort = sched._abort
        self.resolve = sched._resolve
        self.publish = sched._publish
        self.scale = sched._scale
        self.space_available = sched._space_available


def _apply_capacity(pool: str, desired: int, core: Core, now: int) -> None:
    core.set_capacity(now, pool, desired)


__all__ = ["CronoqError", "EventStream", "Scheduler", "StatusEvent", "TaskContext", "TaskHandle"]
