"""The pools a shard's leader runs: its shard's durable placements (``docs/pool-moves.md``).

Each time a server takes the lead, before its engine recovers the store, it reads the placements
its shard's store holds (the file's are written there when there are none yet). The record wins
over the file, and each difference is logged as one sentence; the server's API, router and engine
are then built from the placed configuration, so that the engine knows every pool whose tasks the
store holds for it. A memory store keeps nothing: the file is used as it is.
"""

from __future__ import annotations

import logging

from cronoq.cluster.topology import Topology
from cronoq.config import Config, MemoryStoreConfig
from cronoq.stores.base import Store
from cronoq.stores.placements import load_placements

__all__ = ["keeps_placements", "placed_config"]

log = logging.getLogger("cronoq.server")


def keeps_placements(config: Config) -> bool:
    """Whether the servers of ``config`` keep durable placements (sharded, on a durable store)."""
    return config.sharded and not isinstance(config.store, MemoryStoreConfig)


async def placed_config(file: Config, store: Store) -> tuple[Config, Topology]:
    """``file`` with each shard's pools as ``store``'s record places them, and that topology.
    The store must be led by the caller (its record may be seeded here)."""
    seed = Topology.from_config(file).record()
    record = await load_placements(store, seed)
    topology, differences = Topology.adopt(file, record)
    for difference in differences:
        log.warning("topology: %s", difference)
    return topology.apply(file), topology
