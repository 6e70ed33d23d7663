"""Engine configuration, with the spec's defaults. Durations are int nanoseconds."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from . import limits
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
            validate_pool(pool)
            if pool.name in names:
                raise ConfigError(f"duplicate pool name {pool.name!r}")
            names.add(pool.name)
        rnames: set[str] = set()
        for res in self.resources:
            validate_resource(res)
            if res.name in rnames:
                raise ConfigError(f"duplicate resource name {res.name!r}")
            rnames.add(res.name)
        if not 0 <= self.id_epoch < 1 << 16:
            raise ConfigError("id_epoch must fit in 16 bits")
        if self.id_shard is not None and not 0 <= self.id_shard < 256:
            raise ConfigError("id_shard must fit in 8 bits")
        _require(limits.duration_problem(self.retention, "retention"))
        if not limits.is_int(self.retention_max) or self.retention_max < 0:
            raise ConfigError("retention_max must be a non-negative integer")
        _require(limits.duration_problem(self.metrics_window, "metrics_window", positive=True))
        _require(limits.duration_problem(self.urgency.window, "urgency.window"))
        for what, number in (("urgency.max", self.urgency.max), ("urgency.overdue_rate", self.urgency.overdue_rate),
                             ("urgency.overdue_cap", self.urgency.overdue_cap)):  # fmt: skip
            _require(limits.factor_problem(number, what, low=0.0))
        for what, values in (("priority.base", self.priority.base), ("priority.aging_rate", self.priority.aging_rate),
                             ("priority.age_cap", self.priority.age_cap)):  # fmt: skip
            if len(values) != CLASSES:
                raise ConfigError("priority settings need one value per class")
            for value in values:
                _require(limits.factor_problem(value, what, low=0.0))
        _validate_bounds("global bounds", self.global_bounds)


def _require(problem: str | None, pool: str | None = None) -> None:
    if problem is not None:
        raise ConfigError(problem if pool is None else f"pool {pool!r}: {problem}")


def _validate_bounds(what: str, bounds: Bounds) -> None:
    for bound in (bounds.max_pending, *bounds.per_class):
        if bound is not None and (not limits.is_int(bound) or bound < 0):
            raise ConfigError(f"{what}: pending bounds must be non-negative integers")


def validate_pool(pool: PoolConfig) -> None:
    """Raise ConfigError when a pool's settings are out of range (``CoreConfig.validate`` runs it)."""
    name = pool.name
    if not isinstance(name, str) or not name or "\0" in name:
        raise ConfigError("a pool needs a name without NUL characters")
    _require(limits.count_problem(pool.min_workers, "min_workers"), name)
    _require(limits.count_problem(pool.max_workers, "max_workers"), name)
    if pool.min_workers > pool.max_workers:
        raise ConfigError(f"pool {name!r}: min ({pool.min_workers}) exceeds max ({pool.max_workers})")
    if pool.initial_workers is not None and (
        not limits.is_int(pool.initial_workers) or not 0 <= pool.initial_workers <= pool.max_workers
    ):
        raise ConfigError(f"pool {name!r}: initial must be between 0 and max")
    if limits.factor_problem(pool.reservable_fraction, "reservable_fraction", low=0.0, high=1.0):
        raise ConfigError(f"pool {name!r}: reservable_fraction must be within [0, 1]")
    retry = pool.retry
    if not limits.is_int(retry.max_attempts) or retry.max_attempts < 1:
        raise ConfigError(f"pool {name!r}: retry.max_attempts must be at least 1")
    _require(limits.count_problem(retry.max_attempts, "retry.max_attempts", low=1), name)
    if limits.factor_problem(retry.multiplier, "retry.multiplier", low=1.0):
        raise ConfigError(f"pool {name!r}: retry.multiplier must be a finite number of at least 1")
    _require(limits.duration_problem(retry.initial_backoff, "retry.initial_backoff"), name)
    _require(limits.duration_problem(retry.max_backoff, "retry.max_backoff"), name)
    _require(limits.duration_problem(pool.default_duration, "default_duration"), name)
    _require(limits.duration_problem(pool.max_hold, "max_hold"), name)
    if pool.lease_ttl is not None:
        if limits.is_int(pool.lease_ttl) and pool.lease_ttl <= 0:
            raise ConfigError(f"pool {name!r}: lease_ttl must be positive")
        _require(limits.duration_problem(pool.lease_ttl, "lease_ttl", positive=True), name)
    if pool.await_timeout is not None:
        _require(limits.duration_problem(pool.await_timeout, "await_timeout"), name)
    _validate_bounds(f"pool {name!r}", pool.bounds)
    scale = pool.autoscale
    if scale is not None:
        if limits.factor_problem(scale.target_utilization, "target_utilization", low=0.0, high=1.0, low_open=True):
            raise ConfigError(f"pool {name!r}: target_utilization must be within (0, 1]")
        for what, value in (("interval", scale.interval), ("drain_time", scale.drain_time)):
            if limits.is_int(value) and value <= 0:
                raise ConfigError(f"pool {name!r}: autoscale interval and drain_time must be positive")
            _require(limits.duration_problem(value, f"autoscale {what}", positive=True), name)
        spans = (("reservation_horizon", scale.reservation_horizon),
                 ("stabilization_window", scale.stabilization_window), ("cooldown", scale.cooldown))  # fmt: skip
        for what, value in spans:
            _require(limits.duration_problem(value, f"autoscale {what}"), name)
        if limits.factor_problem(scale.ewma_alpha, "ewma_alpha", low=0.0, high=1.0, low_open=True):
            raise ConfigError(f"pool {name!r}: ewma_alpha must be within (0, 1]")
        if len(scale.slo) != CLASSES:
            raise ConfigError(f"pool {name!r}: autoscale slo needs one entry per class")
        for slo in scale.slo:
            if slo is not None and limits.is_int(slo) and slo <= 0:
                raise ConfigError(f"pool {name!r}: SLOs must be positive")
            if slo is not None:
                _require(limits.duration_problem(slo, "autoscale slo", positive=True), name)
        _require(limits.factor_problem(scale.max_step_up_ratio, "max_step_up_ratio", low=0.0), name)
        _require(limits.count_problem(scale.max_step_up_abs, "max_step_up_abs"), name)
        _require(limits.count_problem(scale.max_step_down, "max_step_down"), name)
        _require(limits.factor_problem(scale.cost_per_worker_second, "cost_per_worker_second", low=0.0), name)
    if pool.fairness is not None:
        for tenant, weight in pool.fairness.weights.items():
            if limits.factor_problem(weight, "weight", low=0.0, low_open=True):
                raise ConfigError(f"pool {name!r}: weight of tenant {tenant!r} must be positive")


def validate_resource(res: ResourceConfig) -> None:
    """Raise ConfigError when a resource's settings are out of range."""
    if not isinstance(res.name, str) or not res.name or "\0" in res.name:
        raise ConfigError("a resource needs a name without NUL characters")
    if res.kind is ResourceKind.SEMAPHORE:
        if not limits.is_int(res.permits) or res.permits < 1:
            raise ConfigError(f"resource {res.name!r}: permits must be at least 1")
        _require(limits.count_problem(res.permits, f"resource {res.name!r}: permits", low=1))
    else:
        if not limits.is_int(res.burst) or res.burst < 1:
            raise ConfigError(f"resource {res.name!r}: burst must be at least 1")
        _require(limits.count_problem(res.burst, f"resource {res.name!r}: burst", low=1))
        if limits.factor_problem(res.rate, "rate", low=0.0, low_open=True):
            raise ConfigError(f"resource {res.name!r}: rate must be positive")
