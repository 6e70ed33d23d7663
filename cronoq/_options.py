"""Public option types of the embedded API and their translation into engine types.

The public API speaks seconds (floats) and Unix-seconds timestamps or aware datetimes; the engine
speaks int nanoseconds. Everything is converted once, here.
"""

from __future__ import annotations

import copy
import datetime as _dt
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from cronoq.engine import admission
from cronoq.engine import config as ec
from cronoq.engine import limits as el
from cronoq.engine import types as et
from cronoq.engine.types import NS_PER_S, Priority

from ._keywords import keyword_signature, option_names, refuse_unknown
from ._otel import TRACEPARENT, current_traceparent
from .errors import InvalidTaskOption

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "AutoscaleConfig",
    "Dep",
    "Pool",
    "Priority",
    "Resource",
    "RetryPolicy",
    "Task",
]

PriorityLike = Priority | int | str
TaskRefLike = str | int
TimeLike = _dt.datetime | float | int
MissPolicyName = Literal["run_late", "skip", "fail"]
DepCondition = Literal["success", "failure", "complete", "on_success", "on_failure", "on_complete"]


class TaskOptions(TypedDict, total=False):
    """The options of one task, taken as keywords by ``Scheduler.submit``, ``Scheduler.enqueue``
    and ``Task`` (each defaults to ``None``: not set)."""

    priority: PriorityLike | None
    pool: str | None
    kind: str | None
    key: str | None
    deadline_in: float | None
    deadline_at: TimeLike | None
    start_in: float | None
    start_at: TimeLike | None
    tolerance: float | None
    on_miss: MissPolicyName | None
    duration_hint: float | None
    timeout: float | None
    retry: RetryPolicy | None
    after: TaskRefLike | Sequence[TaskRefLike] | None
    deps: Sequence[Dep] | None
    resources: Mapping[str, int] | None
    tags: Mapping[str, Any] | None
    labels: Mapping[str, str] | None
    tenant: str | None


TASK_OPTIONS = frozenset(option_names(TaskOptions))

MAX_SECONDS = 100 * 365 * 86400.0  # client-supplied durations beyond a century are refused


def seconds_to_ns(value: float | int, what: str, *, allow_zero: bool = True) -> int:
    """Seconds to int nanoseconds; ValueError for negative, NaN, infinite or absurd durations."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds) or seconds < 0 or seconds > MAX_SECONDS:
        raise ValueError(f"{what} must be a finite, non-negative number of seconds (got {value!r})")
    if not allow_zero and seconds == 0:
        raise ValueError(f"{what} must be positive")
    return round(seconds * NS_PER_S)


def time_to_ns(value: TimeLike, what: str) -> int:
    """An aware datetime or Unix seconds to int nanoseconds since the epoch; ValueError for NaN,
    infinities and instants before 1970 or after 2262 (what 64-bit nanoseconds can hold)."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise ValueError(f"{what} must be a timezone-aware datetime (or Unix seconds)")
        ns = round(value.timestamp() * NS_PER_S)
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a datetime or Unix seconds, not {type(value).__name__}")
    elif math.isnan(value) or math.isinf(value):
        raise ValueError(f"{what} must be finite")
    else:
        seconds = float(value)
        if not 0.0 <= seconds <= _MAX_UNIX_SECONDS:
            raise ValueError(f"{what} must lie between 1970 and 2262 (Unix seconds 0 to {_MAX_UNIX_SECONDS:.0f})")
        ns = round(seconds * NS_PER_S)
    if not 0 <= ns <= el.MAX_INSTANT:
        raise ValueError(f"{what} must lie between 1970 and 2262")
    return ns


_MAX_UNIX_SECONDS = el.MAX_INSTANT // NS_PER_S


