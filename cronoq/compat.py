"""A synchronous stand-in for the prototype ``ElasticPriorityScheduler`` API, on the cronoq engine.

Code written against the prototype keeps its call sites; only the import changes::

    from cronoq.compat import ElasticPriorityScheduler, Priority, Task

Under the hood :class:`ElasticPriorityScheduler` drives a native :class:`cronoq.Scheduler` with a
single pool named ``"default"``. The native scheduler lives on a private asyncio event loop that
runs in a daemon thread called ``cronoq-compat``; every public method may be called from any
thread and hops onto that loop with :func:`asyncio.run_coroutine_threadsafe`.

As in the prototype, a task does no real work: "running" it means sleeping for its ``duration``.
Move to the native API (``cronoq.Scheduler``) for real executors, results, retries and timeouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import threading
import time
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._options import AutoscaleConfig, Pool, TaskOptions, build_spec
from ._options import Task as NativeTask
from ._scheduler import Scheduler, TaskContext
from .errors import SubmitError

__all__ = [
    "ElasticPriorityScheduler",
    "Priority",
    "QualityMetrics",
    "ScalingConfig",
    "ScheduledTask",
    "Task",
]

log = logging.getLogger("cronoq.compat")

EPSILON = 0.001
"""The smallest duration hint given to the engine (seconds); zero-length tasks still get an estimate."""

FIXED_SCHEDULE_BUFFER_SECONDS = 1.0
"""Tolerance around a fixed start (seconds): the window the engine reserves capacity for."""

RESERVABLE_FRACTION = 0.5
"""Share of the pool's maximum size that fixed-start reservations may claim at any instant."""

POOL_NAME = "default"
THREAD_NAME = "cronoq-compat"
SHUTDOWN_GRACE = 2.0
"""Seconds that running tasks get to finish when :meth:`ElasticPriorityScheduler.stop` is called."""

_T = TypeVar("_T")


class Priority(enum.IntEnum):
    """Priority classes of the prototype; a lower value is more urgent."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3


@dataclass
class Task:
    """One unit of (simulated) work.

    ``arrival_time``, ``fixed_start`` and ``deadline`` are Unix timestamps in seconds;
    ``duration`` is in seconds. ``dependencies`` lists the ids of tasks that must complete first.
    An ``arrival_time`` of 0 is replaced by the submission time.
    """

    id: str
    duration: float
    priority: Priority = Priority.NORMAL
    arrival_time: float = 0.0
    fixed_start: float | None = None
    deadline: float | None = None
    dependencies: list[str] = field(default_factory=list)

    def __hash__(self) -> int:
        return hash(self.id)


@dataclass
class ScheduledTask:
    """A finished run: which worker slot ran ``task`` and when (Unix seconds)."""

    task: Task
    worker_id: int
    start_time: float
    end_time: float


@dataclass
class QualityMetrics:
    """Schedule quality as reported by :meth:`ElasticPriorityScheduler.get_metrics`."""

    schedule_quality: float
    priority_adherence: float
    fixed_schedule_hits: float
    utilization: float
    avg_wait_time: float
    pending_count: int
    worker_count: int


@dataclass
class ScalingConfig:
    """The prototype's scaling knobs. Accepted for compatibility; the engine's autoscaler decides."""

    min_workers: int = 1
    max_workers: int = 10
    scale_up_threshold: float = 0.70
    scale_down_threshold: float = 0.90
    cooldown_seconds: float = 30.0
    worker_cost_per_second: float = 0.001


@dataclass(frozen=True)
class _Quality:
    """The windowed quality figures of the last native snapshot."""

    schedule_quality: float = 1.0
    priority_adherence: float = 1.0
    fixed_schedule_hits: float = 1.0
    utilization: float = 0.0
    avg_wait_time: float = 0.0


class _Runtime:
    """One started incarnation: the private loop, its thread and the native scheduler on it."""

    __slots__ = ("loop", "scheduler", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, scheduler: Scheduler) -> None:
        self.loop = loop
        self.thread = thread
        self.scheduler = scheduler

    def call(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        """Run ``coro`` on the private loop and wait for its result from the calling thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


