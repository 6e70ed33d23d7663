"""cronoq.config: the cronoq-server TOML file as typed, frozen dataclasses.

``Config.load(path)`` reads and validates a file; ``Config.parse(text)`` does the same for text;
``Config.default()`` is what the server runs without a file. Every problem is collected before
``ConfigError`` is raised, each as ``"key.path: what is wrong"``. Secrets named by ``token_env`` /
``url_env`` are read from the environment while loading; tokens are kept only as SHA-256 digests.

This package depends on the standard library only (TOML via ``tomllib``).
"""

from .auth import (
    MIN_TOKEN_LEN,
    RECOMMENDED_TOKEN_LEN,
    AuthConfig,
    CertSpec,
    Label,
    Role,
    TokenSpec,
    digest,
    digests_equal,
    parse_label,
    token_matches,
)
from .errors import ConfigError
from .model import Config
from .net import is_loopback_host, parse_socket_addr
from .schema import (
    DEFAULT_POOL,
    MAX_DURATION_S,
    MIB,
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

__all__ = [
    "DEFAULT_POOL",
    "MAX_DURATION_S",
    "MIB",
    "MIN_TOKEN_LEN",
    "RECOMMENDED_TOKEN_LEN",
    "AuthConfig",
    "CertSpec",
    "Config",
    "ConfigError",
    "ConsoleConfig",
    "ExternalScaler",
    "GrpcWebConfig",
    "Label",
    "LimitsConfig",
    "MemoryStoreConfig",
    "OutputsConfig",
    "Overflow",
    "PeerTlsConfig",
    "PoolSection",
    "PostgresStoreConfig",
    "ResourceSection",
    "RetrySection",
    "Role",
    "ScalerSection",
    "SemaphoreResource",
    "ServerConfig",
    "ShardSection",
    "SqliteStoreConfig",
    "StoreConfig",
    "TenantWeights",
    "TlsConfig",
    "TokenBucketResource",
    "TokenSpec",
    "WebhookScaler",
    "digest",
    "digests_equal",
    "is_loopback_host",
    "parse_label",
    "parse_socket_addr",
    "token_matches",
]
