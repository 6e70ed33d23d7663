"""``cronoq admin``: operating a sharded cluster.

``cronoq admin topology`` shows where every shard's durable record places each pool, at which
version (``docs/pool-moves.md``), and says where shards, or a shard and its configuration file,
disagree. ``cronoq admin move-pool POOL --to SHARD`` moves a pool while the cluster runs;
``--status`` and ``--abort`` follow and abandon a move.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

import grpc

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import console_pb2_grpc as cpbg
from cronoq.proto import cronoq_pb2 as pb

from .commands import call, warn_shards
from .connection import Connection
from .exits import CliError, Exit, from_rpc
from .text import Out

__all__ = ["disagreements", "move_pool", "topology"]

MOVE_WAIT_S = 120.0
"""Longest ``move-pool --wait`` follows a move before giving up (exit 5)."""
MOVE_POLL_S = 0.25


def disagreements(response: cpb.ListShardsResponse) -> list[str]:
    """One sentence per pool whose placement is not the same in every shard's record."""
    seen: dict[str, dict[tuple[str, int], list[str]]] = defaultdict(lambda: defaultdict(list))
    for shard in response.shards:
        for placed in shard.placements:
            seen[placed.pool][(placed.shard, placed.version)].append(shard.name)
    out = []
    for pool in sorted(seen):
        views = seen[pool]
        if len(views) < 2:
            continue
        parts = [
            f"{' and '.join(sorted(holders))} place it on {shard} (version {version})"
            for (shard, version), holders in sorted(views.items(), key=lambda item: -item[0][1])
        ]
        out.append(f"pool {pool}: " + "; ".join(parts) + " (the highest version is the newest)")
    return out


def topology(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    response: cpb.ListShardsResponse = call(
        conn,
        cpbg.ConsoleStub(conn.channel).ListShards,  # type: ignore[no-untyped-call]
        pb.Empty(),
        "list the shards",
    )
    if args.output == "json":
        from cronoq.server.console.shapes import shards_json

        out.json({**shards_json(response), "disagreements": disagreements(response)})
        return Exit.OK
    warn_shards(out, response.unavailable_shards)
    for shard in sorted(response.shards, key=lambda shard: shard.number):
        placed = ", ".join(f"{out.safe(p.pool)}@{p.version}" for p in shard.placements if p.shard == shard.name)
        out.line(f"{out.safe(shard.name)}  topology version {shard.topology_version}  serves: {placed or '-'}")
        for difference in shard.topology_differences:
            out.line(f"  file differs: {out.safe(difference)}")
    for line in disagreements(response):
        out.line(f"disagreement: {out.safe(line)}")
    return Exit.OK


def _status_line(status: cpb.MoveStatus, safe: Any) -> str:
    version = status.placement_version
    where = f"pool {safe(status.pool)} is served by shard {safe(status.shard)} (placement version {version})"
    if not status.move_id:
        return f"{where}; that shard has not moved it"
    move = f"move {status.move_id} to shard {safe(status.target)} (version {status.version}): {status.phase}"
    return f"{where}; {move}" + (f" ({safe(status.message)})" if status.message else "")


def _status_json(status: cpb.MoveStatus) -> dict[str, Any]:
    return {
        "pool": status.pool,
        "shard": status.shard,
        "placement_version": str(status.placement_version),
        "move_id": status.move_id,
        "target": status.target,
        "version": str(status.version),
        "phase": status.phase,
        "message": status.message,
        "updated_unix_ns": str(status.updated_unix_ns),
    }


def move_pool(args: argparse.Namespace, conn: Connection, out: Out) -> Exit:
    stub = cpbg.ConsoleStub(conn.channel)  # type: ignore[no-untyped-call]
    if args.status:
        status = call(conn, stub.GetMove, cpb.MoveRequest(pool=args.pool), "move status")
    elif args.abort:
        status = call(conn, stub.AbortMove, cpb.MoveRequest(pool=args.pool), "abort the move")
    else:
        status = call(conn, stub.MovePool, cpb.MovePoolRequest(pool=args.pool, to=args.to), "move the pool")
        if args.wait:
            status = _follow(conn, stub, args.pool, args.to, status)
    if args.output == "json":
        out.json(_status_json(status))
    else:
        out.line(_status_line(status, out.safe))
    if status.phase == "refused" and status.shard != (args.to or ""):
        return Exit.ERROR
    return Exit.OK


def _follow(conn: Connection, stub: Any, pool: str, target: str, status: cpb.MoveStatus) -> cpb.MoveStatus:
    """Ask until the target serves the pool or the move ended otherwise; takeovers on the way
    answer UNAVAILABLE, which is waited out."""
    deadline = time.monotonic() + MOVE_WAIT_S
    while status.shard != target and status.phase not in ("refused", "aborted"):
        if time.monotonic() > deadline:
            raise CliError(Exit.TIMEOUT, f"move-pool: pool {pool} is not on shard {target} after {MOVE_WAIT_S:g} s")
        time.sleep(MOVE_POLL_S)
        try:
            status = stub.GetMove(cpb.MoveRequest(pool=pool), metadata=conn.metadata, timeout=10.0)
        except grpc.RpcError as error:
            if error.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION):
                raise from_rpc(error, "move status") from None
    return status
