"""Every validation rule, one case each; each error must name the offending key."""

from __future__ import annotations

import pytest
from cronoq.config import Config, GrpcWebConfig, ServerConfig, parse_socket_addr

from .helpers import assert_loads, assert_problem, problems

TOKEN = '[[auth.tokens]]\ntoken_env = "CLIENT_TOKEN"\nrole = "client"\n'
TLS_CA = '[server.tls]\ncert = "c.pem"\nkey = "k.pem"\nclient_ca = "ca.pem"\n'
POOL = '[[pools]]\nname = "p"\n'
PG = '[store]\nkind = "postgres"\n'
SQLITE = '[store]\nkind = "sqlite"\n'
SEM = '[[resources]]\nkind = "semaphore"\nname = "r"\n'

# (case id, TOML, key path of the error, phrase the message must contain)
RULES: list[tuple[str, str, str, str]] = [
    # [server]
    ("addr-garbage", '[server]\ngrpc_addr = "nonsense"\n', "server.grpc_addr", "invalid address"),
    ("addr-hostname", '[server]\nhttp_addr = "localhost:7071"\n', "server.http_addr", "not an IPv4 address"),
    ("addr-port", '[server]\ngrpc_addr = "127.0.0.1:70000"\n', "server.grpc_addr", "between 0 and 65535"),
    ("addr-ipv6-brackets", '[server]\ngrpc_addr = "[::1:7070"\n', "server.grpc_addr", "invalid address"),
    ("metrics-addr", '[server]\nmetrics_addr = "0.0.0.0"\n', "server.metrics_addr", "invalid address"),
    ("addr-reused", '[server]\nhttp_addr = "127.0.0.1:7070"\n', "server.http_addr", "already used by server.grpc_addr"),
    ("grace-negative", "[server]\nshutdown_grace_s = -1\n", "server.shutdown_grace_s", "must not be negative"),
    ("grace-inf", "[server]\nshutdown_grace_s = inf\n", "server.shutdown_grace_s", "finite"),
    ("grace-nan", "[server]\nshutdown_grace_s = nan\n", "server.shutdown_grace_s", "finite"),
    ("grace-year", "[server]\nshutdown_grace_s = 31536001\n", "server.shutdown_grace_s", "at most one year"),
    ("tls-empty-cert", '[server.tls]\ncert = ""\nkey = "k"\n', "server.tls.cert", "must not be empty"),
    ("peer-tls-half", '[server.peer_tls]\ncert = "c.pem"\n', "server.peer_tls.key", "go together"),
    ("open-listener", '[server]\ngrpc_addr = "0.0.0.0:7070"\n', "server.grpc_addr", "no credentials are configured"),
    ("open-listener-v6", '[server]\nhttp_addr = "[::]:7071"\n', "server.http_addr", "not a loopback address"),
    (
        "grpc-web-path",
        '[server.grpc_web]\nallowed_origins = ["https://a.example/x"]\n',
        "server.grpc_web.allowed_origins[0]",
        "not an exact origin",
    ),
    # [auth]
    ("token-pool-unknown", TOKEN + 'pools = ["nope"]\n', "auth.tokens[0].pools[0]", "unknown pool 'nope'"),
    ("token-pools-empty", TOKEN + "pools = []\n", "auth.tokens[0].pools", "allows no pool"),
    ("token-label-format", TOKEN + 'labels = ["gpu"]\n', "auth.tokens[0].labels[0]", '"name=value"'),
    ("token-label-no-name", TOKEN + 'labels = ["ok=1", "=x"]\n', "auth.tokens[0].labels[1]", '"name=value"'),
    ("token-tenant-empty", TOKEN + 'tenant = ""\n', "auth.tokens[0].tenant", "must not be empty"),
    ("certs-without-tls", '[[auth.certs]]\ndns_name = "w"\nrole = "worker"\n', "auth.certs", "server.tls.client_ca"),
    (
        "certs-without-client-ca",
        '[server.tls]\ncert = "c"\nkey = "k"\n[[auth.certs]]\ndns_name = "w"\nrole = "worker"\n',
        "auth.certs",
        "server.tls.client_ca",
    ),
    ("cert-dns-empty", TLS_CA + '[[auth.certs]]\ndns_name = ""\nrole = "worker"\n', "auth.certs[0].dns_name", "empty"),
    (
        "cert-dns-duplicate",
        TLS_CA + '[[auth.certs]]\ndns_name = "w.x"\nrole = "worker"\n'
        '[[auth.certs]]\ndns_name = "W.x"\nrole = "client"\n',
        "auth.certs[1].dns_name",
        "duplicate dns_name",
    ),
    (
        "cert-pool-unknown",
        TLS_CA + '[[auth.certs]]\ndns_name = "w"\nrole = "worker"\npools = ["gpu"]\n',
        "auth.certs[0].pools[0]",
        "unknown pool 'gpu'",
    ),
    # [store]
    ("sqlite-path-empty", SQLITE + 'path = ""\n', "store.path", "must not be empty"),
    ("keep-negative", SQLITE + 'path = "x"\nkeep_finished_s = -5\n', "store.keep_finished_s", "negative"),
    ("pg-schema-chars", PG + 'schema = "my-schema"\n', "store.schema", "not a valid schema name"),
    ("pg-schema-long", PG + f'schema = "{"s" * 64}"\n', "store.schema", "1 to 63"),
    ("pg-schema-shard-unsharded", PG + 'schema = "c_{shard}"\n', "store.schema", "no [[shards]]"),
    ("sqlite-shard-unsharded", SQLITE + 'path = "/d/{shard}.db"\n', "store.path", "no [[shards]]"),
    ("pg-url-empty", PG + 'url = ""\n', "store.url", "must not be empty"),
    ("pg-lease-renew-too-long", PG + "lease_ttl_s = 2\nlease_renew_s = 2\n", "store.lease_renew_s", "shorter than"),
    ("sqlite-lease-ttl-zero", SQLITE + 'path = "x"\nlease_ttl_s = 0\n', "store.lease_ttl_s", "greater than 0"),
    ("pg-lock-poll-zero", PG + "lock_poll_s = 0\n", "store.lock_poll_s", "greater than 0"),
    # [limits]
    ("limit-batch-zero", "[limits]\nmax_tasks_per_batch = 0\n", "limits.max_tasks_per_batch", "at least 1"),
    ("limit-pending-zero", "[limits]\nmax_pending_total = 0\n", "limits.max_pending_total", "at least 1"),
    ("limit-negative", "[limits]\nmax_tags = -1\n", "limits.max_tags", "at least 0"),
    ("limit-message-small", "[limits]\nmax_message_bytes = 100\n", "limits.max_message_bytes", "between 1024 and"),
    ("limit-message-huge", "[limits]\nmax_message_bytes = 4294967296\n", "limits.max_message_bytes", "2147483647"),
    ("limit-body-small", "[limits]\nmax_http_body_bytes = 10\n", "limits.max_http_body_bytes", "at least 1024"),
    ("limit-list-zero", "[limits]\nmax_list = 0\n", "limits.max_list", "at least 1"),
    ("limit-streams-u32", f"[limits]\nmax_concurrent_streams = {2**32}\n", "limits.max_concurrent_streams", "between"),
    ("limit-slots-zero", "[limits]\nmax_slots_per_worker = 0\n", "limits.max_slots_per_worker", "between 1 and"),
    ("limit-timeout-zero", "[limits]\nrequest_timeout_s = 0\n", "limits.request_timeout_s", "greater than 0"),
    ("limit-keepalive-zero", "[limits]\nkeepalive_interval_s = 0\n", "limits.keepalive_interval_s", "greater than 0"),
    ("limit-wait-year", "[limits]\nmax_wait_s = 4e7\n", "limits.max_wait_s", "at most one year"),
    ("limit-retention-inf", "[limits]\nkey_retention_s = inf\n", "limits.key_retention_s", "finite"),
    ("limit-connections-zero", "[limits]\nmax_connections = 0\n", "limits.max_connections", "between 1 and"),
    (
        "limit-per-caller-zero",
        "[limits]\nmax_concurrent_requests_per_caller = 0\n",
        "limits.max_concurrent_requests_per_caller",
        "at least 1",
    ),
    (
        "limit-streams-per-caller-zero",
        "[limits]\nmax_streams_per_caller = 0\n",
        "limits.max_streams_per_caller",
        "between 1 and",
    ),
    ("limit-head-timeout-zero", "[limits]\nheader_timeout_s = 0\n", "limits.header_timeout_s", "greater than 0"),
    ("limit-idle-zero", "[limits]\nidle_timeout_s = 0\n", "limits.idle_timeout_s", "greater than 0"),
    ("limit-head-small", "[limits]\nmax_header_bytes = 100\n", "limits.max_header_bytes", "between 1024 and"),
    ("limit-headers-few", "[limits]\nmax_headers = 2\n", "limits.max_headers", "between 8 and"),
    ("limit-resets-zero", "[limits]\nmax_stream_resets_per_s = 0\n", "limits.max_stream_resets_per_s", "between 1"),
    ("limit-stall-nan", "[limits]\nwrite_stall_timeout_s = nan\n", "limits.write_stall_timeout_s", "finite"),
    # [[pools]]
    ("no-pools", "pools = []\n", "pools", "at least one pool"),
    ("pool-name-empty", '[[pools]]\nname = ""\n', "pools[0].name", "invalid pool name"),
    ("pool-name-space", '[[pools]]\nname = "my pool"\n', "pools[0].name", "invalid pool name"),
    ("pool-name-unicode", '[[pools]]\nname = "pööl"\n', "pools[0].name", "A-Z a-z 0-9 _ . : -"),
    ("pool-name-long", f'[[pools]]\nname = "{"p" * 65}"\n', "pools[0].name", "1 to 64"),
    ("pool-name-duplicate", POOL + POOL, "pools[1].name", "duplicate pool name 'p' (also pools[0].name)"),
    ("pool-min-above-max", POOL + "min = 5\nmax = 4\n", "pools[0].min", "must not exceed max"),
    ("pool-max-zero", POOL + "max = 0\nmin = 0\n", "pools[0].max", "between 1 and"),
    ("pool-min-negative", POOL + "min = -1\n", "pools[0].min", "between 0 and"),
    ("pool-max-u32", POOL + "max = 4294967296\n", "pools[0].max", "4294967295"),
    ("pool-lease-zero", POOL + "lease_ttl_s = 0\n", "pools[0].lease_ttl_s", "greater than 0"),
    ("pool-lease-year", POOL + "lease_ttl_s = 1e9\n", "pools[0].lease_ttl_s", "one year"),
    ("pool-max-pending-zero", POOL + "max_pending = 0\n", "pools[0].max_pending", "at least 1"),
    ("retry-attempts-zero", POOL + "retry = { max_attempts = 0 }\n", "pools[0].retry.max_attempts", "between 1"),
    ("retry-multiplier-below-1", POOL + "retry = { multiplier = 0.5 }\n", "pools[0].retry.multiplier", "at least 1"),
    ("retry-multiplier-inf", POOL + "retry = { multiplier = inf }\n", "pools[0].retry.multiplier", "finite"),
    (
        "retry-backoff-negative",
        POOL + "retry = { initial_backoff_s = -1 }\n",
        "pools[0].retry.initial_backoff_s",
        "negative",
    ),
    ("retry-max-backoff-year", POOL + "retry = { max_backoff_s = 1e10 }\n", "pools[0].retry.max_backoff_s", "one year"),
    ("reservable-above-1", POOL + "reservable_fraction = 1.5\n", "pools[0].reservable_fraction", "within [0, 1]"),
    ("reservable-negative", POOL + "reservable_fraction = -0.1\n", "pools[0].reservable_fraction", "within [0, 1]"),
    ("utilization-zero", POOL + "target_utilization = 0\n", "pools[0].target_utilization", "within (0, 1]"),
    ("utilization-above-1", POOL + "target_utilization = 1.01\n", "pools[0].target_utilization", "within (0, 1]"),
    ("drain-zero", POOL + "drain_time_s = 0\n", "pools[0].drain_time_s", "greater than 0"),
    ("cooldown-negative", POOL + "cooldown_s = -1\n", "pools[0].cooldown_s", "negative"),
    ("default-duration-nan", POOL + "default_duration_s = nan\n", "pools[0].default_duration_s", "finite"),
    ("await-year", POOL + "await_unknown_dependencies_s = 1e9\n", "pools[0].await_unknown_dependencies_s", "one year"),
    ("cost-negative", POOL + "cost_per_worker_second = -1\n", "pools[0].cost_per_worker_second", "at least 0"),
    ("pool-slots-zero", POOL + "max_slots_per_worker = 0\n", "pools[0].max_slots_per_worker", "between 1"),
    ("weight-zero", POOL + "tenant_weights = { acme = 0 }\n", "pools[0].tenant_weights.acme", "greater than 0"),
    ("weight-inf", POOL + "tenant_weights = { acme = inf }\n", "pools[0].tenant_weights.acme", "finite"),
    ("weight-tenant-empty", POOL + 'tenant_weights = { "" = 1 }\n', 'pools[0].tenant_weights.""', "must not be empty"),
    ("webhook-scheme", POOL + 'scaler = { kind = "webhook", url = "ftp://x/y" }\n', "pools[0].scaler.url", "http://"),
    ("webhook-no-host", POOL + 'scaler = { kind = "webhook", url = "https://" }\n', "pools[0].scaler.url", "no host"),
    # [[resources]]
    ("resource-name", '[[resources]]\nkind = "semaphore"\nname = "a b"\npermits = 1\n', "resources[0].name", "invalid"),
    (
        "resource-duplicate",
        SEM + 'permits = 1\n[[resources]]\nkind = "token_bucket"\nname = "r"\nrate = 1\nburst = 1\n',
        "resources[1].name",
        "duplicate resource name 'r'",
    ),
    ("permits-zero", SEM + "permits = 0\n", "resources[0].permits", "between 1"),
    (
        "burst-zero",
        '[[resources]]\nkind = "token_bucket"\nname = "r"\nrate = 1\nburst = 0\n',
        "resources[0].burst",
        "between 1",
    ),
    (
        "rate-zero",
        '[[resources]]\nkind = "token_bucket"\nname = "r"\nrate = 0\nburst = 1\n',
        "resources[0].rate",
        "greater than 0",
    ),
    (
        "rate-nan",
        '[[resources]]\nkind = "token_bucket"\nname = "r"\nrate = nan\nburst = 1\n',
        "resources[0].rate",
        "finite",
    ),
    ("resource-shard-unsharded", SEM + 'permits = 1\nshard = "a"\n', "resources[0].shard", "no [[shards]]"),
    # [outputs], server.shard
    ("outputs-negative", "[outputs]\ncache_entries = -1\n", "outputs.cache_entries", "at least 0"),
    ("shard-unsharded", '[server]\nshard = "a"\n', "server.shard", "no [[shards]]"),
]


