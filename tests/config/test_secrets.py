"""Secrets: tokens and URLs from the environment, digests only, nothing printed."""

from __future__ import annotations

import hashlib
import pickle

import pytest
from cronoq.config import (
    AuthConfig,
    Config,
    ConfigError,
    PostgresStoreConfig,
    Role,
    TokenSpec,
    WebhookScaler,
    digest,
    digests_equal,
    token_matches,
)

from .helpers import ADMIN_TOKEN, CLIENT_TOKEN, ENV, PG_URL, WORKER_TOKEN, assert_loads, assert_problem, problems

TOKENS = f"""
[[auth.tokens]]
token_env = "CLIENT_TOKEN"
role = "client"

[[auth.tokens]]
token = "{WORKER_TOKEN}"
role = "worker"
"""


def test_token_env_is_read_and_only_its_digest_kept() -> None:
    config = assert_loads(TOKENS)
    client, worker = config.auth.tokens
    assert client.digest == hashlib.sha256(CLIENT_TOKEN.encode()).digest()
    assert client.env == "CLIENT_TOKEN" and client.length == len(CLIENT_TOKEN)
    assert worker.digest == digest(WORKER_TOKEN) and worker.env is None
    assert not hasattr(client, "token")


def test_no_representation_of_the_config_contains_a_token() -> None:
    config = assert_loads(TOKENS)
    dumps = [repr(config), str(config), repr(config.auth), repr(config.auth.tokens[0]), str(pickle.dumps(config))]
    for text in dumps:
        for secret in (CLIENT_TOKEN, WORKER_TOKEN):
            assert secret not in text
        assert digest(CLIENT_TOKEN).hex() not in text


def test_authenticate_finds_the_entry_in_constant_time_comparison() -> None:
    auth = assert_loads(TOKENS).auth
    assert auth.authenticate(CLIENT_TOKEN) is auth.tokens[0]
    assert auth.authenticate(WORKER_TOKEN) is auth.tokens[1]
    assert auth.authenticate(ADMIN_TOKEN) is None
    assert auth.authenticate(CLIENT_TOKEN[:-1]) is None
    assert auth.tokens[0].matches(CLIENT_TOKEN) and not auth.tokens[0].matches(WORKER_TOKEN)


def test_digest_helpers() -> None:
    assert digest("abc") == hashlib.sha256(b"abc").digest()
    assert digests_equal(digest("abc"), digest("abc"))
    assert not digests_equal(digest("abc"), digest("abd"))
    assert token_matches("abc", digest("abc")) and not token_matches("abd", digest("abc"))


def test_missing_token_env_names_the_variable_and_not_a_token() -> None:
    env = {k: v for k, v in ENV.items() if k != "CLIENT_TOKEN"}
    error = assert_problem(TOKENS, "auth.tokens[0].token_env", "CLIENT_TOKEN is not set", env=env)
    assert WORKER_TOKEN not in error


def test_empty_token_env_is_an_error() -> None:
    assert_problem(TOKENS, "auth.tokens[0].token_env", "CLIENT_TOKEN is empty", env={**ENV, "CLIENT_TOKEN": ""})


def test_check_mode_does_not_read_the_environment() -> None:
    config = Config.parse(TOKENS, env={}, resolve_env=False)
    client = config.auth.tokens[0]
    assert client.digest is None and client.env == "CLIENT_TOKEN"
    assert config.auth.enabled
    assert config.auth.authenticate(CLIENT_TOKEN) is None
    # A literal token is still checked in that mode.
    short = '[[auth.tokens]]\ntoken = "short"\nrole = "client"\n'
    assert_problem(short, "auth.tokens[0].token", "shorter than 16", env={}, resolve_env=False)


def test_token_needs_exactly_one_source() -> None:
    both = f'[[auth.tokens]]\ntoken = "{WORKER_TOKEN}"\ntoken_env = "CLIENT_TOKEN"\nrole = "client"\n'
    neither = '[[auth.tokens]]\nrole = "client"\n'
    assert "both are set" in assert_problem(both, "auth.tokens[0]", "exactly one of token or token_env")
    assert "neither is set" in assert_problem(neither, "auth.tokens[0]", "exactly one of token or token_env")


def test_short_tokens_are_refused_without_echoing_them() -> None:
    error = assert_problem(
        '[[auth.tokens]]\ntoken = "fifteen-chars-x"\nrole = "client"\n',
        "auth.tokens[0].token",
        "shorter than 16 characters",
    )
    assert "fifteen-chars-x" not in error
    assert_problem(
        TOKENS,
        "auth.tokens[0].token_env",
        "the token in CLIENT_TOKEN is shorter than 16",
        env={**ENV, "CLIENT_TOKEN": "tiny"},
    )


def test_tokens_of_16_to_31_characters_load_with_a_warning() -> None:
    config = assert_loads(TOKENS, env={**ENV, "CLIENT_TOKEN": "x" * 16})
    assert len(config.warnings) == 1
    assert config.warnings[0].startswith("auth.tokens[0].token_env: the token in CLIENT_TOKEN is shorter than 32")
    assert assert_loads(TOKENS).warnings == []


