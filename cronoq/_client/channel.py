"""Targets, channels, credentials metadata and the rules for following a shard redirect."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import grpc
import grpc.aio

from cronoq._client.common import GRPC_DEFAULT_RECEIVE, MAX_REDIRECTS
from cronoq._client.errors import ClientError

_SHARD_ENDPOINT_KEY = "cronoq-shard-endpoint"


def receive_limit(options: Sequence[tuple[str, Any]]) -> int:
    """The largest message a channel with ``options`` accepts (what a Worker announces as its
    ``batch_bytes``): gRPC's default unless the options set ``grpc.max_receive_message_length``."""
    limit = GRPC_DEFAULT_RECEIVE
    for key, value in options:
        if key == "grpc.max_receive_message_length" and isinstance(value, int):
            limit = value if value > 0 else 2**31 - 1  # -1: no limit
    return limit


KEEPALIVE: tuple[tuple[str, Any], ...] = (
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    # grpcio 1.85 waits for a ping's answer grpc.http2.ping_timeout_ms (60 s by default), not
    # keepalive_timeout_ms.
    ("grpc.http2.ping_timeout_ms", 5_000),
    # An idle worker, or a Client waiting for a long Wait, sends no data; by default gRPC stops
    # pinging after two pings without data.
    ("grpc.http2.max_pings_without_data", 0),
)
"""While a call or stream is open, a Client or Worker pings its server every 10 s and drops the
connection when 5 s pass without an answer, so the call ends UNAVAILABLE: a leader frozen by the
kernel (SIGSTOP, a stalled VM) still answers TCP, and without pings its workers would stay on it
after a standby took over, and a Client call without a deadline would wait for it forever (the
failover drills found both). A channel without calls does not ping. cronoq-server accepts a ping
every 5 s (``grpc.http2.min_ping_interval_without_data_ms``)."""


def with_keepalive(options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``options`` plus the keepalive settings (``KEEPALIVE``) that the caller did not set itself."""
    chosen = {key for key, _ in options}
    return [*options, *((key, value) for key, value in KEEPALIVE if key not in chosen)]


def strip_target(target: str) -> str:
    """The gRPC address of a target: scheme prefix (http/https/grpc) and trailing slashes removed."""
    lowered = target.lower()
    for prefix in ("http://", "https://", "grpc://"):
        if lowered.startswith(prefix):
            target = target[len(prefix) :]
            break
    return target.rstrip("/")


def wants_tls(target: str, tls: bool, credentials: Any) -> bool:
    """A secure channel is used with ``tls=True``, explicit credentials, or an ``https://`` target."""
    return bool(tls) or credentials is not None or target.lower().startswith("https://")


def open_channel(target: str, *, secure: bool, credentials: Any, options: Sequence[tuple[str, Any]]) -> Any:
    address = strip_target(target)
    if secure:
        creds = credentials if credentials is not None else grpc.ssl_channel_credentials()
        return grpc.aio.secure_channel(address, creds, options=list(options))
    return grpc.aio.insecure_channel(address, options=list(options))


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...] | None:
    return (("authorization", f"Bearer {token}"),) if token else None


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_redirect(
    endpoint: str,
    *,
    current_target: str,
    tls: bool,
    credentials: Any,
    token: str | None,
    insecure_redirect_http: bool,
    followed: int,
) -> bool:
    """Decide whether a worker may follow a shard redirect to ``endpoint``.

    ``followed`` is how many redirects were followed in a row before this one. Returns True when the
    redirect is allowed but sends the token over plain http to another host (log a warning), False
    when it is simply allowed; raises ``ClientError("failed_precondition", ...)`` when refused.
    """
    lowered = endpoint.lower()
    if not (lowered.startswith("http://") or lowered.startswith("https://")):
        raise ClientError("failed_precondition", f"shard redirect to unsupported endpoint {endpoint!r}")
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
    except ValueError:
        raise ClientError("failed_precondition", f"shard redirect to malformed endpoint {endpoint!r}") from None
    if not parts.netloc or "@" in parts.netloc or not host:
        raise ClientError("failed_precondition", f"shard redirect to malformed endpoint {endpoint!r}")
    if followed >= MAX_REDIRECTS:
        raise ClientError(
            "failed_precondition", f"too many shard redirects in a row ({followed + 1}); last to {endpoint}"
        )
    if lowered.startswith("http://"):
        if wants_tls(current_target, tls, credentials):
            raise ClientError("failed_precondition", f"refusing shard redirect from TLS to plain {endpoint}")
        if token and not _is_loopback(host):
            if not insecure_redirect_http:
                raise ClientError(
                    "failed_precondition",
                    f"refusing to send the token over plain http to {endpoint} "
                    "(pass insecure_redirect_http=True on trusted networks)",
                )
            return True
    return False


def _metadata_value(metadata: Any, key: str) -> str | None:
    if not metadata:
        return None
    for item in metadata:
        try:
            k, v = item
        except (TypeError, ValueError):
            continue
        if isinstance(k, str) and k.lower() == key and isinstance(v, str):
            return v
    return None


def redirect_endpoint(e: grpc.aio.AioRpcError) -> str | None:
    """The shard endpoint a ``FAILED_PRECONDITION`` on ``Work`` points at, if any."""
    if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    for getter in (e.trailing_metadata, e.initial_metadata):
        try:
            value = _metadata_value(getter(), _SHARD_ENDPOINT_KEY)
        except Exception:  # metadata may be unavailable on some error paths
            value = None
        if value:
            return value
    return None
