"""Reading TOML: every key, unknown keys, value types, collecting every error, files."""

from __future__ import annotations

from pathlib import Path

import pytest
from cronoq.config import (
    CertSpec,
    Config,
    ConfigError,
    ConsoleConfig,
    GrpcWebConfig,
    LimitsConfig,
    OutputsConfig,
    Overflow,
    PeerTlsConfig,
    PostgresStoreConfig,
    RetrySection,
    Role,
    SemaphoreResource,
    ServerConfig,
    ShardSection,
    TlsConfig,
    TokenBucketResource,
    TokenSpec,
    WebhookScaler,
)

from .helpers import ADMIN_TOKEN, CLIENT_TOKEN, ENV, PG_URL, WORKER_TOKEN, assert_loads, assert_problem, problems

FULL_ENV = {**ENV, "PG_URL": PG_URL, "HOOK_TOKEN": "hook-token-value"}

# Every key of the schema, each with a value other than its default ([server.grpc_web] aside:
# it is refused for now and has its own test).
FULL = """
[server]
grpc_addr = "0.0.0.0:17070"
http_addr = "[::]:17071"
metrics_addr = "10.0.0.5:9090"
insecure_no_auth = true
shutdown_grace_s = 25.5
shard = "gpu"
insecure_peer_http = true

[server.tls]
cert = "/tls/server.pem"
key = "/tls/server.key"
client_ca = "/tls/ca.pem"

[server.peer_tls]
ca = "/tls/peers-ca.pem"
cert = "/tls/peer.pem"
key = "/tls/peer.key"

[[auth.tokens]]
token_env = "CLIENT_TOKEN"
role = "client"
pools = ["default", "llm"]
tenant = "acme"

[[auth.tokens]]
token_env = "WORKER_TOKEN"
role = "worker"
pools = ["llm"]
labels = ["gpu=a100", "zone=eu-west=1", "empty="]

[[auth.tokens]]
token_env = "ADMIN_TOKEN"
role = "admin"

[[auth.certs]]
dns_name = "worker-1.internal"
role = "worker"
pools = ["llm"]
labels = ["gpu=h100"]
tenant = "globex"

[[auth.certs]]
dns_name = "dash.internal"
role = "metrics"

[store]
kind = "postgres"
url_env = "PG_URL"
keep_finished_s = 86400
schema = "jobs_{shard}"

[limits]
max_tasks_per_batch = 11
max_pending_total = 12
max_pending_per_pool = 13
max_message_bytes = 2048
max_http_body_bytes = 4096
max_key_len = 14
max_kind_len = 15
max_tags = 16
max_tag_len = 17
max_deps = 18
max_resources = 19
max_wait_s = 20.5
request_timeout_s = 21.5
max_concurrent_requests = 22
max_concurrent_streams = 23
max_slots_per_worker = 24
keepalive_interval_s = 25.5
keepalive_timeout_s = 26.5
key_retention_s = 27.5
key_retention_max = 28
max_list = 29

[[pools]]
name = "default"

[[pools]]
name = "llm"
min = 2
max = 200
autoscale = false
scaler = { kind = "webhook", url = "https://scaler.example.com/hook", token_env = "HOOK_TOKEN" }
lease_ttl_s = 120
max_pending = 5000
overflow = "shed_oldest"
retry = { max_attempts = 5, initial_backoff_s = 2, multiplier = 1.5, max_backoff_s = 120, jitter = false }
default_duration_s = 3.5
reservable_fraction = 0.25
await_unknown_dependencies_s = 60
target_utilization = 0.9
drain_time_s = 45
cooldown_s = 15
cost_per_worker_second = 0.002
max_slots_per_worker = 8
fair_share = true
tenant_weights = { acme = 3, globex = 1.5, "team.x" = 0.5 }

[[resources]]
kind = "token_bucket"
name = "openai"
rate = 12.5
burst = 40
shard = "gpu"

[[resources]]
kind = "semaphore"
name = "db"
permits = 4
shard = "cpu"

[outputs]
cache_entries = 10
cache_bytes = 1000
info_entries = 20

[[shards]]
name = "cpu"
number = 1
pools = ["default"]
endpoint = "https://cpu.internal:7070"

[[shards]]
name = "gpu"
number = 2
pools = ["llm"]
endpoint = "https://gpu.internal:7070"
"""


