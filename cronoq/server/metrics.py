"""Prometheus text built from a scheduler snapshot at scrape time.

``render`` is what ``GET /metrics`` serves (the HTTP gateway calls it through
``Api.metrics_text``). Each scrape builds a private registry with one collector, so nothing is
kept between scrapes and the numbers are exactly those of the snapshot.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cronoq.engine import Snapshot

__all__ = ["CONTENT_TYPE", "TERMINAL_TOTALS", "ProcessFigures", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

CLASS_NAMES = ("critical", "high", "normal", "low")

TERMINAL_TOTALS = ("succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed")
"""Totals reported as ``cronoq_tasks_total{status=...}``."""

# Other totals: (metric name without _total, help text).
_OTHER_TOTALS = {
    "submitted": ("cronoq_tasks_submitted", "Tasks admitted since this leader started."),
    "dispatched": ("cronoq_tasks_dispatched", "Attempts started since this leader started."),
    "retries": ("cronoq_retries", "Attempts that failed and were scheduled again."),
    "timeouts": ("cronoq_timeouts", "Attempts that ran past their timeout."),
    "lease_expiries": ("cronoq_lease_expiries", "Leases that expired without a heartbeat."),
    "stale_completions": ("cronoq_stale_completions", "Late, duplicate or previous-leader reports that were ignored."),
    "recurring_conflicts": ("cronoq_recurring_conflicts", "Recurring occurrences refused at admission."),
    "recurring_invalid": ("cronoq_recurring_invalid", "Recurring schedules that became invalid."),
    "engine_errors": (
        "cronoq_engine_errors",
        "Engine steps that raised and tasks recovery could not load; each one's task was "
        "dead-lettered (see the error log).",
    ),
}

# Per-pool gauges: (snapshot attribute, metric name, help).
_POOL_GAUGES = (
    ("capacity", "cronoq_pool_capacity", "Slots of the connected workers of the pool."),
    ("busy", "cronoq_pool_busy", "Slots running an attempt."),
    ("held", "cronoq_pool_held", "Slots held idle for an upcoming fixed start."),
    ("pending", "cronoq_pool_pending", "Tasks waiting to run (blocked, scheduled, ready or retrying)."),
    ("ready", "cronoq_pool_ready", "Tasks ready to run now."),
    ("reservations", "cronoq_pool_reservations", "Fixed-start reservations booked."),
    ("dispatched", "cronoq_pool_window_dispatched", "Attempts started over the metrics window."),
    ("succeeded", "cronoq_pool_window_succeeded", "Tasks that succeeded over the metrics window."),
    ("failed", "cronoq_pool_window_failed", "Tasks that failed over the metrics window."),
    ("retried", "cronoq_pool_window_retried", "Attempts retried over the metrics window."),
    ("priority_adherence", "cronoq_pool_priority_adherence", "1 - priority inversions / dispatches over the window."),
    ("fixed_start_hit_rate", "cronoq_pool_fixed_start_hit_rate", "Share of fixed starts within their tolerance."),
    ("utilization", "cronoq_pool_utilization", "Busy slots / capacity, integrated over the window."),
    ("schedule_efficiency", "cronoq_pool_schedule_efficiency", "How well the pool met deadlines and starts."),
    ("wait_mean", "cronoq_pool_wait_mean_seconds", "Mean queue wait over the window."),
    ("wait_p50", "cronoq_pool_wait_p50_seconds", "Median queue wait over the window."),
    ("wait_p90", "cronoq_pool_wait_p90_seconds", "90th percentile queue wait over the window."),
    ("wait_p99", "cronoq_pool_wait_p99_seconds", "99th percentile queue wait over the window."),
    ("run_p50", "cronoq_pool_run_p50_seconds", "Median attempt run time over the window."),
    ("run_p99", "cronoq_pool_run_p99_seconds", "99th percentile attempt run time over the window."),
)


@dataclass(frozen=True, slots=True)
class ProcessFigures:
    """What the serving process knows beside the snapshot: its leadership and its store."""

    leader_epoch: int | None = None
    store_commit_errors: int = 0
    store_fenced_commits: int = 0


class _SnapshotCollector(Collector):
    def __init__(
        self, snap: Snapshot, workers: Mapping[str, int], desired: Mapping[str, int], process: ProcessFigures
    ) -> None:
        self._snap = snap
        self._workers = workers
        self._desired = desired
        self._process = process

    def collect(self) -> Iterator[Metric]:
        snap = self._snap
        pools = snap.pools
        totals = snap.totals

        tasks = CounterMetricFamily(
            "cronoq_tasks", "Tasks that reached a terminal status, by status.", labels=["status"]
        )
        for status in TERMINAL_TOTALS:
            tasks.add_metric([status], float(totals.get(status, 0)))
        yield tasks
        for key, (name, help_text) in _OTHER_TOTALS.items():
            yield CounterMetricFamily(name, help_text, value=float(totals.get(key, 0)))

        yield GaugeMetricFamily(
            "cronoq_workers_connected", "Connected remote workers.", value=float(sum(self._workers.values()))
        )
        yield GaugeMetricFamily("cronoq_live_tasks", "Tasks not yet finished.", value=float(snap.live_tasks))
        yield GaugeMetricFamily("cronoq_running", "Attempts running now.", value=float(snap.running))
        yield GaugeMetricFamily("cronoq_pending", "Tasks waiting to run.", value=float(snap.pending))
        process = self._process
        if process.leader_epoch is not None:
            # Only the serving leader answers /metrics, so the series is there exactly while a
            # process leads; a new value means another leadership began.
            yield GaugeMetricFamily(
                "cronoq_leader_epoch",
                "Epoch of this server's leadership of its shard.",
                value=float(process.leader_epoch),
            )
        yield CounterMetricFamily(
            "cronoq_store_commit_errors",
            "Commit attempts the store refused as unavailable (retried), in this process.",
            value=float(process.store_commit_errors),
        )
        yield CounterMetricFamily(
            "cronoq_store_fenced_commits",
            "Commits refused because another leader had taken over, in this process.",
            value=float(process.store_fenced_commits),
        )

        desired = GaugeMetricFamily(
            "cronoq_pool_desired_workers",
            "Slots the autoscaler wants for the pool (feed this to KEDA or an HPA).",
            labels=["pool"],
        )
        workers = GaugeMetricFamily("cronoq_pool_workers", "Connected remote workers of the pool.", labels=["pool"])
        cost = CounterMetricFamily(
            "cronoq_pool_cost", "Accumulated cost of the pool (cost_per_worker_second).", labels=["pool"]
        )
        worker_seconds = CounterMetricFamily(
            "cronoq_pool_worker_seconds", "Accumulated slot-seconds of capacity.", labels=["pool"]
        )
        by_class = GaugeMetricFamily(
            "cronoq_pool_pending_by_class", "Pending tasks per priority class.", labels=["pool", "class"]
        )
        gauges = {attr: GaugeMetricFamily(name, help_text, labels=["pool"]) for attr, name, help_text in _POOL_GAUGES}
        group_capacity = GaugeMetricFamily(
            "cronoq_group_capacity", "Slots of the workers of one label group.", labels=["pool", "labels"]
        )
        group_busy = GaugeMetricFamily("cronoq_group_busy", "Busy slots of one label group.", labels=["pool", "labels"])
        for pool in pools:
            name = pool.name
            desired.add_metric([name], float(self._desired.get(name, pool.desired)))
            workers.add_metric([name], float(self._workers.get(name, 0)))
            cost.add_metric([name], float(pool.cost))
            worker_seconds.add_metric([name], float(pool.worker_seconds))
            for cls, count in zip(CLASS_NAMES, pool.pending_by_class, strict=True):
                by_class.add_metric([name, cls], float(count))
            for attr, metric in gauges.items():
                metric.add_metric([name], float(getattr(pool, attr)))
            for group in pool.groups:
                labels = ",".join(f"{k}={v}" for k, v in sorted(group.labels.items()))
                group_capacity.add_metric([name, labels], float(group.capacity))
                group_busy.add_metric([name, labels], float(group.busy))
        yield desired
        yield workers
        yield cost
        yield worker_seconds
        yield by_class
        yield from gauges.values()
        yield group_capacity
        yield group_busy


def render(
    snap: Snapshot,
    workers: Mapping[str, int],
    desired: Mapping[str, int] | None = None,
    process: ProcessFigures | None = None,
) -> bytes:
    """Prometheus text (exposition format 0.0.4) of ``snap``.

    ``workers`` counts connected workers per pool, ``desired`` is the autoscaler's latest target
    per pool (the snapshot's own value is used for pools missing there). For a pool-scoped caller
    ``snap`` and ``workers`` already cover its pools only, totals included (``Api`` narrows them),
    so every series, per pool or not, is about what it may see. ``process`` adds the leadership
    epoch and the store's commit failures (shard-wide: ``Api`` gives them to unscoped callers only).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(snap, workers, desired or {}, process or ProcessFigures()))
    return generate_latest(registry)
