"""How the driver contains internal errors of the engine (see ``Driver._fault``): the request to
rebuild an engine, and how a fault's culprit is found and described."""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable
from typing import Any

from cronoq.engine import Core, EngineFault

Command = Callable[[Core, int], Any]

MAX_CONSECUTIVE_FAULTS = 5
"""Internal errors in a row (no clean step between them) after which the driver gives up leading."""

LOGGED_REJECTS = 20
"""Recovered tasks dead-lettered for their values that are named one by one in the log."""


class Rebuild(Exception):
    """The engine may be half-updated by ``error``: rebuild it from the store, then run
    ``requeue`` (commands of the failed step, with their futures) first."""

    def __init__(self, error: Exception, requeue: list[tuple[Command, asyncio.Future[Any] | None]]) -> None:
        super().__init__(str(error))
        self.error = error
        self.requeue = requeue


def creator(error: Exception, marks: list[int], last_id: int) -> int | None:
    """The index of the step's command that created the task a fault names (it was never
    stored, so that command is the one to refuse), or None."""
    task_id = error.task_id if isinstance(error, EngineFault) else None
    if task_id is None or not marks or task_id <= marks[0] or task_id > last_id:
        return None
    return bisect.bisect_left(marks, task_id) - 1


def names_culprit(error: Exception) -> bool:
    return isinstance(error, EngineFault) and (error.task_id is not None or error.schedule is not None)


def culprit_message(error: BaseException) -> str:
    cause = error.__cause__ if isinstance(error, EngineFault) and error.__cause__ is not None else error
    text = f"dead-lettered after an internal error: {type(cause).__name__}: {cause}"
    return text if len(text) <= 500 else text[:497] + "..."
