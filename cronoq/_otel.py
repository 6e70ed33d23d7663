"""OpenTelemetry glue for the embedded scheduler: metrics and attempt spans.

Nothing here costs anything unless the application installed an SDK meter or tracer provider:
``instruments()`` returns None when only OpenTelemetry's default no-op providers are present.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cronoq.engine import Dispatch, Resolve

TRACEPARENT = "traceparent"


def _sdk_installed() -> bool:
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return False
    meter_provider = metrics.get_meter_provider()
    tracer_provider = trace.get_tracer_provider()
    return not _is_default(meter_provider) or not _is_default(tracer_provider)


def _is_default(provider: Any) -> bool:
    name = type(provider).__name__
    return name.startswith(("NoOp", "_Proxy", "Proxy", "_DefaultMeterProvider"))


class Instruments:
    """Counters fed from status events; spans parented to the submitter's trace."""

    def __init__(self) -> None:
        from opentelemetry import metrics, trace

        meter = metrics.get_meter("cronoq")
        self._tasks = meter.create_counter("cronoq.tasks", unit="{task}", description="tasks by terminal status")
        self.tracer = trace.get_tracer("cronoq")

    def task_finished(self, result: Resolve) -> None:
        self._tasks.add(1, {"pool": result.pool, "status": result.status.value})


def instruments() -> Instruments | None:
    return Instruments() if _sdk_installed() else None


@contextlib.contextmanager
def attempt_span(lease: Dispatch) -> Iterator[None]:
    """A span for one attempt, parented to the trace whose ``traceparent`` tag the task carries."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = None
    traceparent = lease.tags.get(TRACEPARENT)
    if traceparent:
        parent = TraceContextTextMapPropagator().extract({TRACEPARENT: traceparent})
    tracer = trace.get_tracer("cronoq")
    attributes: dict[str, Any] = {"task.id": lease.task_id, "task.pool": lease.pool, "task.kind": lease.kind,
                  "task.attempt": lease.attempt}
    with tracer.start_as_current_span("cronoq.task", context=parent, attributes=attributes):
        yield


def current_traceparent() -> str | None:
    """The W3C traceparent of the caller's current span, if tracing is active."""
    try:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get(TRACEPARENT)
