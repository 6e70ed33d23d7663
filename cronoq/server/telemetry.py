"""OpenTelemetry for ``cronoq-server``: traces and metrics over OTLP, configured by ``OTEL_*``.

Nothing happens unless the standard environment asks for an OTLP export (``setup`` returns None,
no provider is built, no interceptor or wrapper is installed, and ``outgoing_traceparent`` returns
None at once). It is switched on by any of:

- ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
  ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` (the signal whose endpoint is set is exported; the base
  endpoint enables both);
- ``OTEL_TRACES_EXPORTER=otlp`` / ``OTEL_METRICS_EXPORTER=otlp`` (``none`` turns a signal off).

``OTEL_SDK_DISABLED=true`` wins over everything. The transport follows
``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the per-signal ``..._TRACES_PROTOCOL``/``..._METRICS_PROTOCOL``):
``http/protobuf`` (the default) or ``grpc``. Every other ``OTEL_*`` setting the SDK knows (headers,
timeouts, certificates, ``OTEL_BSP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_PROPAGATORS``) is read by the SDK itself. The resource is ``service.name=cronoq-server``
(unless ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` name the service) plus
``cronoq.shard`` when the server runs a shard of a federation.

Traces
    - a SERVER span per gRPC call (``cronoq.v1.Tasks/Submit``, ...) and per HTTP request
      (``POST /v1/tasks``, ...), child of the W3C context of the incoming ``traceparent``
      metadata or header;
    - a submitted task without a ``traceparent`` tag gets the context of that span as its tag, so
      remote workers find the trace in ``lease.tags["traceparent"]``;
    - a ``cronoq.task`` span per attempt (from the lease's dispatch to its outcome), parented to
      the trace of the task's ``traceparent`` tag, with ``task.id``, ``task.pool``, ``task.kind``,
      ``task.attempt`` (the names the embedded scheduler uses);
    - ``outgoing_traceparent()`` gives the ``traceparent`` to send with a call this server forwards.

Metrics (read from the leader's shard snapshot when the exporter collects; a standby reports
none). They are the Prometheus series of ``cronoq.server.metrics`` under OTel names: the
``cronoq_`` prefix becomes ``cronoq.``, ``pool_``/``group_``/``store_`` become
``pool.``/``group.``/``store.``, the
Prometheus ``_total`` and ``_seconds`` suffixes are dropped (seconds become the unit ``s``):

- counters: ``cronoq.tasks`` {status}, ``cronoq.tasks_submitted``, ``cronoq.tasks_dispatched``,
  ``cronoq.retries``, ``cronoq.timeouts``, ``cronoq.lease_expiries``, ``cronoq.stale_completions``,
  ``cronoq.recurring_conflicts``, ``cronoq.recurring_invalid``, ``cronoq.pool.cost`` {pool},
  ``cronoq.pool.worker_seconds`` {pool};
- counters of the process: ``cronoq.store.commit_errors``, ``cronoq.store.fenced_commits``;
- gauges: ``cronoq.workers_connected``, ``cronoq.live_tasks``, ``cronoq.running``,
  ``cronoq.pending``, ``cronoq.leader_epoch``, ``cronoq.pool.desired_workers``, ``cronoq.pool.workers``,
  ``cronoq.pool.pending_by_class`` {pool, class}, ``cronoq.pool.<figure>`` {pool} for every
  per-pool figure (capacity, busy, held, pending, ready, reservations, window_*,
  priority_adherence, fixed_start_hit_rate, utilization, schedule_efficiency, wait_mean,
  wait_p50/p90/p99, run_p50/p99), ``cronoq.group.capacity``/``cronoq.group.busy`` {pool, labels}.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc

from cronoq._otel import SPAN_NAME, TRACEPARENT, current_traceparent
from cronoq.config import Config
from cronoq.shard.service import ShardService

from .telemetry_metrics import INSTRUMENTATION, SnapshotMetrics

if TYPE_CHECKING:
    from aiohttp import web
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from cronoq.engine import Abort, Dispatch
    from cronoq.shard.blob import Blob
    from cronoq.shard.workers import WorkerSession

    from .api import Api

__all__ = [
    "SERVICE_NAME",
    "TRACEPARENT",
    "Plan",
    "Telemetry",
    "TelemetryError",
    "TracedShardService",
    "active",
    "forwarded_call_span",
    "grpc_interceptors",
    "outgoing_traceparent",
    "plan",
    "setup",
    "shard_service_type",
    "trace_http",
]

log = logging.getLogger("cronoq.server")

SERVICE_NAME = "cronoq-server"

_SIGNALS = ("traces", "metrics")
_PROTOCOLS = ("http/protobuf", "grpc")
_TRUE = ("true", "1", "yes", "on")


class TelemetryError(ValueError):
    """The ``OTEL_*`` environment asks for something this server cannot do."""


# ======================================================================================= decisions


@dataclass(frozen=True, slots=True)
class Plan:
    """Which signals to export, and over which OTLP transport."""

    traces: str | None  # protocol, or None when the signal is off
    metrics: str | None


def _env(environ: Mapping[str, str], name: str) -> str:
    return environ.get(name, "").strip()


def _signal_protocol(environ: Mapping[str, str], signal: str) -> str | None:
    """The OTLP protocol of ``signal``, or None when it is not exported."""
    upper = signal.upper()
    exporters = _env(environ, f"OTEL_{upper}_EXPORTER").lower()
    if exporters:
        names = {name.strip() for name in exporters.split(",") if name.strip()}
        unsupported = names - {"otlp", "none"}
        if unsupported:
            raise TelemetryError(f"OTEL_{upper}_EXPORTER={exporters}: cronoq-server exports with otlp only (or none)")
        wanted = "otlp" in names
    else:
        wanted = bool(
            _env(environ, "OTEL_EXPORTER_OTLP_ENDPOINT") or _env(environ, f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
        )
    if not wanted:
        return None
    variable = f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL"
    protocol = _env(environ, variable)
    if not protocol:
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
        protocol = _env(environ, variable) or "http/protobuf"
    if protocol not in _PROTOCOLS:
        raise TelemetryError(f"{variable}={protocol}: cronoq-server exports OTLP over http/protobuf or grpc")
    return protocol


def plan(environ: Mapping[str, str]) -> Plan | None:
    """What the environment asks for; None when nothing is to be exported."""
    if _env(environ, "OTEL_SDK_DISABLED").lower() in _TRUE:
        return None
    traces, metrics = (_signal_protocol(environ, signal) for signal in _SIGNALS)
    if traces is None and metrics is None:
        return None
    return Plan(traces, metrics)


# ======================================================================================= providers


def _resource(config: Config, environ: Mapping[str, str]) -> Any:
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    attributes: dict[str, str] = {}
    # Resource.create lets explicit attributes win over the environment: only add our default
    # service name when the operator did not name the service.
    detected = OTELResourceDetector().detect().attributes
    if not _env(environ, "OTEL_SERVICE_NAME") and "service.name" not in detected:
        attributes["service.name"] = SERVICE_NAME
    if config.sharded and config.server.shard:
        attributes["cronoq.shard"] = config.server.shard
    return Resource.create(attributes)


def _tracer_provider(protocol: str, resource: Any) -> TracerProvider:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpans

        exporter: Any = GrpcSpans()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpans

        exporter = HttpSpans()
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _meter_provider(protocol: str, resource: Any) -> MeterProvider:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetrics

        exporter: Any = GrpcMetrics()
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetrics

        exporter = HttpMetrics()
    return MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(exporter)])


# ======================================================================================= the state


class Telemetry:
    """The providers of one server process, the tracer, and the snapshot-backed instruments."""

    def __init__(self, api: Api, tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None) -> None:
        self.api = api
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.tracer: Tracer | None = None
        if tracer_provider is not None:
            self.tracer = tracer_provider.get_tracer(INSTRUMENTATION)
        self._metrics: SnapshotMetrics | None = None
        if meter_provider is not None:
            self._metrics = SnapshotMetrics(api, meter_provider)

    def start(self) -> None:
        """Bind the metric callbacks to the running event loop (the one the shard runs on)."""
        if self._metrics is not None:
            self._metrics.loop = asyncio.get_running_loop()

    async def shutdown(self) -> None:
        """Flush what is pending and stop the exporters (idempotent).

        Runs in a worker thread: a last metric collection may ask the event loop for a snapshot."""
        global _state
        if _state is self:
            _state = None
        tracer_provider, self.tracer_provider = self.tracer_provider, None
        meter_provider, self.meter_provider = self.meter_provider, None

        def stop() -> None:
            if tracer_provider is not None:
                tracer_provider.shutdown()
            if meter_provider is not None:
                meter_provider.shutdown()

        await asyncio.to_thread(stop)


_state: Telemetry | None = None


def setup(config: Config, api: Api) -> Telemetry | None:
    """Build the providers ``os.environ`` asks for; None (and no cost) when it asks for none.

    Raises ``TelemetryError`` for settings this server cannot honour."""
    global _state
    wanted = plan(os.environ)
    if wanted is None:
        return None
    resource = _resource(config, os.environ)
    tracer_provider = _tracer_provider(wanted.traces, resource) if wanted.traces else None
    meter_provider = _meter_provider(wanted.metrics, resource) if wanted.metrics else None
    telemetry = Telemetry(api, tracer_provider, meter_provider)
    _state = telemetry
    log.info("OpenTelemetry on: traces %s, metrics %s", wanted.traces or "off", wanted.metrics or "off")
    return telemetry


def active() -> Telemetry | None:
    """The telemetry of this process, or None when it is off."""
    return _state


def outgoing_traceparent() -> str | None:
    """The W3C ``traceparent`` to send with a call made on behalf of the current request
    (the current server span), or None when tracing is off or no span is active."""
    if _state is None or _state.tracer is None:
        return None
    return current_traceparent()


def _tracer() -> Tracer | None:
    state = _state
    return None if state is None else state.tracer


# ======================================================================================= gRPC spans

# Server spans of calls ending with these codes are errors (OpenTelemetry's RPC conventions).
_ERROR_CODES = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


def _status_code(context: Any, error: BaseException | None) -> grpc.StatusCode:
    code = None
    with contextlib.suppress(Exception):
        code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):
        for status in grpc.StatusCode:
            if status.value[0] == code:
                return status
    if error is None:
        return grpc.StatusCode.OK
    return grpc.StatusCode.CANCELLED if isinstance(error, asyncio.CancelledError) else grpc.StatusCode.UNKNOWN


def _end_rpc(span: Span, context: Any, error: BaseException | None) -> None:
    from opentelemetry.trace import Status, StatusCode

    code = _status_code(context, error)
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code in _ERROR_CODES:
        details = None
        with contextlib.suppress(Exception):
            details = context.details()
        span.set_status(Status(StatusCode.ERROR, details or code.name))


def _carrier(metadata: Iterable[Any] | None) -> dict[str, str]:
    carrier: dict[str, str] = {}
    for key, value in metadata or ():
        if isinstance(value, str):
            carrier[key] = value
    return carrier


class _RpcSpans(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """A SERVER span around each call, child of the caller's ``traceparent`` metadata."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        if method == FORWARD_STREAM:
            return handler  # each call in it gets its own span (``forwarded_call_span``)
        metadata = handler_call_details.invocation_metadata
        return _wrap_handler(self._tracer, handler, method, metadata)