@pytest.mark.parametrize(("text", "path", "phrase"), [case[1:] for case in RULES], ids=[case[0] for case in RULES])
def test_rule(text: str, path: str, phrase: str) -> None:
    assert_problem(text, path, phrase)


def test_rule_ids_are_unique() -> None:
    ids = [case[0] for case in RULES]
    assert len(ids) == len(set(ids))


# Boundary values that must pass.
ACCEPTED = [
    POOL + "reservable_fraction = 0\n",
    POOL + "reservable_fraction = 1\n",
    POOL + "target_utilization = 1\n",
    POOL + "min = 0\nmax = 1\n",
    POOL + "min = 4\nmax = 4\n",
    POOL + "retry = { multiplier = 1, max_attempts = 1 }\n",
    POOL + "cooldown_s = 0\ndefault_duration_s = 0\nawait_unknown_dependencies_s = 31536000\n",
    POOL + "tenant_weights = { x = 0.01 }\n",
    '[[pools]]\nname = "Az09_.:-"\n',
    f'[[pools]]\nname = "{"p" * 64}"\n',
    "[server]\nshutdown_grace_s = 0\n",
    '[server]\ngrpc_addr = "127.0.0.1:0"\nhttp_addr = "127.0.0.1:0"\n',
    '[server]\ngrpc_addr = "[::1]:7070"\nhttp_addr = "127.9.9.9:7071"\n',
    '[server]\nmetrics_addr = "0.0.0.0:9090"\n',
    "[limits]\nmax_tags = 0\nmax_deps = 0\nmax_resources = 0\nkey_retention_max = 0\n",
    "[outputs]\ncache_entries = 0\ncache_bytes = 0\ninfo_entries = 0\n",
    PG + 'schema = "Cronoq_9"\n',
    PG + "lease_ttl_s = 2\nlease_renew_s = 0.5\nlock_poll_s = 0.05\n",
    SQLITE + 'path = "x"\nlease_ttl_s = 1\nlease_renew_s = 0.2\n',
    '[[resources]]\nkind = "token_bucket"\nname = "r"\nrate = 0.001\nburst = 1\n',
]


