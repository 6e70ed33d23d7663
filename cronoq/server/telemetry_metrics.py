"""OpenTelemetry metrics of ``cronoq-server`` (see ``telemetry``'s docstring for the instruments):
observable instruments over the leader's shard snapshot, collected on the exporter's thread."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider

    from cronoq.engine import Snapshot

    from .api import Api

__all__ = ["INSTRUMENTATION", "SnapshotMetrics"]

log = logging.getLogger("cronoq.server")

INSTRUMENTATION = "cronoq.server"

# Totals beside the per-status task counter: (snapshot key, instrument name, description).
_TOTALS = (
    ("submitted", "cronoq.tasks_submitted", "Tasks admitted since this leader started."),
    ("dispatched", "cronoq.tasks_dispatched", "Attempts started since this leader started."),
    ("retries", "cronoq.retries", "Attempts that failed and were scheduled again."),
    ("timeouts", "cronoq.timeouts", "Attempts that ran past their timeout."),
    ("lease_expiries", "cronoq.lease_expiries", "Leases that expired without a heartbeat."),
    ("stale_completions", "cronoq.stale_completions", "Late, duplicate or previous-leader reports that were ignored."),
    ("recurring_conflicts", "cronoq.recurring_conflicts", "Recurring occurrences refused at admission."),
    ("recurring_invalid", "cronoq.recurring_invalid", "Recurring schedules that became invalid."),
    ("engine_errors", "cronoq.engine_errors", "Engine steps that raised and tasks recovery could not load."),
)

# Per-pool figures of the snapshot: (attribute, unit).
_POOL_FIGURES = (
    ("capacity", "{slot}"),
    ("busy", "{slot}"),
    ("held", "{slot}"),
    ("pending", "{task}"),
    ("ready", "{task}"),
    ("reservations", "{reservation}"),
    ("dispatched", "{attempt}"),
    ("succeeded", "{task}"),
    ("failed", "{task}"),
    ("retried", "{attempt}"),
    ("priority_adherence", "1"),
    ("fixed_start_hit_rate", "1"),
    ("utilization", "1"),
    ("schedule_efficiency", "1"),
    ("wait_mean", "s"),
    ("wait_p50", "s"),
    ("wait_p90", "s"),
    ("wait_p99", "s"),
    ("run_p50", "s"),
    ("run_p99", "s"),
)

# The window counts are gauges over the metrics window, named like their Prometheus series.
_WINDOW = frozenset({"dispatched", "succeeded", "failed", "retried"})

_CLASS_NAMES = ("critical", "high", "normal", "low")
_TERMINAL = ("succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed")


@dataclass(frozen=True, slots=True)
class _Reading:
    snapshot: Snapshot
    workers: dict[str, int]
    desired: dict[str, int]
    epoch: int | None = None
    commit_errors: int = 0
    fenced_commits: int = 0


class SnapshotMetrics:
    """Observable instruments over the leader's snapshot.

    The exporter's thread collects; the snapshot lives on the event loop. The first instrument's
    callback (instruments are collected in creation order) fetches one snapshot through the loop
    and every other callback of that collection reads it."""

    FETCH_TIMEOUT_S = 5.0

    def __init__(self, api: Api, provider: MeterProvider) -> None:
        self.api = api
        self.loop: asyncio.AbstractEventLoop | None = None
        self._reading: _Reading | None = None
        meter = provider.get_meter(INSTRUMENTATION)
        gauge, counter = meter.create_observable_gauge, meter.create_observable_counter
        counter(
            "cronoq.tasks",
            [self._refresh_then_tasks],
            unit="{task}",
            description="Tasks that reached a terminal status, by status.",
        )
        for key, name, description in _TOTALS:
            counter(name, [self._total(key)], description=description)
        gauge(
            "cronoq.workers_connected",
            [self._single(lambda r: sum(r.workers.values()))],
            unit="{worker}",
            description="Connected remote workers.",
        )
        gauge(
            "cronoq.live_tasks",
            [self._single(lambda r: r.snapshot.live_tasks)],
            unit="{task}",
            description="Tasks not yet finished.",
        )
        gauge(
            "cronoq.running",
            [self._single(lambda r: r.snapshot.running)],
            unit="{attempt}",
            description="Attempts running now.",
        )
        gauge(
            "cronoq.pending",
            [self._single(lambda r: r.snapshot.pending)],
            unit="{task}",
            description="Tasks waiting to run.",
        )
        gauge(
            "cronoq.leader_epoch",
            [self._single(lambda r: r.epoch or 0)],
            description="Epoch of this server's leadership of its shard.",
        )
        counter(
            "cronoq.store.commit_errors",
            [self._single(lambda r: r.commit_errors)],
            description="Commit attempts the store refused as unavailable (retried), in this process.",
        )
        counter(
            "cronoq.store.fenced_commits",
            [self._single(lambda r: r.fenced_commits)],
            description="Commits refused because another leader had taken over, in this process.",
        )
        gauge(
            "cronoq.pool.desired_workers",
            [self._per_pool(lambda r, p: r.desired.get(p.name, p.desired))],
            unit="{slot}",
            description="Slots the autoscaler wants for the pool.",
        )
        gauge(
            "cronoq.pool.workers",
            [self._per_pool(lambda r, p: r.workers.get(p.name, 0))],
            unit="{worker}",
            description="Connected remote workers of the pool.",
        )
        counter(
            "cronoq.pool.cost",
            [self._per_pool(lambda r, p: p.cost)],
            description="Accumulated cost of the pool (cost_per_worker_second).",
        )
        counter(
            "cronoq.pool.worker_seconds",
            [self._per_pool(lambda r, p: p.worker_seconds)],
            unit="s",
            description="Accumulated slot-seconds of capacity.",
        )
        gauge(
            "cronoq.pool.pending_by_class",
            [self._by_class],
            unit="{task}",
            description="Pending tasks per priority class.",
        )
        for attribute, unit in _POOL_FIGURES:
            name = f"cronoq.pool.window_{attribute}" if attribute in _WINDOW else f"cronoq.pool.{attribute}"
            gauge(
                name,
                [self._per_pool(_attribute_of(attribute))],
                unit=unit,
                description=f"The pool's {attribute.replace('_', ' ')} (snapshot).",
            )
        gauge(
            "cronoq.group.capacity",
            [self._groups("capacity")],
            unit="{slot}",
            description="Slots of the workers of one label group.",
        )
        gauge("cronoq.group.busy", [self._groups("busy")], unit="{slot}", description="Busy slots of one label group.")

    # Reading the snapshot ------------------------------------------------------------------------

    async def _read(self) -> _Reading | None:
        api = self.api
        if not api.serving:
            return None
        service = api.current()
        snapshot = await service.snapshot()
        workers: dict[str, int] = {}
        for session in service.workers_in(None):
            workers[session.pool] = workers.get(session.pool, 0) + 1
        trouble = api.store_trouble
        return _Reading(
            snapshot,
            workers,
            dict(service.desired),
            service.driver.epoch,
            trouble.commit_errors,
            trouble.fenced_commits,
        )

    def _fetch(self, options: CallbackOptions) -> _Reading | None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return None
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            return None  # collecting on the loop itself would wait for itself
        timeout = min(self.FETCH_TIMEOUT_S, max(options.timeout_millis / 1000.0, 0.1))
        try:
            return asyncio.run_coroutine_threadsafe(self._read(), loop).result(timeout)
        except Exception as exc:
            log.debug("no snapshot for the metrics export: %r", exc)
            return None

    # Callbacks -----------------------------------------------------------------------------------

    def _refresh_then_tasks(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        self._reading = reading = self._fetch(options)
        if reading is None:
            return []
        totals = reading.snapshot.totals
        return [Observation(int(totals.get(status, 0)), {"status": status}) for status in _TERMINAL]

    def _total(self, key: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            reading = self._reading
            return [] if reading is None else [Observation(int(reading.snapshot.totals.get(key, 0)))]

        return observe

    def _single(self, value: Callable[[_Reading], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            reading = self._reading
            return [] if reading is None else [Observation(value(reading))]

        return observe

    def _visible_pools(self, reading: _Reading) -> list[Any]:
        local = set(self.api.pools)
        return [pool for pool in reading.snapshot.pools if pool.name in local]

    def _per_pool(self, value: Callable[[_Reading, Any], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            reading = self._reading
            if reading is None:
                return []
            return [Observation(value(reading, pool), {"pool": pool.name}) for pool in self._visible_pools(reading)]

        return observe

    def _by_class(self, options: CallbackOptions) -> Iterable[Observation]:
        from opentelemetry.metrics import Observation

        reading = self._reading
        if reading is None:
            return []
        out = []
        for pool in self._visible_pools(reading):
            for name, count in zip(_CLASS_NAMES, pool.pending_by_class, strict=True):
                out.append(Observation(count, {"pool": pool.name, "class": name}))
        return out

    def _groups(self, attribute: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            reading = self._reading
            if reading is None:
                return []
            out = []
            for pool in self._visible_pools(reading):
                for group in pool.groups:
                    labels = ",".join(f"{k}={v}" for k, v in sorted(group.labels.items()))
                    out.append(Observation(getattr(group, attribute), {"pool": pool.name, "labels": labels}))
            return out

        return observe


def _attribute_of(attribute: str) -> Callable[[_Reading, Any], float]:
    return lambda reading, pool: float(getattr(pool, attribute))
