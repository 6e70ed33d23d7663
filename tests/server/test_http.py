"""The HTTP/JSON gateway against a real in-process server: real aiohttp listeners on loopback,
a real HTTP client, and real ``cronoq.client.Worker``s completing the tasks over gRPC."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cronoq.config import Config

from cronoq.client import Client, Lease, Worker
from cronoq.errors import Permanent
from cronoq.server.api import Api
from cronoq.server.http import METRICS_ROUTES, ROUTES, ListenError, start_http
from cronoq.server.openapi import document
from tests.server.harness import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    METRICS_TOKEN,
    SCOPED_CLIENT_TOKEN,
    SCOPED_METRICS_TOKEN,
    TENANT_TOKEN,
    WORKER_TOKEN,
)
from tests.server.http_support import HttpServerProcess, Running, config_text, request, serve
from tests.waiting import eventually


@pytest.fixture
async def gw() -> AsyncIterator[Running]:
    async with serve(Config.parse(config_text(limits="max_http_body_bytes = 4096"))) as running:
        yield running


async def echo(lease: Lease) -> bytes:
    """Answers with what it was given, as JSON: the payload and its content type."""
    return json.dumps({"payload": base64.b64encode(lease.payload).decode(), "type": lease.content_type}).encode()


# ------------------------------------------------------------------------------------ submit


async def test_submit_with_wait_returns_the_result(gw: Running) -> None:
    await gw.worker("default", echo)
    async with gw.session() as http:
        status, body = await request(http, "POST", "/v1/tasks",
                                     json={"payload": {"prompt": "hi"}, "wait": True, "wait_timeout_s": 5})  # fmt: skip
    assert status == 200, body
    assert isinstance(body["id"], str) and body["id"].isdigit() and body["duplicate"] is False
    result = body["result"]
    assert result["id"] == body["id"] and result["status"] == "succeeded" and result["output_available"] is True
    # The payload reached the worker as compact JSON with the JSON content type ...
    assert result["output"]["type"] == "application/json"
    assert json.loads(base64.b64decode(result["output"]["payload"])) == {"prompt": "hi"}
    # ... and the output comes back both as JSON and as the exact bytes.
    assert json.loads(base64.b64decode(result["output_b64"])) == result["output"]


async def test_binary_payloads_and_outputs_travel_as_base64(gw: Running) -> None:
    async def flip(lease: Lease) -> bytes:
        return bytes(reversed(lease.payload)) + lease.content_type.encode()

    await gw.worker("default", flip)
    async with gw.session() as http:
        raw = b"\x00\xff\x10"
        status, body = await request(http, "POST", "/v1/tasks", json={
            "payload_b64": base64.b64encode(raw).decode(), "wait": True})  # fmt: skip
        assert status == 200, body
        # Not JSON: only output_b64.
        assert "output" not in body["result"]
        assert base64.b64decode(body["result"]["output_b64"]) == b"\x10\xff\x00application/octet-stream"
        status, body = await request(http, "POST", "/v1/tasks", json={
            "payload_b64": base64.b64encode(b"<a/>").decode(), "content_type": "text/xml", "wait": True})  # fmt: skip
        assert base64.b64decode(body["result"]["output_b64"]) == b">/a<text/xml"


async def test_a_key_makes_submission_idempotent(gw: Running) -> None:
    async with gw.session() as http:
        _, first = await request(http, "POST", "/v1/tasks", json={"pool": "other", "key": "idem-1"})
        _, again = await request(http, "POST", "/v1/tasks", json={"pool": "other", "key": "idem-1", "payload": 2})
    assert first["duplicate"] is False and again == {"id": first["id"], "duplicate": True}


async def test_every_task_field_reaches_the_worker(gw: Running) -> None:
    seen: list[Lease] = []

    async def record(lease: Lease) -> str:
        seen.append(lease)
        return "plain text"

    await gw.worker("default", record)
    async with gw.session() as http:
        status, body = await request(http, "POST", "/v1/tasks", json={
            "payload": [1, "two", None], "pool": "default", "kind": "k1", "priority": "high", "key": "fields-1",
            "deadline_in_s": 60, "timeout_s": 30, "duration_hint_s": 0.5, "tolerance_s": 2, "on_miss": "skip",
            "retry": {"max_attempts": 5, "initial_backoff_s": 0.5, "multiplier": 3, "max_backoff_s": 9,
                      "jitter": False},
            "tags": {"team": "x"}, "tenant": "acme", "resources": {}, "labels": {},
            "wait": True,
        })  # fmt: skip
        assert status == 200, body
        assert body["result"]["output_b64"] == base64.b64encode(b"plain text").decode()
        assert "output" not in body["result"]  # "plain text" is not a JSON document
        _, info = await request(http, "GET", f"/v1/tasks/{body['id']}")
    lease = seen[0]
    assert lease.json() == [1, "two", None] and lease.content_type == "application/json"
    assert (lease.kind, lease.key, lease.priority, lease.tags, lease.timeout) == ("k1", "fields-1", "high",
                                                                                 {"team": "x"}, 30)  # fmt: skip
    assert lease.deadline is not None
    assert (info["max_attempts"], info["tenant"], info["priority"], info["kind"]) == (5, "acme", "high", "k1")


async def test_absolute_times_are_accepted_as_strings_or_numbers(gw: Running) -> None:
    async with gw.session() as http:
        far = 4_000_000_000_000_000_000  # the year 2096, in Unix nanoseconds
        for value in (str(far), far):
            status, body = await request(http, "POST", "/v1/tasks", json={"pool": "other",
                                                                          "deadline_unix_ns": value})  # fmt: skip
            assert status == 200, body
        status, body = await request(http, "POST", "/v1/tasks", json={"pool": "other", "deadline_unix_ns": 1.5})
        assert status == 400 and "nanoseconds" in body["error"]


# ------------------------------------------------------------------------------------ batches


async def test_a_batch_dag_runs_in_dependency_order(gw: Running) -> None:
    order: list[str] = []

    async def run(lease: Lease) -> bytes:
        order.append(lease.key)
        return lease.key.encode()

    await gw.worker("dag", run, slots=3)
    async with gw.session() as http:
        status, body = await request(http, "POST", "/v1/tasks:batch", json={"tasks": [
            {"pool": "dag", "payload": "load", "key": "etl-load", "after": ["etl-extract"]},
            {"pool": "dag", "payload": "extract", "key": "etl-extract"},
            {"pool": "dag", "payload": "alert", "key": "etl-alert",
             "deps": [{"key": "etl-load", "cond": "on_failure"}]},
        ]})  # fmt: skip
        assert status == 200, body
        ids = [item["id"] for item in body["tasks"]]
        assert [item["duplicate"] for item in body["tasks"]] == [False, False, False]
        assert all(isinstance(task_id, str) for task_id in ids)
        # A child can also name its parent by id: as a number, a string in {"id": ...}, or in deps.
        status, child = await request(http, "POST", "/v1/tasks:batch", json={"tasks": [
            {"pool": "dag", "key": "etl-report", "after": [int(ids[0]), {"id": ids[1]}],
             "deps": [{"id": ids[0], "cond": "on_complete"}]},
        ]})  # fmt: skip
        assert status == 200, child
        results = {}
        for key in ("etl-load", "etl-extract", "etl-alert", "etl-report"):
            status, results[key] = await request(http, "GET", f"/v1/tasks/by-key/{key}/result",
                                                 params={"timeout_s": "5"})  # fmt: skip
            assert status == 200, results[key]
    assert order[:2] == ["etl-extract", "etl-load"] and "etl-alert" not in order
    assert results["etl-load"]["status"] == "succeeded" and results["etl-load"]["id"] == ids[0]
    assert results["etl-alert"]["status"] == "skipped"  # load succeeded, so its on_failure child never runs
    assert results["etl-report"]["status"] == "succeeded"


async def test_a_batch_is_atomic_and_names_the_offending_task(gw: Running) -> None:
    async with gw.session() as http:
        status, body = await request(
            http,
            "POST",
            "/v1/tasks:batch",
            json={
                "tasks": [
                    {"pool": "other", "key": "atomic-ok"},
                    {"pool": "other", "key": "atomic-bad", "priority": "urgent"},
                ]
            },
        )
        assert status == 400 and body["error"].startswith("task 1: ") and "priority" in body["error"]
        status, body = await request(
            http,
            "POST",
            "/v1/tasks:batch",
            json={
                "tasks": [
                    {"pool": "other", "key": "cyc-a", "after": ["cyc-b"]},
                    {"pool": "other", "key": "cyc-b", "after": ["cyc-a"]},
                ]
            },
        )
        assert (status, body["code"]) == (400, "bad_request"), body
        for key in ("atomic-ok", "cyc-a", "cyc-b"):
            status, _ = await request(http, "GET", f"/v1/tasks/by-key/{key}")
            assert status == 404
        status, body = await request(http, "POST", "/v1/tasks:batch", json={"tasks": []})
        assert (status, body) == (200, {"tasks": []})
        status, body = await request(http, "POST", "/v1/tasks:batch", json={"tasks": [{"wait": True}]})
        assert (status, body["error"]) == (400, "task 0: unknown field 'wait' in the task")


# ------------------------------------------------------------------------------- reading tasks


async def test_get_by_id_and_by_percent_encoded_key(gw: Running) -> None:
    async with gw.session() as http:
        _, sub = await request(http, "POST", "/v1/tasks", json={"pool": "other", "key": "report/2024 q1",
                                                                "kind": "report"})  # fmt: skip
        status, by_id = await request(http, "GET", f"/v1/tasks/{sub['id']}")
        assert status == 200, by_id
        status, by_key = await request(http, "GET", "/v1/tasks/by-key/report%2F2024%20q1")
        assert status == 200 and by_key == by_id
    assert by_id["id"] == sub["id"] and by_id["key"] == "report/2024 q1" and by_id["status"] == "ready"
    assert (by_id["pool"], by_id["kind"], by_id["priority"], by_id["output_available"]) == (
        "other", "report", "normal", False)  # fmt: skip
    assert by_id["created_unix_ns"].isdigit() and "finished_unix_ns" not in by_id


async def test_list_pages_through_tasks_with_filters(gw: Running) -> None:
    async with gw.session() as http:
        submitted = []
        for index in range(5):
            _, sub = await request(http, "POST", "/v1/tasks", json={"pool": "other", "key": f"page-{index}"})
            submitted.append(sub["id"])
        _, cancelled = await request(http, "DELETE", f"/v1/tasks/{submitted[4]}")
        assert cancelled == {"cancelled": True}
        seen: list[str] = []
        after: str | None = None
        pages = 0
        while True:
            params = {"pool": "other", "status": "ready,cancelled", "limit": "2"}
            if after is not None:
                params["after"] = after
            status, page = await request(http, "GET", "/v1/tasks", params=params)
            assert status == 200, page
            pages += 1
            assert len(page["tasks"]) <= 2 and "unavailable_shards" not in page
            seen.extend(task["id"] for task in page["tasks"])
            if "next_after" not in page:
                break
            after = page["next_after"]
            assert after == page["tasks"][-1]["id"]
        assert pages == 3
        assert [task_id for task_id in seen if task_id in submitted] == submitted
        assert [int(task_id) for task_id in seen] == sorted(int(task_id) for task_id in seen)
        _, only = await request(http, "GET", "/v1/tasks?pool=other&status=cancelled")
        assert [task["id"] for task in only["tasks"]] == [submitted[4]]
        _, twice = await request(http, "GET", "/v1/tasks", params=[("pool", "other"), ("pool", "tiny"),
                                                                     ("status", "cancelled")])  # fmt: skip
        assert [task["id"] for task in twice["tasks"]] == [submitted[4]]
        for query, text in (("status=sleeping", "status"), ("limit=-1", "limit"), ("after=x", "after"),
                            ("limit=1&limit=2", "more than once"), ("poool=other", "poool")):  # fmt: skip
            status, body = await request(http, "GET", f"/v1/tasks?{query}")
            assert (status, body["code"]) == (400, "bad_request") and text in body["error"], query
        status, body = await request(http, "GET", "/v1/tasks?pool=nope")
        assert status == 404


async def test_result_waits_then_answers_504_or_the_output(gw: Running) -> None:
    release = asyncio.Event()

    async def slow(lease: Lease) -> dict[str, int]:
        await release.wait()
        return {"answer": 42}

    worker = await gw.worker("default", slow)
    async with gw.session() as http:
        _, sub = await request(http, "POST", "/v1/tasks", json={"key": "slow-1"})
        while worker.running == 0:
            await asyncio.sleep(0.01)
        for path in (f"/v1/tasks/{sub['id']}/result", "/v1/tasks/by-key/slow-1/result"):
            status, body = await request(http, "GET", path, params={"timeout_s": "0"})
            assert (status, body["code"]) == (504, "gateway_timeout"), body
        status, body = await request(http, "GET", f"/v1/tasks/{sub['id']}/result", params={"timeout_s": "0.2"})
        assert status == 504
        waiting = asyncio.ensure_future(request(http, "GET", f"/v1/tasks/{sub['id']}/result"))
        service = gw.app.service
        assert service is not None
        await eventually(lambda: int(sub["id"]) in service._waiters)  # the request waits for the result
        release.set()
        status, body = await waiting
        assert status == 200, body
        assert body == {"id": sub["id"], "status": "succeeded", "output_available": True, "output": {"answer": 42},
                        "output_b64": base64.b64encode(b'{"answer": 42}').decode()}  # fmt: skip
        _, info = await request(http, "GET", "/v1/tasks/by-key/slow-1")
        assert info["status"] == "succeeded" and info["output_available"] is True
        assert int(info["finished_unix_ns"]) >= int(info["started_unix_ns"]) >= int(info["created_unix_ns"])
        status, body = await request(http, "GET", f"/v1/tasks/{sub['id']}/result", params={"timeout_s": "-1"})
        assert status == 400 and "invalid duration" in body["error"]


async def test_a_failed_task_reports_its_message(gw: Running) -> None:
    async def fail(lease: Lease) -> bytes:
        if lease.key == "permanent":
            raise Permanent("asked to fail")
        raise RuntimeError("asked to fail again")

    await gw.worker("default", fail)
    async with gw.session() as http:
        _, sub = await request(http, "POST", "/v1/tasks", json={"key": "permanent", "wait": True})
        _, retried = await request(http, "POST", "/v1/tasks", json={"retry": {"max_attempts": 2}, "wait": True})
    result = sub["result"]
    assert result["status"] == "failed" and result["output_available"] is False and "output_b64" not in result
    assert "asked to fail" in result["message"]
    assert retried["result"]["status"] == "dead_lettered" and "asked to fail again" in retried["result"]["message"]


async def test_cancel_by_id_and_key(gw: Running) -> None:
    async with gw.session() as http:
        _, first = await request(http, "POST", "/v1/tasks", json={"pool": "other", "key": "cancel-1"})
        _, second = await request(http, "POST", "/v1/tasks", json={"pool": "other", "key": "cancel/2"})
        assert await request(http, "DELETE", f"/v1/tasks/{first['id']}") == (200, {"cancelled": True})
        assert await request(http, "DELETE", f"/v1/tasks/{first['id']}") == (200, {"cancelled": False})
        assert await request(http, "DELETE", "/v1/tasks/by-key/cancel%2F2") == (200, {"cancelled": True})
        _, info = await request(http, "GET", f"/v1/tasks/{second['id']}")
        assert info["status"] == "cancelled"
        status, body = await request(http, "DELETE", "/v1/tasks/by-key/never-submitted")
        assert (status, body["code"]) == (404, "not_found")


# ------------------------------------------------------------------------------- admin, roles


async def test_admin_reads_need_the_metrics_role(gw: Running) -> None:
    await gw.worker("default", echo, name="w-1", slots=2)
    async with Client(gw.grpc_address, token=ADMIN_TOKEN) as admin:
        await admin.add_recurring("nightly", "0 3 * * *", b"", pool="other", kind="report", tz="Europe/Berlin")
    async with gw.session(METRICS_TOKEN) as http:
        status, snap = await request(http, "GET", "/v1/snapshot")
        assert status == 200, snap
        assert snap["unavailable_shards"] == [] and snap["workers_connected"] == 1
        pool = next(pool for pool in snap["pools"] if pool["name"] == "default")
        assert (pool["capacity"], pool["workers_connected"], pool["pending_by_class"]) == (2, 1, [0, 0, 0, 0])
        assert set(snap["totals"]) >= {"submitted", "dead_lettered", "stale_completions"}
        _, workers = await request(http, "GET", "/v1/workers")
        (worker,) = workers["workers"]
        assert (worker["name"], worker["pool"], worker["slots"], worker["busy"]) == ("w-1", "default", 2, 0)
        assert worker["id"].isdigit() and worker["connected_unix_ns"].isdigit() and "unavailable_shards" not in workers
        _, schedules = await request(http, "GET", "/v1/recurring")
        (schedule,) = schedules["schedules"]
        assert {key: schedule[key] for key in ("name", "cron", "tz", "pool", "kind", "overlap")} == {
            "name": "nightly", "cron": "0 3 * * *", "tz": "Europe/Berlin", "pool": "other", "kind": "report",
            "overlap": "skip"}  # fmt: skip
        assert schedule["next_unix_ns"].isdigit() and "last_task_id" not in schedule
        async with http.get("/metrics") as response:
            assert response.status == 200
            assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
            assert 'cronoq_pool_workers{pool="default"} 1.0' in await response.text()
        # The metrics role cannot use the task routes.
        status, body = await request(http, "POST", "/v1/tasks", json={})
        assert (status, body["code"]) == (403, "forbidden")
    async with gw.session(CLIENT_TOKEN) as http:
        for path in ("/v1/snapshot", "/v1/workers", "/v1/recurring", "/metrics"):
            status, body = await request(http, "GET", path)
            assert (status, body["code"]) == (403, "forbidden"), path
    async with gw.session(ADMIN_TOKEN) as http:
        for path in ("/v1/snapshot", "/v1/workers", "/v1/recurring", "/metrics", "/v1/tasks"):
            status, _ = await request(http, "GET", path)
            assert status == 200, path
    async with gw.session(SCOPED_METRICS_TOKEN) as http:
        _, snap = await request(http, "GET", "/v1/snapshot")
        assert [pool["name"] for pool in snap["pools"]] == ["other"]
        _, workers = await request(http, "GET", "/v1/workers")
        assert workers["workers"] == []


async def test_credentials_are_checked_before_the_body(gw: Running) -> None:
    for token in (None, "not-a-known-token-0123456789"):
        async with gw.session(token) as http:
            # Neither the body nor its media type matter yet.
            status, body = await request(http, "POST", "/v1/tasks", data=b"\x00 not json",
                                         headers={"content-type": "text/plain"})  # fmt: skip
            assert (status, body["code"]) == (401, "unauthorized")
            async with http.get("/v1/tasks") as response:
                assert response.status == 401 and response.headers["www-authenticate"] == "Bearer"
    async with gw.session(None) as http:
        status, _ = await request(http, "GET", "/v1/tasks", headers={"authorization": "Basic dXNlcjpwYXNz"})
        assert status == 401
    async with gw.session(WORKER_TOKEN) as http:
        status, body = await request(http, "POST", "/v1/tasks", data=b"x" * 10_000,
                                     headers={"content-type": "text/plain"})  # fmt: skip
        assert (status, body["code"]) == (403, "forbidden")  # the role is refused before the media type or size


async def test_scoped_and_tenant_credentials(gw: Running) -> None:
    async with gw.session(CLIENT_TOKEN) as http:
        _, hidden = await request(http, "POST", "/v1/tasks", json={"pool": "default", "key": "hidden-1"})
    async with gw.session(SCOPED_CLIENT_TOKEN) as http:
        for method, path in (
            ("GET", f"/v1/tasks/{hidden['id']}"),
            ("GET", "/v1/tasks/by-key/hidden-1"),
            ("DELETE", f"/v1/tasks/{hidden['id']}"),
            ("GET", "/v1/tasks/by-key/hidden-1/result"),
        ):
            status, body = await request(http, method, path)
            assert (status, body["code"]) == (404, "not_found"), (method, path)
        status, body = await request(http, "POST", "/v1/tasks", json={"pool": "default"})
        assert (status, body["code"]) == (403, "forbidden")
        status, body = await request(http, "POST", "/v1/tasks", json={"pool": "other", "key": "hidden-1"})
        assert (status, body["code"]) == (409, "conflict")
        status, body = await request(http, "GET", "/v1/tasks", params={"pool": "default"})
        assert status == 403
        status, _ = await request(http, "POST", "/v1/tasks", json={"pool": "other"})
        assert status == 200
        _, listed = await request(http, "GET", "/v1/tasks")
        assert {task["pool"] for task in listed["tasks"]} == {"other"}
    async with gw.session(CLIENT_TOKEN) as http:
        assert (await request(http, "DELETE", f"/v1/tasks/{hidden['id']}"))[0] == 200
    async with gw.session(TENANT_TOKEN) as http:
        status, body = await request(http, "POST", "/v1/tasks", json={"pool": "other", "tenant": "b"})
        assert (status, body["code"]) == (403, "forbidden")
        _, sub = await request(http, "POST", "/v1/tasks", json={"pool": "other"})
        _, info = await request(http, "GET", f"/v1/tasks/{sub['id']}")
        assert info["tenant"] == "a"


# ------------------------------------------------------------------------------------ errors


BAD_BODIES = [
    ("malformed JSON", b'{"pool": ', "malformed JSON"),
    ("not an object", b"[1, 2]", "must be a JSON object"),
    ("unknown field", b'{"priorty": "high"}', "unknown field 'priorty' in the task"),
    ("name twice", b'{"key": "a", "key": "b"}', "twice"),
    ("NaN", b'{"timeout_s": NaN}', "malformed JSON"),
    ("invalid UTF-8", b'{"key": "\xff"}', "UTF-8"),
    ("NUL in key", b'{"key": "a\\u0000b"}', "NUL"),
    ("NUL in a tag", b'{"tags": {"t": "\\u0000"}}', "NUL"),
    ("lone surrogate", b'{"kind": "\\ud800"}', "Unicode"),
    ("unknown priority", b'{"priority": "urgent"}', "priority"),
    ("number as string field", b'{"pool": 7}', "pool must be a string"),
    ("boolean as duration", b'{"timeout_s": true}', "timeout_s"),
    ("negative duration", b'{"deadline_in_s": -1}', "invalid duration"),
    ("two centuries", b'{"start_in_s": 7000000000}', "invalid duration"),
    ("both deadlines", b'{"deadline_in_s": 5, "deadline_unix_ns": "1"}', "not both"),
    ("both payloads", b'{"payload": 1, "payload_b64": "AA=="}', "not both"),
    ("bad base64", b'{"payload_b64": "***"}', "base64"),
    ("unknown retry field", b'{"retry": {"attempts": 3}}', "unknown field 'attempts' in retry"),
    ("dependency with id and key", b'{"deps": [{"id": "1", "key": "a"}]}', "exactly one"),
    ("unknown condition", b'{"deps": [{"key": "a", "cond": "maybe"}]}', "cond"),
    ("negative resource", b'{"resources": {"gpu": -1}}', "resources"),
    ("negative id", b'{"after": [-1]}', "negative"),
    ("key too long", b'{"key": "' + b"k" * 65 + b'"}', "longer than 64"),
    ("wait timeout without wait", b'{"wait_timeout_s": 1}', "wait_timeout_s"),
    ("unknown resource", b'{"resources": {"tpu": 1}}', "tpu"),
]


@pytest.mark.parametrize(("what", "body", "text"), BAD_BODIES, ids=[case[0] for case in BAD_BODIES])
async def test_bad_bodies_are_400(gw: Running, what: str, body: bytes, text: str) -> None:
    async with gw.session() as http:
        status, answer = await request(http, "POST", "/v1/tasks", data=body,
                                       headers={"content-type": "application/json"})  # fmt: skip
    assert (status, answer["code"]) == (400, "bad_request"), answer
    assert text in answer["error"], answer


async def test_media_type_size_and_path_errors(gw: Running) -> None:
    async with gw.session() as http:
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1"):
            status, body = await request(http, "POST", "/v1/tasks", data=b"{}", headers={"content-type": content_type})
            assert (status, body["code"]) == (415, "unsupported_media_type"), content_type
        status, _ = await request(http, "POST", "/v1/tasks", data=b"{}",
                                  headers={"content-type": "Application/JSON; charset=UTF-8"})  # fmt: skip
        assert status == 200
        big = json.dumps({"payload": "x" * 5000}).encode()
        status, body = await request(http, "POST", "/v1/tasks", data=big, headers={"content-type": "application/json"})
        assert (status, body["code"]) == (413, "payload_too_large")

        async def chunked() -> AsyncIterator[bytes]:  # no content-length: counted while reading
            for _ in range(10):
                yield b" " * 1000
            yield b"{}"

        status, body = await request(http, "POST", "/v1/tasks", data=chunked(),
                                     headers={"content-type": "application/json"})  # fmt: skip
        assert (status, body["code"]) == (413, "payload_too_large")
        for path in ("/v1/tasks/abc", "/v1/tasks/12a/result", "/v1/tasks/-1", "/v1/tasks/999999999999999999999"):
            status, body = await request(http, "GET", path)
            assert (status, body["code"]) == (400, "bad_request") and "by-key" in body["error"], path
        assert (await request(http, "GET", "/v1/tasks/by-key/a%00b"))[0] == 400
        assert (await request(http, "GET", "/v1/tasks/by-key/%ff"))[0] == 400
        for path in ("/v1/tasks/123456789", "/v1/tasks/99999999999999999999"):  # the latter is above 2**64
            status, body = await request(http, "GET", path)
            assert (status, body["code"]) == (404, "not_found"), path
        status, body = await request(http, "GET", "/v1/nothing-here")
        assert (status, body["code"]) == (404, "not_found")
        async with http.put("/v1/tasks", json={}) as response:
            assert response.status == 405 and response.headers["allow"] == "POST, GET"
            assert (await response.json())["code"] == "method_not_allowed"


async def test_admission_errors_map_to_their_statuses(gw: Running) -> None:
    async with gw.session() as http:
        status, body = await request(http, "POST", "/v1/tasks", json={"pool": "nope"})
        assert (status, body["code"]) == (404, "not_found")
        for after in ("never-seen", 987654321, {"id": "18446744073709551616"}, 2**64):
            status, body = await request(http, "POST", "/v1/tasks", json={"pool": "other", "after": [after]})
            assert (status, body["code"]) == (404, "not_found"), after
        status, body = await request(http, "POST", "/v1/tasks", json={"pool": "other", "key": "self",
                                                                      "after": ["self"]})  # fmt: skip
        assert (status, body["code"]) == (400, "bad_request")
        # Pool "fixed": max = 2 with the default reservable fraction 0.5, so one reservation at a time.
        status, _ = await request(http, "POST", "/v1/tasks", json={"pool": "fixed", "start_in_s": 3600})
        assert status == 200
        status, body = await request(http, "POST", "/v1/tasks", json={"pool": "fixed", "start_in_s": 3600})
        assert (status, body["code"]) == (409, "conflict")
        # Pool "tiny" holds one pending task and rejects the next.
        status, _ = await request(http, "POST", "/v1/tasks", json={"pool": "tiny"})
        assert status == 200
        status, body = await request(http, "POST", "/v1/tasks", json={"pool": "tiny"})
        assert (status, body["code"]) == (429, "too_many_requests")


# ------------------------------------------------------------------------------ time limits


async def test_a_stalled_request_body_runs_out_of_time() -> None:
    config = Config.parse(config_text(auth=False, limits="request_timeout_s = 0.3"))
    async with serve(config) as gw:
        host, port = gw.gateway.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/tasks:batch HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{")  # fmt: skip
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 504")
        writer.close()


async def test_requests_beyond_the_concurrency_limit_are_429() -> None:
    config = Config.parse(config_text(auth=False, limits="max_concurrent_requests = 1"))
    async with serve(config) as gw, gw.session(None) as http:
        _, sub = await request(http, "POST", "/v1/tasks", json={"pool": "other"})
        waiting = asyncio.ensure_future(request(http, "GET", f"/v1/tasks/{sub['id']}/result?timeout_s=2"))
        await eventually(lambda: gw.app.unary.inflight == 1)
        status, body = await request(http, "GET", "/v1/snapshot")
        assert (status, body["code"]) == (429, "too_many_requests")
        assert (await request(http, "GET", "/healthz"))[0] == 200  # probes are not counted
        assert (await waiting)[0] == 504


# ------------------------------------------------------------------------- standby, health, host


async def test_a_standby_answers_503_but_is_healthy() -> None:
    config = Config.parse(config_text())
    standby = Api(config)  # what a server holds before it leads: no shard service
    gateway = await start_http(standby, config)
    try:
        async with aiohttp.ClientSession(gateway.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
            for method, path in (("GET", "/v1/tasks"), ("POST", "/v1/tasks"), ("GET", "/v1/tasks/1"),
                                 ("GET", "/v1/snapshot"), ("GET", "/metrics"), ("GET", "/readyz")):  # fmt: skip
                status, body = await request(http, method, path, json={})
                assert (status, body["code"]) == (503, "service_unavailable"), path
                assert body["error"] == "not the leader (standby or shutting down)"
            assert await request(http, "GET", "/healthz") == (200, {"status": "ok"})
            status, doc = await request(http, "GET", "/v1/openapi.json")
            assert status == 200 and doc["openapi"].startswith("3.")
        async with aiohttp.ClientSession(gateway.url) as anonymous:
            assert (await request(anonymous, "GET", "/v1/tasks"))[0] == 401  # credentials still come first
    finally:
        await gateway.close()


async def test_the_leader_is_ready_and_stops_being_ready_when_it_stops() -> None:
    async with serve(Config.parse(config_text())) as gw, gw.session(None) as http:
        assert await request(http, "GET", "/readyz") == (200, {"status": "ready"})
        gw.app.stop()
        for _ in range(200):
            if (await request(http, "GET", "/readyz"))[0] == 503:
                break
            await asyncio.sleep(0.02)
        assert (await request(http, "GET", "/readyz"))[0] == 503
        assert (await request(http, "GET", "/healthz"))[0] == 200


async def test_without_auth_only_loopback_hosts_are_answered() -> None:
    async with serve(Config.parse(config_text(auth=False))) as gw, gw.session(None) as http:
        for host in ("localhost", "localhost:7071", "app.localhost", "127.0.0.1:80", "127.9.8.7", "[::1]:7071"):
            status, body = await request(http, "POST", "/v1/tasks", json={"pool": "other"}, headers={"Host": host})
            assert status == 200, (host, body)
        for host in ("evil.example", "evil.example:7071", "10.0.0.1", "localhost.evil.example", "[::2]"):
            for method, path in (("POST", "/v1/tasks"), ("GET", "/healthz"), ("GET", "/metrics")):
                status, body = await request(http, method, path, json={}, headers={"Host": host})
                assert (status, body["code"]) == (403, "forbidden"), (host, path)
    # --insecure-no-auth turns the guard off.
    config = Config.parse(config_text(auth=False), insecure_no_auth=True)
    async with serve(config) as gw, gw.session(None) as http:
        status, _ = await request(http, "GET", "/v1/tasks", headers={"Host": "cronoq.internal.example"})
        assert status == 200
    # With credentials there is no Host rule: the token is what counts.
    async with serve(Config.parse(config_text())) as gw, gw.session(CLIENT_TOKEN) as http:
        status, _ = await request(http, "GET", "/v1/tasks", headers={"Host": "cronoq.internal.example"})
        assert status == 200


async def test_the_metrics_listener_needs_no_credentials() -> None:
    config = Config.parse(config_text(server='metrics_addr = "127.0.0.1:0"'))
    async with serve(config) as gw:
        assert gw.gateway.metrics_address is not None
        async with aiohttp.ClientSession(f"http://{gw.gateway.metrics_address}") as http:
            async with http.get("/metrics") as response:
                assert response.status == 200 and "cronoq_tasks_total" in await response.text()
            assert await request(http, "GET", "/readyz") == (200, {"status": "ready"})
            assert (await request(http, "GET", "/healthz"))[0] == 200
            assert (await request(http, "GET", "/v1/snapshot"))[0] == 404  # only the three probes live here
        async with gw.session(None) as http:
            assert (await request(http, "GET", "/metrics"))[0] == 401  # the main listener still wants a token


async def test_a_taken_address_is_reported_with_its_reason() -> None:
    first = await start_http(Api(Config.parse(config_text())), Config.parse(config_text()))
    try:
        taken = Config.parse(config_text().replace('http_addr = "127.0.0.1:0"', f'http_addr = "{first.address}"'))
        with pytest.raises(ListenError) as err:
            await start_http(Api(taken), taken)
        assert str(err.value) == f"cannot listen on {first.address}: Address already in use"
    finally:
        await first.close()


# ------------------------------------------------------------------------------------ OpenAPI


def test_the_openapi_document_lists_exactly_the_served_routes() -> None:
    doc = document()
    documented = {(method.upper(), path) for path, item in doc["paths"].items() for method in item}
    served = {(route.method, route.path) for route in ROUTES}
    assert documented == served
    assert {(route.method, route.path) for route in METRICS_ROUTES} <= served
    # Every schema reference resolves.
    text = json.dumps(doc)
    for name in {part.split('"')[0] for part in text.split("#/components/schemas/")[1:]}:
        assert name in doc["components"]["schemas"], name
    for name in {part.split('"')[0] for part in text.split("#/components/responses/")[1:]}:
        assert name in doc["components"]["responses"], name


async def test_the_openapi_document_is_served(gw: Running) -> None:
    async with gw.session(WORKER_TOKEN) as http:  # any valid credential
        status, doc = await request(http, "GET", "/v1/openapi.json")
    assert status == 200 and doc == json.loads(json.dumps(document(Config.parse(config_text()).limits)))
    async with gw.session(None) as http:
        assert (await request(http, "GET", "/v1/openapi.json"))[0] == 401


# ------------------------------------------------------------------------------------ TLS


async def test_https_with_a_client_certificate_mapped_to_a_role(tmp_path: Path) -> None:
    import shutil
    import ssl

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    from tests.server.test_tls import make_certificates

    make_certificates(tmp_path)
    config = Config.parse(config_text(server=f"""
