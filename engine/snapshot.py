"""Point-in-time views of the engine: per-pool quality signals and totals since start."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

TOTAL_NAMES: tuple[str, ...] = (
    "submitted",
    "dispatched",
    "succeeded",
    "failed",
    "dead_lettered",
    "cancelled",
    "skipped",
    "missed",
    "shed",
    "retries",
    "timeouts",
    "lease_expiries",
    "stale_completions",
    "recurring_conflicts",
    "recurring_invalid",
    "engine_errors",
)


@dataclass(frozen=True, slots=True)
class GroupSnapshot:
    labels: Mapping[str, str]
    capacity: int
    busy: int


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """One pool. Counters and rates cover the metrics window; times are seconds (float)."""

    name: str
    capacity: int
    busy: int
    held: int
    desired: int
    pending: int
    pending_by_class: list[int]  # critical, high, normal, low
    ready: int
    reservations: int
    window: float
    dispatched: int
    succeeded: int
    failed: int
    retried: int
    priority_adherence: float
    fixed_start_hit_rate: float
    utilization: float
    schedule_efficiency: float
    wait_mean: float
    wait_p50: float
    wait_p90: float
    wait_p99: float
    run_p50: float
    run_p99: float
    worker_seconds: float
    cost: float
    groups: tuple[GroupSnapshot, ...] = ()
    totals: Mapping[str, int] = field(default_factory=dict)
    """This pool's share of ``Snapshot.totals`` (what a pool-scoped reader may see)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    pools: list[PoolSnapshot]
    live_tasks: int
    running: int
    pending: int
    totals: Mapping[str, int] = field(default_factory=dict)

    def pool(self, name: str) -> PoolSnapshot | None:
        for pool in self.pools:
            if pool.name == name:
                return pool
        return None
