"""cronoq: an elastic, priority-aware task scheduler.

Embed it with ``cronoq.Scheduler`` (asyncio), or talk to a cronoq server with ``cronoq.client``.
Public names are loaded lazily, so ``import cronoq.engine`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_EXPORTS = {
    "AutoscaleConfig": "cronoq._options",
    "Dep": "cronoq._options",
    "Pool": "cronoq._options",
    "Priority": "cronoq._options",
    "Resource": "cronoq._options",
    "RetryPolicy": "cronoq._options",
    "Task": "cronoq._options",
    "Codec": "cronoq._codec",
    "JsonCodec": "cronoq._codec",
    "CronoqError": "cronoq.errors",
    "EventsLagged": "cronoq.errors",
    "Permanent": "cronoq.errors",
    "Retryable": "cronoq.errors",
    "SchedulerError": "cronoq.errors",
    "SubmitError": "cronoq.errors",
    "TaskFailed": "cronoq.errors",
    "EventStream": "cronoq._scheduler",
    "Scheduler": "cronoq._scheduler",
    "StatusEvent": "cronoq._scheduler",
    "TaskContext": "cronoq._scheduler",
    "TaskHandle": "cronoq._scheduler",
    "Snapshot": "cronoq.engine.snapshot",
    "PoolSnapshot": "cronoq.engine.snapshot",
    "SqliteStore": "cronoq.stores.sqlite",
}

__all__ = [
    "AutoscaleConfig",
    "Codec",
    "CronoqError",
    "Dep",
    "EventStream",
    "EventsLagged",
    "JsonCodec",
    "Permanent",
    "Pool",
    "PoolSnapshot",
    "Priority",
    "Resource",
    "RetryPolicy",
    "Retryable",
    "Scheduler",
    "SchedulerError",
    "Snapshot",
    "SqliteStore",
    "StatusEvent",
    "SubmitError",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskHandle",
    "__version__",
]

if TYPE_CHECKING:
    from cronoq._codec import Codec, JsonCodec
    from cronoq._options import AutoscaleConfig, Dep, Pool, Priority, Resource, RetryPolicy, Task
    from cronoq._scheduler import EventStream, Scheduler, StatusEvent, TaskContext, TaskHandle
    from cronoq.engine.snapshot import PoolSnapshot, Snapshot
    from cronoq.errors import (
        CronoqError,
        EventsLagged,
        Permanent,
        Retryable,
        SchedulerError,
        SubmitError,
        TaskFailed,
    )
    from cronoq.stores.sqlite import SqliteStore


def __getattr__(name: str) -> Any:
    """Import a public name (or the ``client`` / ``compat`` module) on first access."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name in ("client", "compat"):
        return importlib.import_module(f"cronoq.{name}")
    raise AttributeError(f"module 'cronoq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
