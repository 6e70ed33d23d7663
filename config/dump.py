"""Write a ``Config`` back as TOML (used by the cluster launcher and the round-trip tests).

Secrets are written the way they were configured when that is possible: a token or URL from the
environment becomes its ``token_env`` / ``url_env`` again. A token that was written in the file
itself cannot be written back, because only its digest was kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import TYPE_CHECKING

from .auth import CertSpec, TokenSpec
from .schema import (
    ConsoleConfig,
    PoolSection,
    PostgresStoreConfig,
    ResourceSection,
    SemaphoreResource,
    ShardSection,
    SqliteStoreConfig,
    WebhookScaler,
)

if TYPE_CHECKING:
    from .model import Config

__all__ = ["dump"]

Value = str | int | float | bool | tuple[str, ...] | Mapping[str, "Value"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _string(text: str) -> str:
    # JSON string escapes are all valid TOML escapes; TOML also wants DEL escaped.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007F")


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _string(key)


def _value(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_string(item) for item in value) + "]"
    inner = ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items())
    return "{ " + inner + " }" if inner else "{}"


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def table(self, header: str, items: Iterable[tuple[str, Value | None]]) -> None:
        if self.lines:
            self.lines.append("")
        self.lines.append(header)
        for key, value in items:
            if value is not None:
                self.lines.append(f"{_key(key)} = {_value(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def dump(config: Config) -> str:
    out = _Writer()
    server = config.server
    out.table(
        "[server]",
        [
            ("grpc_addr", server.grpc_addr),
            ("http_addr", server.http_addr),
            ("metrics_addr", server.metrics_addr),
            ("insecure_no_auth", server.insecure_no_auth),
            ("shutdown_grace_s", server.shutdown_grace_s),
            ("shard", server.shard),
            ("insecure_peer_http", server.insecure_peer_http),
        ],
    )
    if server.tls is not None:
        tls = server.tls
        out.table("[server.tls]", [("cert", tls.cert), ("key", tls.key), ("client_ca", tls.client_ca)])
    if server.peer_tls is not None:
        peer = server.peer_tls
        out.table("[server.peer_tls]", [("ca", peer.ca), ("cert", peer.cert), ("key", peer.key)])
    if server.grpc_web is not None:
        out.table("[server.grpc_web]", [("allowed_origins", server.grpc_web.allowed_origins)])
    if server.console != ConsoleConfig():
        console = server.console
        out.table("[server.console]", [("enabled", console.enabled)])
    for index, token in enumerate(config.auth.tokens):
        out.table("[[auth.tokens]]", _token(index, token))
    for cert in config.auth.certs:
        out.table("[[auth.certs]]", [("dns_name", cert.dns_name), *_grant(cert)])
    out.table("[store]", _store(config))
    limits = config.limits
    out.table("[limits]", [(f.name, getattr(limits, f.name)) for f in fields(limits)])
    for pool in config.pools:
        out.table("[[pools]]", _pool(pool))
    for res in config.resources:
        out.table("[[resources]]", _resource(res))
    for shard in config.shards:
        out.table("[[shards]]", _shard(shard))
    outputs = config.outputs
    out.table("[outputs]", [(f.name, getattr(outputs, f.name)) for f in fields(outputs)])
    return out.text()


def _grant(spec: TokenSpec | CertSpec) -> list[tuple[str, Value | None]]:
    labels = None if spec.labels is None else tuple(f"{name}={value}" for name, value in spec.labels)
    return [("role", spec.role.value), ("pools", spec.pools), ("labels", labels), ("tenant", spec.tenant)]


def _token(index: int, token: TokenSpec) -> list[tuple[str, Value | None]]:
    if token.env is None:
        raise ValueError(
            f"auth.tokens[{index}] was written in the file; only its digest is kept, so it cannot be written "
            "back (use token_env)"
        )
    return [("token_env", token.env), *_grant(token)]


def _lease(store: SqliteStoreConfig | PostgresStoreConfig) -> list[tuple[str, Value | None]]:
    return [
        ("lease_ttl_s", store.lease_ttl_s),
        ("lease_renew_s", store.lease_renew_s),
        ("lock_poll_s", store.lock_poll_s),
    ]


def _store(config: Config) -> list[tuple[str, Value | None]]:
    store = config.store
    if isinstance(store, SqliteStoreConfig):
        return [("kind", store.kind), ("path", store.path), ("keep_finished_s", store.keep_finished_s), *_lease(store)]
    if isinstance(store, PostgresStoreConfig):
        source: tuple[str, Value | None] = ("url_env", store.url_env) if store.url_env else ("url", store.url)
        return [
            ("kind", store.kind),
            source,
            ("keep_finished_s", store.keep_finished_s),
            ("schema", store.schema),
            *_lease(store),
        ]
    return [("kind", store.kind)]


def _pool(pool: PoolSection) -> list[tuple[str, Value | None]]:
    scaler: Mapping[str, Value] | None = None
    if isinstance(pool.scaler, WebhookScaler):
        hook: dict[str, Value] = {"kind": "webhook", "url": pool.scaler.url}
        if pool.scaler.token_env is not None:
            hook["token_env"] = pool.scaler.token_env
        scaler = hook
    retry: Mapping[str, Value] | None = None
    if pool.retry is not None:
        r = pool.retry
        retry = {
            "max_attempts": r.max_attempts,
            "initial_backoff_s": r.initial_backoff_s,
            "multiplier": r.multiplier,
            "max_backoff_s": r.max_backoff_s,
            "jitter": r.jitter,
        }
    return [
        ("name", pool.name),
        ("min", pool.min),
        ("max", pool.max),
        ("autoscale", pool.autoscale),
        ("scaler", scaler),
        ("lease_ttl_s", pool.lease_ttl_s),
        ("max_pending", pool.max_pending),
        ("overflow", pool.overflow.value),
        ("retry", retry),
        ("default_duration_s", pool.default_duration_s),
        ("reservable_fraction", pool.reservable_fraction),
        ("await_unknown_dependencies_s", pool.await_unknown_dependencies_s),
        ("target_utilization", pool.target_utilization),
        ("drain_time_s", pool.drain_time_s),
        ("cooldown_s", pool.cooldown_s),
        ("cost_per_worker_second", pool.cost_per_worker_second),
        ("max_slots_per_worker", pool.max_slots_per_worker),
        ("fair_share", pool.fair_share),
        ("tenant_weights", dict(pool.tenant_weights) or None),
    ]


def _resource(res: ResourceSection) -> list[tuple[str, Value | None]]:
    if isinstance(res, SemaphoreResource):
        return [("kind", res.kind), ("name", res.name), ("permits", res.permits), ("shard", res.shard)]
    return [("kind", res.kind), ("name", res.name), ("rate", res.rate), ("burst", res.burst), ("shard", res.shard)]


def _shard(shard: ShardSection) -> list[tuple[str, Value | None]]:
    fields: list[tuple[str, Value | None]] = [
        ("name", shard.name),
        ("number", shard.number),
        ("pools", shard.pools),
        ("endpoint", shard.endpoint),
    ]
    if shard.replicas:
        fields.append(("replicas", shard.replicas))
    return fields
