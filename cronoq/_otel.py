"""OpenTelemetry glue for the embedded scheduler: a task counter, attempt spans, trace capture.

Nothing here costs anything unless the application installed an SDK meter or tracer provider:
``instruments()`` returns None when only OpenTelemetry's default no-op providers are present (or
OpenTelemetry is not installed at all), and the scheduler then creates no spans and no metrics.
``current_traceparent()`` is the only function on the submission path; it reads the current span
without creating anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from cronoq.engine import Dispatch, Resolve

TRACEPARENT = "traceparent"
"""The tag that carries the submitter's W3C trace context to each attempt."""

SPAN_NAME = "cronoq.task"
COUNTER_NAME = "cronoq.tasks"

_current_span: Callable[[], Any] | None = None
_resolved = False


def _span_getter() -> Callable[[], Any] | None:
    """``opentelemetry.trace.get_current_span``, or None without OpenTelemetry (looked up once)."""
    global _current_span, _resolved
    if not _resolved:
        try:
            from opentelemetry import trace
        except ImportError:
            _current_span = None
        else:
            _current_span = trace.get_current_span
        _resolved = True
    return _current_span


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the caller's current span, or None when no span is active."""
    getter = _span_getter()
    if getter is None:
        return None
    context = getter().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _is_default(provider: Any) -> bool:
    name = type(provider).__name__
    return name.startswith(("NoOp", "_Proxy", "Proxy", "_DefaultMeterProvider"))


def _sdk_installed() -> bool:
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        return False
    return not _is_default(metrics.get_meter_provider()) or not _is_default(trace.get_tracer_provider())


class Instruments:
    """The scheduler's instruments: a counter of terminal statuses and a tracer for attempts."""

    def __init__(self) -> None:
        from opentelemetry import metrics, trace
        from opentelemetry.context import Context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        meter = metrics.get_meter("cronoq")
        self._tasks = meter.create_counter(COUNTER_NAME, unit="{task}", description="Tasks by terminal status")
        self._tracer = trace.get_tracer("cronoq")
        self._propagator = TraceContextTextMapPropagator()
        self._root = Context

    def task_finished(self, result: Resolve) -> None:
        """Count one task that reached a terminal status."""
        self._tasks.add(1, {"pool": result.pool, "status": result.status.value})

    @contextlib.contextmanager
    def attempt_span(self, lease: Dispatch) -> Iterator[None]:
        """A ``cronoq.task`` span around one attempt.

        It is parented to the trace named by the task's ``traceparent`` tag; without that tag it
        is a root span (not a child of whatever span was current when the scheduler started).
        """
        traceparent = lease.tags.get(TRACEPARENT)
        parent = self._propagator.extract({TRACEPARENT: traceparent}) if traceparent else self._root()
        attributes: dict[str, str | int] = {
            "task.id": lease.task_id,
            "task.pool": lease.pool,
            "task.kind": lease.kind,
            "task.attempt": lease.attempt,
        }
        with self._tracer.start_as_current_span(SPAN_NAME, context=parent, attributes=attributes):
            yield


def instruments() -> Instruments | None:
    """The instruments when an OpenTelemetry SDK provider is installed, else None."""
    return Instruments() if _sdk_installed() else None
