"""The console's overview shows each shard's leader and its standbys, in a real browser (Debian's
Chromium, driven by Playwright) against a real cluster of 2 shards x 2 replicas (SQLite, the
console on, no restarts): the launcher lists every replica in ``[[shards]] replicas`` and each
shard's leader asks them. A killed standby shows as unavailable while its shard serves on; when
a leader is killed, its standby is shown leading. Page state is awaited through Playwright (no
sleeps); screenshots in build/screenshots/.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from cronoq.cluster.launcher import Cluster, RunningShard
from cronoq.cluster.layout import ClusterOptions
from playwright.async_api import BrowserContext, Locator, expect

from tests.console.browser import chromium, screenshot, sign_in

pytestmark = pytest.mark.asyncio(loop_scope="module")

PATIENCE_MS = 60_000
"""How long a change may take to show (a new leader waits for the old one's lease to expire)."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    options = ClusterOptions(
        shards=2, replicas=2, state=tmp_path_factory.mktemp("replica-cluster"), base_port=0, console=True, restart=False
    )
    running = Cluster(options, say=lambda text: None)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[BrowserContext]:
    async with chromium() as context:
        yield context


def endpoint_of(shard: RunningShard, index: int) -> str:
    return f"http://127.0.0.1:{shard.replicas[index].grpc_port}"


def replica_row(card: Locator, endpoint: str) -> Locator:
    return card.locator(f'li.replica[data-replica="{endpoint}"]')


async def test_the_overview_shows_leaders_standbys_and_what_is_gone(cluster: Cluster, browser: BrowserContext) -> None:
    page = await sign_in(browser, cluster.shard("s1").plan.http_url, cluster.token("metrics"), "overview")
    for name in ("s1", "s2"):
        shard = cluster.shard(name)
        leader = shard.leader
        assert leader is not None
        card = page.locator(f'#shards article[data-shard="{name}"]')
        await expect(card).to_have_attribute("data-state", "serving")
        await expect(card.locator("li.replica")).to_have_count(2)
        for index, replica in enumerate(shard.replicas):
            state = "leader" if replica is leader else "standby"
            row = replica_row(card, endpoint_of(shard, index))
            await expect(row).to_have_attribute("data-state", state)
            await expect(row).to_contain_text(f"pid {replica.pid}")
    await screenshot(page, "overview-replicas")

    # A standby killed: shown unavailable, the shard itself serves on.
    s2 = cluster.shard("s2")
    card = page.locator('#shards article[data-shard="s2"]')
    standby_index = next(i for i, replica in enumerate(s2.replicas) if replica is not s2.leader)
    leader_index = 1 - standby_index
    s2.replicas[standby_index].kill()
    await expect(replica_row(card, endpoint_of(s2, standby_index))).to_have_attribute(
        "data-state", "unavailable", timeout=PATIENCE_MS
    )
    await expect(card).to_have_attribute("data-state", "serving")
    await expect(replica_row(card, endpoint_of(s2, leader_index))).to_have_attribute("data-state", "leader")
    await screenshot(page, "replica-unavailable")

    # The leader of s1 killed: its standby takes over and is shown leading, the old one gone.
    s1 = cluster.shard("s1")
    card = page.locator('#shards article[data-shard="s1"]')
    old = next(i for i, replica in enumerate(s1.replicas) if replica is s1.leader)
    s1.replicas[old].kill()
    await expect(replica_row(card, endpoint_of(s1, 1 - old))).to_have_attribute(
        "data-state", "leader", timeout=PATIENCE_MS
    )
    await expect(replica_row(card, endpoint_of(s1, old))).to_have_attribute("data-state", "unavailable")
    await screenshot(page, "replica-took-over")
    assert page.errors == []  # type: ignore[attr-defined]
    await page.close()
