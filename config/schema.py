"""The sections of the cronoq-server TOML file as frozen dataclasses, with their defaults.

Durations are float seconds (the ``_s`` keys), as in the file. Optional pool settings that the
engine has its own default for are ``None`` here ("use the engine's default"), so the server can
tell an explicit value from an omitted one. Values are checked by ``Config.validate``, not by
these constructors, so that every problem is reported at once.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_SHARDED_SCHEMA",
    "MAX_DURATION_S",
    "MIB",
    "ConsoleConfig",
    "ExternalScaler",
    "GrpcWebConfig",
    "LimitsConfig",
    "MemoryStoreConfig",
    "OutputsConfig",
    "Overflow",
    "PeerTlsConfig",
    "PoolSection",
    "PostgresStoreConfig",
    "ResourceSection",
    "RetrySection",
    "ScalerSection",
    "SemaphoreResource",
    "ServerConfig",
    "ShardSection",
    "SqliteStoreConfig",
    "StoreConfig",
    "TenantWeights",
    "TlsConfig",
    "TokenBucketResource",
    "WebhookScaler",
]

MIB = 1024 * 1024
MAX_DURATION_S = 365 * 86400.0
"""No duration in the file may exceed one year."""

DEFAULT_POOL = "default"
SHARD_PLACEHOLDER = "{shard}"
DEFAULT_SHARDED_SCHEMA = "cronoq_{shard}"
DEFAULT_UNSHARDED_SCHEMA = "public"
DEFAULT_URL_ENV = "DATABASE_URL"
SEVEN_DAYS_S = 7 * 86400.0


# --------------------------------------------------------------------------------------- [server]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """``[server.tls]``: TLS for the gRPC and HTTP listeners (not the metrics listener)."""

    cert: str
    """PEM certificate chain."""
    key: str
    """PEM private key."""
    client_ca: str | None = None
    """CA that client certificates must chain to (mTLS); required by ``[[auth.certs]]``."""


@dataclass(frozen=True, slots=True)
class PeerTlsConfig:
    """``[server.peer_tls]``: how this server verifies other shards' ``https://`` endpoints."""

    ca: str | None = None
    """PEM bundle of CAs to trust; ``None`` uses the system roots."""
    cert: str | None = None
    """Client certificate for shards that require mTLS (together with ``key``)."""
    key: str | None = None


@dataclass(frozen=True, slots=True)
class GrpcWebConfig:
    """``[server.grpc_web]``: browser origins allowed to call the gRPC listener over gRPC-Web."""

    allowed_origins: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ConsoleConfig:
    """``[server.console]``: the web console at ``/ui/`` of the HTTP listener (off by default)."""

    enabled: bool = False
    """Serve the console. Its pages call the HTTP API of the node that served them (same origin,
    no CORS), with the token the user types in; see ``cronoq.server.console``."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """``[server]``: listeners, TLS, shutdown and this server's shard."""

    grpc_addr: str = "127.0.0.1:7070"
    http_addr: str = "127.0.0.1:7071"
    metrics_addr: str | None = None
    """Extra listener for ``/metrics``, ``/healthz``, ``/readyz`` only: no auth, no TLS."""
    tls: TlsConfig | None = None
    insecure_no_auth: bool = False
    """Allow non-loopback listeners without credentials. After loading this is also true when
    ``--insecure-no-auth`` was given."""
    shutdown_grace_s: float = 10.0
    grpc_web: GrpcWebConfig | None = None
    console: ConsoleConfig = ConsoleConfig()
    shard: str | None = None
    """This server's entry in ``[[shards]]``. After loading, ``--shard``/``CRONOQ_SHARD`` win."""
    peer_tls: PeerTlsConfig | None = None
    insecure_peer_http: bool = False
    """Allow forwarding callers' tokens to other shards over plain ``http://`` off loopback."""
    retired_keys: tuple[str, ...] = ()
    """Keys of earlier versions the file still sets, which no longer do anything (``links``: the
    links are gone, workers and shards batch over gRPC); each earns a configuration warning."""


# ---------------------------------------------------------------------------------------- [store]


