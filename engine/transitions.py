"""The status machine of a task: which status may follow which.

Every status change in the engine goes through ``check`` (see ``Registry``): a move the table does
not allow is a bug in the engine, raised as ``EngineFault`` naming the task so that the driver
contains it like any other internal error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from .types import EngineFault, TaskStatus

_BLOCKED: Final = TaskStatus.BLOCKED
_SCHEDULED: Final = TaskStatus.SCHEDULED
_READY: Final = TaskStatus.READY
_RUNNING: Final = TaskStatus.RUNNING
_RETRYING: Final = TaskStatus.RETRYING

# Ends a task can meet before it runs: shed, cancelled, skipped by a dependency or an overlap
# guard, missed or failed at its fixed start, dead-lettered by a driver containing a fault.
_ENDS_WAITING: Final = frozenset(
    {
        TaskStatus.FAILED,
        TaskStatus.DEAD_LETTERED,
        TaskStatus.CANCELLED,
        TaskStatus.SKIPPED,
        TaskStatus.MISSED,
        TaskStatus.SHED,
    }
)

ALLOWED: Final[Mapping[TaskStatus, frozenset[TaskStatus]]] = {
    # Released by its dependencies (to wait for its start, or to run); a recovered attempt that
    # was running when the previous leader died waits for its retry.
    _BLOCKED: frozenset({_SCHEDULED, _READY, _RETRYING}) | _ENDS_WAITING,
    _SCHEDULED: frozenset({_READY}) | _ENDS_WAITING,
    # A new fixed-start task whose start is still ahead moves on to Scheduled.
    _READY: frozenset({_SCHEDULED, _RUNNING}) | _ENDS_WAITING,
    _RETRYING: frozenset({_READY}) | _ENDS_WAITING,
    # Only an attempt ends as Succeeded; a running task is never shed, skipped or missed.
    _RUNNING: frozenset(
        {_RETRYING, TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.DEAD_LETTERED, TaskStatus.CANCELLED}
    ),
    **{status: frozenset() for status in TaskStatus if status.terminal},
}

BY_VALUE: Final[Mapping[str, frozenset[str]]] = {
    old._value_: frozenset(new._value_ for new in targets) for old, targets in ALLOWED.items()
}
"""The same table keyed by the members' values: hashing a str runs no Python code, unlike an enum
member, and the table is consulted on every move."""


def allowed(old: TaskStatus, new: TaskStatus) -> bool:
    return new._value_ in BY_VALUE[old._value_]


def check(task_id: int, old: TaskStatus, new: TaskStatus) -> None:
    """Raise ``EngineFault`` unless a task may go from ``old`` to ``new``."""
    if new._value_ not in BY_VALUE[old._value_]:
        raise EngineFault(f"task {task_id} cannot go from {old.value} to {new.value}", task_id=task_id)