def test_full_config_reads_every_key() -> None:
    config = assert_loads(FULL, env=FULL_ENV)
    assert config.server == ServerConfig(
        grpc_addr="0.0.0.0:17070",
        http_addr="[::]:17071",
        metrics_addr="10.0.0.5:9090",
        tls=TlsConfig(cert="/tls/server.pem", key="/tls/server.key", client_ca="/tls/ca.pem"),
        insecure_no_auth=True,
        shutdown_grace_s=25.5,
        grpc_web=None,
        shard="gpu",
        peer_tls=PeerTlsConfig(ca="/tls/peers-ca.pem", cert="/tls/peer.pem", key="/tls/peer.key"),
        insecure_peer_http=True,
    )
    client, worker, admin = config.auth.tokens
    assert client == TokenSpec.from_token(
        CLIENT_TOKEN, Role.CLIENT, env="CLIENT_TOKEN", pools=["default", "llm"], tenant="acme"
    )
    assert worker == TokenSpec.from_token(
        WORKER_TOKEN,
        Role.WORKER,
        env="WORKER_TOKEN",
        pools=["llm"],
        labels=[("gpu", "a100"), ("zone", "eu-west=1"), ("empty", "")],
    )
    assert admin == TokenSpec.from_token(ADMIN_TOKEN, Role.ADMIN, env="ADMIN_TOKEN")
    assert config.auth.certs == (
        CertSpec("worker-1.internal", Role.WORKER, pools=("llm",), labels=(("gpu", "h100"),), tenant="globex"),
        CertSpec("dash.internal", Role.METRICS),
    )
    assert config.store == PostgresStoreConfig(
        url=PG_URL, url_env="PG_URL", keep_finished_s=86400.0, schema="jobs_{shard}"
    )
    assert config.limits == LimitsConfig(
        11, 12, 13, 2048, 4096, 14, 15, 16, 17, 18, 19, 20.5, 21.5, 22, 23, 24, 25.5, 26.5, 27.5, 28, 29
    )
    default, llm = config.pools
    assert default.name == "default"
    assert (llm.name, llm.min, llm.max, llm.autoscale) == ("llm", 2, 200, False)
    assert llm.scaler == WebhookScaler(
        url="https://scaler.example.com/hook", token_env="HOOK_TOKEN", token="hook-token-value"
    )
    assert llm.lease_ttl_s == 120.0 and llm.max_pending == 5000 and llm.overflow is Overflow.SHED_OLDEST
    assert llm.retry == RetrySection(5, 2.0, 1.5, 120.0, False)
    assert llm.default_duration_s == 3.5 and llm.reservable_fraction == 0.25
    assert llm.await_unknown_dependencies_s == 60.0 and llm.target_utilization == 0.9
    assert llm.drain_time_s == 45.0 and llm.cooldown_s == 15.0
    assert llm.cost_per_worker_second == 0.002 and llm.max_slots_per_worker == 8
    assert llm.fair_share is True
    assert dict(llm.tenant_weights) == {"acme": 3.0, "globex": 1.5, "team.x": 0.5}
    assert config.resources == (
        TokenBucketResource(name="openai", rate=12.5, burst=40, shard="gpu"),
        SemaphoreResource(name="db", permits=4, shard="cpu"),
    )
    assert config.outputs == OutputsConfig(10, 1000, 20)
    assert config.shards == (
        ShardSection("cpu", 1, ("default",), "https://cpu.internal:7070"),
        ShardSection("gpu", 2, ("llm",), "https://gpu.internal:7070"),
    )


def test_full_config_writes_back_to_an_equal_config() -> None:
    config = Config.parse(FULL, env=FULL_ENV)
    text = config.to_toml()
    assert CLIENT_TOKEN not in text and PG_URL not in text and "hook-token-value" not in text
    assert Config.parse(text, env=FULL_ENV) == config
    assert Config.parse(Config.default().to_toml(), env={}) == Config.default()


def test_literal_tokens_cannot_be_written_back() -> None:
    config = Config.parse(f'[[auth.tokens]]\ntoken = "{CLIENT_TOKEN}"\nrole = "client"\n', env={})
    with pytest.raises(ValueError, match=r"auth\.tokens\[0\]") as info:
        config.to_toml()
    assert CLIENT_TOKEN not in str(info.value)


