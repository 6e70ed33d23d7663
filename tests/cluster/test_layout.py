"""What ``cronoq cluster up`` writes before it starts anything: the configuration and the tokens."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cronoq.cluster.layout import ClusterOptions, OptionsError, ShardPlan, pools_of_shard, render_config
from cronoq.cluster.tokens import load_or_create_tokens, read_tokens
from cronoq.config import Config, PostgresStoreConfig, SqliteStoreConfig

TOKENS = {
    f"CRONOQ_{role}_TOKEN": f"{role.lower()}-token-0123456789abcdef0123456789"
    for role in ("CLIENT", "WORKER", "METRICS", "ADMIN")
}


def _plans(count: int, base: int = 7070) -> list[ShardPlan]:
    return [
        ShardPlan(f"s{n}", n, pools_of_shard(n), base + 2 * (n - 1), base + 2 * (n - 1) + 1)
        for n in range(1, count + 1)
    ]


def test_the_sqlite_config_is_valid_for_every_shard(tmp_path: Path) -> None:
    options = ClusterOptions(shards=3, replicas=2, state=tmp_path)
    text = render_config(options, _plans(3), state_dir=tmp_path, comment="x")
    # One file for every replica: the listeners come from each replica's --grpc-addr/--http-addr.
    assert "grpc_addr" not in text and "http_addr" not in text
    for index, shard in enumerate(("s1", "s2", "s3")):
        listeners = {"grpc_addr": f"127.0.0.1:{40000 + 2 * index}", "http_addr": f"127.0.0.1:{40001 + 2 * index}"}
        config = Config.parse(text, env=TOKENS, shard_override=shard, listen_overrides=listeners)
        assert config.server.grpc_addr == listeners["grpc_addr"]
        assert config.server.http_addr == listeners["http_addr"]
        assert isinstance(config.store, SqliteStoreConfig)
        assert config.store_namespace() == str(tmp_path / f"{shard}.db")
    config = Config.parse(text, env=TOKENS, shard_override="s3")
    assert [pool.name for pool in config.local_pools()] == ["pool3"]
    assert config.shard_of_pool("default") is not None and config.shard_of_pool("default").name == "s1"
    assert config.shard("s2").endpoint == "http://127.0.0.1:7072"
    assert config.warnings == []


def test_the_postgres_config_uses_one_schema_per_shard(tmp_path: Path) -> None:
    options = ClusterOptions(shards=2, dsn="postgresql://u@127.0.0.1/db", schema_prefix="t1_", state=tmp_path)
    text = render_config(options, _plans(2), state_dir=tmp_path, comment="")
    assert "postgresql://" not in text  # the URL reaches the servers through their environment only
    config = Config.parse(text, env={**TOKENS, "DATABASE_URL": "postgresql://u@127.0.0.1/db"}, shard_override="s2")
    assert isinstance(config.store, PostgresStoreConfig)
    assert config.store_namespace() == "t1_s2"


def test_options_are_checked_all_at_once() -> None:
    with pytest.raises(OptionsError) as problem:
        ClusterOptions(shards=300, replicas=0, base_port=80, schema_prefix="1bad", proxy=False).validate()
    message = str(problem.value)
    for expected in ("--shards", "--replicas", "--base-port", "--schema-prefix", "one replica per shard"):
        assert expected in message


def test_tokens_are_private_and_kept_across_runs(tmp_path: Path) -> None:
    path = tmp_path / "tokens.env"
    first = load_or_create_tokens(path)
    assert sorted(first) == sorted(TOKENS)
    assert len(set(first.values())) == 4 and all(len(token) >= 32 for token in first.values())
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert all(line.startswith("export CRONOQ_") for line in path.read_text().splitlines())
    os.chmod(path, 0o644)
    assert load_or_create_tokens(path) == first == read_tokens(path)
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_shards_on_a_private_network_forward_over_plain_http_only_when_told(tmp_path: Path) -> None:
    plans = [
        ShardPlan(f"s{n}", n, pools_of_shard(n), 7070 + 2 * (n - 1), 7071 + 2 * (n - 1), f"10.213.7.{200 + n}")
        for n in (1, 2)
    ]
    assert plans[1].endpoint == "http://10.213.7.202:7072" and plans[1].grpc_target == "10.213.7.202:7072"
    listeners = {"grpc_addr": "10.213.7.10:40000", "http_addr": "10.213.7.10:40001"}
    for trusted in (False, True):
        options = ClusterOptions(shards=2, state=tmp_path, insecure_peer_http=trusted)
        text = render_config(options, plans, state_dir=tmp_path, comment="x")
        config = Config.parse(text, env=TOKENS, shard_override="s1", listen_overrides=listeners)
        assert config.server.insecure_peer_http is trusted
        # Without it, the other shard's endpoint is named in a warning: calls for it are refused, not forwarded.
        assert any("shards[1].endpoint" in line for line in config.warnings) is not trusted
