"""The embedded scheduler: the engine and its driver on the caller's asyncio loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cronoq.engine import (
    Abort,
    AdmissionError,
    CancelledByExecutor,
    ConfigError,
    Core,
    CoreConfig,
    Dispatch,
    Failure,
    Outcome,
    OverlapPolicy,
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
from cronoq.engine.types import NS_PER_S, MissPolicy
from cronoq.shard.driver import Driver, NotLeader, ShuttingDown, StoreUnavailable
from cronoq.stores.base import Codec, JsonCodec, Store

from . import _otel
from ._options import (
    Pool,
    PriorityLike,
    Resource,
    RetryPolicy,
    Task,
    TaskRefLike,
    build_spec,
    seconds_to_ns,
)
from .errors import CronoqError, EventsLagged, Permanent, Retryable, SchedulerError, SubmitError, TaskFailed

log = logging.getLogger("cronoq")

OUTPUT_CACHE = 1024


@dataclass(frozen=True, slots=True)
class StatusEvent:
    """A task changed status. ``at`` is Unix seconds."""

    id: int
    pool: str
    key: str | None
    status: str
    attempt: int
    at: float
    message: str | None


def _public_event(event: EngineEvent | Resolve) -> StatusEvent:
    return StatusEvent(
        event.id, event.pool, event.key, event.status.value, event.attempt, event.at / NS_PER_S, event.message
    )


class EventStream:
    """Status events as they happen. A consumer that falls behind loses the oldest events."""

    def __init__(self, capacity: int, on_lag: Literal["skip", "raise"], unregister: Callable[[EventStream], None]):
        if on_lag not in ("skip", "raise"):
            raise ValueError("on_lag must be 'skip' or 'raise'")
        self._buffer: deque[StatusEvent] = deque()
        self._capacity = max(1, capacity)
        self._on_lag = on_lag
        self._lagged = 0
        self._unreported = 0
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._unregister = unregister

    @property
    def lagged(self) -> int:
        """Events dropped because this stream's buffer was full."""
        return self._lagged

    @property
    def closed(self) -> bool:
        return self._closed

    def _push(self, event: StatusEvent) -> None:
        if self._closed:
            return
        buffer = self._buffer
        if len(buffer) >= self._capacity:
            buffer.popleft()
            self._lagged += 1
            self._unreported += 1
        buffer.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _end(self) -> None:
        self._closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> StatusEvent:
        while True:
            if self._on_lag == "raise" and self._unreported:
                skipped, self._unreported = self._unreported, 0
                raise EventsLagged(skipped)
            if self._buffer:
                return self._buffer.popleft()
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def close(self) -> None:
        if not self._closed:
            self._end()
            self._unregister(self)

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *args: object) -> None:
        self.close()


class TaskContext:
    """What an executor knows about the attempt it runs."""

    __slots__ = (
        "_cancelled",
        "_deadline",
        "_lease_id",
        "_sched",
        "attempt",
        "group",
        "id",
        "key",
        "kind",
        "pool",
        "tags",
        "timeout",
    )

    def __init__(self, sched: Scheduler, lease: Dispatch) -> None:
        self._sched = sched
        self._lease_id = lease.id
        self.id = lease.task_id
        self.attempt = lease.attempt
        self.kind = lease.kind
        self.key = lease.key
        self.pool = lease.pool
        self.tags: dict[str, str] = dict(lease.tags)
        self.group: dict[str, str] = dict(lease.group)
        self.timeout = lease.timeout / NS_PER_S if lease.timeout is not None else None
        self._deadline = lease.deadline
        self._cancelled = False

    @property
    def deadline(self) -> float | None:
        """The task's deadline as Unix seconds, if it has one."""
        return self._deadline / NS_PER_S if self._deadline is not None else None

    def is_cancelled(self) -> bool:
        return self._cancelled

    def heartbeat(self) -> None:
        """Keep this attempt's lease alive (pools with a lease_ttl)."""
        lease_id = self._lease_id
        self._sched._post(lambda core, now: core.heartbeat(now, lease_id))

    def __repr__(self) -> str:
        return f"TaskContext(id={self.id}, attempt={self.attempt}, pool={self.pool!r}, kind={self.kind!r})"