def test_literal_postgres_url_and_sqlite_round_trip() -> None:
    for text in (
        '[store]\nkind = "postgres"\nurl = "postgres://localhost/x"\n',
        '[store]\nkind = "sqlite"\npath = "/var/lib/cronoq/state.db"\nkeep_finished_s = 10\n',
    ):
        config = Config.parse(text, env={})
        assert Config.parse(config.to_toml(), env={}) == config


def test_grpc_web_and_console_tables_are_read() -> None:
    text = '[server.grpc_web]\nallowed_origins = ["https://dash.example.com"]\n[server.console]\nenabled = true\n'
    config = Config.read(text, env={})
    assert config.server.grpc_web == GrpcWebConfig(("https://dash.example.com",))
    assert config.server.console == ConsoleConfig(enabled=True)
    assert config.validate() == []
    assert Config.parse(config.to_toml(), env={}) == config
    assert Config.read("", env={}).server.console == ConsoleConfig(enabled=False)
    # The console needs no gRPC-Web: its pages call the HTTP API of their own origin.
    assert_problem(
        '[server.console]\ngrpc_web_url = "https://x.example.com"\n', "server.console.grpc_web_url", "unknown key"
    )


UNKNOWN_KEYS = [
    ("bogus = 1\n", "bogus"),
    ("[bogus]\nx = 1\n", "bogus"),
    ("[server]\ngrpc_adr = '127.0.0.1:1'\n", "server.grpc_adr"),
    ("[server.tls]\ncert = 'a'\nkey = 'b'\nca = 'c'\n", "server.tls.ca"),
    ("[server.peer_tls]\nbogus = 'c'\n", "server.peer_tls.bogus"),
    ("[server.grpc_web]\nallowed_origins = ['https://a.b']\norigins = []\n", "server.grpc_web.origins"),
    ("[auth]\nusers = []\n", "auth.users"),
    ("[[auth.tokens]]\ntoken_env = 'CLIENT_TOKEN'\nrole = 'client'\npool = ['default']\n", "auth.tokens[0].pool"),
    ("[[auth.certs]]\ndns_name = 'x'\nrole = 'worker'\nsan = 'x'\n", "auth.certs[0].san"),
    ("[store]\nkind = 'memory'\npath = 'x'\n", "store.path"),
    ("[store]\nkind = 'sqlite'\npath = 'x'\nurl = 'y'\n", "store.url"),
    ("[store]\nkind = 'postgres'\nkeep_finished = 1\n", "store.keep_finished"),
    ("[limits]\nmax_batch = 1\n", "limits.max_batch"),
    ("[[pools]]\nname = 'a'\n[[pools]]\nname = 'b'\nlease_tll_s = 3\n", "pools[1].lease_tll_s"),
    ("[[pools]]\nname = 'a'\nretry = { attempts = 2 }\n", "pools[0].retry.attempts"),
    ("[[pools]]\nname = 'a'\nscaler = { kind = 'external', url = 'x' }\n", "pools[0].scaler.url"),
    (
        "[[pools]]\nname = 'a'\nscaler = { kind = 'webhook', url = 'https://x', secret = 'x' }\n",
        "pools[0].scaler.secret",
    ),
    ("[[resources]]\nkind = 'semaphore'\nname = 'r'\npermits = 1\nrate = 2\n", "resources[0].rate"),
    ("[[resources]]\nkind = 'token_bucket'\nname = 'r'\nrate = 1\nburst = 2\npermits = 2\n", "resources[0].permits"),
    ("[outputs]\ncache = 1\n", "outputs.cache"),
    (
        "[server]\nshard = 'a'\n[[shards]]\nname = 'a'\nnumber = 1\npools = ['default']\n"
        "endpoint = 'https://a:1'\nurl = 'x'\n",
        "shards[0].url",
    ),
]


@pytest.mark.parametrize(("text", "path"), UNKNOWN_KEYS, ids=[path for _, path in UNKNOWN_KEYS])
def test_unknown_keys_are_rejected_with_their_path(text: str, path: str) -> None:
    assert_problem(text, path, "unknown key")


