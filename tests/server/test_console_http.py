"""The console's HTTP side against a real in-process server with a SQLite store: the pages and
their security headers, the history filters of ``GET /v1/tasks``, task details, the event stream
(HTTP/1.1 and HTTP/2), shards, whoami and pausing schedules, with real workers."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cronoq.config import Config

from cronoq.client import Client, Lease
from cronoq.server.console.assets import CSP
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN, METRICS_TOKEN, SCOPED_CLIENT_TOKEN, WORKER_TOKEN
from tests.server.http_support import Running, config_text, request, serve

STATIC = Path(__file__).resolve().parents[2] / "cronoq" / "server" / "console" / "static"


def console_config(tmp_path: Path, *, enabled: bool = True, max_wait_s: float = 5) -> Config:
    server = "[server.console]\nenabled = true\n" if enabled else ""
    store = f'\n[store]\nkind = "sqlite"\npath = "{tmp_path / "cronoq.db"}"\n'
    return Config.parse(config_text(server=server, max_wait_s=max_wait_s) + store)


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Running]:
    async with serve(console_config(tmp_path)) as running:
        yield running


async def work(lease: Lease) -> dict[str, Any]:
    payload = lease.json() or {}
    if payload.get("flaky") and lease.attempt == 1:
        raise RuntimeError("flaky <b>first</b> attempt")
    return {"done": lease.attempt, "big": "x" * payload.get("big", 0)}


# ------------------------------------------------------------------------------------ the pages


async def test_the_pages_are_served_with_a_strict_policy(gw: Running) -> None:
    async with aiohttp.ClientSession(gw.url) as http:  # no credentials: the pages hold no data
        async with http.get("/ui", allow_redirects=False) as response:
            assert response.status == 308 and response.headers["Location"] == "/ui/"
        async with http.get("/ui/") as response:
            assert response.status == 200 and response.headers["Content-Type"] == "text/html; charset=utf-8"
            page = await response.text()
            headers = response.headers
            etag = headers["ETag"]
        policy = headers["Content-Security-Policy"]
        assert policy == CSP
        for rule in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'",
                     "base-uri 'none'", "require-trusted-types-for 'script'"):  # fmt: skip
            assert rule in policy
        assert "unsafe" not in policy and "*" not in policy and "http" not in policy
        assert headers["X-Content-Type-Options"] == "nosniff" and headers["X-Frame-Options"] == "DENY"
        assert headers["Referrer-Policy"] == "no-referrer"
        async with http.get("/ui/", headers={"If-None-Match": etag}) as response:
            assert response.status == 304
        # Every file the page names is served, with its type and the same policy.
        names = re.findall(r'(?:src|href)="([^"#]+)"', page)
        assert sorted(names) == ["app.js", "console.css", "icon.svg"]
        for name in {path.name for path in STATIC.iterdir()}:
            async with http.get(f"/ui/{name}") as response:
                assert response.status == 200, name
                assert response.headers["Content-Security-Policy"] == CSP
                if name.endswith(".js"):
                    assert response.headers["Content-Type"] == "text/javascript; charset=utf-8"
        for name in ("nope.js", "..%2Fassets.py", "%2e%2e", "app.js%00"):
            async with http.get(f"/ui/{name}") as response:
                assert response.status == 404, name


async def test_the_console_is_off_unless_enabled(tmp_path: Path) -> None:
    async with serve(console_config(tmp_path, enabled=False)) as running, running.session(ADMIN_TOKEN) as http:
        for path in ("/ui", "/ui/", "/ui/app.js"):
            assert (await request(http, "GET", path))[0] == 404
        assert (await request(http, "GET", "/v1/whoami"))[0] == 200  # the API is there either way


def test_the_pages_load_nothing_from_elsewhere_and_never_parse_markup() -> None:
    """A guard over the shipped files: relative ES module imports only, no URL of another origin,
    and none of the DOM calls that turn text into markup or code."""
    for path in STATIC.glob("*.js"):
        text = path.read_text(encoding="utf-8")
        for spec in re.findall(r'^import .* from "([^"]+)";$', text, flags=re.M):
            assert re.fullmatch(r"\./[a-z-]+\.js", spec), (path.name, spec)
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                       "localStorage", "setTimeout(\"", "cookie"):  # fmt: skip
            assert banned not in text, (path.name, banned)
        urls = re.findall(r"[a-z]+://[^\s\"'`)]+", text)
        assert set(urls) <= {"http://www.w3.org/2000/svg"}, (path.name, urls)  # the SVG namespace is a name
    for path in (*STATIC.glob("*.html"), *STATIC.glob("*.css")):
        text = path.read_text(encoding="utf-8")
        assert "://" not in text.replace("http://www.w3.org/2000/svg", ""), path.name
        assert "style=" not in text and "<script>" not in text, path.name


# ------------------------------------------------------------------------------------ who and where


async def test_whoami_and_shards(gw: Running) -> None:
    async with gw.session(SCOPED_CLIENT_TOKEN) as http:
        assert await request(http, "GET", "/v1/whoami") == (
            200, {"role": "client", "pools": ["other"], "tenant": None, "authentication": True})  # fmt: skip
        assert (await request(http, "GET", "/v1/shards"))[0] == 403  # the metrics role
    async with gw.session(None) as http:
        assert (await request(http, "GET", "/v1/whoami"))[0] == 401
    async with gw.session(METRICS_TOKEN) as http:
        status, body = await request(http, "GET", "/v1/shards")
    assert status == 200 and body["unavailable_shards"] == []
    [shard] = body["shards"]
    assert shard["name"] == "" and shard["leader"] == gw.grpc_address and shard["store"] == "sqlite"
    assert int(shard["epoch"]) >= 1 and "default" in shard["pools"] and shard["pid"] > 0


# ------------------------------------------------------------------------------------ history search


async def test_get_tasks_filters_like_search_tasks(gw: Running) -> None:
    await gw.worker("default", work)
    async with Client(gw.grpc_address, token=CLIENT_TOKEN) as client:
        ids = {}
        for key, kind, tenant in (("rep-a", "report", "acme"), ("rep-b", "report", "beta"), ("mail-a", "mail", "acme")):
            ids[key] = (await client.submit({}, key=key, kind=kind, tenant=tenant, wait=True, wait_timeout=10)).id
    async with gw.session() as http:

        async def found(query: str) -> list[str]:
            status, body = await request(http, "GET", f"/v1/tasks?{query}")
            assert status == 200, body
            return [task["key"] for task in body["tasks"]]

        assert await found("kind=report") == ["rep-a", "rep-b"]
        assert await found("kind=report&newest_first=true") == ["rep-b", "rep-a"]
        assert await found("tenant=acme&status=succeeded") == ["rep-a", "mail-a"]
        assert await found("kind=mail,report&tenant=beta") == ["rep-b"]
        assert await found("key_prefix=rep-&limit=1&newest_first=1") == ["rep-b"]
        assert await found("key_prefix=rep-&status=failed") == []
        middle = ids["rep-b"]
        _, info = await request(http, "GET", f"/v1/tasks/{middle}")
        created = int(info["created_unix_ns"])
        assert await found(f"key_prefix=&created_from_unix_ns={created}&kind=report,mail") == ["rep-b", "mail-a"]
        assert await found(f"created_to_unix_ns={created}&kind=report,mail") == ["rep-a"]
        _, page = await request(http, "GET", f"/v1/tasks?kind=report&newest_first=true&limit=1&after={ids['rep-b']}")
        assert [task["key"] for task in page["tasks"]] == ["rep-a"]
        assert await found(f"created_from_unix_ns={created}&created_to_unix_ns={created - 1}") == []  # inverted: empty
        for query, word in (("newest_first=maybe", "newest_first"), ("created_from_unix_ns=1e9", "created_from"),
                            ("kind=a%00b", "NUL"), ("limit=%C2%B2", "limit"),  # a superscript two
                            ("key_prefix=a&key_prefix=b", "key_prefix"), ("status=done", "status")):  # fmt: skip
            status, body = await request(http, "GET", f"/v1/tasks?{query}")
            assert status == 400 and word in body["error"], (query, body)


async def test_a_scoped_search_sees_only_its_pools(gw: Running) -> None:
    async with gw.session(ADMIN_TOKEN) as http:
        for pool in ("default", "other"):
            await request(http, "POST", "/v1/tasks", json={"pool": pool, "kind": "shared", "labels": {"x": "y"}})
    async with gw.session(SCOPED_CLIENT_TOKEN) as http:
        _, body = await request(http, "GET", "/v1/tasks?kind=shared")
        assert [task["pool"] for task in body["tasks"]] == ["other"]
        assert (await request(http, "GET", "/v1/tasks?kind=shared&pool=default"))[0] == 403


# ------------------------------------------------------------------------------------ task details


async def test_a_task_detail_has_its_attempts_spec_and_previews(gw: Running) -> None:
    await gw.worker("default", work)
    async with Client(gw.grpc_address, token=CLIENT_TOKEN) as client:
        submitted = await client.submit({"flaky": True, "big": 5000}, key="detail-1", kind="k", tags={"team": "x"},
                                        retry={"max_attempts": 3, "initial_backoff": 0.05}, wait=True,
                                        wait_timeout=10)  # fmt: skip
    async with gw.session() as http:
        status, detail = await request(http, "GET", f"/v1/tasks/{submitted.id}/detail")
        by_key = await request(http, "GET", "/v1/tasks/by-key/detail-1/detail")
    assert status == 200 and by_key == (200, detail)
    assert detail["task"]["status"] == "succeeded" and detail["task"]["attempt"] == 2
    retried = [change for change in detail["transitions"] if change["status"] == "retrying"]
    assert [(change["attempt"], change["message"]) for change in retried] == [
        (1, "RuntimeError: flaky <b>first</b> attempt")]  # fmt: skip
    assert detail["transitions"][-1]["status"] == "succeeded" and detail["transitions"][-1]["attempt"] == 2
    spec = detail["spec"]
    assert (spec["key"], spec["kind"], spec["tags"], spec["retry"]["max_attempts"]) == ("detail-1", "k", {"team": "x"},
                                                                                         3)  # fmt: skip
    assert json.loads(detail["payload"]["preview_text"]) == {"flaky": True, "big": 5000}
    output = detail["output"]
    assert output["bytes"] > 4096 and output["truncated"] is True and len(output["preview_text"]) == 4096
    assert output["content_type"] == "application/json"


async def test_unknown_or_hidden_tasks_have_no_detail(gw: Running) -> None:
    async with gw.session(ADMIN_TOKEN) as http:
        _, hidden = await request(http, "POST", "/v1/tasks", json={"pool": "default", "labels": {"x": "y"}})
    async with gw.session(SCOPED_CLIENT_TOKEN) as http:
        assert (await request(http, "GET", f"/v1/tasks/{hidden['id']}/detail"))[0] == 404
        assert (await request(http, "GET", "/v1/tasks/12345/detail"))[0] == 404
        assert (await request(http, "GET", "/v1/tasks/abc/detail"))[0] == 400
    async with gw.session(METRICS_TOKEN) as http:
        assert (await request(http, "GET", f"/v1/tasks/{hidden['id']}/detail"))[0] == 403


# ------------------------------------------------------------------------------------ events


async def _lines(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    async for raw in response.content:
        yield json.loads(raw)


async def test_the_event_stream_over_http1(tmp_path: Path) -> None:
    async with serve(console_config(tmp_path, max_wait_s=2)) as gw, gw.session() as http:
        await gw.worker("default", work)
        async with http.get("/v1/events?all_transitions=true&pool=default") as response:
            assert response.status == 200 and response.headers["Content-Type"] == "application/x-ndjson"
            lines = _lines(response)
            assert await anext(lines) == {"subscribed": {"unavailable_shards": []}}
            _, submitted = await request(http, "POST", "/v1/tasks", json={"key": "ev-1"})
            seen = []
            async for line in lines:
                seen.append(line)
                if "end" in line:
                    break
        events = [line["event"] for line in seen if "event" in line]
        mine = [event for event in events if event["id"] == submitted["id"]]
        assert [event["status"] for event in mine][-1] == "succeeded"
        assert {event["key"] for event in mine} == {"ev-1"} and "running" in {event["status"] for event in mine}
        assert seen[-1] == {"end": {"reason": "time limit"}}  # limits.max_wait_s; the page reconnects
        async with gw.session(METRICS_TOKEN) as metrics:
            assert (await request(metrics, "GET", "/v1/events"))[0] == 403
        assert (await request(http, "GET", "/v1/events?pool=nope"))[0] == 404
        assert (await request(http, "GET", "/v1/events?all_transitions=sure"))[0] == 400


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs the curl command")
async def test_the_event_stream_over_http2(tmp_path: Path) -> None:
    """The same stream on an HTTP/2 connection (curl with prior knowledge), chunk by chunk."""
    async with serve(console_config(tmp_path, max_wait_s=3)) as gw:
        pipe = asyncio.subprocess.PIPE
        proc = await asyncio.create_subprocess_exec(
            "curl", "-sS", "-N", "--http2-prior-knowledge", "-H", f"authorization: Bearer {CLIENT_TOKEN}",
            f"{gw.url}/v1/events?all_transitions=1", stdout=pipe, stderr=pipe)  # fmt: skip
        assert proc.stdout is not None
        first = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))
        assert first == {"subscribed": {"unavailable_shards": []}}
        async with gw.session() as http:
            _, submitted = await request(http, "POST", "/v1/tasks", json={"key": "ev-h2"})
        second = json.loads(await asyncio.wait_for(proc.stdout.readline(), 20))  # before the stream ends
        assert second["event"]["id"] == submitted["id"] and second["event"]["status"] == "ready"
        rest, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err
        assert json.loads(rest.splitlines()[-1]) == {"end": {"reason": "time limit"}}


# ------------------------------------------------------------------------------------ schedules


async def test_admins_pause_resume_and_remove_schedules_over_http(gw: Running) -> None:
    async with Client(gw.grpc_address, token=ADMIN_TOKEN) as admin:
        await admin.add_recurring("night/ly", "0 3 * * *", {"r": 1}, pool="other", key="nightly")
    path = "/v1/recurring/night%2Fly"
    async with gw.session(METRICS_TOKEN) as http:
        _, published = await request(http, "GET", "/v1/recurring")
        _, listed = await request(http, "GET", "/v1/schedules")
        [schedule] = listed["schedules"]
        assert schedule["paused"] is False and schedule["key"] == "nightly"
        extra = {"paused", "key", "next_runs_unix_ns"}
        assert published["schedules"] == [{k: v for k, v in schedule.items() if k not in extra}]
        runs = [int(ns) for ns in schedule["next_runs_unix_ns"]]
        assert len(runs) == 5 and runs == sorted(runs) and runs[0] == int(schedule["next_unix_ns"])
        assert {run % (86_400 * 10**9) for run in runs} == {3 * 3600 * 10**9}  # 03:00 UTC each day
        assert (await request(http, "POST", f"{path}/pause"))[0] == 403
        assert (await request(http, "DELETE", path))[0] == 403
    async with gw.session(ADMIN_TOKEN) as http:
        assert await request(http, "POST", f"{path}/pause") == (200, {"found": True})
        _, listed = await request(http, "GET", "/v1/schedules")
        [schedule] = listed["schedules"]
        assert schedule["paused"] is True and schedule["next_runs_unix_ns"] == [] and "next_unix_ns" not in schedule
        assert await request(http, "POST", "/v1/recurring/nope/pause") == (200, {"found": False})
        assert await request(http, "POST", f"{path}/resume") == (200, {"found": True})
        _, listed = await request(http, "GET", "/v1/schedules")
        assert listed["schedules"][0]["paused"] is False and len(listed["schedules"][0]["next_runs_unix_ns"]) == 5
        assert await request(http, "DELETE", path) == (200, {"removed": True})
        assert await request(http, "DELETE", path) == (200, {"removed": False})
        assert (await request(http, "POST", "/v1/recurring/a%00b/pause"))[0] == 400


async def test_a_worker_token_is_refused_everywhere(gw: Running) -> None:
    async with gw.session(WORKER_TOKEN) as http:
        for method, path in (("GET", "/v1/tasks?kind=x"), ("GET", "/v1/tasks/1/detail"), ("GET", "/v1/events"),
                             ("GET", "/v1/shards"), ("POST", "/v1/recurring/x/pause")):  # fmt: skip
            assert (await request(http, method, path))[0] == 403, path
        assert (await request(http, "GET", "/v1/whoami"))[1]["role"] == "worker"
