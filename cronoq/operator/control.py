"""The operator's rounds: which scalers are due, one reading per server, decide, scale, report.

``Control`` knows the scalers (kopf tells it about every change), the configured servers and a
Kubernetes client; ``run_round`` does one pass, ``run`` repeats it every second until cancelled.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .decide import Decision, Reason, ScalerSpec, SpecError, Targets, decide, status_of
from .reading import ServerReader, ServerView
from .settings import OperatorSettings

__all__ = ["Control", "ScaleApi", "Scaler"]

log = logging.getLogger("cronoq.operator")

TICK_S = 1.0


class ScaleApi(Protocol):
    """The Kubernetes calls of ``cronoq.operator.kube.Kube``."""

    async def replicas(self, namespace: str, deployment: str) -> int | None: ...

    async def scale(self, namespace: str, deployment: str, replicas: int) -> None: ...

    async def report(self, namespace: str, name: str, status: dict[str, Any]) -> None: ...


@dataclass
class Scaler:
    """One ``CronoqWorkerScaler`` as the operator last saw it, and what it remembers of it."""

    namespace: str
    name: str
    spec: Mapping[str, Any]
    generation: int | None = None
    status: Mapping[str, Any] = field(default_factory=dict)
    due: float = 0.0
    targets: Targets = field(default_factory=Targets)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Control:
    def __init__(
        self, settings: OperatorSettings, kube: ScaleApi, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.clock = clock
        self.scalers: dict[tuple[str, str], Scaler] = {}
        self.readers = {name: ServerReader(server) for name, server in settings.servers.items()}

    # -- what kopf reports ------------------------------------------------------------------

    def seen(
        self, namespace: str, name: str, spec: Mapping[str, Any], generation: int | None, status: Mapping[str, Any]
    ) -> None:
        key = (namespace, name)
        scaler = self.scalers.get(key)
        if scaler is None:
            self.scalers[key] = Scaler(namespace, name, dict(spec), generation, dict(status))
        elif scaler.generation != generation:
            scaler.spec, scaler.generation, scaler.due = dict(spec), generation, 0.0  # a changed spec acts now

    def gone(self, namespace: str, name: str) -> None:
        self.scalers.pop((namespace, name), None)

    # -- rounds ----------------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                await self.run_round()
            except Exception:  # one bad round must not stop the operator
                log.exception("scaling round failed")
            await asyncio.sleep(TICK_S)

    async def run_round(self) -> None:
        now = self.clock()
        due = [scaler for scaler in self.scalers.values() if scaler.due <= now]
        if not due:
            return
        specs: dict[tuple[str, str], ScalerSpec | str] = {}
        for scaler in due:
            try:
                specs[(scaler.namespace, scaler.name)] = ScalerSpec.from_body(scaler.spec)
            except SpecError as error:
                specs[(scaler.namespace, scaler.name)] = str(error)
        servers = {spec.server for spec in specs.values() if isinstance(spec, ScalerSpec)} & set(self.readers)
        views = dict(zip(servers, await asyncio.gather(*(self.readers[s].view() for s in servers)), strict=True))
        for scaler in due:
            spec = specs[(scaler.namespace, scaler.name)]
            await self._reconcile(scaler, spec, views, now)

    async def _reconcile(
        self, scaler: Scaler, spec: ScalerSpec | str, views: Mapping[str, ServerView], now: float
    ) -> None:
        if isinstance(spec, str):
            scaler.due = now + 60.0
            await self._report(scaler, Decision(None, Reason.INVALID_SPEC, spec), None)
            return
        scaler.due = now + spec.interval_seconds
        view = views.get(spec.server)
        if view is None:
            known = ", ".join(sorted(self.readers))
            message = f"server {spec.server!r} is not configured (known: {known})"
            await self._report(scaler, Decision(None, Reason.UNKNOWN_SERVER, message), None)
            return
        try:
            current = await self.kube.replicas(scaler.namespace, spec.deployment)
        except Exception as error:
            await self._report(scaler, Decision(None, Reason.SCALE_FAILED, f"reading the scale: {error}"), None)
            return
        decision = decide(spec, view.reading(spec.pool), current, scaler.targets, now)
        replicas = current
        if decision.replicas is not None:
            try:
                await self.kube.scale(scaler.namespace, spec.deployment, decision.replicas)
            except Exception as error:
                decision = Decision(
                    None,
                    Reason.SCALE_FAILED,
                    f"setting {decision.replicas} replicas: {error}",
                    decision.desired_slots,
                    decision.target,
                )
            else:
                replicas = decision.replicas
                log.info("%s/%s: %s", scaler.namespace, scaler.name, decision.message)
        await self._report(scaler, decision, replicas)

    async def _report(self, scaler: Scaler, decision: Decision, replicas: int | None) -> None:
        status = status_of(decision, replicas, scaler.generation, scaler.status, _now())
        if status == scaler.status:
            return
        try:
            await self.kube.report(scaler.namespace, scaler.name, status)
        except Exception as error:
            log.warning("%s/%s: cannot write the status: %s", scaler.namespace, scaler.name, error)
            return
        scaler.status = status

    async def close(self) -> None:
        for reader in self.readers.values():
            await reader.close()