def test_unknown_key_suggests_the_nearest_known_key() -> None:
    error = assert_problem(
        '[[pools]]\nname = "a"\n[[pools]]\nname = "b"\nlease_tll_s = 3\n', "pools[1].lease_tll_s", "unknown key"
    )
    assert "did you mean 'lease_ttl_s'" in error


WRONG_TYPES = [
    ("[server]\ngrpc_addr = 7070\n", "server.grpc_addr", "expected a string, got an integer"),
    ("[server]\ninsecure_no_auth = 'yes'\n", "server.insecure_no_auth", "expected a boolean"),
    ("[server]\nshutdown_grace_s = '10'\n", "server.shutdown_grace_s", "expected a number, got a string"),
    ("[server]\nshutdown_grace_s = true\n", "server.shutdown_grace_s", "expected a number, got a boolean"),
    ("server = 1\n", "server", "expected a table"),
    ("[limits]\nmax_list = 10.0\n", "limits.max_list", "expected an integer, got a float"),
    ("[limits]\nmax_list = true\n", "limits.max_list", "expected an integer, got a boolean"),
    ("[[pools]]\nname = 1\n", "pools[0].name", "expected a string"),
    ("pools = 'default'\n", "pools", "expected an array of tables"),
    ("pools = ['default']\n", "pools[0]", "expected a table, got a string"),
    ("[[pools]]\nname = 'a'\noverflow = 'drop'\n", "pools[0].overflow", "expected one of wait, reject"),
    ("[[pools]]\nname = 'a'\ntenant_weights = { acme = 'hi' }\n", "pools[0].tenant_weights.acme", "expected a number"),
    ("[[pools]]\nname = 'a'\nretry = 3\n", "pools[0].retry", "expected a table"),
    ("[[auth.tokens]]\ntoken_env = 'CLIENT_TOKEN'\nrole = 'root'\n", "auth.tokens[0].role", "expected one of client"),
    ("[[auth.tokens]]\ntoken_env = 'CLIENT_TOKEN'\nrole = 'client'\npools = 'a'\n", "auth.tokens[0].pools", "array"),
    (
        "[[auth.tokens]]\ntoken_env = 'CLIENT_TOKEN'\nrole = 'client'\npools = [1]\n",
        "auth.tokens[0].pools[0]",
        "expected a string",
    ),
    ("[store]\nkind = 'redis'\n", "store.kind", "expected one of memory, sqlite, postgres"),
    ("[[resources]]\nkind = 'mutex'\nname = 'r'\n", "resources[0].kind", "expected one of semaphore, token_bucket"),
    ("[[pools]]\nname = 'a'\nscaler = { kind = 'keda' }\n", "pools[0].scaler.kind", "expected one of external"),
    ("[server]\ngrpc_addr = 2024-01-01\n", "server.grpc_addr", "got a date/time"),
]


@pytest.mark.parametrize(("text", "path", "phrase"), WRONG_TYPES, ids=[p for _, p, _ in WRONG_TYPES])
def test_wrong_types_are_reported_with_their_path(text: str, path: str, phrase: str) -> None:
    assert_problem(text, path, phrase)


REQUIRED = [
    ("[[pools]]\nmax = 3\n", "pools[0].name"),
    ("[server.tls]\ncert = 'a'\n", "server.tls.key"),
    ("[server.grpc_web]\n", "server.grpc_web.allowed_origins"),
    ("[[auth.tokens]]\ntoken_env = 'CLIENT_TOKEN'\n", "auth.tokens[0].role"),
    ("[[auth.certs]]\nrole = 'worker'\n", "auth.certs[0].dns_name"),
    ("[store]\npath = 'x'\n", "store.kind"),
    ("[store]\nkind = 'sqlite'\n", "store.path"),
    ("[[resources]]\nname = 'r'\npermits = 1\n", "resources[0].kind"),
    ("[[resources]]\nkind = 'semaphore'\nname = 'r'\n", "resources[0].permits"),
    ("[[resources]]\nkind = 'token_bucket'\nname = 'r'\nburst = 1\n", "resources[0].rate"),
    ("[[resources]]\nkind = 'token_bucket'\nname = 'r'\nrate = 1\n", "resources[0].burst"),
    ("[[resources]]\nkind = 'semaphore'\npermits = 1\n", "resources[0].name"),
    ("[[pools]]\nname = 'a'\nscaler = { url = 'https://x' }\n", "pools[0].scaler.kind"),
    ("[[pools]]\nname = 'a'\nscaler = { kind = 'webhook' }\n", "pools[0].scaler.url"),
    ("[[shards]]\nname = 'a'\npools = ['default']\nendpoint = 'https://a:1'\n", "shards[0].number"),
    ("[[shards]]\nname = 'a'\nnumber = 1\nendpoint = 'https://a:1'\n", "shards[0].pools"),
    ("[[shards]]\nname = 'a'\nnumber = 1\npools = ['default']\n", "shards[0].endpoint"),
]


