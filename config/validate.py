"""The rules a loaded configuration must satisfy, and the warnings it may earn.

``issues`` walks the whole configuration and returns every broken rule, each tied to the key
path it concerns. Rules that need the environment (a ``token_env`` that is not set) are checked
while loading, in ``load``; everything that can be decided from the values is here, so a
``Config`` built in Python is held to the same rules as one read from a file.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from .auth import MIN_TOKEN_LEN, RECOMMENDED_TOKEN_LEN, CertSpec, Label, TokenSpec
from .net import (
    check_endpoint,
    check_origin,
    check_webhook_url,
    is_loopback_host,
    parse_socket_addr,
    postgres_url_facts,
    url_host,
)
from .schema import (
    DEFAULT_SHARDED_SCHEMA,
    MAX_DURATION_S,
    SHARD_PLACEHOLDER,
    LimitsConfig,
    PoolSection,
    PostgresStoreConfig,
    RetrySection,
    SemaphoreResource,
    ServerConfig,
    SqliteStoreConfig,
    WebhookScaler,
)

if TYPE_CHECKING:
    from .model import Config

__all__ = ["Issue", "file_errors", "issues", "key_path", "validate", "warnings"]

U8 = 255
U32 = 2**32 - 1
USIZE = 2**64 - 1
MAX_ORIGINS = 64
GRPC_MAX_MESSAGE = 2**31 - 1

NAME_RULE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
NAME_HELP = "1 to 64 characters of A-Z a-z 0-9 _ . : -"
SCHEMA_RULE = re.compile(r"[A-Za-z0-9_]{1,63}")


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def key_path(parent: str, key: str) -> str:
    """``parent.key``, quoting ``key`` the way TOML would when it is not a bare key."""
    shown = key if _BARE_KEY.fullmatch(key) else '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return f"{parent}.{shown}" if parent else shown


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem: the key path it concerns (e.g. ``pools[1].max``) and what is wrong."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def validate(config: Config) -> list[str]:
    return [str(issue) for issue in issues(config)]


def issues(config: Config) -> list[Issue]:
    out: list[Issue] = []
    check = _Checker(out)
    check.server(config)
    check.auth(config)
    check.store(config)
    check.limits(config.limits)
    check.pools(config)
    check.resources(config)
    check.shards(config)
    out_cfg = config.outputs
    for spec in fields(out_cfg):
        check.count(f"outputs.{spec.name}", getattr(out_cfg, spec.name), 0, USIZE)
    return out


# Smallest accepted value of each [limits] key; the largest is the size of its type.
_LIMIT_FLOORS: dict[str, int] = {
    "max_tasks_per_batch": 1,
    "max_pending_total": 1,
    "max_pending_per_pool": 1,
    "max_message_bytes": 1024,
    "max_http_body_bytes": 1024,
    "max_key_len": 1,
    "max_kind_len": 1,
    "max_tags": 0,
    "max_tag_len": 1,
    "max_deps": 0,
    "max_resources": 0,
    "max_concurrent_requests": 1,
    "max_concurrent_streams": 1,
    "max_slots_per_worker": 1,
    "key_retention_max": 0,
    "max_list": 1,
    "max_connections": 1,
    "max_concurrent_requests_per_caller": 1,
    "max_streams_per_caller": 1,
    "max_header_bytes": 1024,
    "max_headers": 8,
    "max_stream_resets_per_s": 1,
}
_LIMIT_CEILINGS: dict[str, int] = {
    "max_message_bytes": GRPC_MAX_MESSAGE,
    "max_concurrent_streams": U32,
    "max_slots_per_worker": U32,
    "max_connections": U32,
    "max_streams_per_caller": U32,
    "max_header_bytes": U32,
    "max_headers": U32,
    "max_stream_resets_per_s": U32,
}
_POSITIVE_LIMIT_DURATIONS = frozenset(
    {
        "request_timeout_s",
        "keepalive_interval_s",
        "keepalive_timeout_s",
        "header_timeout_s",
        "idle_timeout_s",
        "write_stall_timeout_s",
    }
)


class _Checker:
    def __init__(self, out: list[Issue]) -> None:
        self.out = out

    def add(self, path: str, message: str) -> None:
        self.out.append(Issue(path, message))

    # primitive rules

    def duration(self, path: str, value: float, *, positive: bool = False) -> None:
        if not math.isfinite(value):
            self.add(path, "must be a finite number of seconds")
        elif value < 0:
            self.add(path, "must not be negative")
        elif positive and value == 0:
            self.add(path, "must be greater than 0")
        elif value > MAX_DURATION_S:
            self.add(path, f"must be at most one year ({MAX_DURATION_S:.0f} s)")

    def count(self, path: str, value: int, low: int, high: int) -> None:
        if not low <= value <= high:
            if high >= USIZE:
                self.add(path, f"must be at least {low}")
            else:
                self.add(path, f"must be between {low} and {high}")

    def number(self, path: str, value: float, *, low: float, high: float | None = None, low_open: bool = False) -> None:
        """A finite number in [low, high] (or (low, high] when ``low_open``); no upper end if ``high`` is None."""
        below = value <= low if low_open else value < low
        if not math.isfinite(value):
            self.add(path, "must be a finite number")
        elif high is not None and (below or value > high):
            left = "(" if low_open else "["
            self.add(path, f"must be within {left}{low:g}, {high:g}]")
        elif below:
            self.add(path, f"must be greater than {low:g}" if low_open else f"must be at least {low:g}")

    def name(self, path: str, value: str, what: str) -> bool:
        if NAME_RULE.fullmatch(value):
            return True
        self.add(path, f"invalid {what} name {value!r}: use {NAME_HELP}")
        return False

    def text(self, path: str, value: str, what: str) -> None:
        if not value:
            self.add(path, f"{what} must not be empty")
        elif "\0" in value:
            self.add(path, f"{what} must not contain NUL characters")

    def unique(self, items: Iterable[tuple[str, str]], what: str) -> None:
        """Report every value seen before, naming where it was first seen."""
        first: dict[str, str] = {}
        for path, value in items:
            if value in first:
                self.add(path, f"duplicate {what} {value!r} (also {first[value]})")
            else:
                first[value] = path

    # [server]

    def server(self, config: Config) -> None:
        server = config.server
        bound: dict[tuple[str, int], str] = {}
        for key in ("grpc_addr", "http_addr", "metrics_addr"):
            addr = getattr(server, key)
            if addr is None:
                continue
            path = f"server.{key}"
            try:
                host, port = parse_socket_addr(addr)
            except ValueError as exc:
                self.add(path, f"invalid address {addr!r}: {exc}")
                continue
            if port and (host, port) in bound:
                self.add(path, f"{addr} is already used by {bound[(host, port)]}")
            bound[(host, port)] = path
            open_to_all = not config.auth.enabled and not server.insecure_no_auth
            if key != "metrics_addr" and open_to_all and not is_loopback_host(host):
                self.add(
                    path,
                    f"{addr} is not a loopback address and no credentials are configured: add "
                    "[[auth.tokens]] or [[auth.certs]], or set server.insecure_no_auth = true "
                    "(or pass --insecure-no-auth) to run without authentication",
                )
        self.duration("server.shutdown_grace_s", server.shutdown_grace_s)
        if server.tls is not None:
            self.text("server.tls.cert", server.tls.cert, "the certificate path")
            self.text("server.tls.key", server.tls.key, "the key path")
            if server.tls.client_ca is not None:
                self.text("server.tls.client_ca", server.tls.client_ca, "the CA path")
        peer = server.peer_tls
        if peer is not None and (peer.cert is None) != (peer.key is None):
            missing = "key" if peer.key is None else "cert"
            self.add(f"server.peer_tls.{missing}", "peer_tls.cert and peer_tls.key go together")
        if server.grpc_web is not None:
            self.origins(server.grpc_web.allowed_origins)

    def origins(self, origins: tuple[str, ...]) -> None:
        path = "server.grpc_web.allowed_origins"
        if not origins:
            self.add(path, "must list at least one origin")
        elif len(origins) > MAX_ORIGINS:
            self.add(path, f"lists {len(origins)} origins; at most {MAX_ORIGINS} are allowed")
        for index, origin in enumerate(origins):
            problem = check_origin(origin)
            if problem is not None:
                self.add(f"{path}[{index}]", f"{origin!r} is not an exact origin: {problem}")

    # [auth]

    def auth(self, config: Config) -> None:
        pools = {pool.name for pool in config.pools}
        seen: dict[bytes, str] = {}
        for index, token in enumerate(config.auth.tokens):
            base = f"auth.tokens[{index}]"
            where = f"{base}.token_env" if token.env is not None else f"{base}.token"
            what = f"the token in {token.env}" if token.env is not None else "the token"
            if token.length is not None and token.length < MIN_TOKEN_LEN:
                self.add(where, f"{what} is shorter than {MIN_TOKEN_LEN} characters")
            if token.digest is not None:
                if token.digest in seen:
                    self.add(where, f"{what} is the same token as {seen[token.digest]}; tokens must be unique")
                else:
                    seen[token.digest] = base
            self.grant(base, token, pools)
        certs = config.auth.certs
        for index, cert in enumerate(certs):
            base = f"auth.certs[{index}]"
            self.text(f"{base}.dns_name", cert.dns_name, "dns_name")
            self.grant(base, cert, pools)
        self.unique(
            ((f"auth.certs[{i}].dns_name", c.dns_name.lower().rstrip(".")) for i, c in enumerate(certs) if c.dns_name),
            "dns_name",
        )
        tls = config.server.tls
        if certs and (tls is None or tls.client_ca is None):
            self.add(
                "auth.certs",
                "client certificate mappings need server.tls.client_ca (and [server.tls]) so that "
                "clients present certificates",
            )

    def grant(self, base: str, spec: TokenSpec | CertSpec, pools: set[str]) -> None:
        if spec.pools is not None:
            if not spec.pools:
                self.add(f"{base}.pools", "an empty list allows no pool; leave pools out to allow every pool")
            for index, pool in enumerate(spec.pools):
                if pool not in pools:
                    self.add(f"{base}.pools[{index}]", f"unknown pool {pool!r}")
        if spec.labels is not None:
            for index, label in enumerate(spec.labels):
                self.label(f"{base}.labels[{index}]", label)
        if spec.tenant is not None:
            self.text(f"{base}.tenant", spec.tenant, "tenant")

    def label(self, path: str, label: Label) -> None:
        name, value = label
        if not name or "=" in name or "\0" in name or "\0" in value:
            self.add(path, f'expected "name=value" with a non-empty name, got {name}={value}')

    # [store]

    def store(self, config: Config) -> None:
        store = config.store
        if isinstance(store, SqliteStoreConfig | PostgresStoreConfig):
            self.lease(store)
        if isinstance(store, SqliteStoreConfig):
            self.duration("store.keep_finished_s", store.keep_finished_s)
            self.text("store.path", store.path, "the database path")
            self.namespace(config, "store.path", store.path, "path")
        elif isinstance(store, PostgresStoreConfig):
            self.duration("store.keep_finished_s", store.keep_finished_s)
            if store.url_env is None and store.url is not None and not store.url:
                self.add("store.url", "must not be empty")
            if store.schema is not None:
                self.namespace(config, "store.schema", store.schema, "schema")
            names: list[str | None] = [shard.name for shard in config.shards] or [None]
            template = store.schema
            if template is None:
                template = DEFAULT_SHARDED_SCHEMA if config.shards else "public"
            for name in names:
                schema = template if name is None else template.replace(SHARD_PLACEHOLDER, name)
                if SHARD_PLACEHOLDER not in schema and not SCHEMA_RULE.fullmatch(schema):
                    for_shard = "" if name is None else f" for shard {name!r}"
                    self.add(
                        "store.schema",
                        f"schema {schema!r}{for_shard} is not a valid schema name: use 1 to 63 letters, "
                        "digits or underscores",
                    )

    def lease(self, store: SqliteStoreConfig | PostgresStoreConfig) -> None:
        self.duration("store.lease_ttl_s", store.lease_ttl_s, positive=True)
        self.duration("store.lease_renew_s", store.lease_renew_s, positive=True)
        self.duration("store.lock_poll_s", store.lock_poll_s, positive=True)
        if store.lease_renew_s >= store.lease_ttl_s > 0:
            self.add("store.lease_renew_s", f"must be shorter than store.lease_ttl_s ({store.lease_ttl_s:g} s)")

    def namespace(self, config: Config, path: str, value: str, what: str) -> None:
        if config.shards and SHARD_PLACEHOLDER not in value:
            self.add(path, f"with [[shards]] the {what} must contain {SHARD_PLACEHOLDER}, so each shard has its own")
        elif not config.shards and SHARD_PLACEHOLDER in value:
            self.add(path, f"the {what} contains {SHARD_PLACEHOLDER} but there are no [[shards]]")

    # [limits]

    def limits(self, limits: LimitsConfig) -> None:
        for spec in fields(limits):
            value = getattr(limits, spec.name)
            path = f"limits.{spec.name}"
            if isinstance(value, float):
                self.duration(path, value, positive=spec.name in _POSITIVE_LIMIT_DURATIONS)
            else:
                floor = _LIMIT_FLOORS.get(spec.name, 0)
                self.count(path, value, floor, _LIMIT_CEILINGS.get(spec.name, USIZE))

    # [[pools]]

    def pools(self, config: Config) -> None:
        if not config.pools:
            self.add("pools", "at least one pool is required")
        names: list[tuple[str, str]] = []
        for index, pool in enumerate(config.pools):
            base = f"pools[{index}]"
            if self.name(f"{base}.name", pool.name, "pool"):
                names.append((f"{base}.name", pool.name))
            self.pool(base, pool)
        self.unique(names, "pool name")

    def pool(self, base: str, pool: PoolSection) -> None:
        self.count(f"{base}.min", pool.min, 0, U32)
        self.count(f"{base}.max", pool.max, 1, U32)
        if 0 <= pool.min <= U32 and 1 <= pool.max <= U32 and pool.min > pool.max:
            self.add(f"{base}.min", f"min ({pool.min}) must not exceed max ({pool.max})")
        if isinstance(pool.scaler, WebhookScaler):
            problem = check_webhook_url(pool.scaler.url)
            if problem is not None:
                self.add(f"{base}.scaler.url", f"invalid webhook URL: {problem}")
        self.duration(f"{base}.lease_ttl_s", pool.lease_ttl_s, positive=True)
        if pool.max_pending is not None:
            self.count(f"{base}.max_pending", pool.max_pending, 1, USIZE)
        if pool.retry is not None:
            self.retry(f"{base}.retry", pool.retry)
        if pool.default_duration_s is not None:
            self.duration(f"{base}.default_duration_s", pool.default_duration_s)
        if pool.reservable_fraction is not None:
            self.number(f"{base}.reservable_fraction", pool.reservable_fraction, low=0.0, high=1.0)
        if pool.await_unknown_dependencies_s is not None:
            self.duration(f"{base}.await_unknown_dependencies_s", pool.await_unknown_dependencies_s)
        if pool.target_utilization is not None:
            self.number(f"{base}.target_utilization", pool.target_utilization, low=0.0, high=1.0, low_open=True)
        if pool.drain_time_s is not None:
            self.duration(f"{base}.drain_time_s", pool.drain_time_s, positive=True)
        if pool.cooldown_s is not None:
            self.duration(f"{base}.cooldown_s", pool.cooldown_s)
        if pool.cost_per_worker_second is not None:
            self.number(f"{base}.cost_per_worker_second", pool.cost_per_worker_second, low=0.0)
        if pool.max_slots_per_worker is not None:
            self.count(f"{base}.max_slots_per_worker", pool.max_slots_per_worker, 1, U32)
        for tenant, weight in pool.tenant_weights.items():
            path = key_path(f"{base}.tenant_weights", tenant)
            self.text(path, tenant, "a tenant name")
            self.number(path, weight, low=0.0, low_open=True)

    def retry(self, base: str, retry: RetrySection) -> None:
        self.count(f"{base}.max_attempts", retry.max_attempts, 1, U32)
        self.duration(f"{base}.initial_backoff_s", retry.initial_backoff_s)
        self.number(f"{base}.multiplier", retry.multiplier, low=1.0)
        self.duration(f"{base}.max_backoff_s", retry.max_backoff_s)

    # [[resources]]

    def resources(self, config: Config) -> None:
        names: list[tuple[str, str]] = []
        shards = {shard.name for shard in config.shards}
        for index, res in enumerate(config.resources):
            base = f"resources[{index}]"
            if self.name(f"{base}.name", res.name, "resource"):
                names.append((f"{base}.name", res.name))
            if isinstance(res, SemaphoreResource):
                self.count(f"{base}.permits", res.permits, 1, U32)
            else:
                self.number(f"{base}.rate", res.rate, low=0.0, low_open=True)
                self.count(f"{base}.burst", res.burst, 1, U32)
            if config.shards:
                if res.shard is None:
                    self.add(
                        f"{base}.shard",
                        f"resource {res.name!r} needs a shard: with [[shards]] each resource belongs to one "
                        "shard (split a shared limit into one resource per shard)",
                    )
                elif res.shard not in shards:
                    self.add(f"{base}.shard", f"unknown shard {res.shard!r}")
            elif res.shard is not None:
                self.add(f"{base}.shard", f"names shard {res.shard!r} but there are no [[shards]]")
        self.unique(names, "resource name")

    # [[shards]]

    def shards(self, config: Config) -> None:
        shards = config.shards
        server_shard = config.server.shard
        if not shards:
            if server_shard is not None:
                self.add("server.shard", f"names shard {server_shard!r} but there are no [[shards]]")
            return
        names: list[tuple[str, str]] = []
        numbers: list[tuple[str, str]] = []
        endpoints: list[tuple[str, str]] = []
        owner: dict[str, str] = {}
        known_pools = {pool.name for pool in config.pools}
        for index, shard in enumerate(shards):
            base = f"shards[{index}]"
            if self.name(f"{base}.name", shard.name, "shard"):
                names.append((f"{base}.name", shard.name))
            if 1 <= shard.number <= U8:
                numbers.append((f"{base}.number", str(shard.number)))
            else:
                self.add(f"{base}.number", f"must be between 1 and {U8} (0 is reserved for unsharded ids)")
            problem = check_endpoint(shard.endpoint)
            if problem is None:
                endpoints.append((f"{base}.endpoint", shard.endpoint.rstrip("/").lower()))
            else:
                self.add(f"{base}.endpoint", f"invalid endpoint {shard.endpoint!r}: {problem}")
            for position, replica in enumerate(shard.replicas):
                if (problem := check_endpoint(replica)) is not None:
                    self.add(f"{base}.replicas[{position}]", f"invalid endpoint {replica!r}: {problem}")
            if not shard.pools:
                self.add(f"{base}.pools", "a shard must serve at least one pool")
            for position, served in enumerate(shard.pools):
                path = f"{base}.pools[{position}]"
                if served not in known_pools:
                    self.add(path, f"unknown pool {served!r}")
                elif served in owner:
                    message = f"pool {served!r} is already served by {owner[served]}; each pool belongs to one shard"
                    self.add(path, message)
                else:
                    owner[served] = f"shard {shard.name!r}"
        self.unique(names, "shard name")
        self.unique(numbers, "shard number")
        self.unique(endpoints, "shard endpoint")
        for index, pool in enumerate(config.pools):
            if pool.name not in owner and NAME_RULE.fullmatch(pool.name):
                message = f"pool {pool.name!r} is not served by any shard: add it to one [[shards]] entry"
                self.add(f"pools[{index}]", message)
        if server_shard is None:
            self.add(
                "server.shard",
                "required with [[shards]]: name this server's shard (or pass --shard / set CRONOQ_SHARD)",
            )
        elif server_shard not in {shard.name for shard in shards}:
            known = ", ".join(repr(shard.name) for shard in shards)
            self.add("server.shard", f"unknown shard {server_shard!r}; the shards are {known}")


# ---------------------------------------------------------------------------------------- warnings


def warnings(config: Config) -> list[str]:
    out: list[Issue] = []
    for index, token in enumerate(config.auth.tokens):
        if token.length is not None and MIN_TOKEN_LEN <= token.length < RECOMMENDED_TOKEN_LEN:
            key = "token_env" if token.env is not None else "token"
            what = f"the token in {token.env}" if token.env is not None else "the token"
            out.append(
                Issue(
                    f"auth.tokens[{index}].{key}",
                    f"{what} is shorter than {RECOMMENDED_TOKEN_LEN} characters; use 32 or more random "
                    "characters (e.g. openssl rand -hex 24)",
                )
            )
    store = config.store
    if isinstance(store, PostgresStoreConfig) and store.url:
        sslmode, local = postgres_url_facts(store.url)
        if sslmode != "verify-full" and not local:
            key = "store.url_env" if store.url_env is not None else "store.url"
            message = "the database URL does not set sslmode=verify-full, so the database's identity is not verified"
            out.append(Issue(key, message))
    for index, pool in enumerate(config.pools):
        scaler = pool.scaler
        if isinstance(scaler, WebhookScaler) and scaler.url.startswith("http://"):
            host = url_host(scaler.url)
            if host is not None and not is_loopback_host(host):
                out.append(
                    Issue(
                        f"pools[{index}].scaler.url",
                        "plain http:// to a host that is not local: the request (and its token) travel "
                        "unencrypted; prefer https://",
                    )
                )
    if not config.server.insecure_peer_http:
        for index, shard in enumerate(config.shards):
            host = url_host(shard.endpoint) if shard.endpoint.startswith("http://") else None
            if host is not None and not is_loopback_host(host) and shard.name != config.server.shard:
                out.append(
                    Issue(
                        f"shards[{index}].endpoint",
                        "plain http:// to a host that is not local: calls for this shard are refused with its "
                        "endpoint instead of forwarded (callers' tokens are not sent unencrypted) unless "
                        "server.insecure_peer_http = true",
                    )
                )
    for key in config.server.retired_keys:
        message = "no longer used: workers and shards now batch their traffic over gRPC on the gRPC port; remove it"
        out.append(Issue(f"server.{key}", message))
    out.extend(_open_listeners(config.server, config.auth.enabled))
    return [str(issue) for issue in out]


def _open_listeners(server: ServerConfig, auth_enabled: bool) -> list[Issue]:
    if auth_enabled or not server.insecure_no_auth:
        return []
    found: list[Issue] = []
    for key in ("grpc_addr", "http_addr"):
        addr = getattr(server, key)
        try:
            host, _ = parse_socket_addr(addr)
        except ValueError:
            continue
        if not is_loopback_host(host):
            message = f"authentication is off and {addr} is not a loopback address: anyone who reaches it is admin"
            found.append(Issue(f"server.{key}", message))
    return found


# ------------------------------------------------------------------------------------------- files


def file_errors(config: Config) -> list[str]:
    out: list[str] = []
    server = config.server
    candidates: list[tuple[str, str | None]] = []
    if server.tls is not None:
        candidates += [
            ("server.tls.cert", server.tls.cert),
            ("server.tls.key", server.tls.key),
            ("server.tls.client_ca", server.tls.client_ca),
        ]
    if server.peer_tls is not None:
        peer = server.peer_tls
        candidates += [
            ("server.peer_tls.ca", peer.ca),
            ("server.peer_tls.cert", peer.cert),
            ("server.peer_tls.key", peer.key),
        ]
    for path, name in candidates:
        if name is None:
            continue
        if not os.path.isfile(name):
            out.append(f"{path}: {name} does not exist or is not a file")
        elif not os.access(name, os.R_OK):
            out.append(f"{path}: {name} is not readable")
    return out
