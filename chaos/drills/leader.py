"""Faults of a shard's leader: killed outright, or frozen past its lease and woken again."""

from __future__ import annotations

import asyncio
import os
import signal

from ..run import RunContext
from . import Drill, register

LOAD_BEFORE_FAULT = 0.3


async def leader_kill(ctx: RunContext) -> None:
    await ctx.wait_load(LOAD_BEFORE_FAULT)
    shard = ctx.shard()
    leader = await ctx.leader(shard)
    async with ctx.fault("leader-kill", leader.name, shard.name, "SIGKILL"):
        leader.kill()
        if not await ctx.wait_takeover(shard, leader.name):
            ctx.note(f"shard {shard.name} had no leader 90s after {leader.name} was killed")


async def leader_pause(ctx: RunContext) -> None:
    """SIGSTOP the leader for ``pause_s`` (past its lease), then SIGCONT. A standby must take over
    meanwhile, and the woken leader must not write anything (the checker's stale-write rule)."""
    await ctx.wait_load(LOAD_BEFORE_FAULT)
    shard = ctx.shard()
    leader = await ctx.leader(shard)
    pid = leader.pid
    assert pid is not None
    pause = ctx.options.pause_s
    loop = asyncio.get_running_loop()
    async with ctx.fault("leader-pause", leader.name, shard.name, f"SIGSTOP {pause:g}s, then SIGCONT"):
        frozen_at = loop.time()
        os.kill(pid, signal.SIGSTOP)
        try:
            if not await ctx.wait_new_leader(shard, leader.name, pause):
                ctx.note(f"shard {shard.name}: no standby took over during the {pause:g}s pause of {leader.name}")
            # Frozen for the whole pause: the zombie wakes long after it was replaced.
            await asyncio.sleep(max(0.0, pause - (loop.time() - frozen_at)))
        finally:
            os.kill(pid, signal.SIGCONT)
        if not await ctx.wait_serving(shard, 90.0):
            ctx.note(f"shard {shard.name} had no leader 90s after {leader.name} woke up")


register(Drill("leader-kill", "SIGKILL the leader of a shard under load; a standby takes over", leader_kill,
               min_replicas=2))  # fmt: skip
register(
    Drill(
        "leader-pause",
        "SIGSTOP the leader past its lease, SIGCONT it later; a standby takes over and the woken leader writes nothing",
        leader_pause,
        min_replicas=2,
    )
)

__all__ = ["leader_kill", "leader_pause"]