class ElasticPriorityScheduler:
    """The prototype's elastic priority scheduler, backed by the cronoq engine.

    The native pool starts with ``max(1, initial_workers)`` workers and autoscales between 1 and
    ``max(initial, max_workers)`` on queue pressure (drain time 2 s, stabilization window 5 s,
    cooldown 2 s). ``scale_up_threshold`` and ``scale_down_threshold`` are stored but not used;
    ``worker_cost_per_second`` prices worker time for :meth:`get_cost`.

    Differences from the prototype worth knowing:

    * Dependencies name task ids. A dependency that has not been submitted yet is waited for; one
      that already completed is satisfied. A dependency cycle is refused by :meth:`submit`.
    * Fixed starts are admitted against real capacity: at most ``RESERVABLE_FRACTION`` of the
      maximum pool size (at least one worker) may be reserved around any instant, with a buffer of
      ``FIXED_SCHEDULE_BUFFER_SECONDS`` either side. A conflict makes :meth:`submit` return False.
    * Tasks submitted while the scheduler is stopped are queued and handed to the engine together on
      :meth:`start`, so the first dispatch already sees all of them. Checks that need the engine
      (fixed-start capacity) happen then; a task refused at that point is dropped with a warning.
    """

    def __init__(
        self,
        initial_workers: int = 1,
        max_workers: int = 10,
        scale_up_threshold: float = 0.70,
        scale_down_threshold: float = 0.90,
        worker_cost_per_second: float = 0.001,
    ) -> None:
        self.initial_workers = max(1, int(initial_workers))
        self.max_workers = max(self.initial_workers, int(max_workers))
        self.scale_up_threshold = float(scale_up_threshold)
        self.scale_down_threshold = float(scale_down_threshold)
        self.worker_cost_per_second = float(worker_cost_per_second)

        # Serializes start/stop/submit and every other call that waits on the private loop. It is
        # never taken on the loop thread, so holding it while waiting for the loop cannot deadlock.
        self._lifecycle = threading.Lock()
        # Guards the bookkeeping below. Held only briefly, never while waiting on the loop: the
        # executor takes it on the loop thread.
        self._lock = threading.Lock()

        self._runtime: _Runtime | None = None
        # Tasks submitted and not completed, in submission order (id -> task).
        self._pending: dict[str, Task] = {}
        # Engine keys each pending task waits for (already mapped from ids at submission).
        self._after: dict[str, list[str]] = {}
        # The engine key of the latest run of every known id, pending or completed.
        self._keys: dict[str, str] = {}
        # Every engine key handed out so far and the id it belongs to.
        self._key_owner: dict[str, str] = {}
        # How many keys each id has been given (the suffix of the next re-submission).
        self._runs: dict[str, int] = {}
        # Keys whose run completed: edges to them are satisfied.
        self._done_keys: set[str] = set()
        self._completed: list[ScheduledTask] = []
        self._busy_slots: set[int] = set()
        self._cost_before = 0.0  # cost of the incarnations that already stopped
        self._last_quality = _Quality()

    # ------------------------------------------------------------------------------------------
    # Lifecycle

    def start(self) -> None:
        """Start the engine in a background thread and hand it every queued task. Idempotent."""
        with self._lifecycle:
            if self._runtime is not None:
                return
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=_serve, args=(loop,), name=THREAD_NAME, daemon=True)
            thread.start()
            try:
                runtime = _Runtime(loop, thread, self._build_scheduler())
                runtime.call(runtime.scheduler.start())
            except BaseException:
                _close_loop(loop, thread)
                raise
            self._runtime = runtime
            with self._lock:
                queued = [(task_id, self._native_options(task_id)) for task_id in self._pending]
            if queued:
                refused = runtime.call(self._admit_queued(runtime.scheduler, queued))
                if refused:
                    with self._lock:
                        for task_id, reason in refused:
                            log.warning("cronoq.compat: dropping queued task %r: %s", task_id, reason)
                            self._forget(task_id)

    def stop(self) -> None:
        """Stop the engine, giving running tasks 2 s to finish. Idempotent.

        Tasks that did not complete (waiting, or cut off after the grace period) stay pending and
        run again from the beginning on the next :meth:`start`.
        """
        with self._lifecycle:
            runtime = self._runtime
            if runtime is None:
                return
            self._runtime = None
            try:
                snapshot = runtime.call(runtime.scheduler.snapshot(), timeout=10.0)
            except Exception as err:  # the snapshot is a courtesy; shutting down matters more
                log.warning("cronoq.compat: no final snapshot: %s", err)
            else:
                pool = snapshot.pool(POOL_NAME)
                if pool is not None:
                    with self._lock:
                        self._cost_before += pool.cost
                        self._last_quality = _quality_of(pool)
            try:
                runtime.call(runtime.scheduler.shutdown(SHUTDOWN_GRACE), timeout=SHUTDOWN_GRACE + 30.0)
            finally:
                _close_loop(runtime.loop, runtime.thread)
                with self._lock:
                    self._busy_slots.clear()

    @property
    def running(self) -> bool:
        """Whether :meth:`start` was called and :meth:`stop` has not been since."""
        return self._runtime is not None

    # ------------------------------------------------------------------------------------------
    # Submission

    def submit(self, task: Task) -> bool:
        """Queue ``task``; False when it is refused.

        Refused: a dependency cycle, a fixed start the pool has no reservable capacity for, or any
        other submission the engine rejects (e.g. an invalid priority or a non-finite duration).
        An id that is still pending is not submitted twice (True, nothing changes); an id whose
        earlier run completed runs again. An ``arrival_time`` of 0 is set to the current time.
        """
        with self._lifecycle:
            with self._lock:
                if task.id in self._pending:
                    return True
                # Validate before touching any state (raises TypeError on wrongly typed fields).
                try:
                    build_spec(None, time.time_ns(), **self._spec_options(task, task.id, []))
                except SubmitError as err:
                    log.info("cronoq.compat: task %r refused: %s", task.id, err)
                    return False
                after = self._resolve(task.dependencies)
                key, runs = self._next_key(task.id)
                if self._closes_cycle(key, after):
                    log.info("cronoq.compat: task %r refused: its dependencies form a cycle", task.id)
                    return False
                if task.arrival_time == 0:
                    task.arrival_time = time.time()
                previous_key = self._keys.get(task.id)
                previous_runs = self._runs.get(task.id, 0)
                self._pending[task.id] = task
                self._after[task.id] = after
                self._keys[task.id] = key
                self._key_owner[key] = task.id
                self._runs[task.id] = runs
                runtime = self._runtime
                options = self._native_options(task.id) if runtime is not None else None
            if runtime is None or options is None:
                return True  # queued; handed to the engine on start()
            try:
                # The run may start (and even finish) before this returns: the bookkeeping is in place.
                runtime.call(runtime.scheduler.enqueue(None, **options))
            except SubmitError as err:
                log.info("cronoq.compat: task %r refused: %s", task.id, err)
                with self._lock:
                    self._rollback(task.id, key, previous_key, previous_runs)
                return False
            return True

    # ------------------------------------------------------------------------------------------
    # Reports

    def get_metrics(self) -> QualityMetrics:
        """Schedule quality, mapped from the native pool snapshot.

        * ``schedule_quality``: the pool's ``schedule_efficiency``, the share of scheduling
          objectives met (deadlines met and fixed starts started on time); 1.0 with none.
        * ``priority_adherence``: 1 - priority inversions / dispatches.
        * ``fixed_schedule_hits``: the pool's ``fixed_start_hit_rate`` (a rate in [0, 1]).
        * ``utilization``: busy worker time / provisioned worker time.
        * ``avg_wait_time``: mean seconds from ready to started (``wait_mean``).
        * ``pending_count``: tasks waiting to start (the pool's ``pending`` while running; every
          submitted, uncompleted task while stopped).
        * ``worker_count``: the pool's current capacity; 0 while stopped.

        Rates and means cover the engine's sliding metrics window. While stopped, the figures of
        the last run are reported.
        """
        with self._lifecycle:
            runtime = self._runtime
            if runtime is not None:
                snapshot = runtime.call(runtime.scheduler.snapshot())
                pool = snapshot.pool(POOL_NAME)
                if pool is not None:
                    quality = _quality_of(pool)
                    with self._lock:
                        self._last_quality = quality
                    return _metrics(quality, pool.pending, pool.capacity)
            with self._lock:
                return _metrics(self._last_quality, len(self._pending), 0)

    def get_cost(self) -> float:
        """Worker time priced at ``worker_cost_per_second``, summed over every run so far."""
        with self._lifecycle:
            runtime = self._runtime
            current = 0.0
            if runtime is not None:
                snapshot = runtime.call(runtime.scheduler.snapshot())
                pool = snapshot.pool(POOL_NAME)
                current = pool.cost if pool is not None else 0.0
            with self._lock:
                return self._cost_before + current

    @property
    def completed_count(self) -> int:
        with self._lock:
            return len(self._completed)

    @property
    def completed_tasks(self) -> list[ScheduledTask]:
        """Copies of the finished runs, in completion order."""
        with self._lock:
            return [dataclasses.replace(done) for done in self._completed]

    @property
    def pending_tasks(self) -> list[Task]:
        """Submitted tasks that have not completed (waiting or running), in submission order."""
        with self._lock:
            return list(self._pending.values())

    # ------------------------------------------------------------------------------------------
    # Internals: bookkeeping (call with self._lock held)

    def _next_key(self, task_id: str) -> tuple[str, int]:
        """The engine key for the next run of ``task_id`` and the new run count.

        The first run is keyed by the id itself, the n-th re-submission by ``<id>#<n>`` (the engine
        keeps finished keys reserved for its retention window). A key some other id already took
        is skipped.
        """
        runs = self._runs.get(task_id, 0)
        while True:
            key = task_id if runs == 0 else f"{task_id}#{runs}"
            runs += 1
            if key not in self._key_owner:
                return key, runs

    def _resolve(self, dependencies: Iterable[str]) -> list[str]:
        """Map dependency ids to the engine keys to wait for; completed runs need no edge."""
        after: list[str] = []
        for dep in dependencies:
            key = self._keys.get(dep)
            if key is None:
                key = dep  # not submitted yet: wait for its first run, keyed by its id
            elif key in self._done_keys:
                continue
            if key not in after:
                after.append(key)
        return after

    def _closes_cycle(self, key: str, after: list[str]) -> bool:
        """Whether waiting on ``after`` would make the run keyed ``key`` wait for itself."""
        seen: set[str] = set()
        stack = list(after)
        while stack:
            current = stack.pop()
            if current == key:
                return True
            if current in seen:
                continue
            seen.add(current)
            owner = self._key_owner.get(current)
            if owner is not None and owner in self._pending and self._keys.get(owner) == current:
                stack.extend(self._after.get(owner, ()))
        return False

    def _rollback(self, task_id: str, key: str, previous_key: str | None, previous_runs: int) -> None:
        self._pending.pop(task_id, None)
        self._after.pop(task_id, None)
        self._key_owner.pop(key, None)
        if previous_key is None:
            self._keys.pop(task_id, None)
        else:
            self._keys[task_id] = previous_key
        if previous_runs:
            self._runs[task_id] = previous_runs
        else:
            self._runs.pop(task_id, None)

    def _forget(self, task_id: str) -> None:
        """Drop a pending task the engine refused on start (its key stays reserved)."""
        self._pending.pop(task_id, None)
        self._after.pop(task_id, None)
        key = self._keys.get(task_id)
        if key is not None and key not in self._done_keys:
            # Its latest run never happened: point later dependents back at the last completed run.
            earlier = [k for k, owner in self._key_owner.items() if owner == task_id and k in self._done_keys]
            if earlier:
                self._keys[task_id] = earlier[-1]
            else:
                del self._keys[task_id]

    def _spec_options(self, task: Task, key: str, after: list[str]) -> TaskOptions:
        options: TaskOptions = {
            "pool": POOL_NAME,
            "key": key,
            "priority": int(task.priority),
            "duration_hint": max(task.duration, EPSILON),
        }
        if task.fixed_start is not None:
            options["start_at"] = task.fixed_start
            options["tolerance"] = FIXED_SCHEDULE_BUFFER_SECONDS
        if task.deadline is not None:
            options["deadline_at"] = task.deadline
        if after:
            options["after"] = after
        return options

    def _native_options(self, task_id: str) -> TaskOptions:
        """Engine options for the pending run of ``task_id``, without edges already satisfied."""
        task = self._pending[task_id]
        after = [key for key in self._after.get(task_id, ()) if key not in self._done_keys]
        return self._spec_options(task, self._keys[task_id], after)

    # ------------------------------------------------------------------------------------------
    # Internals: running on the private loop

    def _build_scheduler(self) -> Scheduler:
        autoscale = AutoscaleConfig(
            drain_time=2.0,
            stabilization_window=5.0,
            cooldown=2.0,
            cost_per_worker_second=self.worker_cost_per_second,
        )
        pool = Pool(
            POOL_NAME,
            self._execute,
            min=1,
            initial=self.initial_workers,
            max=self.max_workers,
            autoscale=autoscale,
            unknown_dependency="await",
            reservable_fraction=RESERVABLE_FRACTION,
        )
        return Scheduler([pool], shutdown_grace=SHUTDOWN_GRACE)

    async def _admit_queued(self, scheduler: Scheduler, queued: list[tuple[str, TaskOptions]]) -> list[tuple[str, str]]:
        """Hand the queued tasks to the engine: as one batch, else one by one. Returns refusals.

        A batch is admitted in one engine step, so dispatch already sees every queued task and
        starts them in priority order.
        """
        try:
            await scheduler.submit_batch([NativeTask(None, **options) for _, options in queued])
            return []
        except SubmitError:
            pass  # someone in the batch is refused: find out who, admitting the rest
        refused: list[tuple[str, str]] = []
        for task_id, options in queued:
            try:
                await scheduler.enqueue(None, **options)
            except SubmitError as err:
                refused.append((task_id, str(err)))
        return refused

    async def _execute(self, ctx: TaskContext, payload: object) -> None:
        """The pool's executor: sleep for the task's duration and record the run."""
        key = ctx.key
        if key is None:
            return  # not one of ours: every compat run is keyed
        with self._lock:
            task_id = self._key_owner.get(key)
            task = self._pending.get(task_id) if task_id is not None else None
            if task_id is None or task is None or self._keys.get(task_id) != key:
                return  # a run nobody waits for any more
            slot = 0
            while slot in self._busy_slots:
                slot += 1
            self._busy_slots.add(slot)
            started = time.time()
        try:
            await asyncio.sleep(max(0.0, task.duration))
        except BaseException:  # cut off (shutdown): the task stays pending for the next start()
            with self._lock:
                self._busy_slots.discard(slot)
            raise
        ended = time.time()
        with self._lock:
            self._busy_slots.discard(slot)
            if self._pending.get(task_id) is task and self._keys.get(task_id) == key:
                del self._pending[task_id]
                self._after.pop(task_id, None)
                self._done_keys.add(key)
                self._completed.append(ScheduledTask(task, slot, started, ended))


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