[server.tls]
cert = "{tmp_path / 'server.pem'}"
key = "{tmp_path / 'server.key'}"
client_ca = "{tmp_path / 'ca.pem'}"
""") + """
[[auth.certs]]
dns_name = "worker-1.internal"
role = "metrics"
""")  # fmt: skip
    async with serve(config) as gw:
        assert gw.url.startswith("https://")
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        context.load_cert_chain(tmp_path / "client.pem", tmp_path / "client.key")
        async with aiohttp.ClientSession(gw.url, connector=aiohttp.TCPConnector(ssl=context)) as http:
            status, snap = await request(http, "GET", "/v1/snapshot")  # the certificate alone is a credential
            assert status == 200 and snap["unavailable_shards"] == []
            assert (await request(http, "GET", "/v1/tasks"))[0] == 403  # metrics role only
            status, _ = await request(http, "GET", "/v1/tasks", headers={"authorization": f"Bearer {CLIENT_TOKEN}"})
            assert status == 200  # a token beats the certificate
        bare = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        async with aiohttp.ClientSession(gw.url, connector=aiohttp.TCPConnector(ssl=bare)) as http:
            with pytest.raises(aiohttp.ClientError):
                await request(http, "GET", "/healthz")  # no client certificate: no handshake


# ------------------------------------------------------------------------ a real server process


async def test_a_cronoq_server_process_serves_http(tmp_path: Path) -> None:
    config = config_text().replace('"127.0.0.1:0"', '"127.0.0.1:{port}"', 1).replace(
        'http_addr = "127.0.0.1:0"', 'http_addr = "127.0.0.1:{http_port}"')  # fmt: skip
    server = HttpServerProcess(tmp_path, config, name="http").start()
    try:
        async with aiohttp.ClientSession(server.http_url) as http:
            for _ in range(100):
                try:
                    if (await request(http, "GET", "/readyz"))[0] == 200:
                        break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            assert await request(http, "GET", "/readyz") == (200, {"status": "ready"})
            assert (await request(http, "GET", "/v1/tasks"))[0] == 401

            async def shout(lease: Lease) -> bytes:
                return json.dumps({"shout": lease.json()["text"].upper()}).encode()

            worker = Worker(server.address, "default", shout, token=WORKER_TOKEN, backoff=(0.05, 0.2))
            serving = asyncio.ensure_future(worker.run())
            try:
                await worker.wait_registered(10)
                client = {"authorization": f"Bearer {CLIENT_TOKEN}"}
                status, body = await request(
                    http,
                    "POST",
                    "/v1/tasks",
                    headers=client,
                    json={"payload": {"text": "hi"}, "key": "proc-1", "wait": True},
                )
                assert status == 200, body
                assert body["result"]["output"] == {"shout": "HI"}
                status, info = await request(http, "GET", "/v1/tasks/by-key/proc-1", headers=client)
                assert (status, info["id"], info["status"]) == (200, body["id"], "succeeded")
                async with http.get("/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"}) as response:
                    assert response.status == 200
                    assert 'cronoq_tasks_total{status="succeeded"} 1.0' in await response.text()
            finally:
                await worker.stop(1)
                await serving
    finally:
        server.stop()
