"""Domain types of the engine: statuses, task specs, outcomes and admission errors.

All times are ``int`` nanoseconds since the Unix epoch; all durations are ``int`` nanoseconds.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, TypeAlias, TypeVar

NS_PER_S: Final = 1_000_000_000
NS_PER_MS: Final = 1_000_000


def secs(value: float) -> int:
    """Seconds (float) to nanoseconds (int)."""
    return round(value * NS_PER_S)


def to_secs(ns: int) -> float:
    return ns / NS_PER_S


class Priority(enum.IntEnum):
    """Priority classes; a lower value is more important."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3

    # ``name`` is the member name (``"HIGH"``), as the published ``cronoq.Priority`` has it.

    @property
    def label(self) -> str:
        """Lower-case class name (``critical``, ``high``, ``normal``, ``low``), as the wire spells it."""
        return self._name_.lower()

    @classmethod
    def parse(cls, value: Priority | int | str | None) -> Priority:
        if value is None:
            return cls.NORMAL
        if isinstance(value, cls):
            return value
        if isinstance(value, bool):
            raise ValueError(f"invalid priority {value!r}")
        if isinstance(value, int):
            try:
                return cls(value)
            except ValueError:
                raise ValueError(f"invalid priority {value!r}: expected 0..3") from None
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                raise ValueError(f"invalid priority {value!r}: expected critical, high, normal or low") from None
        raise ValueError(f"invalid priority {value!r}")


CLASSES: Final = 4


class TaskStatus(enum.Enum):
    BLOCKED = "blocked"
    SCHEDULED = "scheduled"
    READY = "ready"
    RUNNING = "running"
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    MISSED = "missed"
    SHED = "shed"

    @property
    def terminal(self) -> bool:
        return self._value_ in TERMINAL_VALUES


TERMINAL_STATUSES: Final = frozenset(
    {
        TaskStatus.SUCCEEDED,
        TaskStatus.FAILED,
        TaskStatus.DEAD_LETTERED,
        TaskStatus.CANCELLED,
        TaskStatus.SKIPPED,
        TaskStatus.MISSED,
        TaskStatus.SHED,
    }
)

TERMINAL_VALUES: Final = frozenset(status.value for status in TERMINAL_STATUSES)

# Statuses in which a task counts as pending for backpressure bounds.
PENDING_STATUSES: Final = frozenset({TaskStatus.BLOCKED, TaskStatus.SCHEDULED, TaskStatus.READY, TaskStatus.RETRYING})


class MissPolicy(enum.Enum):
    RUN_LATE = "run_late"
    SKIP = "skip"
    FAIL = "fail"


class OverlapPolicy(enum.Enum):
    SKIP = "skip"
    ALLOW = "allow"
    QUEUE = "queue"
    QUEUE_ON_SUCCESS = "queue_on_success"


class EdgeCond(enum.Enum):
    ON_SUCCESS = "on_success"
    ON_COMPLETE = "on_complete"
    ON_FAILURE = "on_failure"

    @classmethod
    def parse(cls, value: EdgeCond | str | None) -> EdgeCond:
        if value is None:
            return cls.ON_SUCCESS
        if isinstance(value, cls):
            return value
        name = str(value).strip().lower()
        if not name.startswith("on_"):
            name = "on_" + name
        try:
            return cls(name)
        except ValueError:
            raise ValueError(f"invalid dependency condition {value!r}: expected success, failure or complete") from None


class OverflowPolicy(enum.Enum):
    WAIT = "wait"
    REJECT = "reject"
    SHED_LOWEST = "shed_lowest"
    SHED_OLDEST = "shed_oldest"


TaskRef = int | str
"""A task id (int) or key (str)."""


@dataclass(frozen=True, slots=True)
class Dep:
    """A dependency edge on a parent, by id or key."""

    target: TaskRef
    cond: EdgeCond = EdgeCond.ON_SUCCESS


@dataclass(frozen=True, slots=True)
class FixedStart:
    start: int
    tolerance: int = NS_PER_S
    on_miss: MissPolicy = MissPolicy.RUN_LATE


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 3
    initial_backoff: int = NS_PER_S
    multiplier: float = 2.0
    max_backoff: int = 60 * NS_PER_S
    jitter: bool = True

    @classmethod
    def none(cls) -> RetryPolicy:
        return cls(max_attempts=1)

    def backoff(self, next_attempt: int) -> int:
        """Un-jittered delay before attempt ``next_attempt`` (>= 2):
        ``min(initial_backoff * multiplier ** (next_attempt - 2), max_backoff)``.

        Computed without ever forming a power that could overflow: once the exponent reaches the
        point where the delay would pass ``max_backoff`` (found with logarithms), the result is
        ``max_backoff``. Any attempt number and any finite multiplier give a delay in
        ``[0, max(initial_backoff, max_backoff)]``; a non-finite multiplier counts as no growth
        when it is NaN and as immediate saturation when it is infinite.
        """
        initial = self.initial_backoff
        ceiling = self.max_backoff
        if initial >= ceiling:
            return ceiling if ceiling > 0 else 0
        exponent = next_attempt - 2
        multiplier = self.multiplier
        if exponent <= 0 or initial <= 0 or not multiplier > 1.0:
            return initial
        if multiplier == math.inf:
            return ceiling
        # initial * m**k < ceiling  <=>  k < log(ceiling / initial) / log(m)
        if exponent >= math.log(ceiling / initial) / math.log(multiplier):
            return ceiling
        delay = int(initial * multiplier**exponent)
        return delay if delay < ceiling else ceiling