@pytest.mark.parametrize(("text", "path"), REQUIRED, ids=[p for _, p in REQUIRED])
def test_missing_required_keys_are_named(text: str, path: str) -> None:
    assert_problem(text, path, "is required")


def test_every_problem_is_reported_not_just_the_first() -> None:
    text = """
[server]
grpc_addr = "nonsense"
shutdown_grace_s = -1
colour = "blue"

[limits]
max_list = 0

[[pools]]
name = "a"
min = 5
max = 2

[[pools]]
name = "a"
lease_ttl_s = "long"
"""
    found = problems(text)
    paths = sorted(error.split(": ", 1)[0] for error in found)
    assert paths == sorted(
        [
            "server.grpc_addr",
            "server.shutdown_grace_s",
            "server.colour",
            "limits.max_list",
            "pools[0].min",
            "pools[1].name",
            "pools[1].lease_ttl_s",
        ]
    )


def test_a_type_error_is_reported_once() -> None:
    found = problems('[[pools]]\nname = 5\n[[pools]]\nname = "x"\nlease_ttl_s = "soon"\n')
    assert found == [
        "pools[0].name: expected a string, got an integer",
        "pools[1].lease_ttl_s: expected a number, got a string",
    ]


def test_toml_syntax_error() -> None:
    with pytest.raises(ConfigError) as info:
        Config.parse("[server\n", env={})
    assert len(info.value.errors) == 1 and "not valid TOML" in info.value.errors[0]


def test_error_text_lists_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        Config.parse("a = 1\nb = 2\n", env={})
    assert "2 problems" in str(info.value)
    assert "a: unknown key" in str(info.value) and "b: unknown key" in str(info.value)


def test_load_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "cronoq.toml"
    path.write_text('[[pools]]\nname = "only"\n', encoding="utf-8")
    assert [pool.name for pool in Config.load(path, env={}).pools] == ["only"]
    assert Config.load(str(path), env={}) == Config.load(path, env={})


def test_load_reports_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        Config.load(missing, env={})
    assert info.value.errors[0].startswith(str(missing))


def test_load_reports_syntax_errors_with_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("x = [\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        Config.load(path, env={})
    assert info.value.errors[0].startswith(f"{path}: not valid TOML")


def test_read_skips_semantic_checks_but_not_types() -> None:
    config = Config.read('[[pools]]\nname = "a"\nmin = 9\nmax = 1\n', env={})
    assert config.validate() == ["pools[0].min: min (9) must not exceed max (1)"]
    with pytest.raises(ConfigError):
        Config.read('[[pools]]\nname = "a"\nmin = "9"\n', env={})


def test_durations_accept_integers_and_floats() -> None:
    config = assert_loads("[server]\nshutdown_grace_s = 3\n[limits]\nmax_wait_s = 1.5\n", env={})
    assert config.server.shutdown_grace_s == 3.0 and isinstance(config.server.shutdown_grace_s, float)
    assert config.limits.max_wait_s == 1.5


def test_the_retired_links_key_still_loads_with_a_warning() -> None:
    config = assert_loads("[server]\nlinks = false\n")
    assert config.server.retired_keys == ("links",)
    assert config.warnings == [
        "server.links: no longer used: workers and shards now batch their traffic over gRPC on the gRPC port; remove it"
    ]
    assert "links" not in config.to_toml()
    assert_problem('[server]\nlinks = "no"\n', "server.links", "expected a boolean")