@dataclass(frozen=True, slots=True)
class MemoryStoreConfig:
    """``kind = "memory"`` (the default): state lives in the process and is lost on restart."""

    kind: ClassVar[str] = "memory"


@dataclass(frozen=True, slots=True)
class SqliteStoreConfig:
    """``kind = "sqlite"``: one database file on a local disk; processes sharing it elect a leader."""

    kind: ClassVar[str] = "sqlite"
    path: str
    """Database file, created if missing. With ``[[shards]]`` it must contain ``{shard}``."""
    keep_finished_s: float = SEVEN_DAYS_S
    """Finished tasks are deleted this long after they end."""
    lease_ttl_s: float = 10.0
    """The leader's lease lasts this long without renewal (a frozen leader is replaced after it)."""
    lease_renew_s: float = 2.0
    """The leader renews its lease this often (shorter than ``lease_ttl_s``)."""
    lock_poll_s: float = 0.5
    """Standbys look for a free or expired lease this often."""


@dataclass(frozen=True, slots=True)
class PostgresStoreConfig:
    """``kind = "postgres"``: durable state with leader election and fencing."""

    kind: ClassVar[str] = "postgres"
    url: str | None = field(default=None, repr=False)
    """The connection string, read from the file or from ``url_env``. ``None`` only when the
    environment was not read (``--check``). It may hold a password: never print it."""
    url_env: str | None = None
    """The variable ``url`` was read from; ``None`` when ``url`` was written in the file."""
    keep_finished_s: float = SEVEN_DAYS_S
    schema: str | None = None
    """Schema holding the tables. ``None`` means ``public``, or ``cronoq_{shard}`` with shards."""
    lease_ttl_s: float = 8.0
    """The leader's lease beside the advisory lock lasts this long without renewal, by the
    database's clock; a standby then ends a frozen leader's sessions and takes over (chosen)."""
    lease_renew_s: float = 1.0
    """The leader renews its lease (and checks its lock session) this often (chosen)."""
    lock_poll_s: float = 0.5
    """Standbys try the leader lock this often."""


StoreConfig = MemoryStoreConfig | SqliteStoreConfig | PostgresStoreConfig


