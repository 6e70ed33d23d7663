"""deploy/cronoq.example.toml must load, validate, and mention every key of the schema."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
from cronoq.config import (
    CertSpec,
    Config,
    ConfigError,
    ConsoleConfig,
    GrpcWebConfig,
    LimitsConfig,
    MemoryStoreConfig,
    OutputsConfig,
    PeerTlsConfig,
    PoolSection,
    PostgresStoreConfig,
    RetrySection,
    Role,
    SemaphoreResource,
    ServerConfig,
    ShardSection,
    SqliteStoreConfig,
    TlsConfig,
    TokenBucketResource,
    WebhookScaler,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "cronoq.example.toml"
ROLES = ("CLIENT", "WORKER", "METRICS", "ADMIN")
ENV = {f"CRONOQ_{role}_TOKEN": f"{role.lower()}-{'0123456789abcdef' * 3}" for role in ROLES}


def test_example_loads_and_validates_without_warnings() -> None:
    config = Config.load(EXAMPLE, env=ENV)
    assert config.validate() == []
    assert config.warnings == []
    assert [token.role for token in config.auth.tokens] == [Role.CLIENT, Role.WORKER, Role.METRICS, Role.ADMIN]
    assert [token.env for token in config.auth.tokens] == [f"CRONOQ_{role}_TOKEN" for role in ROLES]
    assert isinstance(config.store, MemoryStoreConfig)
    assert [pool.name for pool in config.pools] == ["default", "llm"]
    assert config.limits == LimitsConfig()  # the file shows the defaults
    assert config.outputs == OutputsConfig()


def test_example_in_check_mode_needs_no_secrets() -> None:
    config = Config.load(EXAMPLE, env={}, resolve_env=False)
    assert all(token.digest is None for token in config.auth.tokens)


def test_example_names_the_variables_it_needs_when_they_are_missing() -> None:
    with pytest.raises(ConfigError) as info:
        Config.load(EXAMPLE, env={})
    assert [error.split(":")[0] for error in info.value.errors] == [f"auth.tokens[{i}].token_env" for i in range(4)]


def mentioned_keys(text: str) -> set[str]:
    """Keys the example shows, set or commented out: ``key =`` lines, inline tables, headers."""
    keys = set(re.findall(r"^#?\s*([a-z_]+)\s*=", text, flags=re.MULTILINE))
    keys |= set(re.findall(r"[{,]\s*([a-z_]+)\s*=", text))
    for header in re.findall(r"^#?\s*\[\[?([a-z_.]+)\]\]?", text, flags=re.MULTILINE):
        keys |= set(header.split("."))
    return keys


def test_example_mentions_every_key() -> None:
    classes: list[type] = [
        ServerConfig,
        TlsConfig,
        PeerTlsConfig,
        GrpcWebConfig,
        ConsoleConfig,
        LimitsConfig,
        PoolSection,
        RetrySection,
        WebhookScaler,
        SemaphoreResource,
        TokenBucketResource,
        ShardSection,
        OutputsConfig,
        SqliteStoreConfig,
        PostgresStoreConfig,
        CertSpec,
    ]
    expected = {spec.name for cls in classes for spec in fields(cls)}
    expected |= {
        "server",
        "auth",
        "tokens",
        "certs",
        "token_env",
        "store",
        "limits",
        "pools",
        "resources",
        "outputs",
        "shards",
        "kind",
    }
    # A literal `token` is described in prose only (tokens belong in the environment); a webhook's
    # `token` field holds the value read from its token_env and is not a key.
    expected.discard("token")
    expected.discard("retired_keys")  # not a key: which retired keys the file still set
    missing = sorted(expected - mentioned_keys(EXAMPLE.read_text(encoding="utf-8")))
    assert missing == [], f"keys not described in {EXAMPLE.name}: {missing}"


def test_key_detection_notices_a_missing_key() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert "cooldown_s" in mentioned_keys(text)
    assert "cooldown_s" not in mentioned_keys(text.replace("cooldown_s", "cool_s"))
