"""The drills: each is a ``Drill`` (what it needs of the cluster, and its ``inject`` coroutine)
registered by name. Adding a drill is one small module in this folder that calls ``register``:
``load()`` imports every module here."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..run import RunContext

__all__ = ["DRILLS", "Drill", "register"]


@dataclass(frozen=True, slots=True)
class Drill:
    name: str
    summary: str
    inject: Callable[[RunContext], Awaitable[None]]
    stores: frozenset[str] = frozenset({"sqlite", "postgres"})
    own_postgres: bool = False
    """The drill stops or starts Postgres, so it needs a throwaway server of its own."""
    fault_proxy: bool = False
    """The servers reach Postgres through the drill's fault proxy (not with ``--net netns``)."""
    netns: bool = False
    """With ``--net netns`` every server (and the drill's Postgres) runs in a network namespace of
    its own, so the drill can partition them with routes (``chaos/netns.py``)."""
    min_replicas: int = 1
    min_shards: int = 1
    pools_per_shard: int = 1
    """Pools each shard starts with; each gets workers, and producers cycle over every pool."""
    min_producers: int = 1
    restart: bool = True
    """The launcher starts a dead replica again (it rejoins as a standby)."""
    pool_settings: Mapping[str, int | float] = field(default_factory=dict)
    task_timeout_s: float | None = None
    slow_fraction: float = 0.0
    slow_s: float = 0.0


DRILLS: dict[str, Drill] = {}

_ORDER = ("leader", "store", "partition", "workers", "topology", "pool_move")
"""Modules listed first, in this order (``list`` and ``run all`` follow it); others come after."""


def register(drill: Drill) -> Drill:
    if drill.name in DRILLS:
        raise ValueError(f"drill {drill.name!r} is registered twice")
    DRILLS[drill.name] = drill
    return drill


def load() -> dict[str, Drill]:
    """Every drill, in registration order."""
    found = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    for module in [*(m for m in _ORDER if m in found), *(m for m in found if m not in _ORDER)]:
        importlib.import_module(f"{__name__}.{module}")
    return DRILLS
