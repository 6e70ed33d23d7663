"""``cronoq admin``: operating a sharded cluster.

``cronoq admin topology`` shows where every shard's durable record places each pool, at which
version (``docs/pool-moves.md``), and says where shards, or a shard and its configuration file,
disagree.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import console_pb2_grpc as cpbg
from cronoq.proto import cronoq_pb2 as pb

from .commands import call, warn_shards
from .connection import Connection
from .exits import Exit
from .text import Out

__all__ = ["disagreements", "topology"]


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
    response: cpb.ListShardsResponse = call(conn, cpbg.ConsoleStub(conn.channel).ListShards, pb.Empty(),  # type: ignore[no-untyped-call]
                                            "list the shards")  # fmt: skip
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