@pytest.mark.parametrize("text", ACCEPTED)
def test_boundary_values_are_accepted(text: str) -> None:
    assert_loads(text)


def test_open_listener_allowed_with_credentials_or_insecure_no_auth() -> None:
    public = '[server]\ngrpc_addr = "0.0.0.0:7070"\nhttp_addr = "0.0.0.0:7071"\n'
    assert_loads(public + TOKEN)
    flagged = assert_loads(public, insecure_no_auth=True)
    assert flagged.server.insecure_no_auth is True
    assert any(w.startswith("server.grpc_addr: authentication is off") for w in flagged.warnings)
    keyed = assert_loads(public + "insecure_no_auth = true\n")
    assert keyed.server.insecure_no_auth is True and len(keyed.warnings) == 2
    tls_only = public + TLS_CA + '[[auth.certs]]\ndns_name = "w"\nrole = "worker"\n'
    assert_loads(tls_only)


def test_open_listener_errors_name_both_listeners() -> None:
    found = problems('[server]\ngrpc_addr = "0.0.0.0:7070"\nhttp_addr = "10.1.2.3:7071"\n')
    assert [error.split(":", 1)[0] for error in found] == ["server.grpc_addr", "server.http_addr"]


def test_origin_rules_of_grpc_web() -> None:
    def origin_errors(origins: tuple[str, ...]) -> list[str]:
        config = Config(server=ServerConfig(grpc_web=GrpcWebConfig(origins)))
        return [e for e in config.validate() if e.startswith("server.grpc_web.allowed_origins")]

    assert origin_errors(("https://dash.example.com", "http://localhost:3000")) == []
    assert "at least one origin" in origin_errors(())[0]
    assert "at most 64" in origin_errors(tuple(f"https://h{i}.example" for i in range(65)))[0]
    bad_origins = (
        "https://*.example.com",
        "https://dash.example.com/",
        "https://dash.example.com/app",
        "dash.example.com",
        "ftp://dash.example.com",
        "https://u:p@dash.example.com",
        "null",
    )
    for bad in bad_origins:
        found = origin_errors((bad,))
        assert found and found[0].startswith("server.grpc_web.allowed_origins[0]: "), bad


def test_config_built_in_python_is_held_to_the_same_rules() -> None:
    from cronoq.config import PoolSection

    config = Config(pools=(PoolSection("ok"), PoolSection("ok", min=3, max=2)))
    assert config.validate() == [
        "pools[1].min: min (3) must not exceed max (2)",
        "pools[1].name: duplicate pool name 'ok' (also pools[0].name)",
    ]


def test_parse_socket_addr() -> None:
    assert parse_socket_addr("127.0.0.1:7070") == ("127.0.0.1", 7070)
    assert parse_socket_addr("[::1]:0") == ("::1", 0)
    for bad in ("127.0.0.1", ":7070", "host:1", "1.2.3.4:-1", "[::1]7070", "[zz]:1", "1.2.3.4:abc"):
        with pytest.raises(ValueError):
            parse_socket_addr(bad)