# --------------------------------------------------------------------------------------- [limits]


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """``[limits]``: request and resource limits. With shards they apply to each shard.

    Defaults marked "chosen" were not published for cronoq 0.2; they are ours.
    """

    max_tasks_per_batch: int = 1000
    """Tasks in one SubmitBatch call or ``POST /v1/tasks:batch``."""
    max_pending_total: int = 1_000_000
    """Pending tasks over all pools (chosen)."""
    max_pending_per_pool: int = 100_000
    """Pending bound of a pool without its own ``max_pending`` (chosen)."""
    max_message_bytes: int = 16 * MIB
    """Largest gRPC message, either direction."""
    max_http_body_bytes: int = 16 * MIB
    """Largest HTTP request body (413 beyond)."""
    max_key_len: int = 256
    """Longest task key (chosen)."""
    max_kind_len: int = 128
    """Longest task kind (chosen)."""
    max_tags: int = 64
    """Most tags on one task (chosen)."""
    max_tag_len: int = 1024
    """Longest tag name or value (chosen)."""
    max_deps: int = 256
    """Most dependencies (``after`` plus ``deps``) of one task (chosen)."""
    max_resources: int = 16
    """Most resource requests of one task (chosen)."""
    max_wait_s: float = 300.0
    """Cap (and default) for server-side waits: submit-with-wait, Wait, ``/result``."""
    request_timeout_s: float = 30.0
    """Time limit of one request; waiting requests get ``max_wait_s`` on top."""
    max_concurrent_requests: int = 1024
    """Requests in flight at once (chosen)."""
    max_concurrent_streams: int = 256
    """HTTP/2 streams per connection (chosen)."""
    max_slots_per_worker: int = 256
    """Most slots one worker may register, i.e. leases it may hold (chosen)."""
    keepalive_interval_s: float = 20.0
    """HTTP/2 keepalive ping interval."""
    keepalive_timeout_s: float = 20.0
    """How long a keepalive ping may go unanswered before the connection is closed (chosen)."""
    key_retention_s: float = 3600.0
    """How long finished tasks' keys and statuses stay known (deduplication, dependencies)."""
    key_retention_max: int = 1_000_000
    """Most finished entries retained for that purpose."""
    max_list: int = 1000
    """Largest page of ListTasks / ``GET /v1/tasks`` (chosen)."""

    # Listener bounds (not published for cronoq 0.2: additions of ours). They hold before a caller
    # is authenticated, so nothing unauthenticated costs more than a bounded amount.
    max_connections: int = 4096
    """Open connections per listener (gRPC, HTTP, metrics); more are closed as they come."""
    max_concurrent_requests_per_caller: int = 256
    """Requests in flight at once for one credential (or one tenant, when the credential pins
    one), so a single caller cannot take every ``max_concurrent_requests`` slot."""
    max_streams_per_caller: int = 1024
    """Streams open at once for one credential (or pinned tenant): Watch (gRPC and gRPC-Web),
    Workers.Work and the Peers.Forward streams other nodes open with it; RESOURCE_EXHAUSTED past
    it. A fleet of more workers than this sharing one token needs a higher value."""
    header_timeout_s: float = 10.0
    """Time a connection gets to deliver a complete request head (HTTP/1.1), its first request
    (HTTP/2) or its TLS and HTTP/2 handshake (gRPC); it is closed past that."""
    idle_timeout_s: float = 300.0
    """A connection with no request in progress for this long is closed."""
    max_header_bytes: int = 16384
    """Largest request head: HTTP/1.1 request line plus headers, HTTP/2 header list, gRPC metadata."""
    max_headers: int = 100
    """Most header fields in one HTTP request."""
    max_stream_resets_per_s: int = 100
    """Stream resets, pings and SETTINGS frames one HTTP/2 connection of the gateway (or a native
    gRPC one through the gRPC-Web front) may send per second (with a burst of as many); past it
    the connection gets GOAWAY and is closed. grpcio alone has no such rate."""
    write_stall_timeout_s: float = 30.0
    """An HTTP answer that cannot be written for this long, because the client does not read
    (a full socket buffer or an HTTP/2 window at zero), is abandoned and its stream or
    connection closed."""


# ---------------------------------------------------------------------------------------- [[pools]]


class Overflow(enum.Enum):
    """What a pool does when its pending bound is reached."""

    WAIT = "wait"
    REJECT = "reject"
    SHED_LOWEST = "shed_lowest"
    SHED_OLDEST = "shed_oldest"


@dataclass(frozen=True, slots=True)
class RetrySection:
    """A pool's default retry policy (``retry = { ... }``); omitted keys take these values."""

    max_attempts: int = 3
    """Attempts in total, the first included."""
    initial_backoff_s: float = 1.0
    multiplier: float = 2.0
    max_backoff_s: float = 60.0
    jitter: bool = True
    """Full jitter: each delay is drawn uniformly between 0 and the computed backoff."""


@dataclass(frozen=True, slots=True)
class ExternalScaler:
    """The default: the desired worker count is only exported (``cronoq_pool_desired_workers``)
    for KEDA, an HPA or the operator to act on."""

    kind: ClassVar[str] = "external"


@dataclass(frozen=True, slots=True)
class WebhookScaler:
    """POST ``{"pool": name, "desired": n}`` to ``url`` whenever the desired count changes."""

    kind: ClassVar[str] = "webhook"
    url: str
    token_env: str | None = None
    """Variable holding a bearer token for the webhook."""
    token: str | None = field(default=None, repr=False)
    """That token, read at load (``None`` without ``token_env`` or under ``--check``)."""


ScalerSection = ExternalScaler | WebhookScaler