def _wrap_handler(tracer: Tracer, handler: Any, method: str, metadata: Any) -> Any:
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind

    service, _, name = method.lstrip("/").partition("/")
    span_name = f"{service}/{name}"
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

    def span() -> Any:
        parent = propagate.extract(_carrier(metadata))
        return tracer.start_as_current_span(
            span_name,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        )

    def wrap(behavior: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(behavior):

            async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                with span() as current:
                    try:
                        async for item in behavior(request, context):
                            yield item
                    except BaseException as exc:
                        _end_rpc(current, context, exc)
                        raise
                    _end_rpc(current, context, None)

            return stream

        async def call(request: Any, context: Any) -> Any:
            with span() as current:
                try:
                    result = await behavior(request, context)
                except BaseException as exc:
                    _end_rpc(current, context, exc)
                    raise
                _end_rpc(current, context, None)
                return result

        return call

    common = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(wrap(handler.unary_unary), **common)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(wrap(handler.unary_stream), **common)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(wrap(handler.stream_unary), **common)
    return grpc.stream_stream_rpc_method_handler(wrap(handler.stream_stream), **common)


FORWARD_STREAM = "/cronoq.v1.Peers/Forward"
"""The internal stream other nodes forward calls over: a span per call in it, none for the stream."""


@contextlib.contextmanager
def forwarded_call_span(method: str, traceparent: str) -> Iterator[Callable[[grpc.StatusCode, str], None]]:
    """Around a call forwarded in a Forward stream: the SERVER span the same call made directly
    gets, child of its ``traceparent`` (a root span without one). Yields a function recording
    the call's status; nothing at all when tracing is off."""
    tracer = _tracer()
    if tracer is None:
        yield _no_status
        return
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind, Status, StatusCode

    service, _, name = method.lstrip("/").partition("/")
    attributes = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}
    parent = propagate.extract({TRACEPARENT: traceparent} if traceparent else {})
    with tracer.start_as_current_span(
        f"{service}/{name}",
        context=parent,
        kind=SpanKind.SERVER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:

        def record(code: grpc.StatusCode, details: str) -> None:
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code in _ERROR_CODES:
                span.set_status(Status(StatusCode.ERROR, details or code.name))

        yield record


def _no_status(code: grpc.StatusCode, details: str) -> None:
    pass


def grpc_interceptors() -> Sequence[grpc.aio.ServerInterceptor] | None:
    """Interceptors for ``grpc.aio.server``: None when tracing is off (no per-call cost)."""
    tracer = _tracer()
    return None if tracer is None else [_RpcSpans(tracer)]


# ======================================================================================= HTTP spans

HttpHandler = Callable[["web.BaseRequest"], Awaitable["web.StreamResponse"]]


def trace_http(handler: HttpHandler, route_of: Callable[[str, str], Any]) -> HttpHandler:
    """``handler`` with a SERVER span around each request when tracing is on (else ``handler``).

    ``route_of(method, raw_path)`` answers ``(route, params)`` for a known route (``route.path``
    is the template) and raises otherwise; the span is named ``METHOD /templated/path`` (only
    ``METHOD`` for an unknown path)."""
    tracer = _tracer()
    if tracer is None:
        return handler
    from opentelemetry import propagate
    from opentelemetry.trace import SpanKind, Status, StatusCode

    async def traced(request: web.BaseRequest) -> web.StreamResponse:
        method = request.method
        template: str | None = None
        with contextlib.suppress(Exception):
            template = route_of(method, request.rel_url.raw_path)[0].path
        attributes: dict[str, str] = {"http.request.method": method, "url.path": request.path}
        if template is not None:
            attributes["http.route"] = template
        name = f"{method} {template}" if template else method
        parent = propagate.extract(request.headers)
        with tracer.start_as_current_span(
            name,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                response = await handler(request)
            except BaseException as exc:
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            return response

    return traced


# ======================================================================================= attempt spans


def shard_service_type() -> type[ShardService]:
    """The shard service class to run: with attempt spans when tracing is on."""
    return TracedShardService if _tracer() is not None else ShardService


class TracedShardService(ShardService):
    """The server's shard service plus a ``cronoq.task`` span per attempt: opened when the lease
    is dispatched, closed by the attempt's outcome (completion, failure, abort, lost worker)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        tracer = _tracer()
        if tracer is None:
            raise RuntimeError("TracedShardService needs telemetry with tracing on (telemetry.setup)")
        self._tracer = tracer
        self._attempts: dict[int, Span] = {}

    def _open(self, lease: Dispatch) -> None:
        from opentelemetry import propagate
        from opentelemetry.context import Context

        traceparent = lease.tags.get(TRACEPARENT)
        parent = propagate.extract({TRACEPARENT: traceparent}) if traceparent else Context()
        attributes: dict[str, str | int] = {
            "task.id": lease.task_id,
            "task.pool": lease.pool,
            "task.kind": lease.kind,
            "task.attempt": lease.attempt,
        }
        self._attempts[lease.id] = self._tracer.start_span(SPAN_NAME, context=parent, attributes=attributes)

    def _close(self, lease_id: int, error: str | None = None) -> None:
        span = self._attempts.pop(lease_id, None)
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, error) if error is not None else Status(StatusCode.OK))
        span.end()

    # The driver's sink -------------------------------------------------------------------------

    def dispatch(self, leases: Sequence[Dispatch]) -> None:
        for lease in leases:
            self._open(lease)
        super().dispatch(leases)
        owners = self.workers.lease_owner
        for lease in leases:
            if lease.id not in owners:
                self._close(lease.id, "no connected worker could take the lease")

    def abort(self, aborts: Sequence[Abort]) -> None:
        for abort in aborts:
            self._close(abort.lease_id, abort.reason)
        super().abort(aborts)

    # Worker reports ------------------------------------------------------------------------------

    def worker_complete(self, session: WorkerSession, lease_id: int, output: Blob) -> None:
        self._close(lease_id)
        super().worker_complete(session, lease_id, output)

    def worker_fail(
        self, session: WorkerSession, lease_id: int, message: str, permanent: bool, retry_after: int | None
    ) -> None:
        self._close(lease_id, message or "failed")
        super().worker_fail(session, lease_id, message, permanent, retry_after)

    def worker_cancelled(self, session: WorkerSession, lease_id: int) -> None:
        self._close(lease_id, "cancelled by the worker")
        super().worker_cancelled(session, lease_id)

    def worker_nack(self, session: WorkerSession, lease_id: int, reason: str) -> None:
        super().worker_nack(session, lease_id, reason)
        if lease_id not in self.workers.lease_owner:  # no other worker took it: the attempt failed
            self._close(lease_id, "no other worker could take the lease")

    def unregister_worker(self, session: WorkerSession, reason: str = "worker disconnected") -> None:
        if session.id in self.workers.sessions:
            for lease_id in list(session.running):
                self._close(lease_id, reason)
        super().unregister_worker(session, reason)

    def _end_everything(self, error: Exception, *, not_leader: bool, reason: str) -> None:
        # Step-down and shutdown drop every session at once, without unregister_worker.
        super()._end_everything(error, not_leader=not_leader, reason=reason)
        for lease_id in list(self._attempts):
            self._close(lease_id, reason)
