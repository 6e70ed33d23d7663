"""How the Postgres store classifies asyncpg's failures (shared by the store and its lease)."""

from __future__ import annotations

import asyncpg

from .base import StoreError, Unavailable

__all__ = ["PG_FAILURES", "map_error"]

# SQLSTATE classes of failures worth retrying: connection, transaction rollback (serialization,
# deadlock), insufficient resources, operator intervention (shutdown, cancel).
TRANSIENT_CLASSES = ("08", "40", "53", "57")

PG_FAILURES = (OSError, asyncpg.InterfaceError, asyncpg.PostgresError, TimeoutError)


def map_error(exc: BaseException, doing: str) -> StoreError:
    """``Unavailable`` for what may succeed when retried, ``StoreError`` for the rest."""
    text = f"postgres {doing} failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, OSError | asyncpg.InterfaceError | TimeoutError):
        return Unavailable(text)
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", None) or ""
        if state[:2] in TRANSIENT_CLASSES or state == "55P03":
            return Unavailable(text)
    return StoreError(text)
