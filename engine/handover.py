"""A pool joining or leaving a running engine: the engine's half of a live pool move.

A pool moves between shards without either shard's leader stepping down (docs/pool-moves.md):
the source drains the pool (no attempt of it runs), hands its rows to the target's store in one
fenced transaction, then lets go of the pool here (``release``); the target reads the moved rows
back and adds the pool to its running engine (``join`` then ``adopt``). Every other pool of
either engine keeps its tasks, leases, timers and counters untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import recovery
from .actions import Recovered
from .config import PoolConfig
from .state import Pool
from .types import ConfigError, TaskStatus

if TYPE_CHECKING:
    from .parts import Parts

_GONE = TaskStatus.CANCELLED
"""The status a released task object is left in: terminal, so no timer of it fires any more."""


@dataclass(frozen=True, slots=True)
class Released:
    """What the engine let go of with a pool."""

    live: int
    terminal: int
    schedules: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    """Every task id let go of (whoever waits here for one of them must ask the pool's new shard)."""


@dataclass(frozen=True, slots=True)
class Adopted:
    """What a pool brought into the engine. ``key_clashes`` are keys of adopted tasks that a task
    of another pool of this engine already held; the key keeps naming that task (one key, one
    task), and the adopted one is found by its id only."""

    tasks: int
    schedules: int
    rejected: list[tuple[int, str]] = field(default_factory=list)
    key_clashes: list[str] = field(default_factory=list)


def join(parts: Parts, config: PoolConfig, window: int, now: int) -> None:
    """Add the pool of ``config`` to a running engine, empty (``adopt`` brings its tasks)."""
    if config.name in parts.pools:
        raise ConfigError(f"pool {config.name!r} is already in this engine")
    index = max(pool.index for pool in parts.pool_list) + 1
    pool = Pool(config, index, window, now)
    parts.pools[config.name] = pool
    parts.pool_list.append(pool)
    parts.admission.add_pool(pool)
    parts.capacity.arm_autoscalers([pool])


def adopt(parts: Parts, now: int, recovered: Recovered) -> Adopted:
    """Bring the stored tasks and schedules of pools that joined (``recovered`` holds only theirs)
    into the running engine, by the same rules as recovery: an attempt recorded as running counts
    as used, fixed starts that passed apply their miss policy, schedules keep their overlap guard."""
    registry = parts.registry
    for item in recovered.tasks:
        if item.record.pool not in parts.pools:
            raise ConfigError(f"pool {item.record.pool!r} has not joined this engine")
        if registry.get(item.record.id) is not None:
            raise ConfigError(f"task {item.record.id} is already in this engine")
    held: dict[str, int] = {}
    for item in recovered.tasks:
        key = item.record.spec.key
        owner = registry.key_owner(key) if key is not None else None
        if key is not None and owner is not None:
            held[key] = owner
    rejected = recovery.restore(parts, now, recovered, running=True)
    for key, owner in held.items():
        registry.claim_key(key, owner)
    return Adopted(len(recovered.tasks), len(recovered.recurring), rejected, sorted(held))


def release(parts: Parts, name: str) -> Released:
    """Let go of pool ``name`` and everything of it: tasks (live and retained), keys, schedules,
    waiters and timers. The pool must have no running attempt (it was drained) and must not be
    the engine's only pool. The caller replaces ``parts.default_pool`` if it was that pool."""
    pool = parts.pools.get(name)
    if pool is None:
        raise ConfigError(f"unknown pool {name!r}")
    if len(parts.pool_list) == 1:
        raise ConfigError(f"pool {name!r} is this engine's only pool")
    if pool.busy:
        raise ConfigError(f"pool {name!r} still has {pool.busy} attempts running")
    schedules = parts.recurring.drop_pool(pool)
    dropped = parts.registry.drop_pool(pool)
    live = 0
    resources = parts.resources
    for task in dropped:
        if task.status.terminal:
            continue
        live += 1
        if resources.is_parked(task.id):
            resources.unpark(task.id)
        # The task object may still sit in a timer (retry, fixed start, awaited key): once it
        # is terminal none of them applies. Nothing is stored or published for it here: its
        # rows and its life continue on the shard the pool moved to.
        task.status = _GONE
    parts.dependencies.drop_pool(pool)
    parts.outcomes.drop_retained(pool)
    parts.dispatcher.drop_pool(pool)
    parts.admission.drop_pool(pool)
    del parts.pools[name]
    parts.pool_list.remove(pool)
    if pool is parts.default_pool:
        # What names no pool goes to the first one left (a server always names the pool; this
        # keeps the engine whole for callers that do not).
        parts.intake.set_default_pool(parts.pool_list[0])
        parts.recurring.set_default_pool(parts.pool_list[0])
    return Released(live, len(dropped) - live, schedules, [task.id for task in dropped])
