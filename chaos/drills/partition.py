"""Network partitions. With ``--net netns`` (the default where the machine allows it) every node
runs in a network namespace of its own and a partition is routes (``chaos/netns.py``); with
``--net proxy`` it is made on loopback by the proxies in the way: a connection's other end is
known from ``/proc`` (which process holds the socket), so a proxy can refuse or cut exactly the
connections that cross the partition.

* ``partition-shards``: the nodes of shard s1 and those of s2 cannot reach each other (nor each
  other's endpoint: forwarded calls, merged reads); clients and workers still reach both.
* ``partition-replicas``: the replicas of one shard talk to each other only through their store,
  so the partition is between the leader and Postgres (namespaces: no packet between them;
  proxy: the fault proxy holds every byte of the leader's connections) while the standbys still
  reach the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from cronoq.cluster.launcher import RunningShard

from ..faultproxy import Connection, owner_pid
from ..netns import POSTGRES_NODE
from ..run import RunContext
from . import Drill, register


def _cut_leader_from_postgres(ctx: RunContext, leader: str) -> Callable[[], None]:
    """Cut ``leader`` from Postgres now; the function that heals it."""
    if ctx.network is not None:
        return ctx.network.cut([leader], [POSTGRES_NODE]).heal
    proxy = ctx.proxy
    assert proxy is not None

    def of_leader(connection: Connection) -> bool:
        return connection.owner == leader

    selector = proxy.blackhole(of_leader)
    return lambda: proxy.heal(selector)


async def partition_replicas(ctx: RunContext) -> None:
    await ctx.wait_load(0.3)
    shard = ctx.shard()
    leader = await ctx.leader(shard)
    cut = ctx.options.pause_s

    async with ctx.fault("partition-replicas", leader.name, shard.name, f"leader cut from Postgres for {cut:g}s"):
        heal = _cut_leader_from_postgres(ctx, leader.name)
        try:
            if not await ctx.wait_new_leader(shard, leader.name, cut):
                ctx.note(f"shard {shard.name}: no standby took over while {leader.name} was cut off for {cut:g}s")
            else:
                await asyncio.sleep(1.0)
        finally:
            heal()
        if not await ctx.wait_serving(shard, 90.0):
            ctx.note(f"shard {shard.name} had no leader 90s after the partition healed")


def _from_nodes_of(shard: RunningShard, proxy_port: int) -> Callable[[int], bool]:
    def crosses(peer_port: int) -> bool:
        pids = {replica.pid: replica.name for replica in shard.replicas if replica.pid is not None}
        return owner_pid(peer_port, proxy_port, pids) is not None

    return crosses


def _cut_shards(ctx: RunContext, first: RunningShard, second: RunningShard) -> Callable[[], None]:
    """Cut the nodes of ``first`` from those of ``second`` and from its endpoint, and the reverse;
    the function that heals it."""
    if ctx.network is not None:
        sides = [[shard.name, *(replica.name for replica in shard.replicas)] for shard in (first, second)]
        return ctx.network.cut(sides[0], sides[1]).heal
    pairs = ((first, second), (second, first))
    for source, destination in pairs:
        for proxy in destination.proxies:
            proxy.refuse = _from_nodes_of(source, proxy.port)
            proxy.cut(proxy.refuse)

    def heal() -> None:
        for _, destination in pairs:
            for proxy in destination.proxies:
                proxy.refuse = None

    return heal


async def partition_shards(ctx: RunContext) -> None:
    await ctx.wait_load(0.3)
    first, second = ctx.running.shards[0], ctx.running.shards[1]
    cut = min(5.0, ctx.options.pause_s / 2)
    async with ctx.fault(
        "partition-shards", f"{first.name} <-> {second.name}", None, f"nodes cut from each other's endpoint {cut:g}s"
    ):
        heal = _cut_shards(ctx, first, second)
        try:
            await asyncio.sleep(cut)
        finally:
            heal()


register(
    Drill(
        "partition-shards",
        "the nodes of two shards cut from each other (forwarding, merged reads) while clients reach both; heal",
        partition_shards,
        min_shards=2,
        netns=True,
    )
)
register(
    Drill(
        "partition-replicas",
        "cut the leader of a shard from Postgres while its standbys reach it; heal",
        partition_replicas,
        stores=frozenset({"postgres"}),
        fault_proxy=True,
        min_replicas=2,
        netns=True,
    )
)
