"""Network partitions. The servers of a local cluster share loopback, and the replicas of one shard
talk to each other only through their store, so a partition between replicas is a partition
between one replica and Postgres: the drill's fault proxy holds every byte of the leader's
connections (lock session and data) while the standbys still reach the database."""

from __future__ import annotations

import asyncio

from ..faultproxy import Connection
from ..run import RunContext
from . import Drill, register


async def partition_replicas(ctx: RunContext) -> None:
    proxy = ctx.proxy
    assert proxy is not None
    await ctx.wait_load(0.3)
    shard = ctx.shard()
    leader = await ctx.leader(shard)
    cut = ctx.options.pause_s

    def of_leader(connection: Connection) -> bool:
        return connection.owner == leader.name

    async with ctx.fault("partition-replicas", leader.name, shard.name, f"leader cut from Postgres for {cut:g}s"):
        selector = proxy.blackhole(of_leader)
        try:
            if not await ctx.wait_new_leader(shard, leader.name, cut):
                ctx.note(f"shard {shard.name}: no standby took over while {leader.name} was cut off for {cut:g}s")
            else:
                await asyncio.sleep(1.0)
        finally:
            proxy.heal(selector)
        if not await ctx.wait_serving(shard, 90.0):
            ctx.note(f"shard {shard.name} had no leader 90s after the partition healed")


register(
    Drill(
        "partition-replicas",
        "cut the leader of a shard from Postgres (every connection held) while its standbys reach it; heal",
        partition_replicas,
        stores=frozenset({"postgres"}),
        fault_proxy=True,
        min_replicas=2,
    )
)
