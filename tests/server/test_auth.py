"""Credentials, roles, pool scopes, pinned tenants and worker label allow-lists."""

from __future__ import annotations

import pytest

from cronoq.client import Client, ClientError, Lease, Worker, task
from tests.server.harness import (
    ADMIN_TOKEN,
    CLIENT_TOKEN,
    LABELED_WORKER_TOKEN,
    METRICS_TOKEN,
    SCOPED_CLIENT_TOKEN,
    SCOPED_METRICS_TOKEN,
    TENANT_TOKEN,
    WORKER_TOKEN,
    ServerProcess,
)


async def code_of(call: object) -> str:
    with pytest.raises(ClientError) as err:
        await call  # type: ignore[misc]
    return err.value.code


async def test_missing_or_unknown_credentials_are_unauthenticated(server: ServerProcess) -> None:
    async with Client(server.address) as anonymous:
        assert await code_of(anonymous.submit(b"")) == "unauthenticated"
        assert await code_of(anonymous.snapshot()) == "unauthenticated"
    async with Client(server.address, token="not-a-configured-token-at-all") as stranger:
        assert await code_of(stranger.get(1)) == "unauthenticated"


async def test_roles_gate_services(server: ServerProcess) -> None:
    async with Client(server.address, token=WORKER_TOKEN) as worker:
        assert await code_of(worker.submit(b"")) == "permission_denied"
    async with Client(server.address, token=CLIENT_TOKEN) as client:
        assert await code_of(client.snapshot()) == "permission_denied"
        assert await code_of(client.list_workers()) == "permission_denied"
        assert await code_of(client.add_recurring("r", "* * * * *", b"")) == "permission_denied"
    async with Client(server.address, token=METRICS_TOKEN) as metrics:
        assert await code_of(metrics.submit(b"")) == "permission_denied"
        assert await code_of(metrics.add_recurring("r", "* * * * *", b"", pool="other")) == "permission_denied"
        assert await code_of(metrics.remove_recurring("r")) == "permission_denied"
        await metrics.snapshot()
        await metrics.list_recurring()
    async with Client(server.address, token=ADMIN_TOKEN) as admin:
        # Admin passes every check.
        done = await admin.submit(b"", pool="other", key="admin-submit")
        assert (await admin.get(done.id)).id == done.id
        await admin.snapshot()
        await admin.cancel(done.id)

    async def never(lease: Lease) -> None:
        raise AssertionError("a client token must not get leases")

    wrong = Worker(server.address, "default", never, token=CLIENT_TOKEN, reconnect=False)
    assert await code_of(wrong.run()) == "permission_denied"


async def test_a_pool_scoped_token_sees_only_its_pools(server: ServerProcess) -> None:
    async with (
        Client(server.address, token=CLIENT_TOKEN) as full,
        Client(server.address, token=SCOPED_CLIENT_TOKEN) as scoped,
    ):
        elsewhere = await full.submit(b"", pool="default", key="scope-default", start_in=3600)
        mine = await scoped.submit(b"", pool="other", key="scope-mine")

        # Tasks of other pools look like they do not exist.
        assert await code_of(scoped.get(elsewhere.id)) == "not_found"
        assert await code_of(scoped.get("scope-default")) == "not_found"
        assert await code_of(scoped.wait(elsewhere.id, timeout=0.1)) == "not_found"
        assert await code_of(scoped.cancel("scope-default")) == "not_found"
        assert (await scoped.get(mine.id)).pool == "other"

        # Naming another pool is refused.
        assert await code_of(scoped.submit(b"", pool="default")) == "permission_denied"
        assert await code_of(scoped.list_tasks(pools=["default"])) == "permission_denied"
        watch = scoped.watch(["default"])
        assert await code_of(watch.__anext__()) == "permission_denied"

        # A listing without pools covers the visible ones only.
        page = await scoped.list_tasks(limit=50)
        assert page.tasks and {t.pool for t in page.tasks} == {"other"}

        # Keys are one namespace: a key in use elsewhere is a precondition failure, not a duplicate.
        assert await code_of(scoped.submit(b"", pool="other", key="scope-default")) == "failed_precondition"
        batch = [task(b"", pool="other", key="scope-fresh"), task(b"", pool="other", key="scope-default")]
        assert await code_of(scoped.submit_batch(batch)) == "failed_precondition"
        assert await code_of(scoped.get("scope-fresh")) == "not_found"  # the batch admitted nothing
        # ... and a dependency on another pool's task is as unknown as a missing one.
        assert await code_of(scoped.submit(b"", pool="other", after=elsewhere.id)) == "not_found"
        again = await scoped.submit(b"", pool="other", key="scope-mine")
        assert again.duplicate and again.id == mine.id

        await full.cancel(elsewhere.id)
        await scoped.cancel(mine.id)


async def test_scoped_metrics_token_lists_only_its_pools(server: ServerProcess, workers) -> None:
    async def idle(lease: Lease) -> None:
        return None

    await workers("default", idle, name="scope-default-worker")
    await workers("other", idle, name="scope-other-worker")
    async with (
        Client(server.address, token=SCOPED_METRICS_TOKEN) as scoped,
        Client(server.address, token=ADMIN_TOKEN) as admin,
    ):
        names = {w.name for w in await scoped.list_workers()}
        assert "scope-other-worker" in names and "scope-default-worker" not in names
        assert {p.name for p in (await scoped.snapshot()).pools} == {"other"}
        await admin.add_recurring("scope-hidden", "0 0 1 1 *", b"", pool="default")
        await admin.add_recurring("scope-shown", "0 0 1 1 *", b"", pool="other")
        shown = {s.name for s in await scoped.list_recurring()}
        assert "scope-shown" in shown and "scope-hidden" not in shown
        await admin.remove_recurring("scope-hidden")
        await admin.remove_recurring("scope-shown")


async def test_a_pinned_tenant_is_filled_in_and_others_are_refused(server: ServerProcess) -> None:
    async with Client(server.address, token=TENANT_TOKEN) as pinned:
        done = await pinned.submit(b"", pool="other", key="tenant-filled")
        assert (await pinned.get(done.id)).tenant == "a"
        same = await pinned.submit(b"", pool="other", tenant="a")
        assert (await pinned.get(same.id)).tenant == "a"
        assert await code_of(pinned.submit(b"", pool="other", tenant="b")) == "permission_denied"
        assert await code_of(pinned.submit_batch([task(b"", pool="other", tenant="b")])) == "permission_denied"
        await pinned.cancel(done.id)
        await pinned.cancel(same.id)


async def test_worker_labels_must_be_allowed(server: ServerProcess, workers) -> None:
    async def ok(lease: Lease) -> bytes:
        return b"gpu"

    refused = Worker(server.address, "labeled", ok, token=LABELED_WORKER_TOKEN, labels={"gpu": "h100"}, reconnect=False)
    assert await code_of(refused.run()) == "permission_denied"
    await workers("labeled", ok, token=LABELED_WORKER_TOKEN, labels={"gpu": "a100"})
    async with Client(server.address, token=CLIENT_TOKEN) as client:
        done = await client.submit(b"", pool="labeled", labels={"gpu": "a100"}, wait=True, wait_timeout=5)
        assert done.result is not None and done.result.output == b"gpu"
