"""The web console in a real browser (Debian's Chromium, driven by Playwright) against a real
2-shard cluster (one server process per shard, SQLite, the console on): what a person sees and
may do, page state awaited through Playwright (no sleeps), screenshots in build/screenshots/.

Shard s1 serves pool ``default``, s2 ``pool2``; the page is always loaded from s1's HTTP endpoint,
so everything about pool2 goes through s1's router. Keys are retained for one second only, so
finished tasks soon live in the store's history alone.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from cronoq.cluster.launcher import Cluster
from cronoq.cluster.layout import ClusterOptions
from playwright.async_api import BrowserContext, expect

from cronoq.client import Client, Lease, Worker
from tests.console import grpcweb
from tests.console.browser import chromium, screenshot, sign_in
from tests.server.http_support import until_forgotten

pytestmark = pytest.mark.asyncio(loop_scope="module")

HOLD = {"hold": "never"}
"""Worker labels no worker has: such tasks wait, so they can be cancelled."""
FLAKY = "first attempt fails on purpose"
_serial = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{time.time_ns()}-{next(_serial)}"


async def work(lease: Lease) -> dict[str, Any]:
    payload = lease.json() or {}
    if payload.get("flaky") and lease.attempt == 1:
        raise RuntimeError(FLAKY)
    return {"pool": lease.pool, "attempt": lease.attempt, "echo": payload}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    options = ClusterOptions(
        shards=2,
        replicas=1,
        state=tmp_path_factory.mktemp("console-cluster"),
        base_port=0,
        console=True,
        grpc_web=True,
        restart=False,
        limits={"key_retention_s": 1, "max_wait_s": 30},
    )
    running = Cluster(options, say=lambda text: None)
    await running.start()
    workers = [
        Worker(running.shard(shard).plan.endpoint, pool, work, token=running.token("worker"), grace=0.5)
        for shard, pool in (("s1", "default"), ("s2", "pool2"))
    ]
    runs = [asyncio.ensure_future(worker.run()) for worker in workers]
    try:
        await asyncio.gather(*(worker.wait_registered(30) for worker in workers))
        yield running
    finally:
        await asyncio.gather(*(worker.stop(1) for worker in workers), return_exceptions=True)
        await asyncio.gather(*runs, return_exceptions=True)
        await running.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[BrowserContext]:
    async with chromium() as context:
        yield context


def base(cluster: Cluster) -> str:
    return cluster.shard("s1").plan.http_url


def client(cluster: Cluster, role: str = "client") -> Client:
    return Client(cluster.shard("s1").plan.grpc_target, token=cluster.token(role))


async def test_the_overview_shows_both_shards_their_pools_and_live_charts(
    cluster: Cluster, browser: BrowserContext
) -> None:
    async with client(cluster) as tasks:
        for pool in ("default", "pool2"):
            await tasks.submit({"n": 1}, pool=pool, wait=True, wait_timeout=20)
    page = await sign_in(browser, base(cluster), cluster.token("admin"))
    for shard, pool in (("s1", "default"), ("s2", "pool2")):
        card = page.locator(f'#shards article[data-shard="{shard}"]')
        await expect(card).to_have_attribute("data-state", "serving")
        await expect(card).to_contain_text(pool)
        await expect(card).to_contain_text("Leader")
        panel = page.locator(f'#pools article[data-pool="{pool}"]')
        await expect(panel.locator("svg.chart-plot")).to_have_count(3)
        await expect(panel.locator("polyline.line")).to_have_count(8)  # 3 + 3 + 2 series, drawn
        await expect(panel).to_contain_text("Workers desired / connected")
    await screenshot(page, "overview")
    await page.goto(f"{base(cluster)}/ui/#/workers")
    for pool in ("default", "pool2"):
        await expect(page.locator("#workers tbody tr", has_text=pool)).to_have_count(1)
    await screenshot(page, "workers")
    assert page.errors == []  # type: ignore[attr-defined]
    await page.close()


async def test_a_submitted_task_appears_live(cluster: Cluster, browser: BrowserContext) -> None:
    page = await sign_in(browser, base(cluster), cluster.token("client"), "events")
    await expect(page.locator("#stream-state")).to_have_attribute("data-state", "live")
    key = unique("<img src=x onerror=alert(1)>live")  # another tenant's text: it must stay text
    async with client(cluster) as tasks:
        submitted = await tasks.submit({"live": True}, pool="pool2", key=key)  # forwarded by s1 to s2
    row = page.locator(f'#events tr[data-task="{submitted.id}"][data-status="succeeded"]')
    await expect(row).to_have_count(1)
    await expect(row).to_contain_text("pool2")
    await expect(row).to_contain_text(key)
    await expect(page.locator("#events img")).to_have_count(0)
    await expect(page.locator(f'#events tr[data-task="{submitted.id}"][data-status="running"]')).to_have_count(1)
    await screenshot(page, "events")
    await page.close()


async def test_a_task_page_shows_its_attempts_after_a_retry(cluster: Cluster, browser: BrowserContext) -> None:
    async with client(cluster) as tasks:
        retry = {"max_attempts": 3, "initial_backoff": 0.05, "max_backoff": 0.1}
        submitted = await tasks.submit({"flaky": True}, pool="pool2", key=unique("flaky"), retry=retry)
        result = await tasks.wait(submitted.id, timeout=30)
    assert result.status == "succeeded"
    page = await sign_in(browser, base(cluster), cluster.token("client"), f"task/{submitted.id}")
    await expect(page.locator("#task-status")).to_have_text("succeeded")
    first = page.locator('ol.attempts > li[data-attempt="1"]')
    await expect(first.locator('li[data-status="retrying"]')).to_contain_text(FLAKY)
    second = page.locator('ol.attempts > li[data-attempt="2"]')
    await expect(second.locator('li[data-status="succeeded"]')).to_have_count(1)
    timeline = page.locator("#timeline tbody tr")
    await expect(timeline.first).to_contain_text("submitted")
    await expect(timeline.filter(has_text=FLAKY)).to_contain_text("retrying")
    await expect(timeline.last).to_contain_text("succeeded")
    await expect(page.locator("section.preview", has_text="Output")).to_contain_text('"attempt": 2')
    await expect(page.locator("section.preview", has_text="Payload")).to_contain_text('{"flaky": true}')
    await expect(page.locator("#cancel")).to_have_count(0)  # finished: nothing to cancel
    await screenshot(page, "task-after-retry")
    await page.close()


async def test_a_history_search_finds_a_task_finished_past_retention(cluster: Cluster, browser: BrowserContext) -> None:
    prefix = unique("past")
    async with client(cluster) as tasks:
        old = await tasks.submit(
            {"old": True}, pool="pool2", key=f"{prefix}-a", kind="nightly", wait=True, wait_timeout=20
        )
        await until_forgotten(tasks, f"{prefix}-a")
        info = await tasks.get(old.id)  # by id it is still found, from the store's history
        assert info.status == "succeeded"
    page = await sign_in(
        browser, base(cluster), cluster.token("client"), f"tasks?key_prefix={prefix}&status=succeeded&kind=nightly"
    )
    row = page.locator(f'#results tr[data-task="{old.id}"]')
    await expect(row).to_contain_text("succeeded")
    await expect(page.locator("#results tbody tr")).to_have_count(1)
    await screenshot(page, "history-search")
    await row.locator("a").click()
    await expect(page.locator("#task-status")).to_have_text("succeeded")
    # The key is free again: the same key makes a new task (history is for reading, not for keys).
    async with client(cluster) as tasks:
        again = await tasks.submit({"old": False}, pool="pool2", key=f"{prefix}-a")
    assert not again.duplicate and again.id != old.id
    await page.close()


async def test_a_metrics_token_sees_but_cannot_cancel(cluster: Cluster, browser: BrowserContext) -> None:
    async with client(cluster) as tasks:
        waiting = await tasks.submit({"wait": True}, pool="pool2", labels=HOLD, key=unique("held"))
    page = await sign_in(browser, base(cluster), cluster.token("metrics"), f"task/{waiting.id}")
    await expect(page.locator("[data-denied=client]")).to_contain_text("needs the client role")
    await expect(page.locator("#cancel")).to_have_count(0)
    await expect(page.locator("#nav a")).to_have_text(["Overview", "Workers", "Schedules"])
    # The server refuses it as well, whatever the page shows: the same call the page would make.
    status = await page.evaluate(
        """async (id) => (await fetch(`/v1/tasks/${id}`, {method: "DELETE",
             headers: {authorization: `Bearer ${sessionStorage.getItem("cronoq.token")}`}})).status""",
        str(waiting.id),
    )
    assert status == 403
    await screenshot(page, "metrics-token-task")
    async with client(cluster) as tasks:
        assert (await tasks.get(waiting.id)).status == "ready"
    await page.close()
    # A client token gets the button, and it cancels.
    page = await sign_in(browser, base(cluster), cluster.token("client"), f"task/{waiting.id}")
    await page.locator("#cancel").click()
    await expect(page.locator("#task-status")).to_have_text("cancelled")
    async with client(cluster) as tasks:
        assert (await tasks.get(waiting.id)).status == "cancelled"
    await page.close()


async def test_an_admin_pauses_and_resumes_a_schedule(cluster: Cluster, browser: BrowserContext) -> None:
    name = unique("nightly")
    async with client(cluster, "admin") as admin:
        await admin.add_recurring(name, "0 3 * * *", {"report": True}, pool="pool2")
    page = await sign_in(browser, base(cluster), cluster.token("admin"), "schedules")
    row = page.locator(f'#schedules tr[data-schedule="{name}"]')
    await expect(row).to_have_attribute("data-state", "active")
    await expect(row.locator("ul.plain li")).to_have_count(5)  # the next five runs
    await row.locator("button[data-action=pause]").click()
    await expect(row).to_have_attribute("data-state", "paused")
    await expect(row.locator("ul.plain li")).to_have_count(0)
    await screenshot(page, "schedules-paused")
    async with client(cluster, "metrics") as metrics:
        listed = {schedule.name: schedule for schedule in await metrics.list_recurring()}
    assert listed[name].next_at is None  # paused: no next run, on the published wire too
    await row.locator("button[data-action=resume]").click()
    await expect(row).to_have_attribute("data-state", "active")
    await expect(row.locator("ul.plain li")).to_have_count(5)
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await row.locator("button[data-action=remove]").click()
    await expect(row).to_have_count(0)
    await page.close()
    # A metrics token sees the schedules but no buttons.
    page = await sign_in(browser, base(cluster), cluster.token("metrics"), "schedules")
    await expect(page.locator("#schedules table")).to_have_count(1)
    await expect(page.locator("#schedules button")).to_have_count(0)
    await page.close()


async def test_grpc_web_from_the_browser_across_shards(cluster: Cluster, browser: BrowserContext) -> None:
    """Chromium's own fetch speaks gRPC-Web to s1's gRPC endpoint from a page of s1's HTTP endpoint
    (another origin, listed in allowed_origins): the CORS preflight, the exposed grpc-status, a
    unary call merged over both shards, and a Watch that sees a task of the other shard."""
    page = await browser.new_page()
    await page.goto(f"{base(cluster)}/healthz")
    target = {"url": cluster.shard("s1").plan.endpoint, "token": cluster.token("admin")}
    snapshot = await page.evaluate(grpcweb.SNAPSHOT, target)
    assert (snapshot["status"], snapshot["grpcStatus"]) == (200, None)  # the status is in the trailer
    assert "grpc-status:0" in snapshot["trailer"] and set(snapshot["pools"]) == {"default", "pool2"}
    key = unique("web")
    await page.evaluate(f"(args) => {{ window.watched = ({grpcweb.WATCH})(args); }}", {**target, "key": key})
    await page.wait_for_function("window.watchOpen === true")
    async with client(cluster) as tasks:
        submitted = await tasks.submit({"web": True}, pool="pool2", key=key)
    assert await page.evaluate("window.watched") == {"id": str(submitted.id), "pool": "pool2"}
    refused = await page.evaluate(grpcweb.SNAPSHOT, {**target, "token": cluster.token("client")})
    assert refused["grpcStatus"] == "7"  # PERMISSION_DENIED, readable through the exposed header
    await page.close()


async def test_a_killed_shard_shows_as_unavailable_and_comes_back(cluster: Cluster, browser: BrowserContext) -> None:
    page = await sign_in(browser, base(cluster), cluster.token("admin"), "overview")
    s2 = page.locator('#shards article[data-shard="s2"]')
    await expect(s2).to_have_attribute("data-state", "serving")
    replica = cluster.shard("s2").replicas[0]
    replica.kill()
    await expect(s2).to_have_attribute("data-state", "unavailable", timeout=30_000)
    await expect(s2).to_contain_text("pool2")  # the last known facts stay on the card
    await expect(page.locator('#shards article[data-shard="s1"]')).to_have_attribute("data-state", "serving")
    await screenshot(page, "shard-unavailable")
    await replica.start(same_ports=True)
    await expect(s2).to_have_attribute("data-state", "serving", timeout=60_000)
    await screenshot(page, "shard-back")
    await page.close()
