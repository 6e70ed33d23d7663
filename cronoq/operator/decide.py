"""What a ``CronoqWorkerScaler`` asks for, and the rules that turn a reading into replicas.

Nothing here does I/O: ``decide`` takes the scaler, what the server said about its pool, the
Deployment's current replicas and the scaler's recent targets, and returns what to do and why.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Decision", "Reading", "Reason", "ScalerSpec", "SpecError", "Targets", "decide", "status_of"]

MAX_REPLICAS = 10_000
MIN_INTERVAL_S = 5
MAX_INTERVAL_S = 3600
MAX_STABILIZATION_S = 3600


class Reason:
    """The ``status.reason`` values (CamelCase, as Kubernetes conditions use)."""

    SCALED = "Scaled"  # the replicas were changed to the target
    UP_TO_DATE = "UpToDate"  # the Deployment already has the target
    HOLDING = "Stabilizing"  # a lower target waits out the scale-down stabilization
    SERVER_UNAVAILABLE = "ServerUnavailable"
    UNAUTHORIZED = "Unauthorized"
    POOL_NOT_REPORTED = "PoolNotReported"
    UNKNOWN_SERVER = "UnknownServer"
    INVALID_SPEC = "InvalidSpec"
    DEPLOYMENT_NOT_FOUND = "DeploymentNotFound"
    SCALE_FAILED = "ScaleFailed"


class SpecError(ValueError):
    """A scaler's spec cannot be used; the message names the field."""


@dataclass(frozen=True)
class ScalerSpec:
    server: str
    pool: str
    deployment: str
    max_replicas: int
    slots_per_replica: int = 1
    min_replicas: int = 0
    interval_seconds: int = 15
    scale_down_stabilization_seconds: int = 60

    @classmethod
    def from_body(cls, spec: Mapping[str, Any]) -> ScalerSpec:
        """The spec of a scaler object. The CRD's schema already enforces this; the operator
        checks again, since an object may predate a schema change."""

        def text(key: str) -> str:
            value = spec.get(key)
            if not isinstance(value, str) or not value or len(value) > 253:
                raise SpecError(f"spec.{key}: a non-empty string is required")
            return value

        def integer(key: str, default: int | None, low: int, high: int) -> int:
            value = spec.get(key, default)
            if value is None:
                raise SpecError(f"spec.{key}: required")
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise SpecError(f"spec.{key}: an integer from {low} to {high} is required")
            return value

        made = cls(
            server=text("server"),
            pool=text("pool"),
            deployment=text("deployment"),
            max_replicas=integer("maxReplicas", None, 0, MAX_REPLICAS),
            slots_per_replica=integer("slotsPerReplica", 1, 1, 100_000),
            min_replicas=integer("minReplicas", 0, 0, MAX_REPLICAS),
            interval_seconds=integer("intervalSeconds", 15, MIN_INTERVAL_S, MAX_INTERVAL_S),
            scale_down_stabilization_seconds=integer("scaleDownStabilizationSeconds", 60, 0, MAX_STABILIZATION_S),
        )
        if made.min_replicas > made.max_replicas:
            raise SpecError(f"spec.minReplicas ({made.min_replicas}) exceeds spec.maxReplicas ({made.max_replicas})")
        return made

    def target(self, desired_slots: int) -> int:
        """Replicas for ``desired_slots``: ceil(desired / slotsPerReplica), clamped."""
        wanted = math.ceil(max(desired_slots, 0) / self.slots_per_replica)
        return min(max(wanted, self.min_replicas), self.max_replicas)


@dataclass(frozen=True)
class Reading:
    """What the server said about the pool: its desired slots, or why there are none."""

    desired_slots: int | None
    reason: str = ""
    message: str = ""

    @classmethod
    def of(cls, desired_slots: int) -> Reading:
        return cls(desired_slots)

    @classmethod
    def failed(cls, reason: str, message: str) -> Reading:
        return cls(None, reason, message)


