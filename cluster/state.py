"""``<state>/cluster.json``: what a running ``up`` started, for ``status`` and ``down``.

It names the launcher process and every server process with its start time (so a pid reused by
an unrelated process is never mistaken for ours), each shard's endpoint and each replica's ports
and log. ``up`` writes it once every shard leads and removes it when it stops.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["STATE_FILE", "ClusterState", "ReplicaState", "ShardState", "StateError"]

STATE_FILE = "cluster.json"
_VERSION = 1


class StateError(Exception):
    """The state file exists but cannot be used."""


@dataclass(frozen=True, slots=True)
class ReplicaState:
    name: str
    pid: int
    start_ticks: int | None
    grpc_port: int
    http_port: int
    log: str
    restarts: int = 0
    """How often the launcher started this replica again after it died."""


@dataclass(frozen=True, slots=True)
class ShardState:
    name: str
    number: int
    pools: tuple[str, ...]
    endpoint: str
    http: str
    replicas: tuple[ReplicaState, ...]


@dataclass(frozen=True, slots=True)
class ClusterState:
    pid: int
    start_ticks: int | None
    state_dir: str
    config: str
    tokens: str
    store: str
    shards: tuple[ShardState, ...] = field(default_factory=tuple)

    def write(self, directory: Path) -> Path:
        path = directory / STATE_FILE
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps({"version": _VERSION, **asdict(self)}, indent=2) + "\n")
        os.replace(temporary, path)
        return path

    @classmethod
    def read(cls, directory: Path) -> ClusterState | None:
        """The state in ``directory``; ``None`` when there is none."""
        path = directory / STATE_FILE
        try:
            raw: Any = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StateError(f"cannot read {path}: {exc}") from None
        try:
            if raw.get("version") != _VERSION:
                raise StateError(f"{path} has an unknown format version {raw.get('version')!r}")
            shards = tuple(
                ShardState(
                    name=shard["name"],
                    number=int(shard["number"]),
                    pools=tuple(shard["pools"]),
                    endpoint=shard["endpoint"],
                    http=shard["http"],
                    replicas=tuple(ReplicaState(**replica) for replica in shard["replicas"]),
                )
                for shard in raw["shards"]
            )
            return cls(
                pid=int(raw["pid"]),
                start_ticks=raw["start_ticks"],
                state_dir=raw["state_dir"],
                config=raw["config"],
                tokens=raw["tokens"],
                store=raw["store"],
                shards=shards,
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise StateError(f"{path} is malformed ({exc})") from None

    @staticmethod
    def remove(directory: Path) -> None:
        (directory / STATE_FILE).unlink(missing_ok=True)
