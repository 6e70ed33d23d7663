"""OpenTelemetry in ``cronoq.client``: calls carry the caller's trace, attempts continue it.

The end-to-end case runs a real ``cronoq-server`` process exporting its own spans to an OTLP
receiver started by the test, while this process records the client's and the worker's spans with
the SDK's in-memory exporter on the global tracer provider (set once per process; a provider some
earlier test installed is reused). Cases about what happens *without* a provider or without the
OpenTelemetry API run in a fresh interpreter, since providers and imports are process-wide.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags

from cronoq.client import Client, Lease, Worker
from cronoq.errors import Retryable
from tests.client.fake_server import FakeCronoq, eventually
from tests.server.harness import CLIENT_TOKEN, WORKER_TOKEN
from tests.server.test_telemetry import otel_env, otlp_receiver, parse_traceparent, server_process

ROOT = Path(__file__).resolve().parents[2]

_exporter: InMemorySpanExporter | None = None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The in-memory exporter of the process's SDK tracer provider, emptied for each test."""
    global _exporter
    if _exporter is None:
        exporter = InMemorySpanExporter()
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        _exporter = exporter
    _exporter.clear()
    yield _exporter
    _exporter.clear()


def _hex_traceparent(context: SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def _attempt_spans(exporter: InMemorySpanExporter, trace_id: int) -> list[ReadableSpan]:
    return [
        span
        for span in exporter.get_finished_spans()
        if span.name == "cronoq.task" and span.context is not None and span.context.trace_id == trace_id
    ]


# --------------------------------------------------------------------------- client metadata


async def test_calls_made_inside_a_span_send_its_traceparent(fake: FakeCronoq) -> None:
    # A span from another process's context (no SDK needed): its context is what must travel.
    remote = SpanContext(
        trace_id=0x1234_5678_9ABC_DEF0_1234_5678_9ABC_DEF0,
        span_id=0x0BAD_CAFE_0BAD_CAFE,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    async with Client(fake.address, token=CLIENT_TOKEN) as client:
        await client.submit("untraced", pool="nobody")
        method, metadata, _ = fake.calls[-1]
        assert method == "Submit" and "traceparent" not in metadata
        with trace.use_span(NonRecordingSpan(remote)):
            await client.submit("traced", pool="nobody")
            method, metadata, _ = fake.calls[-1]
            assert method == "Submit" and metadata["traceparent"] == _hex_traceparent(remote)
            assert metadata["authorization"] == f"Bearer {CLIENT_TOKEN}"
            await client.snapshot()
            assert fake.calls[-1][0] == "Snapshot" and fake.calls[-1][1]["traceparent"] == _hex_traceparent(remote)
        await client.snapshot()
        assert "traceparent" not in fake.calls[-1][1]


# ---------------------------------------------------------------------- end to end, real server


async def test_worker_attempts_continue_the_submitters_trace(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("tests.client")
    inside: list[tuple[Lease, SpanContext]] = []

    async def handle(lease: Lease) -> str:
        inside.append((lease, trace.get_current_span().get_span_context()))
        if lease.pool == "flaky" and lease.attempt == 1:
            raise Retryable("not yet", retry_after=0.01)
        return "done"

    async with otlp_receiver() as receiver, server_process(tmp_path, otel_env(receiver)) as server:
        workers = [
            Worker(server.address, pool, handle, token=WORKER_TOKEN, slots=2, backoff=(0.05, 0.2))
            for pool in ("default", "flaky")
        ]
        runs = [asyncio.ensure_future(w.run()) for w in workers]
        try:
            for w in workers:
                await w.wait_registered(20)
            async with Client(server.address, token=CLIENT_TOKEN) as client:
                with tracer.start_as_current_span("request") as request:
                    plain = await client.submit({"n": 1}, kind="summarize", wait=True, wait_timeout=30)
                    flaky = await client.submit("again", pool="flaky", wait=True, wait_timeout=30)
                assert plain.result is not None and plain.result.ok
                assert flaky.result is not None and flaky.result.ok
                # Outside any span the call carries no trace: the task's trace starts at the server.
                loose = await client.submit("loose", wait=True, wait_timeout=30)
                assert loose.result is not None and loose.result.ok
        finally:
            for w in workers:
                await asyncio.wait_for(w.stop(1), 20)
            await asyncio.gather(*runs, return_exceptions=True)

        caller = request.get_span_context()
        attempts = _attempt_spans(spans, caller.trace_id)
        by_task: dict[int, list[ReadableSpan]] = {}
        for span in attempts:
            assert span.attributes is not None
            by_task.setdefault(int(span.attributes["task.id"]), []).append(span)  # type: ignore[arg-type]
        assert sorted(by_task) == sorted([plain.id, flaky.id])

        # The plain task: one attempt, a child of the server's Submit span, itself the caller's child.
        (attempt,) = by_task[plain.id]
        assert attempt.attributes is not None and attempt.parent is not None
        assert dict(attempt.attributes) == {
            "task.id": plain.id,
            "task.pool": "default",
            "task.kind": "summarize",
            "task.attempt": 1,
        }
        assert attempt.status.status_code is StatusCode.OK
        lease, current = next((lease, ctx) for lease, ctx in inside if lease.task_id == plain.id)
        tag = parse_traceparent(lease.tags["traceparent"])
        assert tag.trace_id == caller.trace_id.to_bytes(16, "big")
        assert attempt.parent.span_id == int.from_bytes(tag.span_id, "big")
        # The handler ran with the attempt span as its current span.
        assert attempt.context is not None and current.span_id == attempt.context.span_id

        def submit_span() -> Any:
            return next(
                (span for _, span in receiver.spans if span.span_id == tag.span_id and span.trace_id == tag.trace_id),
                None,
            )

        server_span = await receiver.until(submit_span, "the server's Submit span")
        assert server_span.name == "cronoq.v1.Tasks/Submit"
        assert server_span.parent_span_id == caller.span_id.to_bytes(8, "big")

        # The flaky task: a failed first attempt (error, with the exception) and a successful retry.
        first, second = sorted(by_task[flaky.id], key=lambda s: s.attributes["task.attempt"])  # type: ignore[index]
        assert first.status.status_code is StatusCode.ERROR and first.status.description == "not yet"
        assert [event.name for event in first.events] == ["exception"]
        assert second.status.status_code is StatusCode.OK
        assert first.parent is not None and second.parent is not None
        assert first.parent.span_id == second.parent.span_id  # both under the same submission

        # The untraced task's attempt is in the server's trace, not in ours.
        loose_spans = [
            s
            for s in spans.get_finished_spans()
            if s.name == "cronoq.task" and s.attributes and s.attributes["task.id"] == loose.id
        ]
        assert len(loose_spans) == 1 and loose_spans[0].context is not None
        assert loose_spans[0].context.trace_id != caller.trace_id


# ------------------------------------------------------------------ no provider, no OpenTelemetry

_QUIET_SCRIPT = """
import asyncio, json, sys
{block}
from cronoq._client.tracing import attempt_tracer
from cronoq.client import Client, Worker
from tests.client.fake_server import FakeCronoq, start_server

async def main():
    fake = FakeCronoq()
    server = await start_server(fake)
    seen = []

    async def handle(lease):
        seen.append(lease.tags.get("traceparent"))
        return "ok"

    worker = Worker(fake.address, "default", handle, backoff=(0.01, 0.05))
    run = asyncio.ensure_future(worker.run())
    await worker.wait_registered(10)
    async with Client(fake.address) as client:
        {submit}
    await worker.stop(1)
    await run
    await server.stop(0)
    print(json.dumps({{
        "tracer": attempt_tracer() is not None,
        "metadata": sorted(fake.calls[-1][1]),
        "tags": seen,
        "sdk_imported": any(name.startswith("opentelemetry.sdk") for name in sys.modules),
        "otel_imported": any(name.startswith("opentelemetry") and module is not None
                             for name, module in sys.modules.items()),
    }}))

asyncio.run(main())
"""

_WITH_REMOTE_SPAN = """
        from opentelemetry import trace
        remote = trace.SpanContext(0xABC, 0xDEF, False, trace.TraceFlags(1))
        with trace.use_span(trace.NonRecordingSpan(remote)):
            done = await client.submit("x", tags={"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"},
                                       wait=True, wait_timeout=10)
        assert done.result.ok
"""


def _run_quietly(block: str, submit: str) -> dict[str, Any]:
    script = _QUIET_SCRIPT.format(block=block, submit=textwrap.dedent(submit).strip().replace("\n", "\n        "))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_without_a_tracer_provider_nothing_is_traced_and_the_sdk_is_not_loaded() -> None:
    seen = _run_quietly("", _WITH_REMOTE_SPAN)
    # The API's context still travels on calls, but attempts get no span and the SDK stays unloaded.
    assert seen["tracer"] is False
    assert "traceparent" in seen["metadata"]
    assert seen["tags"] == ["00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"]
    assert seen["sdk_imported"] is False


def test_without_opentelemetry_the_client_works_and_imports_nothing_of_it() -> None:
    # ``None`` in sys.modules makes every ``import opentelemetry...`` fail as if not installed.
    block = "sys.modules['opentelemetry'] = None"
    seen = _run_quietly(
        block,
        """
        done = await client.submit("x", wait=True, wait_timeout=10)
        assert done.result.ok
    """,
    )
    assert seen["tracer"] is False
    assert "traceparent" not in seen["metadata"]
    assert seen["tags"] == [None]
    assert seen["otel_imported"] is False


async def test_an_attempt_without_a_traceparent_is_a_root_span(fake: FakeCronoq, spans: InMemorySpanExporter) -> None:
    # Not a child of whatever span was current where the worker started: a trace of its own.
    async def handle(lease: Lease) -> None:
        return None

    worker = Worker(fake.address, "default", handle, backoff=(0.01, 0.05))
    run = asyncio.ensure_future(worker.run())
    try:
        await worker.wait_registered(10)
        async with Client(fake.address) as client:
            done = await client.submit(None, wait=True, wait_timeout=10)
        assert done.result is not None and done.result.ok
        await eventually(
            lambda: any(s.name == "cronoq.task" for s in spans.get_finished_spans()), 10, "the attempt span"
        )
        (span,) = [s for s in spans.get_finished_spans() if s.name == "cronoq.task"]
        assert span.parent is None and span.attributes is not None and span.attributes["task.id"] == done.id
    finally:
        await worker.stop(1)
        await run