def test_duplicate_tokens_are_refused_including_env_tokens() -> None:
    env = {**ENV, "CLIENT_TOKEN": WORKER_TOKEN}
    error = assert_problem(TOKENS, "auth.tokens[1].token", "same token as auth.tokens[0]", env=env)
    assert WORKER_TOKEN not in error
    literal_twice = f'[[auth.tokens]]\ntoken = "{ADMIN_TOKEN}"\nrole = "admin"\n' * 2
    assert_problem(literal_twice, "auth.tokens[1].token", "tokens must be unique", env={})


def test_tokens_with_whitespace_are_refused() -> None:
    error = assert_problem(
        TOKENS,
        "auth.tokens[0].token_env",
        "spaces, control or non-ASCII",
        env={**ENV, "CLIENT_TOKEN": CLIENT_TOKEN + "\n"},
    )
    assert CLIENT_TOKEN not in error


def test_invalid_env_variable_name() -> None:
    assert_problem('[[auth.tokens]]\ntoken_env = ""\nrole = "client"\n', "auth.tokens[0].token_env", "not a valid")


def test_postgres_url_env_defaults_to_database_url() -> None:
    store = assert_loads('[store]\nkind = "postgres"\n').store
    assert isinstance(store, PostgresStoreConfig)
    assert store.url == PG_URL and store.url_env == "DATABASE_URL"


def test_postgres_missing_url_names_the_variable() -> None:
    error = assert_problem('[store]\nkind = "postgres"\n', "store.url_env", "DATABASE_URL is not set", env={})
    assert "store.url" in error
    assert_problem('[store]\nkind = "postgres"\nurl_env = "PG"\n', "store.url_env", "PG is not set", env={})


def test_postgres_url_and_url_env_together_are_refused() -> None:
    assert_problem('[store]\nkind = "postgres"\nurl = "postgres://h/db"\nurl_env = "X"\n', "store.url_env", "not both")


def test_postgres_url_never_appears_in_repr_or_errors() -> None:
    config = assert_loads('[store]\nkind = "postgres"\n')
    assert "s3cret-pw" not in repr(config) and "s3cret-pw" not in repr(config.store)
    insecure = "postgres://u:pw-secret@db.example.com/x"
    config = assert_loads('[store]\nkind = "postgres"\n', env={"DATABASE_URL": insecure})
    assert config.warnings == [
        "store.url_env: the database URL does not set sslmode=verify-full, so the database's identity is not verified"
    ]
    assert "pw-secret" not in " ".join(config.warnings)


@pytest.mark.parametrize(
    ("url", "warned"),
    [
        ("postgres://u:p@db.example.com/x?sslmode=require", True),
        ("postgresql://db.example.com/x?sslmode=verify-full", False),
        ("postgres://u:p@localhost/x", False),
        ("postgres://u:p@127.0.0.1:5432/x", False),
        ("postgres:///x?host=/var/run/postgresql", False),
        ("host=db.example.com dbname=x sslmode=verify-full", False),
        ("host=db.example.com dbname=x", True),
    ],
)
def test_sslmode_warning(url: str, warned: bool) -> None:
    config = assert_loads('[store]\nkind = "postgres"\n', env={"DATABASE_URL": url})
    assert bool(config.warnings) is warned


def test_webhook_token_env_is_read_and_hidden() -> None:
    text = '[[pools]]\nname = "a"\nscaler = { kind = "webhook", url = "https://h/x", token_env = "HOOK" }\n'
    config = assert_loads(text, env={"HOOK": "hook-secret"})
    scaler = config.pools[0].scaler
    assert isinstance(scaler, WebhookScaler) and scaler.token == "hook-secret"
    assert "hook-secret" not in repr(config)
    assert_problem(text, "pools[0].scaler.token_env", "HOOK is not set", env={})


def test_plain_http_webhook_to_another_host_warns() -> None:
    text = '[[pools]]\nname = "a"\nscaler = { kind = "webhook", url = "http://scaler.example.com/x" }\n'
    warnings = assert_loads(text).warnings
    assert len(warnings) == 1 and warnings[0].startswith("pools[0].scaler.url: plain http://")
    local = '[[pools]]\nname = "a"\nscaler = { kind = "webhook", url = "http://localhost:9000/x" }\n'
    assert assert_loads(local).warnings == []


def test_token_spec_built_in_python() -> None:
    spec = TokenSpec.from_token("z" * 40, Role.METRICS, pools=["a"], labels=[("gpu", "a100")])
    auth = AuthConfig(tokens=(spec,))
    assert auth.authenticate("z" * 40) is spec
    assert spec.allows_pool("a") and not spec.allows_pool("b")
    assert spec.allows_labels({"gpu": "a100"}) and not spec.allows_labels({"gpu": "h100"})
    assert spec.allows_labels({})
    assert TokenSpec(Role.CLIENT).allows_labels({"any": "thing"})
    assert Role.ADMIN.grants(Role.WORKER) and not Role.CLIENT.grants(Role.WORKER) and Role.WORKER.grants(Role.WORKER)


def test_config_error_messages_never_contain_env_token_values() -> None:
    env = {**ENV, "CLIENT_TOKEN": "short-secret"}
    with pytest.raises(ConfigError) as info:
        Config.parse(TOKENS + "[server]\nbogus = 1\n", env=env)
    assert "short-secret" not in str(info.value)
    assert len(info.value.errors) == 2


def test_problems_helper_sees_no_errors_for_valid_tokens() -> None:
    assert problems(TOKENS) == []
