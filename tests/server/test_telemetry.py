"""OpenTelemetry of ``cronoq-server`` against a real OTLP/HTTP receiver started by the test.

The receiver is an aiohttp server that accepts ``POST /v1/traces`` and ``POST /v1/metrics`` with
protobuf bodies and decodes them with the ``opentelemetry-proto`` messages. Servers are real
``cronoq-server`` processes configured through the ``OTEL_*`` environment; submitters call them
over gRPC (``traceparent`` metadata) and HTTP (``traceparent`` header) and a real
``cronoq.client.Worker`` runs the tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from cronoq.config import Config
from cronoq.shard.service import ShardService
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as metrics_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as trace_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from cronoq.client import Lease, Worker
from cronoq.errors import Retryable
from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pbg
from cronoq.server import telemetry
from cronoq.server.api import Api
from tests.server.harness import CLIENT_TOKEN, TOKENS_TOML, WORKER_TOKEN
from tests.server.http_support import HttpServerProcess

CONFIG = f"""
[server]
grpc_addr = "127.0.0.1:{{port}}"
http_addr = "127.0.0.1:{{http_port}}"
shutdown_grace_s = 1

[limits]
max_wait_s = 10

{TOKENS_TOML}
[[pools]]
name = "default"
max = 4

[[pools]]
name = "flaky"
retry = {{ max_attempts = 3, initial_backoff_s = 0.02, max_backoff_s = 0.05 }}

