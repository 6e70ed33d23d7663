"""Engine configuration, with the spec's defaults. Durations are int nanoseconds."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .types import CLASSES, NS_PER_S, ConfigError, OverflowPolicy, RetryPolicy


@dataclass(frozen=True, slots=True)
class PriorityConfig:
    """score = base[class] + min(aging_rate[class] * wait_s, age_cap[class]) + urgency."""

    base: tuple[float, float, float, float] = (10000.0, 1000.0, 100.0, 10.0)
    aging_rate: tuple[float, float, float, float] = (2.0, 2.0, 2.0, 2.0)
    age_cap: tuple[float, float, float, float] = (800.0, 800.0, 800.0, 800.0)


@dataclass(frozen=True, slots=True)
class UrgencyConfig:
    max: float = 5000.0
    window: int = 5 * NS_PER_S
    overdue_rate: float = 100.0
    overdue_cap: float = 3000.0


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    interval: int = NS_PER_S
    target_utilization: float = 0.75
    drain_time: int = 30 * NS_PER_S
    slo: tuple[int | None, int | None, int | None, int | None] = (None, None, None, None)
    reservation_horizon: int = 60 * NS_PER_S
    stabilization_window: int = 60 * NS_PER_S
    cooldown: int = 30 * NS_PER_S
    max_step_up_ratio: float = 1.0
    max_step_up_abs: int = 4
    max_step_down: int = 1
    ewma_alpha: float = 0.3
    cost_per_worker_second: float = 0.0


@dataclass(frozen=True, slots=True)
class Bounds:
    """Limits on pending tasks: overall and per class (None = unbounded)."""

    max_pending: int | None = None
    per_class: tuple[int | None, int | None, int | None, int | None] = (None, None, None, None)

    @property
    def bounded(self) -> bool:
        return self.max_pending is not None or any(b is not None for b in self.per_class)


class UnknownDependencyPolicy(enum.Enum):
    REJECT = "reject"
    AWAIT = "await"


@dataclass(frozen=True, slots=True)
class Fairness:
    """Weighted fair sharing between tenants; unlisted tenants (and no tenant) weigh 1."""

    weights: Mapping[str, float] = field(default_factory=dict)

    def weight(self, tenant: str | None) -> float:
        if tenant is None:
            return 1.0
        return self.weights.get(tenant, 1.0)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    name: str
    min_workers: int = 1
    max_workers: int = 10
    initial_workers: int | None = None
    autoscale: AutoscaleConfig | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    bounds: Bounds = field(default_factory=Bounds)
    overflow: OverflowPolicy = OverflowPolicy.WAIT
    reservable_fraction: float = 0.5
    default_duration: int = NS_PER_S
    max_hold: int = 300 * NS_PER_S
    lease_ttl: int | None = None
    unknown_dependency: UnknownDependencyPolicy = UnknownDependencyPolicy.REJECT
    await_timeout: int | None = None
    fairness: Fairness | None = None

    @property
    def reservation_limit(self) -> int:
        return max(1, math.floor(self.max_workers * self.reservable_fraction))


class ResourceKind(enum.Enum):
    SEMAPHORE = "semaphore"
    TOKEN_BUCKET = "token_bucket"


@dataclass(frozen=True, slots=True)
class ResourceConfig:
    name: str
    kind: ResourceKind
    permits: int = 0
    rate: float = 0.0
    burst: int = 0

    @classmethod
    def semaphore(cls, name: str, permits: int) -> ResourceConfig:
        return cls(name, ResourceKind.SEMAPHORE, permits=permits)

    @classmethod
    def token_bucket(cls, name: str, rate: float, burst: int) -> ResourceConfig:
        return cls(name, ResourceKind.TOKEN_BUCKET, rate=rate, burst=burst)

    @property
    def capacity(self) -> int:
        return self.permits if self.kind is ResourceKind.SEMAPHORE else self.burst


@dataclass(frozen=True, slots=True)
class CoreConfig:
    pools: Sequence[PoolConfig] = (PoolConfig("default"),)
    resources: Sequence[ResourceConfig] = ()
    priority: PriorityConfig = field(default_factory=PriorityConfig)
    urgency: UrgencyConfig = field(default_factory=UrgencyConfig)
    global_bounds: Bounds = field(default_factory=Bounds)
    retention: int = 3600 * NS_PER_S
    retention_max: int = 1_000_000
    persist: bool = False
    emit_transitions: bool = False
    id_epoch: int = 1
    id_shard: int | None = None
    metrics_window: int = 60 * NS_PER_S
    seed: int = 0

    def validate(self) -> None:
        if not self.pools:
            raise ConfigError("at least one pool is required")
        names: set[str] = set()
        for pool in self.pools:
            _validate_pool(pool)
            if pool.name in names:
                raise ConfigError(f"duplicate pool name {pool.name!r}")
            names.add(pool.name)
        rnames: set[str] = set()
        for res in self.resources:
            _validate_resource(res)
            if res.name in rnames:
                raise ConfigError(f"duplicate resource name {res.name!r}")
            rnames.add(res.name)
        if not 0 <= self.id_epoch < 1 << 16:
            raise ConfigError("id_epoch must fit in 16 bits")
        if self.id_shard is not None and not 0 <= self.id_shard < 256:
            raise ConfigError("id_shard must fit in 8 bits")
        if self.retention < 0 or self.retention_max < 0:
            raise ConfigError("retention must not be negative")
        if self.metrics_window <= 0:
            raise ConfigError("metrics_window must be positive")
        for values in (self.priority.base, self.priority.aging_rate, self.priority.age_cap):
            if len(values) != CLASSES:
                raise ConfigError("priority settings need one value per class")


def _validate_pool(pool: PoolConfig) -> None:
    if not pool.name or "\0" in pool.name:
        raise ConfigError("a pool needs a name without NUL characters")
    if pool.min_workers < 0 or pool.max_workers < 0:
        raise ConfigError(f"pool {pool.name!r}: worker counts must not be negative")
    if pool.min_workers > pool.max_workers:
        raise ConfigError(f"pool {pool.name!r}: min ({pool.min_workers}) exceeds max ({pool.max_workers})")
    if pool.initial_workers is not None and not 0 <= pool.initial_workers <= pool.max_workers:
        raise ConfigError(f"pool {pool.name!r}: initial must be between 0 and max")
    if not 0.0 <= pool.reservable_fraction <= 1.0 or math.isnan(pool.reservable_fraction):
        raise ConfigError(f"pool {pool.name!r}: reservable_fraction must be within [0, 1]")
    if pool.retry.max_attempts < 1:
        raise ConfigError(f"pool {pool.name!r}: retry.max_attempts must be at least 1")
    if pool.retry.multiplier < 1.0:
        raise ConfigError(f"pool {pool.name!r}: retry.multiplier must be at least 1")
    if pool.default_duration < 0 or pool.max_hold < 0:
        raise ConfigError(f"pool {pool.name!r}: durations must not be negative")
    if pool.lease_ttl is not None and pool.lease_ttl <= 0:
        raise ConfigError(f"pool {pool.name!r}: lease_ttl must be positive")
    scale = pool.autoscale
    if scale is not None:
        if not 0.0 < scale.target_utilization <= 1.0:
            raise ConfigError(f"pool {pool.name!r}: target_utilization must be within (0, 1]")
        if scale.interval <= 0 or scale.drain_time <= 0:
            raise ConfigError(f"pool {pool.name!r}: autoscale interval and drain_time must be positive")
        if not 0.0 < scale.ewma_alpha <= 1.0:
            raise ConfigError(f"pool {pool.name!r}: ewma_alpha must be within (0, 1]")
        if any(s is not None and s <= 0 for s in scale.slo):
            raise ConfigError(f"pool {pool.name!r}: SLOs must be positive")
    if pool.fairness is not None:
        for tenant, weight in pool.fairness.weights.items():
            if not weight > 0 or math.isinf(weight):
                raise ConfigError(f"pool {pool.name!r}: weight of tenant {tenant!r} must be positive")


def _validate_resource(res: ResourceConfig) -> None:
    if not res.name or "\0" in res.name:
        raise ConfigError("a resource needs a name without NUL characters")
    if res.kind is ResourceKind.SEMAPHORE:
        if res.permits < 1:
            raise ConfigError(f"resource {res.name!r}: permits must be at least 1")
    else:
        if res.burst < 1:
            raise ConfigError(f"resource {res.name!r}: burst must be at least 1")
        if not res.rate > 0 or math.isinf(res.rate):
            raise ConfigError(f"resource {res.name!r}: rate must be positive")
