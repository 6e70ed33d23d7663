"""The pool → shard map as versioned data (``docs/pool-moves.md``, section 1).

A ``Placement`` says which shard serves a pool and at which version of that pool's line of owners;
versions are compared per pool only (a higher version is a later move). Every shard's store keeps
the placements it knows (``cronoq.stores.placements``); the configuration file seeds them at first
start and the durable record wins afterwards. A node routes by its ``Topology`` and learns newer
placements from the shard that refuses a call (``cronoq-topology-version``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cronoq.config import Config

__all__ = [
    "FIRST_VERSION",
    "MOVED_KEY",
    "POOL_KEY",
    "SHARD_KEY",
    "VERSION_KEY",
    "Placement",
    "Topology",
    "parse_version",
    "stale_placement",
]

FIRST_VERSION = 1
"""The version of a placement taken from the configuration file."""
MAX_VERSION = 2**62
"""Versions past this are refused as corrupt (a move adds one; nothing real comes near)."""
VERSION_KEY = "cronoq-topology-version"
"""Refusal metadata: the version of the placement the refusing shard holds for the pool."""
POOL_KEY = "cronoq-pool"
"""Refusal metadata: the pool the refusal is about."""
SHARD_KEY = "cronoq-shard"
MOVED_KEY = "cronoq-task-moved"
"""Refusal metadata: the id of a task that moved with its pool to the shard in ``cronoq-shard``."""


@dataclass(frozen=True, slots=True)
class Placement:
    shard: str
    version: int


def parse_version(text: str) -> int | None:
    """A version from refusal metadata (sent by a peer: never trusted), or None if not one."""
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        return None
    value = int(text)
    return value if FIRST_VERSION <= value <= MAX_VERSION else None


def stale_placement(metadata: Iterable[tuple[str, object]]) -> tuple[str, Placement] | None:
    """The (pool, placement) a stale-route refusal names, or None when ``metadata`` is not one."""
    found: dict[str, str] = {}
    for key, value in metadata:
        if key in (VERSION_KEY, POOL_KEY, SHARD_KEY) and isinstance(value, str):
            found[key] = value
    if len(found) != 3:
        return None
    version = parse_version(found[VERSION_KEY])
    if version is None:
        return None
    return found[POOL_KEY], Placement(found[SHARD_KEY], version)


class Topology:
    """One node's view of the placements: changed only by ``learn`` (newer versions win)."""

    __slots__ = ("_placements", "_shards", "differences")

    def __init__(self, placements: Mapping[str, Placement], shards: Iterable[str]) -> None:
        self._shards = frozenset(shards)
        self._placements = dict(placements)
        self.differences: dict[str, str] = {}
        """Per pool, how the record this topology was adopted from differs from the file."""

    @classmethod
    def from_config(cls, config: Config) -> Topology:
        """The file's placements, each at the first version."""
        placements = {pool: Placement(shard.name, FIRST_VERSION) for shard in config.shards for pool in shard.pools}
        return cls(placements, (shard.name for shard in config.shards))

    @classmethod
    def adopt(cls, config: Config, record: Mapping[str, tuple[str, int]]) -> tuple[Topology, list[str]]:
        """The topology a node routes by, given its shard's durable ``record``: the record's
        placement of every pool the file knows, the file's for pools the record lacks. Also the
        differences between file and record, one sentence each, and the record's entries that
        cannot be used (an unknown shard or pool: reported, the file's placement kept)."""
        file = cls.from_config(config)
        placements = dict(file._placements)
        notes: dict[str, str] = {}
        for pool in sorted(record):
            shard, version = record[pool]
            if pool not in placements:
                notes[pool] = (
                    f"pool {pool!r}: the durable record (version {version}) places it on shard {shard!r}, "
                    f"but the file has no such pool; ignored"
                )
                continue
            if shard not in file._shards:
                notes[pool] = (
                    f"pool {pool!r}: the durable record (version {version}) places it on shard {shard!r}, "
                    f"which the file does not define; the file's shard {placements[pool].shard!r} is used"
                )
                continue
            if shard != placements[pool].shard:
                notes[pool] = (
                    f"pool {pool!r}: the file places it on shard {placements[pool].shard!r}, the durable "
                    f"record (version {version}) on shard {shard!r}; the record wins"
                )
            placements[pool] = Placement(shard, version)
        topology = cls(placements, file._shards)
        topology.differences = notes
        return topology, list(notes.values())

    def copy(self) -> Topology:
        return Topology(self._placements, self._shards)

    @property
    def version(self) -> int:
        """The highest placement version known (0 for an unsharded deployment)."""
        return max((placement.version for placement in self._placements.values()), default=0)

    def placement(self, pool: str) -> Placement | None:
        return self._placements.get(pool)

    def pools_of(self, shard: str) -> tuple[str, ...]:
        return tuple(pool for pool, placement in self._placements.items() if placement.shard == shard)

    def placements(self) -> dict[str, Placement]:
        return dict(self._placements)

    def record(self) -> dict[str, tuple[str, int]]:
        """The placements in the form the stores keep."""
        return {pool: (p.shard, p.version) for pool, p in self._placements.items()}

    def learn(self, pool: str, placement: Placement) -> bool:
        """Take ``placement`` if it is newer than the one held for a known pool and names a known
        shard; whether it was taken."""
        held = self._placements.get(pool)
        if held is None or placement.shard not in self._shards or placement.version <= held.version:
            return False
        self._placements[pool] = placement
        return True

    def apply(self, config: Config) -> Config:
        """``config`` with each shard's ``pools`` as placed here (what the server builds from)."""
        shards = tuple(dataclasses.replace(shard, pools=self.pools_of(shard.name)) for shard in config.shards)
        return dataclasses.replace(config, shards=shards)
