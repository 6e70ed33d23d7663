"""Faults of Postgres itself: a crash and restart, and a misbehaving network between the servers
and the database (latency, blackhole, resets, the lock session cut while the data connections
live and the reverse)."""

from __future__ import annotations

import asyncio

from ..faultproxy import Connection
from ..run import RunContext
from . import Drill, register

ALL_SHARDS = "*"


async def postgres_restart(ctx: RunContext) -> None:
    assert ctx.postgres is not None
    await ctx.wait_load(0.3)
    outage = min(3.0, ctx.options.pause_s / 5)
    async with ctx.fault("postgres-restart", "postgres", ALL_SHARDS, f"pg_ctl stop -m immediate, {outage:g}s, start"):
        await asyncio.to_thread(ctx.postgres.stop, "immediate")
        await asyncio.sleep(outage)
        await asyncio.to_thread(ctx.postgres.restart)
        for shard in ctx.running.shards:
            if not await ctx.wait_serving(shard, 90.0):
                ctx.note(f"shard {shard.name} had no leader 90s after Postgres came back")


async def pg_proxy_faults(ctx: RunContext) -> None:
    proxy = ctx.proxy
    assert proxy is not None
    hold = min(4.0, ctx.options.pause_s / 4)
    shard = ctx.shard()

    async def settle() -> None:
        for each in ctx.running.shards:
            if not await ctx.wait_serving(each, 90.0):
                ctx.note(f"shard {each.name} had no leader 90s after a proxy fault")
        await asyncio.sleep(0.5)

    await ctx.wait_load(0.15)
    async with ctx.fault("pg-latency", "postgres link", ALL_SHARDS, f"+200ms per chunk for {hold:g}s"):
        proxy.latency_s = 0.2
        await asyncio.sleep(hold)
        proxy.latency_s = 0.0
    await settle()
    async with ctx.fault("pg-blackhole", "postgres link", ALL_SHARDS, f"every connection held {hold:g}s"):
        selector = proxy.blackhole()
        await asyncio.sleep(hold)
        proxy.heal(selector)
        await settle()
    async with ctx.fault("pg-reset", "postgres link", ALL_SHARDS, "every connection reset"):
        proxy.reset()
        await settle()
    leader = await ctx.leader(shard)

    def lock_of_leader(connection: Connection) -> bool:
        return connection.owner == leader.name and connection.lock_session

    def data_of_leader(connection: Connection) -> bool:
        return connection.owner == leader.name and not connection.lock_session

    # After the resets the leader opens its lock session again; wait for it (a few seconds at most).
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while not any(lock_of_leader(c) for c in proxy.connections) and loop.time() < deadline:
        await asyncio.sleep(0.05)
        leader = await ctx.leader(shard)
    async with ctx.fault("pg-cut-lock-session", leader.name, shard.name, "the leader's lock session reset"):
        cut = proxy.reset(lock_of_leader)
        if cut == 0:
            seen = sorted({(c.owner or "?", c.application or "?") for c in proxy.connections})
            ctx.note(f"pg-cut-lock-session: found no lock session of {leader.name} among {seen}")
        await settle()
    leader = await ctx.leader(shard)
    async with ctx.fault("pg-hold-data", leader.name, shard.name, f"the leader's data connections held {hold:g}s"):
        selector = proxy.blackhole(data_of_leader)
        await asyncio.sleep(hold)
        proxy.heal(selector)
        await settle()


register(
    Drill(
        "postgres-restart",
        "crash Postgres (pg_ctl stop -m immediate) under load and start it again",
        postgres_restart,
        stores=frozenset({"postgres"}),
        own_postgres=True,
    )
)
register(
    Drill(
        "pg-proxy-faults",
        "a TCP fault proxy between the servers and Postgres: latency, blackhole, resets, the lock "
        "session cut while the data connections live, and the data held while the lock lives",
        pg_proxy_faults,
        stores=frozenset({"postgres"}),
        fault_proxy=True,
    )
)
