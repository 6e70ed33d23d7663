"""The shape of a local cluster: its options, its shards, and the configuration its servers read.

Naming (stable, so scripts and docs can rely on it):

* shards are ``s1`` .. ``sN`` with numbers 1 .. N;
* shard ``s1`` serves the pool ``default`` (what clients use when they name no pool); shard ``si``
  for i >= 2 serves the pool ``pool{i}`` (``pool2``, ``pool3``, ...);
* replicas of a shard are ``{shard}-r1`` .. ``{shard}-rR``;
* shard ``si``'s endpoint is ``http://127.0.0.1:{base + 2*(i-1)}`` (gRPC) and its HTTP gateway
  the next port; with ``base_port = 0`` every endpoint gets a free port instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "DEFAULT_STATE_DIR",
    "ROLES",
    "URL_ENV",
    "ClusterOptions",
    "OptionsError",
    "Placement",
    "ShardPlan",
    "pools_of_shard",
    "render_config",
    "shard_name",
    "token_env",
]

DEFAULT_STATE_DIR = Path(".cronoq") / "cluster"
ROLES = ("client", "worker", "metrics", "admin")
URL_ENV = "DATABASE_URL"
"""The variable the servers read the Postgres URL from (set by the launcher in their environment)."""
HOST = "127.0.0.1"
MAX_SHARDS = 255
MAX_REPLICAS = 16
_SCHEMA_PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")


class OptionsError(ValueError):
    """Options that cannot make a cluster; the message says which and why."""


def token_env(role: str) -> str:
    """The environment variable holding the bearer token of ``role``."""
    return f"CRONOQ_{role.upper()}_TOKEN"


def shard_name(number: int) -> str:
    return f"s{number}"


def pools_of_shard(number: int, count: int = 1) -> tuple[str, ...]:
    """Shard ``number``'s pools: its first, then ``count - 1`` more named ``s{number}p{i}``."""
    first = "default" if number == 1 else f"pool{number}"
    return (first, *(f"s{number}p{index}" for index in range(2, count + 1)))


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a replica runs when not on loopback (the chaos drills' network namespaces): the
    address it listens on, and the command prefix that starts it there (``ip netns exec NAME``)."""

    host: str
    prefix: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """What ``cronoq cluster up`` starts. ``validate()`` explains every unusable value."""

    shards: int = 2
    replicas: int = 2
    dsn: str | None = field(default=None, repr=False)
    """Postgres URL: one schema per shard. ``None`` keeps each shard in a SQLite file."""
    state: Path = DEFAULT_STATE_DIR
    base_port: int = 7070
    """First endpoint port; 0 picks free ports."""
    schema_prefix: str = "cronoq_"
    """Postgres schemas are ``{schema_prefix}{shard}``."""
    proxy: bool = True
    """Front each shard with a leader-following TCP proxy on its endpoint. Without it (one replica
    per shard only) the endpoint is the server's own listener: one hop less, for benchmarks."""
    pools_per_shard: int = 1
    """Pools each shard starts with (``pools_of_shard``); the pool-move drill needs two."""
    pool_max: int = 64
    """Each pool's ``max``: the autoscaler's bound and the most slots one worker is granted."""
    limits: Mapping[str, int | float] = field(default_factory=dict)
    """Extra ``[limits]`` keys, written as given (the server validates them)."""
    pool_settings: Mapping[str, int | float] = field(default_factory=dict)
    """Extra keys of every ``[[pools]]`` entry (e.g. ``lease_ttl_s`` for the chaos drills), written
    as given (the server validates them)."""
    shutdown_grace_s: float = 2.0
    """``server.shutdown_grace_s``: short, since a local cluster is stopped by hand."""
    server_env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment of the server processes (e.g. ``CRONOQ_LOG``)."""
    restart: bool = True
    """Start a replica again (same ports, same store: it rejoins as a standby) when it exits
    without being asked to, with exponential backoff. Off: a dead replica stays dead, as drills
    that assert on a killed server need (``cronoq cluster up --no-restart``)."""
    grpc_web: bool = False
    """Serve gRPC-Web (``[server.grpc_web]``) on every server, for pages served from any shard's
    HTTP endpoint (127.0.0.1 and localhost)."""
    console: bool = False
    """Serve the web console (``[server.console]``) at ``/ui/`` of every server's HTTP listener."""
    store_settings: Mapping[str, int | float] = field(default_factory=dict)
    """Extra ``[store]`` keys (e.g. a short ``lease_ttl_s`` for failover tests), written as given
    (the server validates them)."""
    insecure_peer_http: bool = False
    """``server.insecure_peer_http``: forward calls over plain http:// to endpoints not on
    loopback (the chaos drills' private network of namespaces)."""
    placements: Mapping[str, Placement] = field(default_factory=dict)
    """By replica name (``s1-r1``): where that replica runs; by shard name (``s1``): the address
    its endpoint listens on (no prefix). Others stay on 127.0.0.1."""

    def validate(self) -> None:
        problems = []
        if not 1 <= self.shards <= MAX_SHARDS:
            problems.append(f"--shards must be between 1 and {MAX_SHARDS}, got {self.shards}")
        if not 1 <= self.replicas <= MAX_REPLICAS:
            problems.append(f"--replicas must be between 1 and {MAX_REPLICAS}, got {self.replicas}")
        if self.base_port != 0 and not 1024 <= self.base_port <= 65535 - 2 * max(self.shards, 1):
            problems.append(
                f"--base-port must be 0 (free ports) or leave room for {2 * self.shards} ports "
                f"between 1024 and 65535, got {self.base_port}"
            )
        if not self.proxy and self.replicas != 1:
            problems.append("running without proxies needs exactly one replica per shard")
        if not _SCHEMA_PREFIX.fullmatch(self.schema_prefix):
            problems.append(
                f"--schema-prefix {self.schema_prefix!r} must be letters, digits and underscores "
                "(not starting with a digit, at most 41 characters)"
            )
        if self.dsn is not None and not self.dsn.startswith(("postgres://", "postgresql://")):
            problems.append("--dsn must be a postgres:// or postgresql:// URL")
        if not 1 <= self.pools_per_shard <= 16:
            problems.append(f"pools_per_shard must be between 1 and 16, got {self.pools_per_shard}")
        if self.pool_max < 1:
            problems.append(f"pool_max must be at least 1, got {self.pool_max}")
        if problems:
            raise OptionsError("; ".join(problems))

    @property
    def store_kind(self) -> str:
        return "sqlite" if self.dsn is None else "postgres"

    def endpoint_ports(self, number: int) -> tuple[int, int]:
        """The (gRPC, HTTP) endpoint ports of shard ``number`` under ``base_port`` (0, 0 for free)."""
        if self.base_port == 0:
            return 0, 0
        grpc_port = self.base_port + 2 * (number - 1)
        return grpc_port, grpc_port + 1


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """One shard once its endpoint ports are bound."""

    name: str
    number: int
    pools: tuple[str, ...]
    grpc_port: int
    http_port: int
    host: str = HOST

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.grpc_port}"

    @property
    def grpc_target(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"


def _toml_str(text: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(text)


def _toml_value(value: int | float) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise OptionsError(f"limits values must be numbers, got {value!r}")
    return repr(value)


def render_config(options: ClusterOptions, shards: Sequence[ShardPlan], *, state_dir: Path, comment: str,
                  replicas: Mapping[str, Sequence[str]] | None = None) -> str:  # fmt: skip
    """The one TOML file every server of the cluster reads. It names no listener addresses: each
    replica gets its own with ``--grpc-addr`` / ``--http-addr`` (and its shard with ``--shard``).
    ``replicas``: each shard's replica endpoints, listed so the console shows them."""
    lines = [f"# {line}" if line else "#" for line in comment.splitlines()]
    lines += [
        "",
        "[server]",
        f"shutdown_grace_s = {options.shutdown_grace_s!r}",
        *(["insecure_peer_http = true"] if options.insecure_peer_http else []),
        "",
    ]
    for role in ROLES:
        lines += ["[[auth.tokens]]", f'token_env = "{token_env(role)}"', f'role = "{role}"', ""]
    lines.append("[store]")
    if options.dsn is None:
        lines += ['kind = "sqlite"', f"path = {_toml_str(str(state_dir / '{shard}.db'))}"]
    else:
        lines += ['kind = "postgres"', f'url_env = "{URL_ENV}"', f'schema = "{options.schema_prefix}{{shard}}"']
    lines += [f"{key} = {_toml_value(value)}" for key, value in sorted(options.store_settings.items())]
    lines.append("")
    if options.console:
        lines += ["[server.console]", "enabled = true", ""]
    if options.grpc_web:
        origins = [f"http://{host}:{shard.http_port}" for shard in shards for host in (HOST, "localhost")]
        allowed = ", ".join(_toml_str(origin) for origin in origins)
        lines += ["[server.grpc_web]", f"allowed_origins = [{allowed}]", ""]
    if options.limits:
        lines.append("[limits]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in sorted(options.limits.items())]
        lines.append("")
    for shard in shards:
        for pool in shard.pools:
            lines += ["[[pools]]", f'name = "{pool}"', f"max = {options.pool_max}"]
            lines += [f"{key} = {_toml_value(value)}" for key, value in sorted(options.pool_settings.items())]
            lines.append("")
    for shard in shards:
        pools = ", ".join(f'"{pool}"' for pool in shard.pools)
        lines += [
            "[[shards]]",
            f'name = "{shard.name}"',
            f"number = {shard.number}",
            f"pools = [{pools}]",
            f'endpoint = "{shard.endpoint}"',
        ]
        listed = (replicas or {}).get(shard.name)
        if listed:
            lines.append(f"replicas = [{', '.join(_toml_str(endpoint) for endpoint in listed)}]")
        lines += [
            "",
        ]
    return "\n".join(lines)
