"""From TOML text to a ``Config``: types, unknown keys, required keys and secrets.

The reader never stops at the first problem. A value of the wrong type is reported with its
key path and replaced by the default, so the rest of the file is still read and checked; the
semantic checks of ``validate`` then skip the keys that already have a type error, so one typo
is reported once.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace

from .auth import AuthConfig, CertSpec, Label, Role, TokenSpec, parse_label
from .errors import ConfigError
from .model import Config
from .reader import Report, Table
from .schema import (
    DEFAULT_URL_ENV,
    SEVEN_DAYS_S,
    ConsoleConfig,
    ExternalScaler,
    GrpcWebConfig,
    LimitsConfig,
    MemoryStoreConfig,
    OutputsConfig,
    Overflow,
    PeerTlsConfig,
    PoolSection,
    PostgresStoreConfig,
    ResourceSection,
    RetrySection,
    ScalerSection,
    SemaphoreResource,
    ServerConfig,
    ShardSection,
    SqliteStoreConfig,
    StoreConfig,
    TenantWeights,
    TlsConfig,
    TokenBucketResource,
    WebhookScaler,
)
from .validate import issues

__all__ = ["LISTENER_KEYS", "build", "read_text"]

LISTENER_KEYS = ("grpc_addr", "http_addr", "metrics_addr")
"""The ``[server]`` addresses ``listen_overrides`` may replace (``cronoq-server --grpc-addr`` ...)."""
RETIRED_SERVER_KEYS = ("links",)
"""Boolean ``[server]`` keys of earlier versions: still accepted (a file that sets one keeps
loading), ignored, and named in a configuration warning."""

# --------------------------------------------------------------------------------- entry points


def read_text(path: str | os.PathLike[str]) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise ConfigError([f"{os.fspath(path)}: cannot read the configuration file: {exc.strerror}"]) from None
    except UnicodeDecodeError:
        raise ConfigError([f"{os.fspath(path)}: the configuration file is not UTF-8 text"]) from None


def build(
    text: str,
    *,
    env: Mapping[str, str],
    shard_override: str | None,
    insecure_no_auth: bool,
    resolve_env: bool,
    validate: bool,
    source: str | None = None,
    listen_overrides: Mapping[str, str] | None = None,
) -> Config:
    overrides = dict(listen_overrides or {})
    unknown = sorted(set(overrides) - set(LISTENER_KEYS))
    if unknown:
        raise ValueError(f"listen_overrides only takes {', '.join(LISTENER_KEYS)}, not {', '.join(unknown)}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{source or 'configuration'}: not valid TOML: {exc}"]) from None
    report = Report()
    reader = _Reader(report, env, resolve_env)
    root = Table(report, data, "")
    config = Config(
        server=reader.server(root.table("server"), shard_override or None, insecure_no_auth, overrides),
        auth=reader.auth(root.table("auth")),
        store=reader.store(root.table("store")),
        limits=reader.limits(root.table("limits")),
        pools=reader.pools(root),
        resources=reader.resources(root),
        outputs=reader.outputs(root.table("outputs")),
        shards=reader.shards(root),
    )
    root.finish()
    problems = list(report.items)
    if validate:
        problems.extend(issue for issue in issues(config) if not report.covers(issue.path))
    if problems:
        raise ConfigError([str(problem) for problem in problems])
    return config


# ------------------------------------------------------------------------------------- sections


def _retired(t: Table, keys: Sequence[str]) -> tuple[str, ...]:
    """The retired ``keys`` that ``t`` sets (each still type-checked, so it is not an unknown key)."""
    found = []
    for key in keys:
        if t.has(key):
            t.bool_or(key, False)
            found.append(key)
    return tuple(found)


def _with_listeners(server: ServerConfig, listeners: Mapping[str, str]) -> ServerConfig:
    """``server`` with the addresses given on the command line in place of its own."""
    return replace(
        server,
        grpc_addr=listeners.get("grpc_addr", server.grpc_addr),
        http_addr=listeners.get("http_addr", server.http_addr),
        metrics_addr=listeners.get("metrics_addr", server.metrics_addr),
    )


_VISIBLE_ASCII = frozenset(chr(code) for code in range(0x21, 0x7F))


class _Reader:
    def __init__(self, report: Report, env: Mapping[str, str], resolve_env: bool) -> None:
        self.report = report
        self.env = env
        self.resolve_env = resolve_env

    def _env_name(self, table: Table, key: str, name: str) -> bool:
        if not name or "=" in name or "\0" in name:
            self.report.error(table.at(key), f"{name!r} is not a valid environment variable name")
            return False
        return True

    def _secret(self, table: Table, key: str, name: str, what: str) -> str | None:
        """Read a secret from the environment; report (without its value) if it is missing."""
        if not self._env_name(table, key, name) or not self.resolve_env:
            return None
        value = self.env.get(name)
        if value is None:
            self.report.error(table.at(key), f"environment variable {name} is not set (it must hold {what})")
            return None
        if value == "":
            self.report.error(table.at(key), f"environment variable {name} is empty (it must hold {what})")
            return None
        return value

    def _each(self, tables: Sequence[Table] | None, read: Callable[[Table], object]) -> None:
        for table in tables or ():
            read(table)
            table.finish()

    # [server]

    def server(
        self, t: Table | None, shard_override: str | None, insecure_flag: bool, listeners: Mapping[str, str]
    ) -> ServerConfig:
        base = ServerConfig()
        if t is None:
            # The overrides replace the defaults like file values would, and are validated the same way.
            return _with_listeners(ServerConfig(shard=shard_override, insecure_no_auth=insecure_flag), listeners)
        tls_table = t.table("tls")
        tls = None
        if tls_table is not None:
            tls = TlsConfig(
                cert=tls_table.req_str("cert", "PEM certificate chain file"),
                key=tls_table.req_str("key", "PEM private key file"),
                client_ca=tls_table.opt_str("client_ca"),
            )
            tls_table.finish()
        peer_table = t.table("peer_tls")
        peer = None
        if peer_table is not None:
            peer = PeerTlsConfig(
                ca=peer_table.opt_str("ca"), cert=peer_table.opt_str("cert"), key=peer_table.opt_str("key")
            )
            peer_table.finish()
        web_table = t.table("grpc_web")
        web = None
        if web_table is not None:
            origins = web_table.opt_strs("allowed_origins")
            if origins is None and not web_table.report.covers(web_table.at("allowed_origins")):
                web_table.missing("allowed_origins", "exact origins such as https://dash.example.com")
            web = GrpcWebConfig(allowed_origins=origins or ())
            web_table.finish()
        console_table = t.table("console")
        console = ConsoleConfig()
        if console_table is not None:
            console = ConsoleConfig(enabled=console_table.bool_or("enabled", False))
            console_table.finish()
        config = ServerConfig(
            grpc_addr=t.str_or("grpc_addr", base.grpc_addr),
            http_addr=t.str_or("http_addr", base.http_addr),
            metrics_addr=t.opt_str("metrics_addr"),
            tls=tls,
            insecure_no_auth=t.bool_or("insecure_no_auth", False) or insecure_flag,
            shutdown_grace_s=t.num_or("shutdown_grace_s", base.shutdown_grace_s),
            grpc_web=web,
            console=console,
            shard=shard_override if shard_override is not None else t.opt_str("shard"),
            peer_tls=peer,
            insecure_peer_http=t.bool_or("insecure_peer_http", False),
            retired_keys=_retired(t, RETIRED_SERVER_KEYS),
        )
        if shard_override is not None:
            t.known.append("shard")
        t.finish()
        # The file's values were still read above, so a mistyped one is reported even when overridden.
        return _with_listeners(config, listeners)

    # [auth]

    def auth(self, t: Table | None) -> AuthConfig:
        if t is None:
            return AuthConfig()
        tokens: list[TokenSpec] = []
        certs: list[CertSpec] = []
        self._each(t.tables("tokens"), lambda x: tokens.append(self.token(x)))
        self._each(t.tables("certs"), lambda x: certs.append(self.cert(x)))
        t.finish()
        return AuthConfig(tokens=tuple(tokens), certs=tuple(certs))

    def _role(self, t: Table) -> Role:
        if not t.has("role"):
            t.known.append("role")
            t.missing("role", "client, worker, metrics or admin")
            return Role.CLIENT
        return t.opt_enum("role", Role) or Role.CLIENT

    def _labels(self, t: Table) -> tuple[Label, ...] | None:
        texts = t.opt_strs("labels")
        if texts is None:
            return None
        labels: list[Label] = []
        for index, text in enumerate(texts):
            try:
                labels.append(parse_label(text))
            except ValueError as exc:
                self.report.error(f"{t.at('labels')}[{index}]", str(exc))
        return tuple(labels)

    def token(self, t: Table) -> TokenSpec:
        literal = t.opt_str("token")
        env_name = t.opt_str("token_env")
        role = self._role(t)
        pools = t.opt_strs("pools")
        labels = self._labels(t)
        tenant = t.opt_str("tenant")
        token: str | None = None
        source_key = "token"
        if (literal is None) == (env_name is None):
            if not (t.report.covers(t.at("token")) or t.report.covers(t.at("token_env"))):
                which = "both are set" if literal is not None else "neither is set"
                self.report.error(t.path, f"set exactly one of token or token_env ({which})")
            env_name = None
        elif literal is not None:
            token = literal
        elif env_name is not None:
            source_key = "token_env"
            token = self._secret(t, "token_env", env_name, "the token")
        if token is not None and not set(token) <= _VISIBLE_ASCII:
            where = f"the token in {env_name}" if env_name else "the token"
            self.report.error(
                t.at(source_key), f"{where} contains spaces, control or non-ASCII characters; it could never be sent"
            )
            token = None
        if token is not None:
            return TokenSpec.from_token(token, role, env=env_name, pools=pools, labels=labels, tenant=tenant)
        return TokenSpec(role=role, env=env_name, pools=pools, labels=labels, tenant=tenant)

    def cert(self, t: Table) -> CertSpec:
        return CertSpec(
            dns_name=t.req_str("dns_name", "the DNS subject alternative name of the client certificate"),
            role=self._role(t),
            pools=t.opt_strs("pools"),
            labels=self._labels(t),
            tenant=t.opt_str("tenant"),
        )

    # [store]

    def store(self, t: Table | None) -> StoreConfig:
        if t is None:
            return MemoryStoreConfig()
        if not t.has("kind"):
            t.known.append("kind")
            t.missing("kind", "memory, sqlite or postgres")
            t.known.extend(t.data)
            return MemoryStoreConfig()
        kind = t.opt_str("kind")
        store: StoreConfig
        if kind == "memory":
            store = MemoryStoreConfig()
        elif kind == "sqlite":
            base = SqliteStoreConfig(path="")
            store = SqliteStoreConfig(
                path=t.req_str("path", "the database file"),
                keep_finished_s=t.num_or("keep_finished_s", SEVEN_DAYS_S),
                lease_ttl_s=t.num_or("lease_ttl_s", base.lease_ttl_s),
                lease_renew_s=t.num_or("lease_renew_s", base.lease_renew_s),
                lock_poll_s=t.num_or("lock_poll_s", base.lock_poll_s),
            )
        elif kind == "postgres":
            store = self._postgres(t)
        else:
            if kind is not None:
                self.report.error(t.at("kind"), f"expected one of memory, sqlite, postgres; got {kind!r}")
            t.known.extend(t.data)
            return MemoryStoreConfig()
        t.context = f'for kind "{kind}"'
        t.finish()
        return store

    def _postgres(self, t: Table) -> PostgresStoreConfig:
        url = t.opt_str("url")
        url_env = t.opt_str("url_env")
        keep = t.num_or("keep_finished_s", SEVEN_DAYS_S)
        schema = t.opt_str("schema")
        if url is not None and url_env is not None:
            self.report.error(t.at("url_env"), "set store.url or store.url_env, not both")
            url_env = None
        elif url is None:
            what = "the database URL"
            if url_env is None:
                url_env = DEFAULT_URL_ENV
                what += f"; store.url_env defaults to {DEFAULT_URL_ENV}, or write store.url"
            url = self._secret(t, "url_env", url_env, what)
        base = PostgresStoreConfig()
        return PostgresStoreConfig(
            url=url,
            url_env=url_env,
            keep_finished_s=keep,
            schema=schema,
            lease_ttl_s=t.num_or("lease_ttl_s", base.lease_ttl_s),
            lease_renew_s=t.num_or("lease_renew_s", base.lease_renew_s),
            lock_poll_s=t.num_or("lock_poll_s", base.lock_poll_s),
        )

    # [limits], [outputs]

    def limits(self, t: Table | None) -> LimitsConfig:
        if t is None:
            return LimitsConfig()
        values: dict[str, int | float] = {}
        for spec in fields(LimitsConfig):
            default = spec.default
            if isinstance(default, float):
                values[spec.name] = t.num_or(spec.name, default)
            elif isinstance(default, int):
                values[spec.name] = t.int_or(spec.name, default)
        t.finish()
        return LimitsConfig(**values)  # type: ignore[arg-type]  # each value has its field's type

    def outputs(self, t: Table | None) -> OutputsConfig:
        if t is None:
            return OutputsConfig()
        base = OutputsConfig()
        config = OutputsConfig(
            cache_entries=t.int_or("cache_entries", base.cache_entries),
            cache_bytes=t.int_or("cache_bytes", base.cache_bytes),
            info_entries=t.int_or("info_entries", base.info_entries),
        )
        t.finish()
        return config

    # [[pools]]

    def pools(self, root: Table) -> tuple[PoolSection, ...]:
        tables = root.tables("pools")
        if tables is None:
            return Config().pools
        pools: list[PoolSection] = []
        self._each(tables, lambda t: pools.append(self.pool(t)))
        return tuple(pools)

    def pool(self, t: Table) -> PoolSection:
        base = PoolSection("")
        retry_table = t.table("retry")
        retry = None
        if retry_table is not None:
            plain = RetrySection()
            retry = RetrySection(
                max_attempts=retry_table.int_or("max_attempts", plain.max_attempts),
                initial_backoff_s=retry_table.num_or("initial_backoff_s", plain.initial_backoff_s),
                multiplier=retry_table.num_or("multiplier", plain.multiplier),
                max_backoff_s=retry_table.num_or("max_backoff_s", plain.max_backoff_s),
                jitter=retry_table.bool_or("jitter", plain.jitter),
            )
            retry_table.finish()
        return PoolSection(
            name=t.req_str("name", "1 to 64 characters of A-Z a-z 0-9 _ . : -"),
            min=t.int_or("min", base.min),
            max=t.int_or("max", base.max),
            autoscale=t.bool_or("autoscale", base.autoscale),
            scaler=self.scaler(t.table("scaler")),
            lease_ttl_s=t.num_or("lease_ttl_s", base.lease_ttl_s),
            max_pending=t.opt_int("max_pending"),
            overflow=t.opt_enum("overflow", Overflow) or base.overflow,
            retry=retry,
            default_duration_s=t.opt_num("default_duration_s"),
            reservable_fraction=t.opt_num("reservable_fraction"),
            await_unknown_dependencies_s=t.opt_num("await_unknown_dependencies_s"),
            target_utilization=t.opt_num("target_utilization"),
            drain_time_s=t.opt_num("drain_time_s"),
            cooldown_s=t.opt_num("cooldown_s"),
            cost_per_worker_second=t.opt_num("cost_per_worker_second"),
            max_slots_per_worker=t.opt_int("max_slots_per_worker"),
            fair_share=t.bool_or("fair_share", base.fair_share),
            tenant_weights=self.weights(t.table("tenant_weights")),
        )

    def scaler(self, t: Table | None) -> ScalerSection:
        if t is None:
            return ExternalScaler()
        kind = t.opt_str("kind") if t.has("kind") else None
        if kind is None and not t.report.covers(t.at("kind")):
            t.known.append("kind")
            t.missing("kind", "external or webhook")
        scaler: ScalerSection = ExternalScaler()
        if kind is None:
            t.known.extend(t.data)
        elif kind == "webhook":
            url = t.req_str("url", "where to POST the desired worker count")
            token_env = t.opt_str("token_env")
            token = None
            if token_env is not None:
                token = self._secret(t, "token_env", token_env, "the webhook's bearer token")
            scaler = WebhookScaler(url=url, token_env=token_env, token=token)
        elif kind != "external":
            self.report.error(t.at("kind"), f"expected one of external, webhook; got {kind!r}")
            t.known.extend(t.data)
        if kind is not None:
            t.context = f'for kind "{kind}"'
        t.finish()
        return scaler

    def weights(self, t: Table | None) -> Mapping[str, float]:
        if t is None:
            return TenantWeights()
        out: dict[str, float] = {}
        for tenant in list(t.data):
            value = t.opt_num(tenant)
            if value is not None:
                out[tenant] = value
        t.finish()
        return TenantWeights(out)

    # [[resources]], [[shards]]

    def resources(self, root: Table) -> tuple[ResourceSection, ...]:
        out: list[ResourceSection] = []
        self._each(root.tables("resources"), lambda t: self._resource(t, out))
        return tuple(out)

    def _resource(self, t: Table, out: list[ResourceSection]) -> None:
        if not t.has("kind"):
            t.known.append("kind")
            t.missing("kind", "semaphore or token_bucket")
        kind = t.opt_str("kind")
        name = t.req_str("name", "the name tasks request it by")
        shard = t.opt_str("shard")
        if kind == "semaphore":
            out.append(SemaphoreResource(name=name, permits=t.req_int("permits", "units held at once"), shard=shard))
        elif kind == "token_bucket":
            rate = t.req_num("rate", "units added per second")
            burst = t.req_int("burst", "bucket size")
            out.append(TokenBucketResource(name=name, rate=rate, burst=burst, shard=shard))
        else:
            if kind is not None:
                self.report.error(t.at("kind"), f"expected one of semaphore, token_bucket; got {kind!r}")
            t.known.extend(t.data)
            return
        t.context = f'for kind "{kind}"'

    def shards(self, root: Table) -> tuple[ShardSection, ...]:
        out: list[ShardSection] = []

        def read(t: Table) -> None:
            pools = t.opt_strs("pools")
            if pools is None and not t.report.covers(t.at("pools")):
                t.missing("pools", "the pools this shard serves")
            out.append(
                ShardSection(
                    name=t.req_str("name", "the shard's name"),
                    number=t.req_int("number", "1 to 255, the top 8 bits of its task ids"),
                    pools=pools or (),
                    endpoint=t.req_str("endpoint", "http(s)://host:port of the shard's gRPC listener"),
                    replicas=t.opt_strs("replicas") or (),
                )
            )

        self._each(root.tables("shards"), read)
        return tuple(out)