[[pools]]
name = "other"
"""

WORKER_SLOTS = 3

# Every variable that could switch exporting on in the child, cleared unless a test sets it.
_CLEARED = {name: "" for name in os.environ if name.startswith("OTEL_")}


# ---------------------------------------------------------------------------------- the receiver


@dataclass
class Point:
    """One data point of an exported metric."""

    attributes: dict[str, str]
    value: float


@dataclass
class OtlpReceiver:
    """Everything the server exported, decoded."""

    port: int = 0
    requests: list[str] = field(default_factory=list)
    spans: list[tuple[dict[str, Any], Span]] = field(default_factory=list)  # (resource attributes, span)
    metrics: list[dict[str, list[Point]]] = field(default_factory=list)  # one dict per export
    resources: list[dict[str, Any]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.Response:
        """OTLP/HTTP with protobuf bodies."""
        self.requests.append(request.path)
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if request.path == "/v1/traces":
            self.record_traces(ExportTraceServiceRequest.FromString(body))
            answer = ExportTraceServiceResponse().SerializeToString()
        elif request.path == "/v1/metrics":
            self.record_metrics(ExportMetricsServiceRequest.FromString(body))
            answer = ExportMetricsServiceResponse().SerializeToString()
        else:
            return web.Response(status=404)
        return web.Response(body=answer, content_type="application/x-protobuf")

    def record_traces(self, export: ExportTraceServiceRequest) -> None:
        for resource_spans in export.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            self.resources.append(resource)
            for scope in resource_spans.scope_spans:
                self.spans.extend((resource, span) for span in scope.spans)
        self.changed.set()

    def record_metrics(self, export: ExportMetricsServiceRequest) -> None:
        seen: dict[str, list[Point]] = {}
        for resource_metrics in export.resource_metrics:
            self.resources.append(_attributes(resource_metrics.resource.attributes))
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    data = metric.gauge if metric.HasField("gauge") else metric.sum
                    seen[metric.name] = [
                        Point(_attributes(p.attributes), p.as_int if p.WhichOneof("value") == "as_int" else p.as_double)
                        for p in data.data_points
                    ]
        self.metrics.append(seen)
        self.changed.set()

    async def until(self, found: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
        """Wait for the exports to contain something (the bound only stops a broken test)."""

        async def poll() -> Any:
            while not (result := found()):
                self.changed.clear()
                await self.changed.wait()
            return result

        try:
            return await asyncio.wait_for(poll(), timeout)
        except TimeoutError:
            raise AssertionError(f"the receiver never got {what}; requests: {self.requests}") from None

    def spans_named(self, name: str, trace_id: bytes | None = None) -> list[Span]:
        return [span for _, span in self.spans if span.name == name and trace_id in (None, span.trace_id)]

    def latest(self, metric: str) -> list[Point] | None:
        for export in reversed(self.metrics):
            if metric in export:
                return export[metric]
        return None


def _attributes(pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        out[pair.key] = getattr(pair.value, kind) if kind else None
    return out


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    runner = web.ServerRunner(web.Server(receiver.handle), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    receiver.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield receiver
    finally:
        await runner.cleanup()


class _GrpcTraces(trace_grpc.TraceServiceServicer):  # type: ignore[misc]
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    async def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
        self.receiver.requests.append("grpc:traces")
        self.receiver.record_traces(request)
        return ExportTraceServiceResponse()


class _GrpcMetrics(metrics_grpc.MetricsServiceServicer):  # type: ignore[misc]
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    async def Export(self, request: ExportMetricsServiceRequest, context: Any) -> ExportMetricsServiceResponse:
        self.receiver.requests.append("grpc:metrics")
        self.receiver.record_metrics(request)
        return ExportMetricsServiceResponse()


@contextlib.asynccontextmanager
async def otlp_grpc_receiver() -> AsyncIterator[OtlpReceiver]:
    """The same receiver speaking OTLP/gRPC."""
    receiver = OtlpReceiver()
    server = grpc.aio.server()
    trace_grpc.add_TraceServiceServicer_to_server(_GrpcTraces(receiver), server)
    metrics_grpc.add_MetricsServiceServicer_to_server(_GrpcMetrics(receiver), server)
    receiver.port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield receiver
    finally:
        await server.stop(0)


# ----------------------------------------------------------------------------------- the server


@contextlib.asynccontextmanager
async def server_process(
    directory: Path,
    env: dict[str, str],
    expect: str = "listening",
) -> AsyncIterator[HttpServerProcess]:
    proc = HttpServerProcess(directory, CONFIG, name="otel", env={**_CLEARED, **env})
    # Starting blocks on the child's output: keep the receiver's event loop free meanwhile.
    await asyncio.to_thread(proc.start, expect)
    try:
        yield proc
    finally:
        await asyncio.to_thread(proc.stop)


def otel_env(receiver: OtlpReceiver, **extra: str) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
        **extra,
    }


@dataclass
class Traceparent:
    trace_id: bytes
    span_id: bytes

    @classmethod
    def new(cls) -> Traceparent:
        return cls(secrets.token_bytes(16), secrets.token_bytes(8))

    @property
    def header(self) -> str:
        return f"00-{self.trace_id.hex()}-{self.span_id.hex()}-01"


def parse_traceparent(value: str) -> Traceparent:
    version, trace_id, span_id, flags = value.split("-")
    assert (version, len(trace_id), len(span_id), len(flags)) == ("00", 32, 16, 2), value
    return Traceparent(bytes.fromhex(trace_id), bytes.fromhex(span_id))


def worker(address: str, seen: list[Lease]) -> contextlib.AbstractAsyncContextManager[Worker]:
    return worker_for(address, "default", seen)


@contextlib.asynccontextmanager
async def worker_for(address: str, pool: str, seen: list[Lease]) -> AsyncIterator[Worker]:
    """A ``cronoq.client.Worker`` of ``pool`` that records the leases it runs."""

    async def handle(lease: Lease) -> dict[str, str]:
        seen.append(lease)
        return {"ok": "yes"}

    running = Worker(address, pool, handle, token=WORKER_TOKEN, slots=WORKER_SLOTS, backoff=(0.05, 0.2))
    task = asyncio.ensure_future(running.run())
    try:
        await running.wait_registered(10)
        yield running
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(running.stop(1), 10)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, 10)


async def submit_grpc(
    address: str,
    traceparent: Traceparent | None,
    tags: dict[str, str] | None = None,
) -> pb.SubmitResponse:
    metadata = [("authorization", f"Bearer {CLIENT_TOKEN}")]
    if traceparent is not None:
        metadata.append(("traceparent", traceparent.header))
    async with grpc.aio.insecure_channel(address) as channel:
        request = pb.SubmitRequest(
            task=pb.TaskSpec(pool="default", payload=b"{}", tags=tags or {}), wait=True, wait_timeout_s=10
        )
        response: pb.SubmitResponse = await pbg.TasksStub(channel).Submit(request, metadata=metadata, timeout=20)
    assert response.result.status == pb.TASK_STATUS_SUCCEEDED, response
    return response


async def submit_http(url: str, traceparent: Traceparent) -> str:
    headers = {"authorization": f"Bearer {CLIENT_TOKEN}", "traceparent": traceparent.header}
    submission = {"pool": "default", "wait": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/tasks", headers=headers, json=submission) as response,
    ):
        body = await response.json()
    assert response.status == 200 and body["result"]["status"] == "succeeded", body
    return str(body["id"])


def point(points: list[Point] | None, **attributes: str) -> float | None:
    for p in points or ():
        if all(p.attributes.get(k) == v for k, v in attributes.items()):
            return p.value
    return None


# ---------------------------------------------------------------------------------------- tests


async def test_spans_follow_the_submitters_trace_to_the_worker(tmp_path: Path) -> None:
    async with otlp_receiver() as receiver, server_process(tmp_path, otel_env(receiver)) as server:
        seen: list[Lease] = []
        async with worker(server.address, seen):
            over_grpc, over_http = Traceparent.new(), Traceparent.new()
            grpc_task = (await submit_grpc(server.address, over_grpc)).id
            http_task = int(await submit_http(server.http_url, over_http))

            # The workers got the submitters' traces in lease.tags["traceparent"] ...
            by_task = {lease.task_id: lease for lease in seen}
            grpc_tag = parse_traceparent(by_task[grpc_task].tags["traceparent"])
            http_tag = parse_traceparent(by_task[http_task].tags["traceparent"])
            assert grpc_tag.trace_id == over_grpc.trace_id and http_tag.trace_id == over_http.trace_id

            # ... naming the server span of the submission, itself a child of the submitter's span.
            rpc = (
                await receiver.until(
                    lambda: receiver.spans_named("cronoq.v1.Tasks/Submit", over_grpc.trace_id), "the gRPC Submit span"
                )
            )[0]
            assert rpc.kind == Span.SPAN_KIND_SERVER and rpc.parent_span_id == over_grpc.span_id
            assert grpc_tag.span_id == rpc.span_id
            request = (
                await receiver.until(
                    lambda: receiver.spans_named("POST /v1/tasks", over_http.trace_id), "the HTTP request span"
                )
            )[0]
            assert request.kind == Span.SPAN_KIND_SERVER and request.parent_span_id == over_http.span_id
            assert http_tag.span_id == request.span_id
            assert _attributes(request.attributes)["http.response.status_code"] == 200

            # Each attempt has a cronoq.task span under the submission's span.
            for submitted, task_id in ((rpc, grpc_task), (request, http_task)):
                attempt = (
                    await receiver.until(
                        lambda s=submitted: receiver.spans_named("cronoq.task", s.trace_id), "an attempt span"
                    )
                )[0]
                attributes = _attributes(attempt.attributes)
                assert attempt.parent_span_id == submitted.span_id
                assert (attributes["task.id"], attributes["task.pool"], attributes["task.attempt"]) == (
                    task_id,
                    "default",
                    1,
                )
                assert attempt.status.code == attempt.status.STATUS_CODE_OK

            # A refused call's span carries its status code (a caller's mistake is no server error).
            refused = Traceparent.new()
            metadata = (("authorization", f"Bearer {CLIENT_TOKEN}"), ("traceparent", refused.header))
            async with grpc.aio.insecure_channel(server.address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as raised:
                    await pbg.TasksStub(channel).Get(pb.GetRequest(task=pb.TaskRef(id=12345)), metadata=metadata)
            assert raised.value.code() == grpc.StatusCode.NOT_FOUND
            get = (
                await receiver.until(
                    lambda: receiver.spans_named("cronoq.v1.Tasks/Get", refused.trace_id), "the Get span"
                )
            )[0]
            assert _attributes(get.attributes)["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
            assert get.status.code == get.status.STATUS_CODE_UNSET

            # A tag the submitter set is left alone.
            own = f"00-{'ab' * 16}-{'cd' * 8}-01"
            own_task = (await submit_grpc(server.address, Traceparent.new(), {"traceparent": own})).id
            assert {lease.task_id: lease for lease in seen}[own_task].tags["traceparent"] == own

            # Metrics: pool figures of the leader's snapshot.
            def figures() -> bool:
                succeeded = point(receiver.latest("cronoq.tasks"), status="succeeded")
                capacity = point(receiver.latest("cronoq.pool.capacity"), pool="default")
                return succeeded == 3 and capacity == WORKER_SLOTS

            await receiver.until(figures, "cronoq.tasks{succeeded}=3 and cronoq.pool.capacity=3")
            assert point(receiver.latest("cronoq.pool.workers"), pool="default") == 1
            assert point(receiver.latest("cronoq.workers_connected")) == 1
            assert point(receiver.latest("cronoq.pool.pending_by_class"), pool="default", **{"class": "high"}) == 0
            assert point(receiver.latest("cronoq.pool.desired_workers"), pool="default") is not None
            assert point(receiver.latest("cronoq.pool.cost"), pool="default") is not None
        # The worker's stream is a span too, ended with the stream.
        await receiver.until(lambda: receiver.spans_named("cronoq.v1.Workers/Work"), "the Work stream span")
    assert all(resource.get("service.name") == "cronoq-server" for resource in receiver.resources)


async def test_retries_show_up_under_the_request_that_caused_them(tmp_path: Path) -> None:
    async def flaky(lease: Lease) -> str:
        if lease.attempt == 1:
            raise Retryable("first attempts fail")
        return "fine"

    async with otlp_receiver() as receiver, server_process(tmp_path, otel_env(receiver)) as server:
        running = Worker(server.address, "flaky", flaky, token=WORKER_TOKEN, backoff=(0.05, 0.2))
        task = asyncio.ensure_future(running.run())
        try:
            await running.wait_registered(10)
            caller = Traceparent.new()
            headers = {"authorization": f"Bearer {CLIENT_TOKEN}", "traceparent": caller.header}
            submission = {"pool": "flaky", "wait": True}
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{server.http_url}/v1/tasks", headers=headers, json=submission) as response,
            ):
                body = await response.json()
            assert body["result"]["status"] == "succeeded", body
        finally:
            await asyncio.wait_for(running.stop(1), 10)
            await asyncio.wait_for(task, 10)
        attempts = await receiver.until(
            lambda: (found := receiver.spans_named("cronoq.task", caller.trace_id)) and len(found) == 2 and found,
            "two attempt spans",
        )
        request = receiver.spans_named("POST /v1/tasks", caller.trace_id)[0]
        by_attempt = {_attributes(span.attributes)["task.attempt"]: span for span in attempts}
        assert {span.parent_span_id for span in attempts} == {request.span_id}
        assert by_attempt[1].status.code == by_attempt[1].status.STATUS_CODE_ERROR
        assert by_attempt[1].status.message == "first attempts fail"
        assert by_attempt[2].status.code == by_attempt[2].status.STATUS_CODE_OK


async def test_only_the_signal_whose_endpoint_is_set_is_exported(tmp_path: Path) -> None:
    async with otlp_receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.endpoint}/v1/traces",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRIC_EXPORT_INTERVAL": "200",
            "OTEL_SERVICE_NAME": "scheduler-a",
        }
        async with server_process(tmp_path, env) as server:
            seen: list[Lease] = []
            async with worker(server.address, seen):
                caller = Traceparent.new()
                await submit_grpc(server.address, caller)
                await receiver.until(lambda: receiver.spans_named("cronoq.task", caller.trace_id), "the attempt span")
        # The process has stopped (after a final flush): no metrics went anywhere.
        assert "/v1/metrics" not in receiver.requests
        assert {resource.get("service.name") for resource, _ in receiver.spans} == {"scheduler-a"}


async def test_otlp_over_grpc(tmp_path: Path) -> None:
    async with otlp_grpc_receiver() as receiver:
        env = otel_env(receiver, OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_INSECURE="true")
        async with server_process(tmp_path, env) as server:
            seen: list[Lease] = []
            async with worker(server.address, seen):
                caller = Traceparent.new()
                await submit_grpc(server.address, caller)
                rpc = (
                    await receiver.until(
                        lambda: receiver.spans_named("cronoq.v1.Tasks/Submit", caller.trace_id), "the Submit span"
                    )
                )[0]
                assert rpc.parent_span_id == caller.span_id
                assert parse_traceparent(seen[0].tags["traceparent"]).span_id == rpc.span_id
                await receiver.until(
                    lambda: point(receiver.latest("cronoq.pool.workers"), pool="default") == 1, "cronoq.pool.workers"
                )
        assert {"grpc:traces", "grpc:metrics"} <= set(receiver.requests)


@pytest.mark.parametrize(
    "switch",
    [
        {},  # nothing set at all
        {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "{endpoint}"},
        {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "{endpoint}"},
    ],
    ids=["unset", "sdk-disabled", "exporters-none"],
)
async def test_nothing_is_exported_when_not_asked_for(tmp_path: Path, switch: dict[str, str]) -> None:
    async with otlp_receiver() as receiver:
        env = {name: value.format(endpoint=receiver.endpoint) for name, value in switch.items()}
        env |= {"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_METRIC_EXPORT_INTERVAL": "100"}
        async with server_process(tmp_path, env) as server:
            seen: list[Lease] = []
            async with worker(server.address, seen):
                await submit_grpc(server.address, Traceparent.new())
                async with aiohttp.ClientSession() as http, http.get(f"{server.http_url}/healthz") as response:
                    assert response.status == 200
        # Without telemetry the request's traceparent is not turned into a tag either.
        assert len(seen) == 1 and "traceparent" not in seen[0].tags
        assert "OpenTelemetry on" not in server.stderr()
    assert receiver.requests == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/json",
        ),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER=zipkin"),
    ],
    ids=["protocol", "exporter"],
)
async def test_unsupported_settings_stop_the_server_with_a_clear_error(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    proc = HttpServerProcess(tmp_path, CONFIG, name="bad-otel", env={**_CLEARED, **env})
    with pytest.raises(RuntimeError, match="exited with 1"):
        await asyncio.to_thread(proc.start, "listening", 30.0)
    assert message in proc.stderr()


# ------------------------------------------------------------------------- the plan, in-process


def test_the_environment_decides_what_is_exported() -> None:
    assert telemetry.plan({}) is None
    assert telemetry.plan({"OTEL_BSP_SCHEDULE_DELAY": "5", "OTEL_SERVICE_NAME": "x"}) is None
    both = telemetry.plan({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert both is not None and (both.traces, both.metrics) == ("http/protobuf", "http/protobuf")
    metrics_only = telemetry.plan(
        {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc"}
    )
    assert metrics_only is not None and (metrics_only.traces, metrics_only.metrics) == (None, "grpc")
    asked = telemetry.plan({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert asked is not None and (asked.traces, asked.metrics) == ("grpc", None)
    assert telemetry.plan({"OTEL_SDK_DISABLED": "TRUE", "OTEL_TRACES_EXPORTER": "otlp"}) is None
    off = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}
    off_plan = telemetry.plan(off)
    assert off_plan is not None and (off_plan.traces, off_plan.metrics) == (None, "http/protobuf")
    with pytest.raises(telemetry.TelemetryError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=thrift"):
        telemetry.plan({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"})
    with pytest.raises(telemetry.TelemetryError, match="OTEL_METRICS_EXPORTER=prometheus"):
        telemetry.plan({"OTEL_METRICS_EXPORTER": "prometheus"})


@pytest.fixture
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    yield monkeypatch
    assert telemetry.active() is None, "a test left telemetry on"


async def test_without_telemetry_nothing_is_wrapped(clean_otel_env: pytest.MonkeyPatch) -> None:
    config = Config.parse("")
    assert telemetry.setup(config, Api(config)) is None

    async def handler(request: Any) -> Any:
        raise AssertionError("not called")

    assert telemetry.trace_http(handler, lambda method, path: None) is handler
    assert telemetry.grpc_interceptors() is None
    assert telemetry.shard_service_type() is ShardService
    assert telemetry.outgoing_traceparent() is None


async def test_outgoing_traceparent_names_the_current_span(clean_otel_env: pytest.MonkeyPatch) -> None:
    async with otlp_receiver() as receiver:
        clean_otel_env.setenv("OTEL_TRACES_EXPORTER", "otlp")
        clean_otel_env.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.endpoint}/v1/traces")
        config = Config.parse("")
        state = telemetry.setup(config, Api(config))
        assert state is not None and state.tracer is not None and state.meter_provider is None
        try:
            assert telemetry.outgoing_traceparent() is None  # no span yet
            with state.tracer.start_as_current_span("forwarding") as span:
                context = span.get_span_context()
                assert telemetry.outgoing_traceparent() == (
                    f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
                )
        finally:
            await state.shutdown()
        assert telemetry.active() is None and telemetry.outgoing_traceparent() is None
        # The shutdown flushed the span to the receiver.
        assert [span.name for _, span in receiver.spans] == ["forwarding"]


# ----------------------------------------------------------------------------- forwarded calls


async def test_a_forwarded_call_continues_the_callers_trace(tmp_path: Path) -> None:
    from tests.federation.conftest import Federation

    async with otlp_receiver() as receiver:
        cluster = Federation(tmp_path, '[store]\nkind = "memory"')
        for node in cluster.nodes.values():
            node.env = {**_CLEARED, **otel_env(receiver)}
        await asyncio.to_thread(cluster.start)
        try:
            seen: list[Lease] = []
            async with worker_for(cluster["s2"].address, "p2", seen):
                caller = Traceparent.new()
                # Shard s1 does not serve pool p2: it forwards the call to s2.
                metadata = [("authorization", f"Bearer {CLIENT_TOKEN}"), ("traceparent", caller.header)]
                async with grpc.aio.insecure_channel(cluster["s1"].address) as channel:
                    request = pb.SubmitRequest(task=pb.TaskSpec(pool="p2", payload=b"{}"), wait=True)
                    response = await pbg.TasksStub(channel).Submit(request, metadata=metadata, timeout=20)
                assert response.result.status == pb.TASK_STATUS_SUCCEEDED

                def submit_spans() -> dict[str, Span] | None:
                    spans = {
                        resource.get("cronoq.shard"): span
                        for resource, span in receiver.spans
                        if span.name == "cronoq.v1.Tasks/Submit" and span.trace_id == caller.trace_id
                    }
                    return spans if len(spans) == 2 else None

                spans = await receiver.until(submit_spans, "the Submit spans of both shards")
                # s1's span is the caller's child, s2's span is s1's child ...
                assert spans["s1"].parent_span_id == caller.span_id
                assert spans["s2"].parent_span_id == spans["s1"].span_id
                # ... and the task's trace starts at the shard that admitted it.
                tag = parse_traceparent(seen[0].tags["traceparent"])
                assert (tag.trace_id, tag.span_id) == (caller.trace_id, spans["s2"].span_id)
        finally:
            await asyncio.to_thread(cluster.stop)
