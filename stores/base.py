"""The ``Store`` protocol, its errors and the payload codec.

A store is the write-ahead log of the engine: the driver hands it every mutation of one engine
step (``commit``), and a new leader reads the surviving state back (``recover``). Three
implementations share these semantics and one conformance suite: ``MemoryStore``,
``SqliteStore`` and ``PostgresStore``.

Conventions shared by every store:

* Engine times (``recover(now, ...)``, ``prune(before)``, everything inside mutations) are ``int``
  nanoseconds since the Unix epoch. Constructor durations (lease TTLs, poll intervals, timeouts)
  are ``float`` seconds, like the published ``SqliteStore`` signature.
* Leadership: ``acquire_leadership()`` waits until this instance leads and returns a fresh epoch
  (one more than any epoch issued before on this store). Every ``commit`` names the epoch it was
  issued under; a stale epoch raises ``Fenced`` and writes nothing.
* Loss of leadership is signalled through the ``lost`` attribute, an ``asyncio.Event``. It is set
  when the store notices that leadership went away without being released (lease taken over,
  lock session gone or unresponsive, a commit fenced), and cleared by the next successful
  ``acquire_leadership()``. A voluntary ``release_leadership()`` or ``close()`` does not set it.
  The owner typically races its serving loop against ``await store.lost.wait()``.
* ``commit`` is idempotent: applying the same batch twice leaves the same rows, so a driver may
  retry a batch whose commit raised ``Unavailable`` (its outcome is unknown).
* Text rules: NUL characters are refused (``ValueError``, before anything is written) in keys,
  kinds, pool, tag, label, resource, tenant and recurring names; in messages they are stored as
  U+FFFD, as are unpaired surrogates.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from cronoq.engine.actions import Mutation, Recovered

__all__ = [
    "BytesOrJsonCodec",
    "Codec",
    "Corrupt",
    "Fenced",
    "JsonCodec",
    "SchemaTooNew",
    "ShardMismatch",
    "Store",
    "StoreError",
    "Unavailable",
    "Unstorable",
]


# ---------------------------------------------------------------------------------------------
# Settings

MAX_SETTING_S = 100 * 365.25 * 86400.0
"""The longest duration a store setting may be (a century, as every duration the engine takes)."""


def check_seconds(what: str, value: object, *, positive: bool = True) -> float:
    """A store setting in seconds: a finite number, positive (or not negative), at most a century.
    ValueError (TypeError for a non-number) names the setting."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not (seconds > 0.0 if positive else seconds >= 0.0) or not seconds <= MAX_SETTING_S:
        bound = "positive" if positive else "non-negative"
        raise ValueError(f"{what} must be a {bound}, finite number of seconds of at most 100 years (got {value!r})")
    return seconds


# ---------------------------------------------------------------------------------------------
# Errors


class StoreError(Exception):
    """Base of every error a store raises (besides ``ValueError``/``TypeError`` for bad input)."""


class Unavailable(StoreError):
    """A transient failure: the database could not be reached, was busy, or a commit took longer
    than ``commit_timeout``. The outcome of such a commit is unknown; retrying it is safe."""


class Fenced(StoreError):
    """The caller's epoch is stale or its leadership is gone: it must stop serving at once."""


class Corrupt(StoreError):
    """A stored row cannot be decoded (recovery quarantines such rows instead of raising)."""


class Unstorable(ValueError, TypeError):
    """A mutation a store cannot encode (a value outside int64, text a database cannot hold, a
    payload the codec refuses); nothing of its step was written. ``task_id`` names the task it
    belongs to (None for a schedule). Both a ValueError and a TypeError, as the errors it wraps."""

    def __init__(self, message: str, task_id: int | None = None) -> None:
        super().__init__(message)
        self.task_id = task_id


class SchemaTooNew(StoreError):
    """The database was migrated by a newer build than this one."""


class ShardMismatch(StoreError):
    """The store already holds the tasks of another shard."""


# ---------------------------------------------------------------------------------------------
# Codecs


@runtime_checkable
class Codec(Protocol):
    """Turns payloads and outputs into bytes for storage, and back."""

    def encode(self, obj: Any, /) -> bytes: ...

    def decode(self, data: bytes, /) -> Any: ...


# One encoder, built once: ``json.dumps`` with non-default options builds a new one per call.
_encode_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def json_bytes(obj: Any) -> bytes:
    """``obj`` as compact UTF-8 JSON; the same bytes as ``json.dumps(obj, ensure_ascii=False,
    separators=(",", ":"))``, with the commonest scalars answered without the encoder."""
    kind = type(obj)
    if obj is None:
        return b"null"
    if kind is int:
        return int.__repr__(obj).encode()
    if kind is bool:
        return b"true" if obj else b"false"
    return _encode_json(obj).encode("utf-8")