class TaskHandle:
    """A submitted task. Await it for the executor's return value (or TaskFailed)."""

    __slots__ = ("_future", "_sched", "duplicate", "id")

    def __init__(self, sched: Scheduler, task_id: int, duplicate: bool, future: asyncio.Future[Any]) -> None:
        self._sched = sched
        self.id = task_id
        self.duplicate = duplicate
        self._future = future

    def __await__(self) -> Generator[Any, None, Any]:
        return asyncio.shield(self._future).__await__()

    def result(self) -> Awaitable[Any]:
        return asyncio.shield(self._future)

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> None:
        """Cancel the task (not just this handle)."""
        if not self._future.done():
            task_id = self.id
            self._sched._post(lambda core, now: core.cancel(now, task_id))

    def __repr__(self) -> str:
        return f"TaskHandle(id={self.id}, duplicate={self.duplicate}, done={self.done()})"


def _failed(resolve: Resolve) -> TaskFailed:
    return TaskFailed(resolve.status.value, resolve.message or resolve.status.value, resolve.id)


class Scheduler:
    """The embedded scheduler. Use ``async with Scheduler(pools) as sched:`` on one event loop."""

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
            pool.name: (pool.executor, _is_async(pool.executor)) for pool in pools
        }
        configs: tuple[PoolConfig, ...] = tuple(pool.to_engine() for pool in pools)
        self._config = CoreConfig(
            pools=configs,
            resources=tuple(r.to_engine() for r in (resources or ())),
            emit_transitions=bool(emit_transitions),
            seed=time.time_ns() & 0xFFFFFFFF,
        )
        try:
            self._config.validate()
        except ConfigError as err:
            raise SchedulerError(str(err)) from None
        self._shutdown_grace = float(shutdown_grace)
        self._event_capacity = int(event_capacity)
        self._store = store
        self._codec: Codec = codec if codec is not None else JsonCodec()
        if store is not None and hasattr(store, "codec"):
            store.codec = self._codec
        self._loop: asyncio.AbstractEventLoop | None = None
        self._driver: Driver | None = None
        self._handles: dict[int, list[asyncio.Future[Any]]] = {}
        self._outputs: OrderedDict[int, Any] = OrderedDict()
        self._running: dict[int, tuple[TaskContext, asyncio.Task[Any] | None]] = {}
        self._streams: set[EventStream] = set()
        self._space: dict[str | None, asyncio.Event] = {}
        self._done: list[tuple[int, Outcome]] = []
        self._stopped = False
        self._otel = _otel.instruments()

    # ------------------------------------------------------------------------------------------
    # Properties and lifecycle

    @property
    def started(self) -> bool:
        return self._driver is not None and not self._stopped

    @property
    def pools(self) -> list[str]:
        return list(self._pools)

    @property
    def default_pool(self) -> str:
        return "default" if "default" in self._pools else next(iter(self._pools))

    async def start(self) -> None:
        """Start on the running loop. With a store, waits until this process leads it."""
        if self._driver is not None:
            raise SchedulerError("the scheduler was already started")
        self._loop = asyncio.get_running_loop()
        driver = Driver(self._config, _Sink(self), store=self._store)
        self._driver = driver
        try:
            await driver.lead()
        except BaseException:
            self._driver = None
            raise
        driver.on_step_down = self._on_step_down

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop admitting, let running attempts finish for ``grace`` seconds, then cancel the rest."""
        if self._stopped or self._driver is None:
            self._stopped = True
            return
        self._stopped = True
        driver = self._driver
        with contextlib.suppress(Exception):
            await driver.shutdown(grace)
        self._cancel_all_attempts()
        self._fail_all_handles()
        for stream in list(self._streams):
            stream._end()
        self._streams.clear()
        if self._store is not None:
            with contextlib.suppress(Exception):
                await self._store.close()

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *args: object) -> None:
        await self.shutdown(self._shutdown_grace)

    def _on_step_down(self, reason: str) -> None:
        log.warning("scheduler stopped: %s", reason)
        self._stopped = True
        self._cancel_all_attempts()
        self._fail_all_handles()
        for stream in list(self._streams):
            stream._end()

    def _cancel_all_attempts(self) -> None:
        for ctx, task in list(self._running.values()):
            ctx._cancelled = True
            if task is not None and not task.done():
                task.cancel()
        self._running.clear()

    def _fail_all_handles(self) -> None:
        handles = self._handles
        self._handles = {}
        for task_id, futures in handles.items():
            for future in futures:
                if not future.done():
                    future.set_exception(TaskFailed("shutdown", "the scheduler stopped first", task_id))

    def _driver_or_raise(self) -> Driver:
        driver = self._driver
        if driver is None:
            raise RuntimeError("the scheduler has not been started (await sched.start() or use async with)")
        loop = self._loop
        if loop is None or loop.is_closed():
            raise SchedulerError("the scheduler's event loop is closed")
        if self._stopped:
            raise SchedulerError("the scheduler is shut down")
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

    def _post(self, command: Callable[[Core, int], Any]) -> None:
        driver = self._driver
        if driver is not None and not self._stopped:
            driver.post(command)

    # ------------------------------------------------------------------------------------------
    # Submission

    def _check_payload(self, payload: Any) -> None:
        if self._store is not None:
            # Refuse what the store could not hold before anything is stored.
            self._codec.encode(payload)

    async def submit(self, payload: Any, **options: Any) -> TaskHandle:
        """Submit a task and get a handle to await its result."""
        self._driver_or_raise()
        self._check_payload(payload)
        spec = build_spec(payload, time.time_ns(), **options)
        future: asyncio.Future[Any] = self._loop.create_future()  # type: ignore[union-attr]

        def command(core: Core, now: int) -> tuple[int, bool, TaskStatus | None]:
            submitted = core.submit(now, spec)
            return self._attach(core, submitted.id, submitted.duplicate, future)

        task_id, duplicate, status = await self._admit(spec.pool, command)
        handle = TaskHandle(self, task_id, duplicate, future)
        if status is not None:
            await self._resolve_finished(task_id, status, future)
        return handle

    async def enqueue(self, payload: Any, **options: Any) -> int:
        """Submit a task without a handle (cheaper); returns its id."""
        self._driver_or_raise()
        self._check_payload(payload)
        spec = build_spec(payload, time.time_ns(), **options)
        result: int = await self._admit(spec.pool, lambda core, now: core.submit(now, spec).id)
        return result

    async def submit_batch(self, tasks: Sequence[Task]) -> list[TaskHandle]:
        """Admit every task or none; the error names the offending index."""
        self._driver_or_raise()
        now = time.time_ns()
        specs = []
        for index, task in enumerate(tasks):
            if not isinstance(task, Task):
                raise TypeError(f"task {index}: submit_batch takes cronoq.Task objects")
            self._check_payload(task.payload)
            try:
                specs.append(task.to_spec(now))
            except SubmitError as err:
                raise SubmitError(err.code, f"task {index}: {err.message}") from None
        loop = self._loop
        assert loop is not None
        futures = [loop.create_future() for _ in specs]

        def command(core: Core, now: int) -> list[tuple[int, bool, TaskStatus | None]]:
            results = core.submit_batch(now, specs)
            return [self._attach(core, r.id, r.duplicate, f) for r, f in zip(results, futures, strict=True)]

        pool = specs[0].pool if specs else None
        outcomes = await self._admit(pool, command)
        handles = []
        for (task_id, duplicate, status), future in zip(outcomes, futures, strict=True):
            if status is not None:
                await self._resolve_finished(task_id, status, future)
            handles.append(TaskHandle(self, task_id, duplicate, future))
        return handles

    async def _admit(self, pool: str | None, command: Callable[[Core, int], Any]) -> Any:
        """Run a submission; with overflow 'wait', wait for space and try again."""
        while True:
            try:
                return await self._call(command)
            except SubmitError as err:
                if err.code != SubmitCode.FULL.value:
                    raise
            event = self._space.setdefault(pool or self.default_pool, asyncio.Event())
            event.clear()
            await event.wait()

    def _attach(self, core: Core, task_id: int, duplicate: bool, future: asyncio.Future[Any]) -> tuple[
        int, bool, TaskStatus | None
    ]:
        """Inside the step: register the handle, or report that the task already finished."""
        info = core.get(task_id)
        if info is not None and info.status.terminal:
            return task_id, duplicate, info.status
        self._handles.setdefault(task_id, []).append(future)
        return task_id, duplicate, None

    async def _resolve_finished(self, task_id: int, status: TaskStatus, future: asyncio.Future[Any]) -> None:
        if future.done():
            return
        if status is not TaskStatus.SUCCEEDED:
            info = await self._call(lambda core, now: core.get(task_id))
            message = info.message if info is not None and info.message else status.value
            future.set_exception(TaskFailed(status.value, message, task_id))
            return
        found, output = await self._load_output(task_id)
        if found:
            future.set_result(output)
        else:
            gone = "the task succeeded but its output is no longer kept"
            future.set_exception(TaskFailed("succeeded", gone, task_id))

    async def _load_output(self, task_id: int) -> tuple[bool, Any]:
        if task_id in self._outputs:
            return True, self._outputs[task_id]
        if self._store is not None:
            try:
                return await self._store.load_output(task_id)
            except Exception as err:  # a corrupt or unreachable row: the result is unavailable
                log.warning("could not load the output of task %d: %s", task_id, err)
        return False, None

    # ------------------------------------------------------------------------------------------
    # Lookups and control

    async def cancel(self, target: TaskRefLike) -> bool:
        """Cancel a task by id or key; False when it had already finished."""
        _check_ref(target)
        try:
            result: bool = await self._call(lambda core, now: core.cancel(now, target))
        except UnknownTask:
            return False
        return result

    async def status(self, target: TaskRefLike) -> str | None:
        _check_ref(target)
        info = await self._call(lambda core, now: core.get(target))
        return info.status.value if info is not None else None

    async def handle(self, target: TaskRefLike) -> TaskHandle | None:
        """A handle to an existing task (live, or finished within the retention window)."""
        _check_ref(target)
        loop = self._loop
        assert loop is not None
        future: asyncio.Future[Any] = loop.create_future()

        def command(core: Core, now: int) -> tuple[int, bool, TaskStatus | None] | None:
            info = core.get(target)
            if info is None:
                return None
            return self._attach(core, info.id, True, future)

        found = await self._call(command)
        if found is None:
            return None
        task_id, _, status = found
        if status is not None:
            await self._resolve_finished(task_id, status, future)
        return TaskHandle(self, task_id, True, future)

    async def snapshot(self) -> Snapshot:
        result: Snapshot = await self._call(lambda core, now: core.snapshot(now))
        return result

    async def set_capacity(self, pool: str, capacity: int) -> None:
        await self._call(lambda core, now: core.set_capacity(now, pool, int(capacity)))

    async def set_group_capacity(self, pool: str, labels: Mapping[str, str], capacity: int) -> None:
        labels = {str(k): str(v) for k, v in labels.items()}
        await self._call(lambda core, now: core.set_group_capacity(now, pool, labels, int(capacity)))

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
        """Add (or replace, by name) a cron schedule creating fixed-start occurrences."""
        self._driver_or_raise()
        self._check_payload(payload)
        try:
            overlap_policy = OverlapPolicy(overlap)
            miss = MissPolicy(on_miss)
            template = build_spec(
                payload, 0, priority=priority, pool=pool, kind=kind, key=key, duration_hint=duration_hint,
                timeout=timeout, retry=retry, resources=resources, tags=tags, labels=labels, tenant=tenant,
            )
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
        except (ValueError, SubmitError) as err:
            raise SchedulerError(str(err)) from None
        await self._call(lambda core, now: core.add_recurring(now, spec))

    async def remove_recurring(self, name: str) -> bool:
        result: bool = await self._call(lambda core, now: core.remove_recurring(now, name))
        return result

    def events(self, on_lag: Literal["skip", "raise"] = "skip") -> EventStream:
        """A stream of status events: terminal ones, and every transition with emit_transitions."""
        self._driver_or_raise()
        stream = EventStream(self._event_capacity, on_lag, self._streams.discard)
        self._streams.add(stream)
        return stream

    # ------------------------------------------------------------------------------------------
    # Running attempts (called by the sink inside a driver step)

    def _start_attempts(self, leases: Sequence[Dispatch]) -> None:
        loop = self._loop
        assert loop is not None
        otel = self._otel
        for lease in leases:
            executor, is_async = self._executors[lease.pool]
            ctx = TaskContext(self, lease)
            payload = lease.payload
            if otel is not None:
                task: asyncio.Task[Any] | None = loop.create_task(
                    self._traced(lease, ctx, executor, is_async, payload)
                )
                self._running[lease.id] = (ctx, task)
                continue
            if is_async:
                # Run the coroutine eagerly: most executors either finish at once or await I/O.
                coro = executor(ctx, payload)
                self._running[lease.id] = (ctx, None)
                try:
                    yielded = coro.send(None)
                except StopIteration as stop:
                    self._finished(lease.id, stop.value)
                    continue
                except BaseException as error:
                    self._failed(lease.id, error)
                    continue
                task = loop.create_task(self._resume(lease.id, coro, yielded))
            else:
                task = loop.create_task(self._run_sync(lease.id, executor, ctx, payload))
            self._running[lease.id] = (ctx, task)

    async def _resume(self, lease_id: int, coro: Any, yielded: Any) -> None:
        """Drive an executor coroutine that suspended during its eager first step."""
        while True:
            try:
                if yielded is None:
                    await asyncio.sleep(0)  # a bare yield: give the loop one turn
                else:
                    # The coroutine already marked this future as awaited; hand the wait to us.
                    yielded._asyncio_future_blocking = False
                    await yielded
            except asyncio.CancelledError as cancel:
                try:
                    yielded = coro.throw(cancel)
                except StopIteration as stop:
                    self._finished(lease_id, stop.value)
                    return
                except BaseException as error:
                    self._failed(lease_id, error)
                    return
                continue
            except BaseException:  # the awaited future failed: the coroutine sees the exception
                pass
            try:
                yielded = coro.send(None)
            except StopIteration as stop:
                self._finished(lease_id, stop.value)
                return
            except BaseException as error:
                self._failed(lease_id, error)
                return

    async def _run_sync(self, lease_id: int, executor: Callable[..., Any], ctx: TaskContext, payload: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(None, functools.partial(executor, ctx, payload))
            if inspect.isawaitable(result):
                result = await result
        except BaseException as error:
            self._failed(lease_id, error)
            return
        self._finished(lease_id, result)

    async def _traced(self, lease: Dispatch, ctx: TaskContext, executor: Callable[..., Any], is_async: bool,
                      payload: Any) -> None:
        with _otel.attempt_span(lease):
            try:
                if is_async:
                    result = await executor(ctx, payload)
                else:
                    result = await asyncio.get_running_loop().run_in_executor(
                        None, functools.partial(executor, ctx, payload)
                    )
                    if inspect.isawaitable(result):
                        result = await result
            except BaseException as error:
                self._failed(lease.id, error)
                return
            self._finished(lease.id, result)

    def _finished(self, lease_id: int, output: Any) -> None:
        entry = self._running.pop(lease_id, None)
        if entry is None or entry[0]._cancelled:
            return  # aborted (timeout, cancellation, lost lease): the engine already moved on
        if self._store is not None:
            try:
                self._codec.encode(output)
            except Exception as err:
                self._report(lease_id, Failure(f"output cannot be stored: {err}", permanent=True))
                return
        self._report(lease_id, Success(output))

    def _failed(self, lease_id: int, error: BaseException) -> None:
        entry = self._running.pop(lease_id, None)
        if entry is None or entry[0]._cancelled:
            return
        if isinstance(error, Retryable):
            retry_after = error.retry_after
            delay = seconds_to_ns(retry_after, "retry_after") if retry_after is not None else None
            outcome: Outcome = Failure(str(error), False, delay)
        elif isinstance(error, Permanent):
            outcome = Failure(str(error) or "permanent failure", True)
        elif isinstance(error, asyncio.CancelledError):
            outcome = CancelledByExecutor("the executor cancelled itself")
        elif isinstance(error, (KeyboardInterrupt, SystemExit)):
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
        for lease_id, outcome in done:
            core.complete(now, lease_id, outcome)

    # Sink callbacks -------------------------------------------------------------------------------

    def _abort(self, aborts: Sequence[Abort]) -> None:
        for abort in aborts:
            entry = self._running.pop(abort.lease_id, None)
            if entry is None:
                continue
            ctx, task = entry
            ctx._cancelled = True
            if task is not None and not task.done():
                task.cancel()

    def _resolve(self, results: Sequence[Resolve]) -> None:
        outputs = self._outputs
        handles = self._handles
        streams = self._streams
        otel = self._otel
        for result in results:
            if result.has_output:
                outputs[result.id] = result.output
                if len(outputs) > OUTPUT_CACHE:
                    outputs.popitem(last=False)
            if handles:
                futures = handles.pop(result.id, None)
                if futures:
                    for future in futures:
                        if future.done():
                            continue
                        if result.status is TaskStatus.SUCCEEDED:
                            future.set_result(result.output)
                        else:
                            future.set_exception(_failed(result))
            if streams:
                event = _public_event(result)
                for stream in streams:
                    stream._push(event)
            if otel is not None:
                otel.task_finished(result)

    def _publish(self, events: Sequence[EngineEvent]) -> None:
        if not self._streams:
            return
        for engine_event in events:
            event = _public_event(engine_event)
            for stream in self._streams:
                stream._push(event)

    def _scale(self, scales: Sequence[Scale]) -> None:
        # In-process pools: capacity follows the autoscaler at once.
        for scale in scales:
            self._post(functools.partial(_apply_capacity, scale.pool, scale.desired))

    def _space_available(self, pools: Sequence[str | None]) -> None:
        for pool in pools:
            if pool is None:
                for waiting in self._space.values():
                    waiting.set()
            else:
                event = self._space.get(pool)
                if event is not None:
                    event.set()


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


def _is_async(fn: Callable[..., Any]) -> bool:
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.iscoroutinefunction(target):
        return True
    call = getattr(target, "__call__", None)  # noqa: B004 - callable objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _check_ref(target: object) -> None:
    if isinstance(target, bool) or not isinstance(target, int | str):
        raise TypeError("a task is named by its id (int) or key (str)")


__all__ = ["CronoqError", "EventStream", "Scheduler", "StatusEvent", "TaskContext", "TaskHandle"]
