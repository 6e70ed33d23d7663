"""Sharded configurations: valid ones, the questions the server asks, and every refusal."""

from __future__ import annotations

import pytest
from cronoq.config import Config

from .helpers import assert_loads, assert_problem, problems

PG_ENV = {"DATABASE_URL": "postgres://cronoq@db.internal/cronoq?sslmode=verify-full"}

SHARDED = """
[server]
shard = "cpu"

[store]
kind = "postgres"

[[pools]]
name = "default"
[[pools]]
name = "reports"
[[pools]]
name = "llm"

[[resources]]
kind = "semaphore"
name = "db"
permits = 4
shard = "cpu"

[[resources]]
kind = "token_bucket"
name = "openai"
rate = 5
burst = 10
shard = "gpu"

[[shards]]
name = "cpu"
number = 1
pools = ["default", "reports"]
endpoint = "https://cpu.internal:7070"

[[shards]]
name = "gpu"
number = 7
pools = ["llm"]
endpoint = "https://gpu.internal:7070"
"""


def test_sharded_config_loads() -> None:
    config = assert_loads(SHARDED, env=PG_ENV)
    assert config.sharded
    assert config.warnings == []


def test_local_view_of_the_cpu_shard() -> None:
    config = assert_loads(SHARDED, env=PG_ENV)
    local = config.local_shard()
    assert local is not None and local.name == "cpu" and config.shard_number() == 1
    assert [pool.name for pool in config.local_pools()] == ["default", "reports"]
    assert [res.name for res in config.local_resources()] == ["db"]
    assert [shard.name for shard in config.peers()] == ["gpu"]
    assert config.is_local_pool("reports") and not config.is_local_pool("llm")
    assert config.store_namespace() == "cronoq_cpu"
    assert config.store_namespace("gpu") == "cronoq_gpu"


def test_shard_lookups() -> None:
    config = assert_loads(SHARDED, env=PG_ENV)
    gpu = config.shard_of_pool("llm")
    assert gpu is not None and gpu.name == "gpu" and gpu.endpoint == "https://gpu.internal:7070"
    assert config.shard_of_resource("openai") is gpu
    assert config.shard_by_number(7) is gpu and config.shard("gpu") is gpu
    with pytest.raises(KeyError):
        config.shard_of_pool("nope")
    with pytest.raises(KeyError):
        config.shard_of_resource("nope")
    with pytest.raises(KeyError):
        config.shard_by_number(3)


def test_unsharded_lookups() -> None:
    config = Config.default()
    assert config.shard_of_pool("default") is None
    assert config.local_shard() is None and config.shard_number() == 0
    assert config.local_pools() == config.pools
    assert config.is_local_pool("default")
    assert config.peers() == ()


def test_shard_override_replaces_server_shard() -> None:
    config = assert_loads(SHARDED, env=PG_ENV, shard_override="gpu")
    assert config.server.shard == "gpu"
    assert [pool.name for pool in config.local_pools()] == ["llm"]
    assert [res.name for res in config.local_resources()] == ["openai"]
    assert config.store_namespace() == "cronoq_gpu"
    no_shard_in_file = SHARDED.replace('shard = "cpu"\n\n[store]', "[store]")
    assert assert_loads(no_shard_in_file, env=PG_ENV, shard_override="cpu").server.shard == "cpu"
    assert_loads(SHARDED, env=PG_ENV, shard_override="")  # empty means "not given"


def test_explicit_schema_and_sqlite_path_get_the_shard_name() -> None:
    schema = assert_loads(
        SHARDED.replace('kind = "postgres"', 'kind = "postgres"\nschema = "jobs_{shard}_v1"'), env=PG_ENV
    )
    assert schema.store_namespace() == "jobs_cpu_v1"
    sqlite = assert_loads(SHARDED.replace('kind = "postgres"', 'kind = "sqlite"\npath = "/data/{shard}/state.db"'))
    assert sqlite.store_namespace() == "/data/cpu/state.db"
    memory = assert_loads(SHARDED.replace('kind = "postgres"', 'kind = "memory"'))
    assert memory.store_namespace() is None


def _shards_only(*entries: str, server_shard: str = "a", pools: tuple[str, ...] = ("default",)) -> str:
    text = f'[server]\nshard = "{server_shard}"\n' if server_shard else ""
    text += "".join(f'[[pools]]\nname = "{pool}"\n' for pool in pools)
    return text + "".join(entries)


def shard(name: str = "a", number: int = 1, pools: str = '["default"]', endpoint: str = "") -> str:
    endpoint = endpoint or f"https://{name}.internal:7070"
    return f'[[shards]]\nname = "{name}"\nnumber = {number}\npools = {pools}\nendpoint = "{endpoint}"\n'


TWO_POOLS = ("default", "llm")

