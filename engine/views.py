"""Read-only views of tasks and schedules handed out by the engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .types import OverlapPolicy, Priority, TaskStatus


@dataclass(slots=True)
class Submitted:
    id: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class TaskInfo:
    id: int
    pool: str
    key: str | None
    kind: str
    status: TaskStatus
    attempt: int
    max_attempts: int
    priority: Priority
    tenant: str | None
    created_at: int
    started_at: int | None
    finished_at: int | None
    message: str | None
    has_output: bool
    tags: Mapping[str, str]
    deadline: int | None
    fixed_start: int | None


@dataclass(frozen=True, slots=True)
class RecurringInfo:
    name: str
    cron: str
    tz: str | None
    pool: str
    kind: str
    overlap: OverlapPolicy
    next_at: int | None
    last_task_id: int | None
    armed: bool
    key: str | None = None
    """The template's key: each occurrence's key is ``<key>@<start>``."""