def json_value(data: bytes) -> Any:
    """``json.loads(data)``, with the commonest payloads (``null``, small non-negative integers)
    answered without the parser."""
    if type(data) is bytes and len(data) < 19:
        if data.isdigit() and (data[0] != 0x30 or len(data) == 1):  # JSON has no leading zeros
            return int(data)
        if data == b"null":
            return None
    return json.loads(data)


class JsonCodec:
    """Plain JSON (UTF-8, compact, non-ASCII kept as is). Values JSON cannot hold raise TypeError.

    This is the codec of the embedded Python API.
    """

    __slots__ = ()

    def encode(self, obj: Any, /) -> bytes:
        return json_bytes(obj)

    def decode(self, data: bytes, /) -> Any:
        return json_value(data)


class BytesOrJsonCodec:
    """The stores' default codec: raw bytes stay raw, everything else is JSON.

    Byte strings (``bytes``, ``bytearray``, ``memoryview``) are stored as one 0x00 marker byte
    followed by the bytes unchanged, and come back as ``bytes``. Other values are stored as JSON
    text; JSON never starts with 0x00, so the two forms cannot be confused. This suits the server,
    whose payloads and outputs are opaque bytes, while keeping JSON values readable in the table.
    """

    __slots__ = ()

    _RAW = b"\x00"

    def encode(self, obj: Any, /) -> bytes:
        if isinstance(obj, bytes | bytearray | memoryview):
            return self._RAW + bytes(obj)
        return json_bytes(obj)

    def decode(self, data: bytes, /) -> Any:
        if data[:1] == self._RAW:
            return bytes(data[1:])
        return json_value(data)


DEFAULT_CODEC: Codec = BytesOrJsonCodec()


# ---------------------------------------------------------------------------------------------
# The protocol


@runtime_checkable
class Store(Protocol):
    """What the shard driver needs from durable state.

    ``open`` is optional for callers: every other method opens the store on first use. Opening
    applies pending migrations and checks the schema version and the shard the store belongs to.
    """

    lost: asyncio.Event
    """Set when leadership is lost involuntarily; cleared by the next ``acquire_leadership``."""

    @property
    def epoch(self) -> int | None:
        """The epoch this instance currently leads with, or None."""
        ...

    async def open(self) -> None:
        """Connect, migrate and check the shard (idempotent)."""
        ...

    async def acquire_leadership(self) -> int:
        """Wait until this instance leads; return the new epoch (persisted, always increasing)."""
        ...

    async def release_leadership(self) -> None:
        """Step down at once so that a standby can take over without waiting for a timeout."""
        ...

    async def commit(self, epoch: int, mutations: Sequence[Mutation]) -> None:
        """Write one engine step in one transaction.

        Raises ``Fenced`` (stale epoch or lost leadership; nothing written), ``Unavailable``
        (transient; outcome unknown, retry is safe), ``Unstorable`` (a ``ValueError`` and a
        ``TypeError``, naming the task) for input that cannot be stored (nothing written).

        A store may also offer ``prepare(mutations) -> None`` (not part of this protocol, looked
        up by the driver): called with a step's mutations while an earlier commit is still in
        flight, it may encode them ahead for the ``commit`` of the same list object. It writes
        nothing and raises nothing; ``commit`` behaves the same whether it ran or not.
        """
        ...

    async def recover(self, now: int, retention: int | None = None) -> Recovered:
        """Read back the state a new leader restores.

        Tasks: every non-terminal task, terminal tasks finished at or after ``now - retention``,
        and terminal tasks that a non-terminal task depends on (by id, or the newest task with the
        key), in id order. Rows that cannot be decoded are quarantined: marked DeadLettered in the
        store with the message ``"quarantined: <reason>"`` and returned as such (with whatever
        of their spec could be read). Recurring rows that cannot be decoded are skipped and
        logged. ``retention`` defaults to the store's configured retention.
        """
        ...

    async def load_output(self, task_id: int) -> tuple[bool, object]:
        """``(True, output)`` when the task's output is stored, else ``(False, None)``.

        Raises ``Corrupt`` when the stored output cannot be decoded.
        """
        ...

    async def prune(self, before: int) -> int:
        """Delete terminal tasks that finished before ``before``; return how many.

        The id high-water mark is kept, so ids are never reused.
        """
        ...

    async def close(self) -> None:
        """Release leadership if held and free every resource (idempotent)."""
        ...
