"""cronoq.stores: the ``Store`` protocol and its memory, SQLite and Postgres implementations.

``SqliteStore`` and ``PostgresStore`` are imported on first use, so that importing this package
does not require asyncpg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (
    BytesOrJsonCodec,
    Codec,
    Corrupt,
    Fenced,
    JsonCodec,
    SchemaTooNew,
    ShardMismatch,
    Store,
    StoreError,
    Unavailable,
)
from .memory import MemoryState, MemoryStore

if TYPE_CHECKING:
    from .postgres import PostgresStore
    from .sqlite import SqliteStore

    def _implementations_conform(m: MemoryStore, s: SqliteStore, p: PostgresStore) -> list[Store]:
        return [m, s, p]  # the type checker verifies that each one is a Store


__all__ = [
    "BytesOrJsonCodec",
    "Codec",
    "Corrupt",
    "Fenced",
    "JsonCodec",
    "MemoryState",
    "MemoryStore",
    "PostgresStore",
    "SchemaTooNew",
    "ShardMismatch",
    "SqliteStore",
    "Store",
    "StoreError",
    "Unavailable",
]


def __getattr__(name: str) -> Any:
    if name == "SqliteStore":
        from .sqlite import SqliteStore

        return SqliteStore
    if name == "PostgresStore":
        from .postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
