"""Asking a cronoq server for its pools' desired capacity.

One ``Admin.Snapshot`` per server and round serves every scaler that names the server. The
answer is the merged snapshot of every shard the server could ask; a pool of a shard it could
not ask is missing from it (and the shard named in ``unavailable_shards``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from cronoq.client import Client, ClientError

from .decide import Reading, Reason
from .settings import ServerSettings

__all__ = ["ServerReader", "ServerView"]

READ_TIMEOUT_S = 10.0

_UNAUTHORIZED = {"unauthenticated", "permission_denied"}


@dataclass(frozen=True)
class ServerView:
    """One server's answer: the desired slots of every pool it reported, or why it gave none."""

    server: str
    desired: Mapping[str, int] | None
    unavailable_shards: tuple[str, ...] = ()
    reason: str = ""
    message: str = ""
    capacity: Mapping[str, int] = field(default_factory=dict)

    def reading(self, pool: str) -> Reading:
        if self.desired is None:
            return Reading.failed(self.reason, self.message)
        if pool not in self.desired:
            missing = (
                f"; shards {', '.join(self.unavailable_shards)} could not be asked" if self.unavailable_shards else ""
            )
            return Reading.failed(
                Reason.POOL_NOT_REPORTED, f"server {self.server!r} does not report pool {pool!r}{missing}"
            )
        return Reading.of(self.desired[pool])


class ServerReader:
    """Reads one configured server; keeps its channel open between rounds."""

    def __init__(self, settings: ServerSettings, timeout: float = READ_TIMEOUT_S) -> None:
        self.settings = settings
        self.timeout = timeout
        self._client: Client | None = None
        self._token: str | None = None

    async def _current_client(self) -> Client:
        """The client for the current token (a rotated token gets a fresh channel)."""
        token = self.settings.token()
        if not token:
            raise ClientError("unauthenticated", "no metrics token is configured for this server")
        if self._client is None or token != self._token:
            ca = self.settings.ca()
            credentials = grpc.ssl_channel_credentials(root_certificates=ca) if self.settings.secure else None
            await self.close()
            self._client, self._token = Client(self.settings.url, token=token, credentials=credentials), token
        return self._client

    async def view(self) -> ServerView:
        name = self.settings.name
        try:
            client = await self._current_client()
        except OSError as error:
            return ServerView(
                name, None, reason=Reason.UNAUTHORIZED, message=f"server {name!r}: cannot read its token or CA: {error}"
            )
        except ClientError as error:
            return ServerView(name, None, reason=Reason.UNAUTHORIZED, message=f"server {name!r}: {error.message}")
        try:
            async with asyncio.timeout(self.timeout):
                snapshot = await client.snapshot()
        except ClientError as error:
            reason = Reason.UNAUTHORIZED if error.code in _UNAUTHORIZED else Reason.SERVER_UNAVAILABLE
            return ServerView(name, None, reason=reason, message=f"server {name!r}: {error.code}: {error.message}")
        except (TimeoutError, OSError) as error:
            return ServerView(
                name,
                None,
                reason=Reason.SERVER_UNAVAILABLE,
                message=f"server {name!r} did not answer: {error or type(error).__name__}",
            )
        return ServerView(
            name,
            {pool.name: pool.desired for pool in snapshot.pools},
            tuple(snapshot.unavailable_shards),
            capacity={pool.name: pool.capacity for pool in snapshot.pools},
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