def _count(value: object, what: str, *, low: int = 0) -> int:
    """An int (not a bool, not a float) between ``low`` and 2**32 - 1."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None
    if not low <= number <= el.MAX_COUNT:
        raise ValueError(f"{what} must be between {low} and {el.MAX_COUNT} (got {number})")
    return number


def _fraction(value: object, what: str, *, low: float, high: float = math.inf, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number, not {type(value).__name__}")
    problem = el.factor_problem(value, what, low=low, high=high, low_open=low_open)
    if problem is not None:
        raise ValueError(problem)
    return float(value)


def _name(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    problem = admission.text_problem(what, value) if value else f"{what} must not be empty"
    if problem is not None:
        raise ValueError(problem)
    return value


def parse_priority(value: PriorityLike | None) -> Priority:
    """``Priority``, its index 0..3 or its name (any case); ValueError otherwise."""
    return Priority.parse(value)


class RetryPolicy:
    """How failed attempts are retried.

    ``max_attempts`` counts every attempt, the first included. The delay before attempt n (n >= 2)
    is ``min(initial_backoff * multiplier ** (n - 2), max_backoff)`` seconds; with ``jitter`` a
    uniformly random fraction of it. An executor's ``Retryable(retry_after=...)`` raises the delay
    to at least that. Set per pool (``Pool(retry=...)``) and overridable per task.
    """

    __slots__ = ("initial_backoff", "jitter", "max_attempts", "max_backoff", "multiplier")

    def __init__(
        self,
        max_attempts: int = 3,
        initial_backoff: float = 1.0,
        multiplier: float = 2.0,
        max_backoff: float = 60.0,
        jitter: bool = True,
    ) -> None:
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError("max_attempts must be an int of at least 1")
        self.max_attempts = _count(max_attempts, "max_attempts", low=1)
        if isinstance(multiplier, bool) or not isinstance(multiplier, int | float):
            raise TypeError(f"multiplier must be a number, not {type(multiplier).__name__}")
        if not multiplier >= 1.0 or math.isinf(multiplier):
            raise ValueError("multiplier must be a finite number of at least 1")
        seconds_to_ns(initial_backoff, "initial_backoff")
        seconds_to_ns(max_backoff, "max_backoff")
        self.initial_backoff = float(initial_backoff)
        self.multiplier = float(multiplier)
        self.max_backoff = float(max_backoff)
        self.jitter = bool(jitter)

    @staticmethod
    def none() -> RetryPolicy:
        """A single attempt, no retries."""
        return RetryPolicy(max_attempts=1)

    def to_engine(self) -> et.RetryPolicy:
        """The engine's form (int nanoseconds)."""
        return et.RetryPolicy(
            max_attempts=self.max_attempts,
            initial_backoff=seconds_to_ns(self.initial_backoff, "initial_backoff"),
            multiplier=self.multiplier,
            max_backoff=seconds_to_ns(self.max_backoff, "max_backoff"),
            jitter=self.jitter,
        )

    def __repr__(self) -> str:
        return (
            f"RetryPolicy(max_attempts={self.max_attempts}, initial_backoff={self.initial_backoff}, "
            f"multiplier={self.multiplier}, max_backoff={self.max_backoff}, jitter={self.jitter})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RetryPolicy):
            return NotImplemented
        return (self.max_attempts, self.initial_backoff, self.multiplier, self.max_backoff, self.jitter) == (
            other.max_attempts,
            other.initial_backoff,
            other.multiplier,
            other.max_backoff,
            other.jitter,
        )

    __hash__ = None  # type: ignore[assignment]


class AutoscaleConfig:
    """The queue-pressure autoscaling policy of a pool (durations in seconds).

    Every ``interval`` the pool's desired capacity is recomputed from arrival rate, run times and
    backlog (aiming at ``target_utilization`` and draining the backlog within ``drain_time``),
    raised where a per-class wait objective in ``slo`` (``{"high": 2.0, ...}``) would be missed,
    and kept between the pool's ``min`` and ``max``. Scale-downs wait for the
    ``stabilization_window`` and ``cooldown``; steps are bounded by ``max_step_up_abs`` and
    ``max_step_down``. ``cost_per_worker_second`` turns capacity into the snapshot's ``cost``.
    """

    __slots__ = (
        "cooldown",
        "cost_per_worker_second",
        "drain_time",
        "interval",
        "max_step_down",
        "max_step_up_abs",
        "reservation_horizon",
        "slo",
        "stabilization_window",
        "target_utilization",
    )

    def __init__(
        self,
        interval: float = 1.0,
        target_utilization: float = 0.75,
        drain_time: float = 30.0,
        slo: Mapping[PriorityLike, float] | None = None,
        reservation_horizon: float = 60.0,
        stabilization_window: float = 60.0,
        cooldown: float = 30.0,
        max_step_up_abs: int = 4,
        max_step_down: int = 1,
        cost_per_worker_second: float = 0.0,
    ) -> None:
        seconds_to_ns(interval, "interval", allow_zero=False)
        seconds_to_ns(drain_time, "drain_time", allow_zero=False)
        seconds_to_ns(reservation_horizon, "reservation_horizon")
        seconds_to_ns(stabilization_window, "stabilization_window")
        seconds_to_ns(cooldown, "cooldown")
        self.interval = float(interval)
        self.target_utilization = _fraction(target_utilization, "target_utilization", low=0.0, high=1.0, low_open=True)
        self.drain_time = float(drain_time)
        self.slo: dict[str, float] = {}
        if slo is not None and not isinstance(slo, Mapping):
            raise TypeError("slo must be a mapping of priority to seconds")
        for cls, seconds in (slo or {}).items():
            name = Priority.parse(cls).label
            seconds_to_ns(seconds, f"slo[{name}]", allow_zero=False)
            self.slo[name] = float(seconds)
        self.reservation_horizon = float(reservation_horizon)
        self.stabilization_window = float(stabilization_window)
        self.cooldown = float(cooldown)
        self.max_step_up_abs = _count(max_step_up_abs, "max_step_up_abs")
        self.max_step_down = _count(max_step_down, "max_step_down")
        self.cost_per_worker_second = _fraction(cost_per_worker_second, "cost_per_worker_second", low=0.0)

    def to_engine(self) -> ec.AutoscaleConfig:
        """The engine's form (int nanoseconds, one SLO slot per class)."""
        slo: list[int | None] = [None] * et.CLASSES
        for name, seconds in self.slo.items():
            slo[int(Priority.parse(name))] = seconds_to_ns(seconds, f"slo[{name}]", allow_zero=False)
        return ec.AutoscaleConfig(
            interval=seconds_to_ns(self.interval, "interval", allow_zero=False),
            target_utilization=self.target_utilization,
            drain_time=seconds_to_ns(self.drain_time, "drain_time", allow_zero=False),
            slo=(slo[0], slo[1], slo[2], slo[3]),
            reservation_horizon=seconds_to_ns(self.reservation_horizon, "reservation_horizon"),
            stabilization_window=seconds_to_ns(self.stabilization_window, "stabilization_window"),
            cooldown=seconds_to_ns(self.cooldown, "cooldown"),
            max_step_up_abs=self.max_step_up_abs,
            max_step_down=self.max_step_down,
            cost_per_worker_second=self.cost_per_worker_second,
        )

    def __repr__(self) -> str:
        return f"AutoscaleConfig(interval={self.interval}, slo={self.slo}, cooldown={self.cooldown})"


class Dep:
    """A dependency edge on a task (id or key), for ``deps=``.

    ``on`` is ``"success"`` (the default, like ``after=``), ``"failure"`` or ``"complete"`` (either
    way); the ``on_``-prefixed spellings are accepted too. A child whose edge can no longer be
    satisfied ends as skipped.
    """

    __slots__ = ("_cond", "_target")

    def __init__(self, target: TaskRefLike, on: DepCondition = "success") -> None:
        if isinstance(target, bool) or not isinstance(target, int | str):
            raise TypeError("a dependency names a task id (int) or key (str)")
        if isinstance(target, int) and not 0 < target < 1 << 64:
            raise ValueError(f"a task id is an unsigned 64-bit integer above 0, not {target}")
        if isinstance(target, str):
            _name(target, "a dependency key")
        self._target = target
        try:
            self._cond = et.EdgeCond.parse(on)
        except ValueError as err:
            raise ValueError(str(err)) from None

    def to_engine(self) -> et.Dep:
        """The engine's form."""
        return et.Dep(self._target, self._cond)

    def __repr__(self) -> str:
        return f"Dep({self._target!r}, on={self._cond.value!r})"


class Resource:
    """A shared limit that tasks request units of (``resources={"name": n}``), across all pools.

    Build one with ``Resource.semaphore`` or ``Resource.token_bucket`` and pass it to
    ``Scheduler(resources=[...])``. A task that cannot get its units waits without holding a slot.
    """

    __slots__ = ("_config",)

    def __init__(self, config: ec.ResourceConfig) -> None:
        self._config = config

    @staticmethod
    def semaphore(name: str, permits: int) -> Resource:
        """At most ``permits`` units held at once; units are returned when the attempt ends."""
        return Resource._checked(ec.ResourceConfig.semaphore(_name(name, "resource name"), _count(permits, "permits")))

    @staticmethod
    def token_bucket(name: str, rate: float, burst: int) -> Resource:
        """``rate`` units per second, up to ``burst`` at once; units are spent, not returned."""
        config = ec.ResourceConfig.token_bucket(
            _name(name, "resource name"), _fraction(rate, "rate", low=0.0), _count(burst, "burst")
        )
        return Resource._checked(config)

    @staticmethod
    def _checked(config: ec.ResourceConfig) -> Resource:
        try:
            ec.validate_resource(config)
        except et.ConfigError as err:
            raise ValueError(str(err)) from None
        return Resource(config)

    @property
    def name(self) -> str:
        """The name tasks use in ``resources=``."""
        return self._config.name

    def to_engine(self) -> ec.ResourceConfig:
        """The engine's form."""
        return self._config

    def __repr__(self) -> str:
        c = self._config
        if c.kind is ec.ResourceKind.SEMAPHORE:
            return f"Resource.semaphore({c.name!r}, {c.permits})"
        return f"Resource.token_bucket({c.name!r}, {c.rate}, {c.burst})"


Executor = Callable[[Any, Any], Any]


class Pool:
    """A pool of concurrency slots running one executor, ``executor(ctx, payload)``.

    The executor is an ``async def`` function run on the scheduler's loop, or a plain function
    run in the loop's default thread pool. By default the pool autoscales between ``min`` and
    ``max`` slots (starting at ``initial``, else ``min``); ``autoscale=False`` fixes it at
    ``initial``, else ``max``; an ``AutoscaleConfig`` tunes the policy. ``lease_ttl`` makes
    attempts heartbeat (``ctx.heartbeat()``). ``max_pending`` bounds waiting tasks, and
    ``overflow`` says what a submission does at the bound: ``"wait"`` for room, ``"reject"``
    (``SubmitError("overloaded")``), or shed the lowest-priority or oldest waiting task. ``retry``
    is the pool's default ``RetryPolicy``. ``unknown_dependency="await"`` lets children wait up to
    ``await_timeout`` for a key not yet submitted. ``default_duration`` is the run-time estimate
    before any is learned; ``reservable_fraction`` the share of ``max`` that fixed starts may
    reserve. ``tenant_weights`` or ``fair_share`` share the pool between tenants by weight.
    """

    def __init__(
        self,
        name: str,
        executor: Executor,
        *,
        min: int = 1,
        max: int = 10,
        initial: int | None = None,
        autoscale: bool | AutoscaleConfig | None = None,
        lease_ttl: float | None = None,
        max_pending: int | None = None,
        overflow: Literal["wait", "reject", "shed_lowest", "shed_oldest"] = "wait",
        retry: RetryPolicy | None = None,
        unknown_dependency: Literal["reject", "await"] = "reject",
        await_timeout: float | None = None,
        default_duration: float = 1.0,
        reservable_fraction: float = 0.5,
        tenant_weights: Mapping[str, float] | None = None,
        fair_share: bool = False,
    ) -> None:
        if not callable(executor):
            raise TypeError("executor must be callable as executor(ctx, payload)")
        self.name = _name(name, "pool name")
        self.executor = executor
        scale: AutoscaleConfig | None
        if autoscale is None or autoscale is True:
            scale = AutoscaleConfig()
        elif autoscale is False:
            scale = None
        elif isinstance(autoscale, AutoscaleConfig):
            scale = autoscale
        else:
            raise TypeError("autoscale takes a bool or a cronoq.AutoscaleConfig")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise TypeError("retry= takes a cronoq.RetryPolicy")
        min = _count(min, "min")
        max = _count(max, "max", low=1)
        if min > max:
            raise ValueError(f"min ({min}) must not exceed max ({max})")
        if initial is None:
            initial = min if scale is not None else max
        initial = _count(initial, "initial")
        if initial > max:
            raise ValueError(f"initial ({initial}) must not exceed max ({max})")
        if max_pending is not None:
            max_pending = _count(max_pending, "max_pending")
        reservable_fraction = _fraction(reservable_fraction, "reservable_fraction", low=0.0, high=1.0)
        try:
            overflow_policy = et.OverflowPolicy(overflow)
            unknown = ec.UnknownDependencyPolicy(unknown_dependency)
        except ValueError as err:
            raise ValueError(str(err)) from None
        fairness = None
        if tenant_weights:
            weights = {
                _name(str(k), "tenant"): _fraction(v, f"tenant_weights[{k!r}]", low=0.0, low_open=True)
                for k, v in tenant_weights.items()
            }
            fairness = ec.Fairness(weights)
        elif fair_share:
            fairness = ec.Fairness({})
        self._config = ec.PoolConfig(
            name=name,
            min_workers=min,
            max_workers=max,
            initial_workers=initial,
            autoscale=scale.to_engine() if scale is not None else None,
            retry=(retry or RetryPolicy()).to_engine(),
            bounds=ec.Bounds(max_pending=max_pending),
            overflow=overflow_policy,
            reservable_fraction=float(reservable_fraction),
            default_duration=seconds_to_ns(default_duration, "default_duration"),
            lease_ttl=seconds_to_ns(lease_ttl, "lease_ttl", allow_zero=False) if lease_ttl is not None else None,
            unknown_dependency=unknown,
            await_timeout=seconds_to_ns(await_timeout, "await_timeout") if await_timeout is not None else None,
            fairness=fairness,
        )
        try:
            ec.validate_pool(self._config)
        except et.ConfigError as err:
            raise ValueError(str(err)) from None

    def to_engine(self) -> ec.PoolConfig:
        """The engine's form."""
        return self._config

    def __repr__(self) -> str:
        return f"Pool({self.name!r}, max={self._config.max_workers})"


class Task:
    """One task of a ``Scheduler.submit_batch``: a payload plus the options ``submit`` takes.

    The options are checked here, as ``submit`` checks them: a bad value raises ``ValueError`` (a
    wrong type ``TypeError``) at construction. Relative times (``deadline_in``, ``start_in``)
    count from the batch's submission.
    """

    __slots__ = ("_options", "_spec", "key", "payload")

    _options: Mapping[str, Any]

    @keyword_signature(TaskOptions)
    def __init__(self, payload: Any, **options: Unpack[TaskOptions]) -> None:
        if options:
            refuse_unknown(options, TASK_OPTIONS, "Task.__init__")
        self.payload = payload
        self.key = options.get("key")
        if _all_absent(options):
            # The common case (a bare payload): skip building and filtering the options dict.
            self._options = _NO_OPTIONS
            return
        self._options = {name: value for name, value in options.items() if value is not None}
        # Built once (relative times from 0) to refuse bad options now; ``to_spec`` shifts a copy.
        spec = build_spec(payload, 0, trace=False, **self._options)
        try:
            admission.check_values(spec)
        except et.AdmissionError as err:
            raise InvalidTaskOption(err.message) from None
        self._spec = spec

    @property
    def bare(self) -> bool:
        """Whether the task is a bare payload (no option was given)."""
        return not self._options

    def to_spec(self, now: int, *, trace: bool = True) -> et.TaskSpec:
        """The engine spec of this task, with relative times counted from ``now`` (ns)."""
        options = self._options
        if not options:
            return plain_spec(self.payload, trace)
        spec = copy.copy(self._spec)
        spec.payload = self.payload
        if "deadline_in" in options and spec.deadline is not None:
            spec.deadline += now
        fixed = spec.fixed_start
        if "start_in" in options and fixed is not None:
            spec.fixed_start = et.FixedStart(fixed.start + now, fixed.tolerance, fixed.on_miss)
        if trace and TRACEPARENT not in spec.tags:
            traceparent = current_traceparent()
            if traceparent is not None:
                spec.tags = {**spec.tags, TRACEPARENT: traceparent}
        return spec

    def __repr__(self) -> str:
        return f"Task({self.payload!r}, key={self.key!r})"


_NO_OPTIONS: Mapping[str, Any] = {}
"""The options of a task submitted with none set (shared, never mutated)."""


def _refs(after: TaskRefLike | Sequence[TaskRefLike] | None) -> list[TaskRefLike]:
    if after is None:
        return []
    if isinstance(after, str | int):
        if isinstance(after, bool):
            raise TypeError("after= takes task ids (int) or keys (str)")
        return [after]
    refs = list(after)
    for ref in refs:
        if isinstance(ref, bool) or not isinstance(ref, int | str):
            raise TypeError("after= takes task ids (int) or keys (str)")
    return refs


def _str_map(values: Mapping[str, Any] | None, what: str) -> Mapping[str, str]:
    if not values:
        return {}
    out: dict[str, str] = {}
    for name, value in values.items():
        if not isinstance(name, str):
            raise TypeError(f"{what} keys must be strings")
        out[name] = value if isinstance(value, str) else str(value)
    return out


def _all_absent(options: TaskOptions) -> bool:
    """Whether no task option was given (the common case: a bare payload); ``None`` is absent."""
    for value in options.values():  # noqa: SIM110  # a loop, not all(): it runs on every submission
        if value is not None:
            return False
    return True


def build_spec(payload: Any, now: int, *, trace: bool = True, **options: Unpack[TaskOptions]) -> et.TaskSpec:
    """Turn the keyword options of submit/enqueue/Task into an engine TaskSpec.

    Bad values raise ``InvalidTaskOption`` (a ``ValueError`` and a ``SubmitError`` with code
    ``invalid``); values of the wrong type raise ``TypeError``. With ``trace`` (the default), the
    W3C ``traceparent`` of the caller's active OpenTelemetry span becomes a tag, unless the
    caller set that tag.
    """
    if _all_absent(options):
        return plain_spec(payload, trace)
    try:
        spec = _build_spec(payload, now, options)
    except InvalidTaskOption:
        raise
    except ValueError as err:
        raise InvalidTaskOption(str(err)) from None
    if trace and TRACEPARENT not in spec.tags:
        traceparent = current_traceparent()
        if traceparent is not None:
            spec.tags = {**spec.tags, TRACEPARENT: traceparent}
    return spec


def plain_spec(payload: Any, trace: bool = True) -> et.TaskSpec:
    """The spec of a task with every option at its default: what ``build_spec`` returns when
    given none, without validating options that are all absent.

    The empty maps are the engine's shared constants (nothing mutates a spec's maps in place).
    """
    spec = et.TaskSpec(
        payload,
        None,
        "default",
        Priority.NORMAL,
        None,
        None,
        None,
        None,
        None,
        None,
        (),
        et.EMPTY_INT_MAP,
        et.EMPTY_STR_MAP,
        et.EMPTY_STR_MAP,
        None,
    )
    if trace:
        traceparent = current_traceparent()
        if traceparent is not None:
            spec.tags = {TRACEPARENT: traceparent}
    return spec


def _build_spec(payload: Any, now: int, options: TaskOptions) -> et.TaskSpec:
    deadline_in, deadline_at = options.get("deadline_in"), options.get("deadline_at")
    start_in, start_at = options.get("start_in"), options.get("start_at")
    tolerance, on_miss = options.get("tolerance"), options.get("on_miss")
    pool, kind, key, tenant = options.get("pool"), options.get("kind"), options.get("key"), options.get("tenant")
    retry, resources, duration_hint, timeout = (
        options.get("retry"),
        options.get("resources"),
        options.get("duration_hint"),
        options.get("timeout"),
    )
    if deadline_in is not None and deadline_at is not None:
        raise ValueError("set deadline_in or deadline_at, not both")
    if start_in is not None and start_at is not None:
        raise ValueError("set start_in or start_at, not both")
    deadline = None
    if deadline_in is not None:
        deadline = now + seconds_to_ns(deadline_in, "deadline_in")
    elif deadline_at is not None:
        deadline = time_to_ns(deadline_at, "deadline_at")
    fixed = None
    start = None
    if start_in is not None:
        start = now + seconds_to_ns(start_in, "start_in")
    elif start_at is not None:
        start = time_to_ns(start_at, "start_at")
    if start is not None:
        try:
            miss = et.MissPolicy(on_miss or "run_late")
        except ValueError:
            raise ValueError(f"invalid on_miss {on_miss!r}: expected run_late, skip or fail") from None
        fixed = et.FixedStart(
            start,
            seconds_to_ns(tolerance, "tolerance") if tolerance is not None else NS_PER_S,
            miss,
        )
    elif tolerance is not None or on_miss is not None:
        raise ValueError("tolerance and on_miss apply only to tasks with start_in or start_at")
    edges: list[et.Dep] = [et.Dep(ref, et.EdgeCond.ON_SUCCESS) for ref in _refs(options.get("after"))]
    for dep in options.get("deps") or ():
        if not isinstance(dep, Dep):
            raise TypeError("deps= takes cronoq.Dep objects")
        edges.append(dep.to_engine())
    if pool is not None and not isinstance(pool, str):
        raise TypeError("pool must be a string")
    if kind is not None and not isinstance(kind, str):
        raise TypeError("kind must be a string")
    if key is not None and not isinstance(key, str):
        raise TypeError("key must be a string")
    if tenant is not None and not isinstance(tenant, str):
        raise TypeError("tenant must be a string")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise TypeError("retry= takes a cronoq.RetryPolicy")
    amounts: dict[str, int] = {}
    for name, amount in (resources or {}).items():
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError(f"resource amounts must be ints (got {amount!r} for {name!r})")
        amounts[name] = amount
    return et.TaskSpec(
        payload=payload,
        pool=pool,
        kind=kind if kind is not None else "default",
        priority=parse_priority(options.get("priority")),
        key=key,
        deadline=deadline,
        fixed_start=fixed,
        duration_hint=seconds_to_ns(duration_hint, "duration_hint") if duration_hint is not None else None,
        timeout=seconds_to_ns(timeout, "timeout", allow_zero=False) if timeout is not None else None,
        retry=retry.to_engine() if retry is not None else None,
        deps=tuple(edges),
        resources=amounts,
        tags=_str_map(options.get("tags"), "tags"),
        labels=_str_map(options.get("labels"), "labels"),
        tenant=tenant,
    )