class TenantWeights(Mapping[str, float]):
    """An immutable (and picklable, hashable) tenant -> weight mapping."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, float] | None = None) -> None:
        self._items: dict[str, float] = dict(items or {})

    def __getitem__(self, tenant: str) -> float:
        return self._items[tenant]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"TenantWeights({self._items!r})"

    def weight(self, tenant: str | None) -> float:
        """The weight of ``tenant``: 1 when unlisted or when the task has no tenant."""
        return 1.0 if tenant is None else self._items.get(tenant, 1.0)


@dataclass(frozen=True, slots=True)
class PoolSection:
    """One ``[[pools]]`` entry: a pool served by remote workers.

    ``None`` in an optional field means the engine's default applies.
    """

    name: str
    min: int = 1
    """The autoscaler never asks for fewer slots than this (it does not create capacity)."""
    max: int = 10
    """The autoscaler's upper bound, the base of the reservation limit, and the most slots one
    worker of this pool is granted."""
    autoscale: bool = True
    """Compute a desired slot count from queue pressure."""
    scaler: ScalerSection = field(default_factory=ExternalScaler)
    lease_ttl_s: float = 30.0
    """A lease without a heartbeat for this long expires (a retryable failure)."""
    max_pending: int | None = None
    """Pending bound; ``None`` uses ``limits.max_pending_per_pool``."""
    overflow: Overflow = Overflow.WAIT
    retry: RetrySection | None = None
    default_duration_s: float | None = None
    reservable_fraction: float | None = None
    await_unknown_dependencies_s: float | None = None
    """Let a task wait this long for a dependency key not yet submitted; ``None`` rejects it."""
    target_utilization: float | None = None
    drain_time_s: float | None = None
    cooldown_s: float | None = None
    cost_per_worker_second: float | None = None
    max_slots_per_worker: int | None = None
    """Per-pool cap on one worker's slots; ``None`` uses ``limits.max_slots_per_worker``."""
    fair_share: bool = False
    tenant_weights: Mapping[str, float] = field(default_factory=TenantWeights)
    """Per-tenant weights; non-empty implies fair sharing. Unlisted tenants weigh 1."""

    @property
    def fair(self) -> bool:
        """Does this pool share dispatches between tenants?"""
        return self.fair_share or bool(self.tenant_weights)

    def pending_bound(self, limits: LimitsConfig) -> int:
        return self.max_pending if self.max_pending is not None else limits.max_pending_per_pool

    def slots_cap(self, limits: LimitsConfig) -> int:
        """Most slots one worker of this pool is granted."""
        cap = self.max_slots_per_worker if self.max_slots_per_worker is not None else limits.max_slots_per_worker
        return min(cap, self.max)


# ------------------------------------------------------------------------------------ [[resources]]


@dataclass(frozen=True, slots=True)
class SemaphoreResource:
    """``kind = "semaphore"``: at most ``permits`` units held at once."""

    kind: ClassVar[str] = "semaphore"
    name: str
    permits: int
    shard: str | None = None
    """The shard that owns this resource; required with ``[[shards]]``."""

    @property
    def capacity(self) -> int:
        return self.permits


@dataclass(frozen=True, slots=True)
class TokenBucketResource:
    """``kind = "token_bucket"``: units refill at ``rate`` per second up to ``burst``."""

    kind: ClassVar[str] = "token_bucket"
    name: str
    rate: float
    burst: int
    shard: str | None = None

    @property
    def capacity(self) -> int:
        return self.burst


ResourceSection = SemaphoreResource | TokenBucketResource


# ---------------------------------------------------------------------------- [[shards]], [outputs]


@dataclass(frozen=True, slots=True)
class ShardSection:
    """One ``[[shards]]`` entry."""

    name: str
    number: int
    """1 to 255; carried in the top 8 bits of the shard's task ids."""
    pools: tuple[str, ...]
    endpoint: str
    """``http(s)://host:port`` of the shard's gRPC listener (its leader, behind a Service)."""
    replicas: tuple[str, ...] = ()
    """``http(s)://host:port`` of each replica's own gRPC listener, for the console's overview
    (optional; the leader asks each whether it leads or stands by)."""


@dataclass(frozen=True, slots=True)
class OutputsConfig:
    """``[outputs]``: in-memory caches behind Wait/Get after a task finished."""

    cache_entries: int = 1024
    """Most outputs kept in memory."""
    cache_bytes: int = 64 * MIB
    """Most bytes of outputs kept in memory."""
    info_entries: int = 100_000
    """Most task records (pool, kind, times, last error) kept for Get and List (chosen)."""
