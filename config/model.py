"""``Config``: the whole cronoq-server configuration, how to load it, and the questions the
server asks of it (which pools are mine, which shard serves a pool, which schema do I use)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .auth import AuthConfig
from .schema import (
    DEFAULT_POOL,
    DEFAULT_SHARDED_SCHEMA,
    DEFAULT_UNSHARDED_SCHEMA,
    SHARD_PLACEHOLDER,
    LimitsConfig,
    MemoryStoreConfig,
    OutputsConfig,
    PoolSection,
    PostgresStoreConfig,
    ResourceSection,
    ServerConfig,
    ShardSection,
    SqliteStoreConfig,
    StoreConfig,
)

__all__ = ["Config"]


def _default_pools() -> tuple[PoolSection, ...]:
    return (PoolSection(DEFAULT_POOL),)


@dataclass(frozen=True, slots=True)
class Config:
    """The parsed TOML file. Build one with ``parse``, ``load`` or ``default``.

    Loading options (the same for ``parse``, ``read`` and ``load``):

    ``env``
        Where ``token_env``, ``url_env`` and a webhook's ``token_env`` are looked up
        (default ``os.environ``).
    ``shard_override``
        The value of ``--shard`` / ``CRONOQ_SHARD``; replaces ``server.shard``.
    ``insecure_no_auth``
        ``--insecure-no-auth``; the loaded ``server.insecure_no_auth`` is true if either is.
    ``listen_overrides``
        ``--grpc-addr`` / ``--http-addr`` / ``--metrics-addr``: ``{"grpc_addr": "127.0.0.1:9000"}``
        and so on replace those ``[server]`` addresses before validation, so every rule (IP:PORT,
        loopback only without credentials, no two listeners on one address) applies to them too.
    ``resolve_env``
        ``False`` for ``--check``: variable names are checked but not read, so a configuration
        can be validated where its secrets are not available. Tokens from the environment then
        have no digest and match nothing: never serve with such a configuration.
    """

    server: ServerConfig = field(default_factory=ServerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    store: StoreConfig = field(default_factory=MemoryStoreConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    pools: tuple[PoolSection, ...] = field(default_factory=_default_pools)
    resources: tuple[ResourceSection, ...] = ()
    outputs: OutputsConfig = field(default_factory=OutputsConfig)
    shards: tuple[ShardSection, ...] = ()

    # ----------------------------------------------------------------------------------- loading

    @classmethod
    def default(cls) -> Config:
        """What the server runs without a file: one pool ``default``, in-memory state, no
        credentials, listeners on 127.0.0.1."""
        return cls()

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        env: Mapping[str, str] | None = None,
        shard_override: str | None = None,
        insecure_no_auth: bool = False,
        resolve_env: bool = True,
        listen_overrides: Mapping[str, str] | None = None,
    ) -> Config:
        """Parse and validate TOML text. Raises ``ConfigError`` listing every problem."""
        from .load import build

        return build(
            text,
            env=os.environ if env is None else env,
            shard_override=shard_override,
            insecure_no_auth=insecure_no_auth,
            resolve_env=resolve_env,
            listen_overrides=listen_overrides,
            validate=True,
        )

    @classmethod
    def read(
        cls,
        text: str,
        *,
        env: Mapping[str, str] | None = None,
        shard_override: str | None = None,
        insecure_no_auth: bool = False,
        resolve_env: bool = True,
        listen_overrides: Mapping[str, str] | None = None,
    ) -> Config:
        """Like ``parse`` but without the semantic checks of ``validate``: only TOML syntax,
        unknown keys, value types, required keys and environment variables are checked."""
        from .load import build

        return build(
            text,
            env=os.environ if env is None else env,
            shard_override=shard_override,
            insecure_no_auth=insecure_no_auth,
            resolve_env=resolve_env,
            listen_overrides=listen_overrides,
            validate=False,
        )

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        env: Mapping[str, str] | None = None,
        shard_override: str | None = None,
        insecure_no_auth: bool = False,
        resolve_env: bool = True,
        listen_overrides: Mapping[str, str] | None = None,
    ) -> Config:
        """Read the file at ``path``, then ``parse`` it."""
        from .load import build, read_text

        return build(
            read_text(path),
            env=os.environ if env is None else env,
            shard_override=shard_override,
            insecure_no_auth=insecure_no_auth,
            resolve_env=resolve_env,
            listen_overrides=listen_overrides,
            validate=True,
            source=os.fspath(path),
        )

    def validate(self) -> list[str]:
        """Every rule this configuration breaks, one ``"key.path: problem"`` line each."""
        from .validate import validate

        return validate(self)

    @property
    def warnings(self) -> list[str]:
        """Problems worth a log line that do not stop the server: tokens shorter than 32
        characters, a remote Postgres URL without ``sslmode=verify-full``, plain-http webhooks
        and shard endpoints, authentication switched off on a public listener."""
        from .validate import warnings

        return warnings(self)

    def to_toml(self) -> str:
        """This configuration as TOML that loads back to an equal ``Config``.

        Tokens written in the original file cannot be written back (only digests are kept):
        ``ValueError`` then. Tokens and URLs from the environment are written as their variable.
        """
        from .dump import dump

        return dump(self)

    def file_errors(self) -> list[str]:
        """The TLS files named in ``[server.tls]`` / ``[server.peer_tls]`` that cannot be read.

        Not part of ``validate`` (files may only exist where the server runs); the server calls
        this at startup."""
        from .validate import file_errors

        return file_errors(self)

    # ---------------------------------------------------------------------------------- queries

    @property
    def sharded(self) -> bool:
        return bool(self.shards)

    def pool(self, name: str) -> PoolSection:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    def shard(self, name: str) -> ShardSection:
        for shard in self.shards:
            if shard.name == name:
                return shard
        raise KeyError(name)

    def shard_by_number(self, number: int) -> ShardSection:
        for shard in self.shards:
            if shard.number == number:
                return shard
        raise KeyError(number)

    def local_shard(self) -> ShardSection | None:
        """This server's shard; ``None`` when the deployment is not sharded."""
        if not self.shards or self.server.shard is None:
            return None
        return self.shard(self.server.shard)

    def shard_number(self) -> int:
        """The number in the top 8 bits of this server's task ids: 0 when not sharded."""
        local = self.local_shard()
        return 0 if local is None else local.number

    def shard_of_pool(self, pool: str) -> ShardSection | None:
        """The shard serving ``pool``; ``None`` when not sharded. ``KeyError`` for an unknown pool."""
        self.pool(pool)
        for shard in self.shards:
            if pool in shard.pools:
                return shard
        if self.shards:
            raise KeyError(pool)
        return None

    def shard_of_resource(self, resource: str) -> ShardSection | None:
        """The shard owning ``resource``; ``None`` when not sharded. ``KeyError`` if unknown."""
        for res in self.resources:
            if res.name == resource:
                if not self.shards:
                    return None
                if res.shard is None:
                    raise KeyError(resource)
                return self.shard(res.shard)
        raise KeyError(resource)

    def is_local_pool(self, pool: str) -> bool:
        local = self.local_shard()
        return local is None or pool in local.pools

    def local_pools(self) -> tuple[PoolSection, ...]:
        """The pools this server runs: its shard's, or all of them when not sharded."""
        local = self.local_shard()
        if local is None:
            return self.pools
        return tuple(pool for pool in self.pools if pool.name in local.pools)

    def local_resources(self) -> tuple[ResourceSection, ...]:
        """The resources this server's engine owns: its shard's, or all when not sharded."""
        local = self.local_shard()
        if local is None:
            return self.resources
        return tuple(res for res in self.resources if res.shard == local.name)

    def peers(self) -> tuple[ShardSection, ...]:
        """The other shards."""
        return tuple(shard for shard in self.shards if shard.name != self.server.shard)

    def store_namespace(self, shard: str | None = None) -> str | None:
        """The Postgres schema or SQLite path of ``shard`` (default: this server's shard) with
        ``{shard}`` filled in; ``None`` for the memory store."""
        store = self.store
        name = self.server.shard if shard is None else shard
        if isinstance(store, PostgresStoreConfig):
            template = store.schema
            if template is None:
                template = DEFAULT_SHARDED_SCHEMA if self.shards else DEFAULT_UNSHARDED_SCHEMA
        elif isinstance(store, SqliteStoreConfig):
            template = store.path
        else:
            return None
        if name is not None and self.shards:
            return template.replace(SHARD_PLACEHOLDER, name)
        return template
