"""OpenTelemetry: attempt spans parented to the submitter's trace, and a counter of terminal statuses.

OpenTelemetry providers are process-global and can be set only once, so each case runs a small
script in a fresh interpreter and reports what it saw as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

WITH_PROVIDERS = """
import asyncio, json
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
tracer_provider = TracerProvider()
tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(tracer_provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

import cronoq

seen = {}

async def run(ctx, payload):
    current = trace.get_current_span().get_span_context()
    seen.setdefault(payload, []).append({
        "tag": ctx.tags.get("traceparent"), "attempt": ctx.attempt,
        "trace_id": current.trace_id, "span_id": current.span_id,
    })
    if payload == "flaky" and ctx.attempt == 1:
        raise cronoq.Retryable("again")
    if payload == "bad":
        raise cronoq.Permanent("no")
    return payload

def hexid(n, width):
    return format(n, "0%dx" % width)

async def main():
    tracer = trace.get_tracer("app")
    retry = cronoq.RetryPolicy(max_attempts=3, initial_backoff=0.01, jitter=False)
    async with cronoq.Scheduler([cronoq.Pool("default", run, retry=retry)]) as sched:
        with tracer.start_as_current_span("request") as request:
            ok = await sched.submit("ok", kind="summarize")
            flaky = await sched.submit("flaky")
            batch = await sched.submit_batch([cronoq.Task("batched")])
        own = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
        with tracer.start_as_current_span("other"):
            mine = await sched.submit("mine", tags={"traceparent": own})
        outside = await sched.submit("outside")
        bad = await sched.submit("bad")
        for handle in (ok, flaky, *batch, mine, outside):
            await handle
        try:
            await bad
        except cronoq.TaskFailed:
            pass
    ctx = request.get_span_context()
    spans = [
        {"name": s.name, "trace_id": hexid(s.context.trace_id, 32), "span_id": hexid(s.context.span_id, 16),
         "parent": hexid(s.parent.span_id, 16) if s.parent else None, "attributes": dict(s.attributes),
         "status": s.status.status_code.name}
        for s in exporter.get_finished_spans() if s.name == "cronoq.task"
    ]
    counts = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == "cronoq.tasks":
                    for point in metric.data.data_points:
                        key = point.attributes["pool"] + "/" + point.attributes["status"]
                        counts[key] = counts.get(key, 0) + point.value
    print(json.dumps({
        "request": {"trace_id": hexid(ctx.trace_id, 32), "span_id": hexid(ctx.span_id, 16),
                    "flags": hexid(ctx.trace_flags, 2)},
        "own": own, "seen": {k: [dict(v, trace_id=hexid(v["trace_id"], 32), span_id=hexid(v["span_id"], 16))
                                 for v in vs] for k, vs in seen.items()},
        "ids": {"ok": ok.id},
        "spans": spans, "counts": counts,
    }))

asyncio.run(main())
"""

WITHOUT_PROVIDERS = """
import asyncio, json
from opentelemetry import trace
import cronoq
import cronoq._otel

tags = []

async def run(ctx, payload):
    tags.append(ctx.tags)
    return payload

async def main():
    tracer = trace.get_tracer("app")  # the API's no-op tracer
    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        with tracer.start_as_current_span("request"):
            await (await sched.submit(1))
            traceparent = cronoq._otel.current_traceparent()
        print(json.dumps({"instruments": sched._otel is not None, "tags": tags, "traceparent": traceparent,
                          "tracer_provider": type(trace.get_tracer_provider()).__name__}))

asyncio.run(main())
"""


def run_script(source: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_attempt_spans_and_task_counter_with_sdk_providers() -> None:
    out = run_script(WITH_PROVIDERS)
    request = out["request"]
    expected_tag = f"00-{request['trace_id']}-{request['span_id']}-{request['flags']}"
    seen = out["seen"]
    # The submitter's traceparent was captured as a tag, also for batches and on every attempt.
    assert [s["tag"] for s in seen["ok"]] == [expected_tag]
    assert [s["tag"] for s in seen["flaky"]] == [expected_tag, expected_tag]
    assert [s["tag"] for s in seen["batched"]] == [expected_tag]
    # A traceparent the caller set wins; outside any span nothing is captured.
    assert [s["tag"] for s in seen["mine"]] == [out["own"]]
    assert [s["tag"] for s in seen["outside"]] == [None]

    spans = out["spans"]
    assert len(spans) == 7  # ok, flaky twice, batched, mine, outside, bad
    by_span_id = {s["span_id"]: s for s in spans}
    for payload in ("ok", "flaky", "batched"):
        for attempt in seen[payload]:
            # The executor ran inside its attempt span, a child of the submitter's request span.
            span = by_span_id[attempt["span_id"]]
            assert span["name"] == "cronoq.task"
            assert span["trace_id"] == request["trace_id"] == attempt["trace_id"]
            assert span["parent"] == request["span_id"]
            assert span["attributes"]["task.attempt"] == attempt["attempt"]
            assert span["attributes"]["task.pool"] == "default"
    ok_span = by_span_id[seen["ok"][0]["span_id"]]
    assert ok_span["attributes"] == {
        "task.id": out["ids"]["ok"],
        "task.pool": "default",
        "task.kind": "summarize",
        "task.attempt": 1,
    }
    mine = by_span_id[seen["mine"][0]["span_id"]]
    assert (mine["trace_id"], mine["parent"]) == ("ab" * 16, "cd" * 8)
    outside = by_span_id[seen["outside"][0]["span_id"]]
    assert outside["parent"] is None and outside["trace_id"] != request["trace_id"]  # a root span
    failed = [s for s in spans if s["status"] == "ERROR"]
    assert len(failed) == 2  # the first attempt of "flaky" and "bad"

    assert out["counts"] == {"default/succeeded": 5, "default/failed": 1}


def test_nothing_is_created_without_providers() -> None:
    out = run_script(WITHOUT_PROVIDERS)
    assert out["instruments"] is False
    assert out["traceparent"] is None
    assert out["tags"] == [{}]
    assert out["tracer_provider"].startswith("Proxy")
