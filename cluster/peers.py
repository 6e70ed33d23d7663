"""Channels from one node to the other shards' endpoints.

One ``grpc.aio`` channel per peer shard, opened on first use and reused by every forwarded call.
``https://`` endpoints use ``[server.peer_tls]`` (its CA, or the system roots, and a client
certificate for shards that require mTLS). A plain ``http://`` endpoint on another host would carry
callers' tokens unencrypted, so it is refused unless ``server.insecure_peer_http`` allows it;
loopback endpoints are always used. Reconnect backoff is short so a restarted shard is reached again
within a second or two; each call sets its own deadline, so a dead shard costs a bounded wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
from cronoq.config import Config, ShardSection
from cronoq.config.net import is_loopback_host

from cronoq.proto import cronoq_pb2_grpc as pbg

__all__ = ["Peer", "PeerChannels", "endpoint_address"]


def endpoint_address(endpoint: str) -> tuple[str, bool]:
    """``(host:port, tls)`` of a shard endpoint such as ``https://cronoq-gpu.internal:7070``."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"shard endpoint {endpoint!r} is not an http(s):// URL")
    return parts.netloc, parts.scheme == "https"


@dataclass(slots=True)
class Peer:
    """Another shard as seen from this node."""

    shard: ShardSection
    refusal: str | None
    """Why calls are not forwarded there (plain http to another host), or None."""
    channel: Any = None
    tasks: Any = None
    admin: Any = None

    @property
    def name(self) -> str:
        return self.shard.name


def _read(path: str | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


class PeerChannels:
    """The peers of this node's shard, with lazily opened, shared channels."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", config.limits.max_message_bytes),
            ("grpc.max_receive_message_length", config.limits.max_message_bytes),
            # Pings while a Forward stream is open, even an idle one, and drop the connection when
            # one goes unanswered for keepalive_timeout_s: grpcio otherwise waits for a ping's
            # answer grpc.http2.ping_timeout_ms (60 s), and calls forwarded to a frozen or cut-off
            # peer would each wait out their deadline on the dead connection until then. Peers
            # ping at most every 6 s: servers accept a ping every 5 s without data between.
            ("grpc.keepalive_time_ms", max(6000, round(config.limits.keepalive_interval_s * 1000))),
            ("grpc.keepalive_timeout_ms", max(1000, round(config.limits.keepalive_timeout_s * 1000))),
            ("grpc.http2.ping_timeout_ms", max(1000, round(config.limits.keepalive_timeout_s * 1000))),
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        self._peers = {shard.name: Peer(shard, self._refusal(shard)) for shard in config.peers()}
        self._credentials: grpc.ChannelCredentials | None = None
        self._replicas: dict[str, Any] = {}  # endpoint -> channel

    def _refusal(self, shard: ShardSection) -> str | None:
        if self._plain_to_another_host(shard.endpoint):
            return (
                f"shard {shard.name!r} has a plain http:// endpoint on another host; callers' tokens are not "
                f"forwarded there unencrypted (server.insecure_peer_http allows it on trusted networks)"
            )
        return None

    def _plain_to_another_host(self, endpoint: str) -> bool:
        parts = urlsplit(endpoint)
        if parts.scheme == "https" or self._config.server.insecure_peer_http:
            return False
        return not is_loopback_host(parts.hostname or "")

    def replica_channel(self, endpoint: str) -> Any:
        """A channel to one replica of this node's shard (``[[shards]] replicas``), opened on first
        use; ValueError when callers' tokens may not be sent there (plain http to another host)."""
        channel = self._replicas.get(endpoint)
        if channel is None:
            if self._plain_to_another_host(endpoint):
                raise ValueError("a plain http:// endpoint on another host: the caller's token is not sent there")
            address, tls = endpoint_address(endpoint)
            if tls:
                channel = grpc.aio.secure_channel(address, self._tls(), options=self._options)
            else:
                channel = grpc.aio.insecure_channel(address, options=self._options)
            self._replicas[endpoint] = channel
        return channel

    def __contains__(self, name: str) -> bool:
        return name in self._peers

    def names(self) -> list[str]:
        return list(self._peers)

    def peer(self, name: str) -> Peer:
        """The peer shard ``name`` with its channel open (``KeyError`` for an unknown shard)."""
        peer = self._peers[name]
        if peer.channel is None and peer.refusal is None:
            address, tls = endpoint_address(peer.shard.endpoint)
            if tls:
                peer.channel = grpc.aio.secure_channel(address, self._tls(), options=self._options)
            else:
                peer.channel = grpc.aio.insecure_channel(address, options=self._options)
            peer.tasks = pbg.TasksStub(peer.channel)  # type: ignore[no-untyped-call]
            peer.admin = pbg.AdminStub(peer.channel)  # type: ignore[no-untyped-call]
        return peer

    def _tls(self) -> grpc.ChannelCredentials:
        if self._credentials is None:
            peer_tls = self._config.server.peer_tls
            if peer_tls is None:
                self._credentials = grpc.ssl_channel_credentials()
            else:
                self._credentials = grpc.ssl_channel_credentials(
                    root_certificates=_read(peer_tls.ca),
                    private_key=_read(peer_tls.key),
                    certificate_chain=_read(peer_tls.cert),
                )
        return self._credentials

    async def close(self) -> None:
        replicas, self._replicas = list(self._replicas.values()), {}
        for channel in replicas:
            await channel.close()
        for peer in self._peers.values():
            if peer.channel is not None:
                await peer.channel.close()
                peer.channel = peer.tasks = peer.admin = None
