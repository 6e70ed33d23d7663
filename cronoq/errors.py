"""The exceptions of the cronoq package. All of them pickle, so they cross process boundaries."""

from __future__ import annotations

__all__ = [
    "CronoqError",
    "EventsLagged",
    "Permanent",
    "Retryable",
    "SchedulerError",
    "SubmitError",
    "TaskFailed",
]


class CronoqError(Exception):
    """Base class of every cronoq exception."""


class SubmitError(CronoqError):
    """A submission was not admitted. ``code`` says why (``unknown_pool``, ``cycle``, ``full``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type[SubmitError], tuple[str, str]]:
        return (type(self), (self.code, self.message))


class InvalidTaskOption(SubmitError, ValueError):
    """A task option has a bad value (a negative duration, an unknown priority, ...).

    Both a ``SubmitError`` (code ``invalid``) and a ``ValueError``, so either ``except`` clause
    catches it. Not exported from ``cronoq``: catch one of its bases.
    """

    def __init__(self, message: str, code: str = "invalid") -> None:
        super().__init__(code, message)

    def __reduce__(self) -> tuple[type[SubmitError], tuple[str, str]]:
        return (type(self), (self.message, self.code))


class SchedulerError(CronoqError):
    """The scheduler cannot serve the call: stopped, misconfigured, or its store failed."""


class TaskFailed(CronoqError):
    """Awaiting a task that did not succeed.

    ``status`` is its terminal status (``failed``, ``dead_lettered``, ``cancelled``, ``skipped``,
    ``missed``, ``shed``), ``shutdown`` when the scheduler stopped first, or ``succeeded`` when the
    task succeeded but its output is no longer kept.
    """

    def __init__(self, status: str, message: str, task_id: int | None = None) -> None:
        super().__init__(status, message, task_id)
        self.status = status
        self.message = message
        self.task_id = task_id

    def __str__(self) -> str:
        return f"task {self.task_id} ended as {self.status}: {self.message}"

    def __reduce__(self) -> tuple[type[TaskFailed], tuple[str, str, int | None]]:
        return (type(self), (self.status, self.message, self.task_id))


class EventsLagged(CronoqError):
    """An event stream with ``on_lag="raise"`` dropped ``skipped`` events; iterate again to resume."""

    def __init__(self, skipped: int) -> None:
        super().__init__(skipped)
        self.skipped = skipped

    def __str__(self) -> str:
        return f"the event stream fell behind and skipped {self.skipped} events"

    def __reduce__(self) -> tuple[type[EventsLagged], tuple[int]]:
        return (type(self), (self.skipped,))


class Retryable(CronoqError):
    """Raise from an executor to fail this attempt and retry (no earlier than ``retry_after`` s)."""

    _cronoq_kind = "retryable"

    def __init__(self, message: str = "", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[type[Retryable], tuple[str, float | None]]:
        return (type(self), (str(self), self.retry_after))


class Permanent(CronoqError):
    """Raise from an executor to fail the task for good (no retry)."""

    _cronoq_kind = "permanent"