@dataclass(frozen=True)
class Decision:
    """``replicas`` to set, or None to leave the Deployment alone; ``reason`` and ``message`` go to
    the scaler's status."""

    replicas: int | None
    reason: str
    message: str
    desired_slots: int | None = None
    target: int | None = None


@dataclass
class Targets:
    """The targets of one scaler's recent readings (monotonic seconds, replicas), for the
    scale-down stabilization. Kept in memory: after a restart of the operator the window starts
    over, so nothing scales down before a whole window of readings asked for it."""

    seen: deque[tuple[float, int]] = field(default_factory=deque)
    since: float | None = None  # when the first reading of this window arrived

    def add(self, now: float, target: int, window: float) -> int:
        """Record ``target``; the highest target over the last ``window`` seconds."""
        if self.since is None:
            self.since = now
        self.seen.append((now, target))
        while self.seen and self.seen[0][0] < now - window:
            self.seen.popleft()
        return max(t for _, t in self.seen)

    def covers(self, now: float, window: float) -> bool:
        return self.since is not None and now - self.since >= window

    def forget(self) -> None:
        """A reading failed: the next lower target must wait a whole window again."""
        self.seen.clear()
        self.since = None


def decide(spec: ScalerSpec, reading: Reading, current: int | None, targets: Targets, now: float) -> Decision:
    """What to do with the Deployment (``current`` replicas, None when it does not exist)."""
    if reading.desired_slots is None:
        targets.forget()
        return Decision(None, reading.reason, f"{reading.message}; the Deployment is left alone")
    desired = reading.desired_slots
    target = spec.target(desired)
    window = float(spec.scale_down_stabilization_seconds)
    highest = targets.add(now, target, window)
    if current is None:
        return Decision(None, Reason.DEPLOYMENT_NOT_FOUND, f"deployment {spec.deployment!r} not found", desired, target)
    described = f"pool {spec.pool!r} wants {desired} slots: {target} replicas of {spec.slots_per_replica} slots"
    if target == current:
        return Decision(None, Reason.UP_TO_DATE, described, desired, target)
    if target > current:
        return Decision(target, Reason.SCALED, f"{described} (was {current})", desired, target)
    # Lower: go down only as far as every reading of the window allows, and only once a whole
    # window has been seen.
    if window > 0 and (highest >= current or not targets.covers(now, window)):
        message = f"{described}; keeping {current} until {window:g}s of readings agree"
        return Decision(None, Reason.HOLDING, message, desired, target)
    lowered = highest if window > 0 else target
    return Decision(lowered, Reason.SCALED, f"{described} (was {current})", desired, target)


_HEALTHY = {Reason.SCALED, Reason.UP_TO_DATE, Reason.HOLDING}


def status_of(
    decision: Decision, replicas: int | None, generation: int | None, previous: Mapping[str, Any], now: str
) -> dict[str, Any]:
    """The scaler's ``status`` after ``decision``: ``replicas`` is what the Deployment has now,
    ``now`` an RFC 3339 time. Fields a failed reading cannot know keep their previous values."""
    status: dict[str, Any] = {
        "reason": decision.reason,
        "message": decision.message[:1024],
        "observedGeneration": generation,
        "desiredSlots": decision.desired_slots if decision.desired_slots is not None else previous.get("desiredSlots"),
        "replicas": replicas if replicas is not None else previous.get("replicas"),
        "lastScaleTime": now if decision.replicas is not None else previous.get("lastScaleTime"),
    }
    healthy = "True" if decision.reason in _HEALTHY else "False"
    old = next((c for c in previous.get("conditions") or [] if c.get("type") == "Ready"), None)
    changed = old is None or old.get("status") != healthy
    since = now if old is None or changed else old.get("lastTransitionTime", now)
    status["conditions"] = [
        {
            "type": "Ready",
            "status": healthy,
            "reason": decision.reason,
            "message": decision.message[:1024],
            "lastTransitionTime": since,
        }
    ]
    return {key: value for key, value in status.items() if value is not None}
