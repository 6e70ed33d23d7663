"""A pool moved back and forth between two shards under load (issue 20, docs/pool-moves.md), with
a leader killed at a random point of some moves: the source's leader (which drives the move), the
target's, or the leader behind the endpoint the admin call entered by. The seed picks each move's
fault, its moment and the entry point. Each move is recorded in the ledger (asked at, target seen
owning the pool at), for the checker's ``split-ownership`` rule and the move figures."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
from cronoq.cluster.launcher import RunningShard

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import console_pb2_grpc as cpbg

from ..run import RunContext
from . import Drill, register

MOVES = 4
FAULTS = ("none", "source-leader", "target-leader", "entry-leader")
KILL_WITHIN_S = 0.8
"""A fault strikes this long after the request at most: the drain, the source's engine letting go
of the pool, the handover transaction and the target adding the pool to its engine all fall in it
(a move took 0.3-0.6 s once both leaders stayed up through it; 3 s when each stepped down)."""
MOVE_TIMEOUT_S = 90.0
POLL_S = 0.05
RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.CANCELLED,
         grpc.StatusCode.DEADLINE_EXCEEDED)  # fmt: skip
"""Answers while a shard changes leaders or the pool changes hands (FAILED_PRECONDITION: a node's
placement was older than the move; the call is sent again)."""


def already_there(error: grpc.aio.AioRpcError, request: object) -> bool:
    """A MovePool refused because the pool is on its target already."""
    target = getattr(request, "to", "")
    return error.code() is grpc.StatusCode.INVALID_ARGUMENT and f"already served by shard {target!r}" in (
        error.details() or ""
    )


class Mover:
    """The admin calls of the drill, through one shard's endpoint (its proxy follows the leader)."""

    def __init__(self, ctx: RunContext, entry: RunningShard) -> None:
        self.metadata = (("authorization", f"Bearer {ctx.running.token('admin')}"),)
        self.channel = grpc.aio.insecure_channel(entry.plan.grpc_target)
        self.stub = cpbg.ConsoleStub(self.channel)  # type: ignore[no-untyped-call]

    async def call(self, method: str, request: object, deadline: float) -> cpb.MoveStatus | None:
        """``method`` answered, or None once ``deadline`` (loop time) passed; retried meanwhile."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            try:
                status: cpb.MoveStatus = await getattr(self.stub, method)(request, metadata=self.metadata, timeout=5.0)
                return status
            except grpc.aio.AioRpcError as error:
                if method == "MovePool" and already_there(error, request):
                    # A try whose answer was lost (its node killed) moved the pool: follow it.
                    return await self.call("GetMove", cpb.MoveRequest(pool=request.pool), deadline)  # type: ignore[attr-defined]
                if error.code() not in RETRY:
                    raise
            await asyncio.sleep(POLL_S)
        return None

    async def close(self) -> None:
        await self.channel.close()


async def _kill_later(ctx: RunContext, fault: str, delay: float, shards: dict[str, RunningShard]) -> None:
    """SIGKILL the leader of ``shards[fault]`` ``delay`` seconds from now (the launcher restarts it)."""
    await asyncio.sleep(delay)
    shard = shards[fault]
    leader = await ctx.leader(shard)
    async with ctx.fault("pool-move", leader.name, shard.name, f"SIGKILL the {fault} {delay:.2f}s into the move"):
        leader.kill()
        if not await ctx.wait_takeover(shard, leader.name):
            ctx.note(f"shard {shard.name} had no leader 90s after {leader.name} was killed")


async def _move_once(ctx: RunContext, pool: str, source: RunningShard, target: RunningShard) -> bool:
    """One move of ``pool``, with the fault the seed picks; whether the target came to own it."""
    fault = ctx.rng.choice(FAULTS)
    delay = ctx.rng.uniform(0.0, KILL_WITHIN_S)
    entry = ctx.rng.choice([source, target])
    loop = asyncio.get_running_loop()
    mover = Mover(ctx, entry)
    striking = None
    if fault != "none":
        shards = {"source-leader": source, "target-leader": target, "entry-leader": entry}
        striking = asyncio.ensure_future(_kill_later(ctx, fault, delay, shards))
    asked = time.time()
    done_at = None
    move_id, version = "", 0
    try:
        deadline = loop.time() + MOVE_TIMEOUT_S
        status = await mover.call("MovePool", cpb.MovePoolRequest(pool=pool, to=target.name), deadline)
        if status is not None:
            # Following a move an earlier try made (see ``Mover.call``): its version is the placement's.
            move_id, version = status.move_id, status.version or status.placement_version
        while status is not None and not (status.shard == target.name and status.placement_version >= version):
            if status.move_id == move_id and status.phase in ("refused", "aborted"):
                ctx.note(f"!! move of {pool} to {target.name} ended {status.phase}: {status.message}")
                break
            await asyncio.sleep(POLL_S)
            status = await mover.call("GetMove", cpb.MoveRequest(pool=pool), deadline)
        if status is not None and status.shard == target.name and status.placement_version >= version:
            done_at = time.time()
    finally:
        if striking is not None:
            await striking
        await mover.close()
    what = "" if fault == "none" else f"{fault} killed {delay:.2f}s in"
    ctx.ledger.add_move(pool, version, source.name, target.name, asked, done_at, what)
    if done_at is None:
        ctx.note(f"!! pool {pool} was not seen on shard {target.name} {MOVE_TIMEOUT_S:g}s after the move was asked")
    return done_at is not None


async def pool_move(ctx: RunContext) -> None:
    await ctx.wait_load(0.15)
    first, second = ctx.running.shards[0], ctx.running.shards[1]
    pool = first.plan.pools[1]
    source, target = first, second
    for index in range(MOVES):
        if not await _move_once(ctx, pool, source, target):
            return
        source, target = target, source
        # Some load on the new owner before the next move.
        await ctx.wait_load(0.15 + 0.8 * (index + 1) / MOVES)
        with contextlib.suppress(Exception):
            await ctx.wait_serving(source, 30.0)


register(
    Drill(
        "pool-move",
        "move a pool between two shards and back under load, SIGKILLing the source's, the target's or the entry "
        "node's leader at a random point of some moves",
        pool_move,
        min_replicas=2,
        min_shards=2,
        pools_per_shard=2,
        min_producers=3,  # the first pools of both shards, and the moving pool
    )
)

__all__ = ["pool_move"]
