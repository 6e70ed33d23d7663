"""What a server routes by: its shard's durable pool placements (``docs/pool-moves.md``).

Before a sharded server builds its engine it reads the placements its shard's store holds (the
file's are written there at first start); the record wins over the file, and every difference is
logged as one sentence. A memory store keeps nothing, so the file is used as it is.
"""

from __future__ import annotations

import asyncio
import logging

from cronoq.cluster.topology import Topology
from cronoq.config import Config, MemoryStoreConfig
from cronoq.stores.base import Store, Unavailable
from cronoq.stores.placements import load_placements

__all__ = ["adopt_placements"]

log = logging.getLogger("cronoq.server")


async def adopt_placements(config: Config, store: Store) -> tuple[Config, Topology, list[str]]:
    """``config`` as placed by ``store``'s record (opened here), the topology, and the differences
    between the file and the record."""
    if not config.sharded or isinstance(config.store, MemoryStoreConfig):
        return config, Topology.from_config(config), []
    file = Topology.from_config(config)
    delay = 0.5
    while True:
        try:
            await store.open()
            record = await load_placements(store, file.record())
            break
        except Unavailable as exc:
            # As a standby waits for leadership: the store may come back.
            log.warning("topology: cannot read the shard's placements yet (%s); retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
    topology, differences = Topology.adopt(config, record)
    for difference in differences:
        log.warning("topology: %s", difference)
    return topology.apply(config), topology, differences