def _close_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """Cancel whatever still runs on ``loop``, stop it, join its thread and close it."""

    async def cancel_rest() -> None:
        current = asyncio.current_task()
        rest = [task for task in asyncio.all_tasks() if task is not current]
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.gather(*rest, return_exceptions=True)
        await loop.shutdown_asyncgens()
        await loop.shutdown_default_executor()

    # The thread was started before anything was scheduled, so the loop runs (or is about to).
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(cancel_rest(), loop).result(30.0)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30.0)
    if not thread.is_alive():
        loop.close()


def _quality_of(pool: Any) -> _Quality:
    return _Quality(
        schedule_quality=float(pool.schedule_efficiency),
        priority_adherence=float(pool.priority_adherence),
        fixed_schedule_hits=float(pool.fixed_start_hit_rate),
        utilization=float(pool.utilization),
        avg_wait_time=float(pool.wait_mean),
    )


def _metrics(quality: _Quality, pending: int, workers: int) -> QualityMetrics:
    return QualityMetrics(
        schedule_quality=quality.schedule_quality,
        priority_adherence=quality.priority_adherence,
        fixed_schedule_hits=quality.fixed_schedule_hits,
        utilization=quality.utilization,
        avg_wait_time=quality.avg_wait_time,
        pending_count=pending,
        worker_count=workers,
    )
