"""OpenTelemetry, used only when the application installed its API: call metadata and attempt spans."""

from __future__ import annotations

from typing import Any

#: The tag (and call metadata) carrying a W3C trace context; the attempt span's name.
TRACEPARENT = "traceparent"
SPAN_NAME = "cronoq.task"

# ``opentelemetry.trace`` once looked up: a module, or False when the API is not installed. The
# client never imports the SDK; it uses whatever provider and propagator the application set.
_otel_trace: Any = None
_otel_propagate: Any = None


def _trace_api() -> Any | None:
    """``opentelemetry.trace``, or None without the OpenTelemetry API (the import is tried once)."""
    global _otel_trace
    if _otel_trace is None:
        try:
            from opentelemetry import trace
        except ImportError:
            _otel_trace = False
        else:
            _otel_trace = trace
    return _otel_trace or None


def propagate_api() -> Any:
    """``opentelemetry.propagate`` (imported only once a span or a traced lease needs it)."""
    global _otel_propagate
    if _otel_propagate is None:
        from opentelemetry import propagate

        _otel_propagate = propagate
    return _otel_propagate


def trace_metadata() -> list[tuple[str, str]]:
    """The current span's context as call metadata (``traceparent``, ...); empty without a span."""
    trace = _trace_api()
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return []
    carrier: dict[str, str] = {}
    propagate_api().inject(carrier)
    return [(key.lower(), value) for key, value in carrier.items() if isinstance(value, str)]


def attempt_tracer() -> Any | None:
    """A tracer of the application's tracer provider, or None when it set none (then attempts
    cost no span at all rather than a non-recording one)."""
    trace = _trace_api()
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("cronoq.client")
