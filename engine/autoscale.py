"""The queue-pressure autoscaling policy: how many worker slots a pool should have.

Deterministic and sans-IO: the caller feeds arrivals and run times as they happen and calls
``evaluate`` at (or after) ``next_evaluation()`` with the pool's backlog, busy slots and reserved
capacity. Rates are per second and service times in seconds, as in the spec; times are int ns.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from .config import AutoscaleConfig
from .types import CLASSES, NS_PER_S

__all__ = ["Autoscaler", "ceil_clean"]

# Below this smoothed arrival rate (tasks/s) the base term is 0: the EWMA decays towards zero
# without ever reaching it.
_MIN_RATE = 0.01


# Worker counts never need more than this; larger (or non-finite) targets saturate here.
_MAX_TARGET = float(1 << 32)


def ceil_clean(value: float) -> int:
    """``ceil`` that ignores floating-point noise (4.000000000000001 -> 4), saturating at 2**32
    for huge or infinite values (and treating NaN as 0), so extreme settings never overflow."""
    if not value < _MAX_TARGET:
        return 0 if value != value else int(_MAX_TARGET)
    return math.ceil(round(value, 9))


class Autoscaler:
    """Desired capacity of one pool under the queue-pressure policy.

    ``desired`` starts at ``initial`` (the capacity the pool starts with, capped at
    ``max_workers`` but not raised to ``min_workers``); the first evaluation moves it into
    [min_workers, max_workers], subject to the step-up limit.
    """

    __slots__ = (
        "_arrivals",
        "_history",
        "_last_eval",
        "_last_scale_down",
        "_next_eval",
        "_rate",
        "_run_count",
        "_run_total",
        "_service",
        "config",
        "default_duration",
        "desired",
        "last_raw",
        "max_workers",
        "min_workers",
        "start",
    )

    def __init__(
        self,
        config: AutoscaleConfig,
        min_workers: int,
        max_workers: int,
        default_duration: int,
        initial: int,
        start: int,
    ) -> None:
        if min_workers < 0 or max_workers < min_workers:
            raise ValueError("need 0 <= min_workers <= max_workers")
        if len(config.slo) != CLASSES:
            raise ValueError("autoscale slo needs one entry per class")
        self.config = config
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.default_duration = default_duration
        self.start = start
        self.desired: int = max(0, min(initial, max_workers))
        self.last_raw: int = self.desired  # clamped target of the latest evaluation
        self._arrivals = 0
        self._run_total = 0
        self._run_count = 0
        self._rate: float | None = None  # EWMA of arrivals per second
        self._service: float | None = None  # EWMA of run time, seconds
        self._last_eval = start
        self._next_eval = start + config.interval
        self._last_scale_down = start
        # (time, raw) of recent evaluations, oldest first, for the scale-down stabilization.
        self._history: deque[tuple[int, int]] = deque()

    # -- inputs --------------------------------------------------------------------------------

    def record_arrivals(self, n: int = 1) -> None:
        """Count ``n`` tasks that became ready since the previous evaluation."""
        self._arrivals += n

    def record_run(self, duration_ns: int) -> None:
        """Record the run time of a finished attempt."""
        self._run_total += duration_ns if duration_ns > 0 else 0
        self._run_count += 1

    # -- outputs -------------------------------------------------------------------------------

    @property
    def arrival_rate(self) -> float:
        """Smoothed arrival rate λ, tasks per second (0.0 before the first evaluation)."""
        return 0.0 if self._rate is None else self._rate

    @property
    def service_time(self) -> float:
        """Smoothed service time S, seconds (``default_duration`` before any observation)."""
        return self.default_duration / NS_PER_S if self._service is None else self._service

    def next_evaluation(self) -> int:
        return self._next_eval

    def evaluate(self, now: int, backlog: Sequence[int], busy: int, reserved: int) -> int:
        """Run one evaluation at ``now`` and return the new ``desired``.

        ``backlog`` holds the ready-or-retrying tasks per class (critical first), ``busy`` the
        slots running attempts and ``reserved`` the peak concurrent reservations within the
        reservation horizon.
        """
        cfg = self.config
        alpha = cfg.ewma_alpha

        # λ: arrivals over the time since the previous evaluation.
        elapsed = now - self._last_eval
        if elapsed > 0:
            sample = self._arrivals * NS_PER_S / elapsed
            rate = self._rate
            self._rate = sample if rate is None else rate + alpha * (sample - rate)
            self._arrivals = 0
            self._last_eval = now
        # S: the mean run time of this interval's completions is one EWMA sample.
        if self._run_count:
            sample = self._run_total / self._run_count / NS_PER_S
            service = self._service
            self._service = sample if service is None else service + alpha * (sample - service)
            self._run_total = 0
            self._run_count = 0

        raw = self.target(backlog, busy, reserved)
        self.last_raw = raw
        self._next_eval = self.start + ((now - self.start) // cfg.interval + 1) * cfg.interval

        history = self._history
        history.append((now, raw))
        horizon = now - cfg.stabilization_window
        while history and history[0][0] <= horizon:
            history.popleft()

        current = self.desired
        if raw > current:
            step = max(ceil_clean(current * cfg.max_step_up_ratio), cfg.max_step_up_abs)
            self.desired = min(raw, current + step)
        elif raw < current:
            floor = max(value for _, value in history)
            if floor < current and now - self._last_scale_down >= cfg.cooldown:
                self.desired = max(floor, current - cfg.max_step_down)
                self._last_scale_down = now
        return self.desired

    def target(self, backlog: Sequence[int], busy: int, reserved: int) -> int:
        """The clamped instantaneous target (before step limits and stabilization), computed
        from the current λ and S without updating them."""
        cfg = self.config
        service = self.service_time
        rate = self.arrival_rate
        base = 0 if rate < _MIN_RATE else ceil_clean(rate * service / cfg.target_utilization)
        total = 0
        slo_need = 0
        slos = cfg.slo
        for cls in range(CLASSES):
            waiting = backlog[cls]
            total += waiting
            limit = slos[cls]
            if waiting > 0 and limit is not None:
                need = ceil_clean(total * service * NS_PER_S / limit)
                if need > slo_need:
                    slo_need = need
        drain = ceil_clean(total * service * NS_PER_S / cfg.drain_time)
        raw = max(base + drain, slo_need, busy) + reserved
        if raw < self.min_workers:
            return self.min_workers
        if raw > self.max_workers:
            return self.max_workers
        return raw
