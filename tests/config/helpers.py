"""Shared helpers of the configuration tests."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from cronoq.config import Config, ConfigError

CLIENT_TOKEN = "client-token-0123456789abcdefghijklmnop"
WORKER_TOKEN = "worker-token-0123456789abcdefghijklmnop"
ADMIN_TOKEN = "admin-token-0123456789abcdefghijklmnopq"
PG_URL = "postgres://cronoq:s3cret-pw@db.example.com:5432/cronoq?sslmode=verify-full"

ENV: dict[str, str] = {
    "CLIENT_TOKEN": CLIENT_TOKEN,
    "WORKER_TOKEN": WORKER_TOKEN,
    "ADMIN_TOKEN": ADMIN_TOKEN,
    "DATABASE_URL": PG_URL,
}


def problems(text: str, env: Mapping[str, str] = ENV, **options: object) -> list[str]:
    """Every error ``Config.parse`` reports for ``text`` ([] when it loads)."""
    try:
        Config.parse(text, env=env, **options)  # type: ignore[arg-type]
    except ConfigError as exc:
        assert exc.errors, "ConfigError without errors"
        return exc.errors
    return []


def assert_problem(text: str, path: str, phrase: str, env: Mapping[str, str] = ENV, **options: object) -> str:
    """Loading ``text`` fails with an error at ``path`` that mentions ``phrase``; returns it."""
    found = problems(text, env, **options)
    at_path = [error for error in found if error.startswith(f"{path}: ")]
    if not any(phrase in error for error in at_path):
        pytest.fail(f"expected an error at {path!r} mentioning {phrase!r}; got {found!r}")
    return next(error for error in at_path if phrase in error)


def assert_loads(text: str, env: Mapping[str, str] = ENV, **options: object) -> Config:
    found = problems(text, env, **options)
    assert found == [], found
    return Config.parse(text, env=env, **options)  # type: ignore[arg-type]
