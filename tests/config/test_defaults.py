"""Defaults: what the server runs with when a file (or a key) is absent."""

from __future__ import annotations

from cronoq.config import (
    MIB,
    Config,
    ExternalScaler,
    LimitsConfig,
    MemoryStoreConfig,
    OutputsConfig,
    Overflow,
    PoolSection,
    PostgresStoreConfig,
    RetrySection,
    ServerConfig,
    SqliteStoreConfig,
)

from .helpers import assert_loads


def test_default_config_is_one_pool_memory_store_no_auth_loopback() -> None:
    config = Config.default()
    assert [pool.name for pool in config.pools] == ["default"]
    assert isinstance(config.store, MemoryStoreConfig)
    assert not config.auth.enabled
    assert config.server.grpc_addr == "127.0.0.1:7070"
    assert config.server.http_addr == "127.0.0.1:7071"
    assert config.resources == () and config.shards == ()
    assert config.validate() == []
    assert config.warnings == []


def test_empty_file_equals_default() -> None:
    assert assert_loads("", env={}) == Config.default()


def test_empty_tables_equal_default() -> None:
    text = "[server]\n[auth]\n[limits]\n[outputs]\n"
    assert assert_loads(text, env={}) == Config.default()


def test_server_defaults() -> None:
    server = ServerConfig()
    assert server.metrics_addr is None
    assert server.tls is None and server.peer_tls is None and server.grpc_web is None
    assert server.insecure_no_auth is False
    assert server.shutdown_grace_s == 10.0
    assert server.shard is None
    assert server.insecure_peer_http is False


def test_limits_defaults() -> None:
    limits = LimitsConfig()
    assert limits.max_tasks_per_batch == 1000
    assert limits.max_pending_total == 1_000_000
    assert limits.max_pending_per_pool == 100_000
    assert limits.max_message_bytes == 16 * MIB
    assert limits.max_http_body_bytes == 16 * MIB
    assert limits.max_key_len == 256
    assert limits.max_kind_len == 128
    assert limits.max_tags == 64
    assert limits.max_tag_len == 1024
    assert limits.max_deps == 256
    assert limits.max_resources == 16
    assert limits.max_wait_s == 300.0
    assert limits.request_timeout_s == 30.0
    assert limits.max_concurrent_requests == 1024
    assert limits.max_concurrent_streams == 256
    assert limits.max_slots_per_worker == 256
    assert limits.keepalive_interval_s == 20.0
    assert limits.keepalive_timeout_s == 20.0
    assert limits.key_retention_s == 3600.0
    assert limits.key_retention_max == 1_000_000
    assert limits.max_list == 1000


LISTENER_LIMITS = {
    "max_connections": 4096,
    "max_concurrent_requests_per_caller": 256,
    "max_streams_per_caller": 1024,
    "header_timeout_s": 10.0,
    "idle_timeout_s": 300.0,
    "max_header_bytes": 16384,
    "max_headers": 100,
    "max_stream_resets_per_s": 100,
    "write_stall_timeout_s": 30.0,
}
"""Keys of ours beside the published ones: the bounds of the listeners (issue 14)."""


def test_limits_has_the_21_published_keys_plus_the_listener_bounds() -> None:
    names = list(LimitsConfig.__dataclass_fields__)
    assert len(names) == 21 + len(LISTENER_LIMITS)
    limits = LimitsConfig()
    assert {name: getattr(limits, name) for name in LISTENER_LIMITS} == LISTENER_LIMITS


def test_pool_defaults() -> None:
    pool = assert_loads('[[pools]]\nname = "p"\n', env={}).pools[0]
    assert pool == PoolSection("p")
    assert (pool.min, pool.max, pool.autoscale) == (1, 10, True)
    assert pool.scaler == ExternalScaler()
    assert pool.lease_ttl_s == 30.0
    assert pool.overflow is Overflow.WAIT
    assert pool.retry is None and pool.max_pending is None
    assert pool.fair_share is False and dict(pool.tenant_weights) == {}
    assert not pool.fair
    limits = LimitsConfig()
    assert pool.pending_bound(limits) == 100_000
    assert pool.slots_cap(limits) == 10  # capped by max


def test_retry_keys_default_individually() -> None:
    text = '[[pools]]\nname = "p"\nretry = { max_attempts = 7 }\n'
    assert assert_loads(text, env={}).pools[0].retry == RetrySection(max_attempts=7)
    assert RetrySection() == RetrySection(3, 1.0, 2.0, 60.0, True)


def test_store_defaults() -> None:
    sqlite = assert_loads('[store]\nkind = "sqlite"\npath = "/tmp/x.db"\n', env={}).store
    assert sqlite == SqliteStoreConfig(path="/tmp/x.db", keep_finished_s=604800.0)
    postgres = assert_loads('[store]\nkind = "postgres"\n', env={"DATABASE_URL": "postgres://localhost/db"}).store
    assert isinstance(postgres, PostgresStoreConfig)
    assert postgres.url_env == "DATABASE_URL"
    assert postgres.url == "postgres://localhost/db"
    assert postgres.keep_finished_s == 604800.0
    assert postgres.schema is None


def test_outputs_defaults() -> None:
    assert OutputsConfig() == OutputsConfig(cache_entries=1024, cache_bytes=64 * MIB, info_entries=100_000)


def test_store_namespace_defaults() -> None:
    pg = Config.parse('[store]\nkind = "postgres"\n', env={"DATABASE_URL": "postgres://localhost/db"})
    assert pg.store_namespace() == "public"
    assert Config.default().store_namespace() is None
