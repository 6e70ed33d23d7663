"""Building pool snapshots from the metrics window and the pool's live counters."""

from __future__ import annotations

from .snapshot import GroupSnapshot, PoolSnapshot
from .state import Pool
from .types import NS_PER_S


def pool_snapshot(pool: Pool, now: int) -> PoolSnapshot:
    window = pool.window
    agg = window.totals(now, pool.busy, pool.capacity)
    pool.account_workers(now)
    worker_seconds = pool.worker_ns / NS_PER_S
    cost_rate = pool.config.autoscale.cost_per_worker_second if pool.config.autoscale else 0.0
    dispatched = agg.dispatched
    objectives = agg.objective_total + agg.fixed_total
    met = agg.objective_met + agg.fixed_hits
    groups = sorted(pool.groups.values(), key=lambda g: (len(g.key), sorted(g.key)))
    return PoolSnapshot(
        name=pool.name,
        capacity=pool.capacity,
        busy=pool.busy,
        held=pool.held,
        desired=pool.desired,
        pending=pool.pending,
        pending_by_class=list(pool.pending_by_class),
        ready=sum(pool.counts[2]),
        reservations=len(pool.reservations),
        window=window.span(now) / NS_PER_S,
        dispatched=dispatched,
        succeeded=agg.succeeded,
        failed=agg.failed,
        retried=agg.retried,
        priority_adherence=1.0 - agg.inversions / dispatched if dispatched else 1.0,
        fixed_start_hit_rate=agg.fixed_hits / agg.fixed_total if agg.fixed_total else 1.0,
        utilization=agg.busy_ns / agg.capacity_ns if agg.capacity_ns else 0.0,
        schedule_efficiency=met / objectives if objectives else 1.0,
        wait_mean=agg.wait.mean() / NS_PER_S,
        wait_p50=agg.wait.quantile(0.5) / NS_PER_S,
        wait_p90=agg.wait.quantile(0.9) / NS_PER_S,
        wait_p99=agg.wait.quantile(0.99) / NS_PER_S,
        run_p50=agg.run.quantile(0.5) / NS_PER_S,
        run_p99=agg.run.quantile(0.99) / NS_PER_S,
        worker_seconds=worker_seconds,
        cost=worker_seconds * cost_rate,
        groups=tuple(GroupSnapshot(dict(g.labels), g.capacity, g.busy) for g in groups),
        totals=dict(pool.totals),
    )