# What the engine carries for its callers and never reads: payloads and outputs. A name of its own
# also lets mypyc compile the dataclasses that hold one (it fetches a field's type by the name
# written in the annotation from the module's globals, where `object` is not).
Opaque: TypeAlias = object

EMPTY_STR_MAP: Final[Mapping[str, str]] = {}
EMPTY_INT_MAP: Final[Mapping[str, int]] = {}


@dataclass(slots=True)
class TaskSpec:
    """Everything a submission says about a task. ``pool=None`` means the default pool."""

    payload: Opaque = None
    pool: str | None = None
    kind: str = "default"
    priority: Priority = Priority.NORMAL
    key: str | None = None
    deadline: int | None = None
    fixed_start: FixedStart | None = None
    duration_hint: int | None = None
    timeout: int | None = None
    retry: RetryPolicy | None = None
    deps: tuple[Dep, ...] = ()
    resources: Mapping[str, int] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class RecurringSpec:
    """A cron schedule producing fixed-start occurrences of ``template``."""

    name: str
    cron: str
    template: TaskSpec
    tz: str | None = None
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    tolerance: int = NS_PER_S
    on_miss: MissPolicy = MissPolicy.RUN_LATE
    deadline_after: int | None = None


RECURRING_TAG: Final = "cronoq.recurring"


# ---------------------------------------------------------------------------------------------
# Attempt outcomes reported through Core.complete()


@dataclass(frozen=True, slots=True)
class Success:
    output: Opaque = None


@dataclass(frozen=True, slots=True)
class Failure:
    message: str = ""
    permanent: bool = False
    retry_after: int | None = None


@dataclass(frozen=True, slots=True)
class CancelledByExecutor:
    """The executor asked for its task to end as Cancelled."""

    message: str = ""


Outcome = Success | Failure | CancelledByExecutor


# ---------------------------------------------------------------------------------------------
# Errors


class SubmitCode(enum.Enum):
    UNKNOWN_POOL = "unknown_pool"
    UNKNOWN_RESOURCE = "unknown_resource"
    RESOURCE_EXCEEDS_CAPACITY = "resource_exceeds_capacity"
    RESERVATION_CONFLICT = "reservation_conflict"
    CYCLE = "cycle"
    UNKNOWN_DEPENDENCY = "unknown_dependency"
    FULL = "full"
    OVERLOADED = "overloaded"
    DUPLICATE_KEY_IN_BATCH = "duplicate_key_in_batch"
    INVALID = "invalid"


_Raised = TypeVar("_Raised", bound=BaseException)


class EngineError(Exception):
    """Base of errors raised by the engine."""


class AdmissionError(EngineError):
    """A submission (or one task of a batch, named by ``index``) was not admitted."""

    def __init__(self, code: SubmitCode, message: str, index: int | None = None) -> None:
        super().__init__(message if index is None else f"task {index}: {message}")
        self.code = code
        self.message = message
        self.index = index

    def at(self, index: int) -> AdmissionError:
        return AdmissionError(self.code, self.message, index)


class ConfigError(EngineError):
    """A configuration or recurring template the engine cannot accept."""


class UnknownTask(EngineError):
    """No live or retained task has this id or key."""


class InvalidRequest(EngineError, ValueError):
    """A call with an argument out of range (a negative capacity, ...); nothing was changed."""


class EngineFault(Exception):
    """An unexpected exception inside the engine, tagged with what it was working on.

    Raised instead of the original exception (kept as ``__cause__``) where the engine can tell
    which task (``task_id``) or schedule (``schedule``) it was handling. The engine's state may
    be half-updated: the driver must not keep using it, but rebuild it from the store (with the
    culprit dead-lettered) or, without a store, dead-letter the culprit and check the invariants.
    Deliberately not an ``EngineError``: those are refusals that leave the state untouched.
    """

    def __init__(self, message: str, *, task_id: int | None = None, schedule: str | None = None) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.schedule = schedule

    @classmethod
    def wrap(cls, error: BaseException, *, task_id: int | None = None, schedule: str | None = None) -> EngineFault:
        """A fault for ``error`` (an existing fault keeps its own culprit unless it has none)."""
        if isinstance(error, EngineFault):
            if error.task_id is None and error.schedule is None:
                error.task_id, error.schedule = task_id, schedule
            return error
        what = f"task {task_id}" if task_id is not None else f"schedule {schedule!r}" if schedule else "the engine"
        fault = cls(f"{type(error).__name__} while handling {what}: {error}", task_id=task_id, schedule=schedule)
        return caused_by(fault, error)


def caused_by(error: _Raised, cause: BaseException | None) -> _Raised:
    """``error`` with ``cause`` as its ``__cause__`` (``None``: no cause, and the exception being
    handled not shown as its context), exactly as ``raise error from cause`` sets them. The engine
    compiled by mypyc (scripts/build_engine.py) raises ``raise ... from ...`` as a plain ``raise``,
    so its modules state the cause with this too: ``raise caused_by(error, None) from None``."""
    error.__cause__ = cause
    return error