INVALID: list[tuple[str, str, str, str]] = [
    (
        "duplicate-name",
        _shards_only(shard("a", 1, '["default"]'), shard("a", 2, '["llm"]', "https://b:1"), pools=TWO_POOLS),
        "shards[1].name",
        "duplicate shard name 'a'",
    ),
    (
        "duplicate-number",
        _shards_only(shard("a", 3, '["default"]'), shard("b", 3, '["llm"]'), pools=TWO_POOLS),
        "shards[1].number",
        "duplicate shard number '3'",
    ),
    (
        "duplicate-endpoint",
        _shards_only(
            shard("a", 1, '["default"]', "https://x:1"), shard("b", 2, '["llm"]', "HTTPS://X:1/"), pools=TWO_POOLS
        ),
        "shards[1].endpoint",
        "duplicate shard endpoint",
    ),
    ("number-zero", _shards_only(shard(number=0)), "shards[0].number", "between 1 and 255"),
    ("number-256", _shards_only(shard(number=256)), "shards[0].number", "between 1 and 255"),
    ("endpoint-scheme", _shards_only(shard(endpoint="grpc://a:1")), "shards[0].endpoint", "http:// or https://"),
    ("endpoint-bare", _shards_only(shard(endpoint="a.internal:7070")), "shards[0].endpoint", "http:// or https://"),
    ("endpoint-path", _shards_only(shard(endpoint="https://a:1/api")), "shards[0].endpoint", "no path"),
    ("endpoint-user", _shards_only(shard(endpoint="https://u:p@a:1")), "shards[0].endpoint", "user information"),
    ("endpoint-port", _shards_only(shard(endpoint="https://a:99999")), "shards[0].endpoint", "not a valid URL"),
    (
        "replica-path",
        _shards_only(shard() + 'replicas = ["https://a-0:1", "https://a-1:1/x"]\n'),
        "shards[0].replicas[1]",
        "no path",
    ),
    ("unknown-pool", _shards_only(shard(pools='["default", "gpu"]')), "shards[0].pools[1]", "unknown pool 'gpu'"),
    (
        "pool-in-two",
        _shards_only(shard("a", 1, '["default"]'), shard("b", 2, '["default", "llm"]'), pools=TWO_POOLS),
        "shards[1].pools[0]",
        "already served by shard 'a'",
    ),
    (
        "pool-twice-in-one",
        _shards_only(shard(pools='["default", "default"]')),
        "shards[0].pools[1]",
        "already served by shard 'a'",
    ),
    ("pool-in-none", _shards_only(shard(), pools=TWO_POOLS), "pools[1]", "'llm' is not served by any shard"),
    ("shard-without-pools", _shards_only(shard("a", 1), shard("b", 2, "[]")), "shards[1].pools", "at least one pool"),
    ("shard-name", _shards_only(shard("a b"), server_shard="a b"), "shards[0].name", "invalid shard name"),
    ("server-shard-missing", _shards_only(shard(), server_shard=""), "server.shard", "required with [[shards]]"),
    ("server-shard-unknown", _shards_only(shard(), server_shard="zz"), "server.shard", "unknown shard 'zz'"),
    (
        "pg-schema-without-shard",
        _shards_only(shard()) + '[store]\nkind = "postgres"\nschema = "cronoq"\n',
        "store.schema",
        "must contain {shard}",
    ),
    (
        "pg-schema-bad-shard-name",
        _shards_only(shard("a-1"), server_shard="a-1") + '[store]\nkind = "postgres"\n',
        "store.schema",
        "'cronoq_a-1' for shard 'a-1' is not a valid schema name",
    ),
    (
        "sqlite-path-without-shard",
        _shards_only(shard()) + '[store]\nkind = "sqlite"\npath = "/d/state.db"\n',
        "store.path",
        "must contain {shard}",
    ),
    (
        "resource-without-shard",
        _shards_only(shard()) + '[[resources]]\nkind = "semaphore"\nname = "r"\npermits = 1\n',
        "resources[0].shard",
        "needs a shard",
    ),
    (
        "resource-unknown-shard",
        _shards_only(shard()) + '[[resources]]\nkind = "semaphore"\nname = "r"\npermits = 1\nshard = "b"\n',
        "resources[0].shard",
        "unknown shard 'b'",
    ),
]


@pytest.mark.parametrize(("text", "path", "phrase"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_sharded_config(text: str, path: str, phrase: str) -> None:
    assert_problem(text, path, phrase, env=PG_ENV)


def test_replicas_are_read_and_optional() -> None:
    text = _shards_only(shard() + 'replicas = ["https://a-0.internal:7070", "https://a-1.internal:7070"]\n')
    assert assert_loads(text, env=PG_ENV).shards[0].replicas == (
        "https://a-0.internal:7070",
        "https://a-1.internal:7070",
    )
    assert assert_loads(_shards_only(shard()), env=PG_ENV).shards[0].replicas == ()


def test_unknown_shard_override_is_refused() -> None:
    assert_problem(SHARDED, "server.shard", "unknown shard 'gone'", env=PG_ENV, shard_override="gone")


def test_minimal_valid_sharded_configs() -> None:
    assert_loads(_shards_only(shard()))
    assert_loads(_shards_only(shard("a", 255, '["default"]', "http://127.0.0.1:7070")))
    assert_loads(_shards_only(shard("a", 1, '["default"]'), shard("b", 2, '["llm"]'), pools=TWO_POOLS))


def test_plain_http_peer_endpoints_warn_unless_trusted() -> None:
    text = _shards_only(
        shard("a", 1, '["default"]', "http://a.internal:7070"),
        shard("b", 2, '["llm"]', "http://b.internal:7070"),
        pools=TWO_POOLS,
    )
    warnings = assert_loads(text).warnings
    assert len(warnings) == 1 and warnings[0].startswith("shards[1].endpoint: plain http://")
    trusted = text.replace('shard = "a"', 'shard = "a"\ninsecure_peer_http = true')
    assert assert_loads(trusted).warnings == []
    loopback = _shards_only(
        shard("a", 1, '["default"]'), shard("b", 2, '["llm"]', "http://127.0.0.1:7170"), pools=TWO_POOLS
    )
    assert assert_loads(loopback).warnings == []


def test_every_shard_error_is_reported_together() -> None:
    text = _shards_only(shard("a", 0, '["nope"]', "ftp://x"), server_shard="")
    paths = {error.split(": ", 1)[0] for error in problems(text)}
    assert {"shards[0].number", "shards[0].endpoint", "shards[0].pools[0]", "pools[0]", "server.shard"} <= paths
