"""Read-only views of tasks and schedules handed out by the engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .types import OverlapPolicy, Priority, TaskStatus


@dataclass(slots=True)
class Submitted:
    id: int
    duplicate: bool

    def __init__(self, id: int, duplicate: bool) -> None:  # see actions.py on explicit __init__
        self.id = id
        self.duplicate = duplicate


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
class TaskQuery:
    """Which tasks a listing wants; ``None`` (or an empty set) leaves a field unfiltered.

    The same filter selects live and retained tasks in the engine and finished ones in a store's
    history, so both halves of a listing agree. ``created_from`` is inclusive, ``created_to``
    exclusive (Unix ns of submission).
    """

    pools: frozenset[str] | None = None
    statuses: frozenset[TaskStatus] | None = None
    kinds: frozenset[str] | None = None
    tenants: frozenset[str] | None = None
    key_prefix: str | None = None
    created_from: int | None = None
    created_to: int | None = None

    def matches(self, pool: str, status: TaskStatus, kind: str, tenant: str | None, key: str | None,
                created_at: int) -> bool:  # fmt: skip
        if self.pools and pool not in self.pools:
            return False
        if self.statuses and status not in self.statuses:
            return False
        if self.kinds and kind not in self.kinds:
            return False
        if self.tenants and (tenant is None or tenant not in self.tenants):
            return False
        if self.key_prefix and (key is None or not key.startswith(self.key_prefix)):
            return False
        if self.created_from is not None and created_at < self.created_from:
            return False
        return self.created_to is None or created_at < self.created_to


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
    paused: bool = False
    """Paused by an admin: it creates no occurrence (``next_at`` is None) until resumed."""
