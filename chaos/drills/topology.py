"""Faults of whole nodes and shards: every replica of one shard lost while the others keep
serving, a rolling restart of every node under load, and every node killed at once."""

from __future__ import annotations

import asyncio

from cronoq.cluster.launcher import RunningShard

from ..run import RunContext
from . import Drill, register

ALL_SHARDS = "*"


async def _start_again(ctx: RunContext, shard: RunningShard) -> None:
    await asyncio.gather(*(replica.start(same_ports=True) for replica in shard.replicas if not replica.alive))
    if not await ctx.wait_serving(shard, 90.0):
        ctx.note(f"shard {shard.name} had no leader 90s after its replicas came back")


async def shard_lost(ctx: RunContext) -> None:
    await ctx.wait_load(0.3)
    # The last shard: s1 is the producers' front door, which must stay up.
    shard = ctx.running.shards[-1]
    outage = min(5.0, ctx.options.pause_s / 3)
    async with ctx.fault("shard-lost", f"every replica of {shard.name}", shard.name, f"SIGKILL all, {outage:g}s down"):
        for replica in shard.replicas:
            replica.stop_requested = True  # not restarted by the launcher: the drill brings it back
            replica.kill()
        await asyncio.sleep(outage)
        await _start_again(ctx, shard)


async def rolling_restart(ctx: RunContext) -> None:
    await ctx.wait_load(0.2)
    for shard in ctx.running.shards:
        leader = await ctx.leader(shard)
        order = [r for r in shard.replicas if r is not leader] + [leader]
        for replica in order:
            async with ctx.fault("rolling-restart", replica.name, shard.name, "SIGTERM, started again"):
                await replica.stop()
                await replica.start(same_ports=True)
                if not await ctx.wait_serving(shard, 90.0):
                    ctx.note(f"shard {shard.name} had no leader 90s after {replica.name} restarted")


async def restart_all(ctx: RunContext) -> None:
    await ctx.wait_load(0.3)
    async with ctx.fault("restart-all", "every server", ALL_SHARDS, "SIGKILL every server at once; restarted"):
        for replica in ctx.running.replicas:
            replica.stop_requested = True
            replica.kill()
        await asyncio.sleep(0.5)
        await asyncio.gather(*(_start_again(ctx, shard) for shard in ctx.running.shards))


register(
    Drill(
        "shard-lost",
        "every replica of one shard killed for a while; the other shards keep serving; then it comes back",
        shard_lost,
        min_shards=2,
    )
)
register(Drill("rolling-restart", "restart every server one by one (standbys first) under load", rolling_restart))
register(Drill("restart-all", "kill every server at once under load and start them all again", restart_all))
