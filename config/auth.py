"""``[auth]``: bearer tokens and client-certificate mappings, and the helpers to check them.

A token never outlives loading: the configuration keeps its SHA-256 digest (and its length, for
the length rules), so neither ``repr`` nor a log line nor a core dump of the parsed configuration
can reveal it. Incoming tokens are hashed the same way and compared in constant time.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "MIN_TOKEN_LEN",
    "RECOMMENDED_TOKEN_LEN",
    "AuthConfig",
    "CertSpec",
    "Label",
    "Role",
    "TokenSpec",
    "digest",
    "digests_equal",
    "parse_label",
    "token_matches",
]

MIN_TOKEN_LEN = 16
"""Shorter tokens are refused."""

RECOMMENDED_TOKEN_LEN = 32
"""Tokens shorter than this load with a warning."""

Label = tuple[str, str]
"""A worker label as ``(name, value)``; written ``"name=value"`` in the file."""


class Role(enum.Enum):
    """What a credential may do. ``admin`` includes every other role."""

    CLIENT = "client"
    """Tasks service: submit, batch, get, list, wait, cancel, watch."""
    WORKER = "worker"
    """The Workers.Work stream: lease and run tasks."""
    METRICS = "metrics"
    """Read-only admin calls (snapshot, workers, recurring) and ``/metrics``."""
    ADMIN = "admin"
    """Everything, including adding and removing recurring schedules."""

    def grants(self, needed: Role) -> bool:
        """True if a credential with this role may make a call that needs ``needed``."""
        return self is Role.ADMIN or self is needed


def digest(token: str) -> bytes:
    """The SHA-256 digest under which a token is kept (of its UTF-8 bytes)."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def digests_equal(a: bytes, b: bytes) -> bool:
    """Compare two digests in time independent of where they differ."""
    return hmac.compare_digest(a, b)


def token_matches(token: str, expected: bytes) -> bool:
    """Does the presented ``token`` hash to ``expected``? Constant time in the comparison."""
    return hmac.compare_digest(digest(token), expected)


def parse_label(text: str) -> Label:
    """``"gpu=a100"`` -> ``("gpu", "a100")``. The name must be non-empty; the value may be empty.

    Raises ``ValueError`` with a message that quotes ``text`` (labels are not secret).
    """
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or name != name.strip():
        raise ValueError(f'expected "name=value", got {text!r}')
    if "\0" in text:
        raise ValueError("labels must not contain NUL characters")
    return name, value


def _allows_pool(pools: tuple[str, ...] | None, pool: str) -> bool:
    return pools is None or pool in pools


def _allows_labels(allowed: tuple[Label, ...] | None, labels: Mapping[str, str]) -> bool:
    if allowed is None:
        return True
    permitted = set(allowed)
    return all((name, value) in permitted for name, value in labels.items())


@dataclass(frozen=True, slots=True)
class TokenSpec:
    """One ``[[auth.tokens]]`` entry, with the token replaced by its digest.

    ``digest`` is ``None`` only when the configuration was loaded with ``resolve_env=False``
    (``--check``) and the token lives in an environment variable that was not read; such a token
    matches nothing. ``env`` names that variable (``None``: the token was written in the file).
    """

    role: Role
    digest: bytes | None = field(default=None, repr=False)
    env: str | None = None
    length: int | None = field(default=None, repr=False)
    pools: tuple[str, ...] | None = None
    """Pools this token may use; ``None`` means every pool."""
    labels: tuple[Label, ...] | None = None
    """Worker labels this token may claim; ``None`` means any."""
    tenant: str | None = None
    """Tenant forced on submissions made with this token."""

    @classmethod
    def from_token(
        cls,
        token: str,
        role: Role,
        *,
        env: str | None = None,
        pools: Iterable[str] | None = None,
        labels: Iterable[Label] | None = None,
        tenant: str | None = None,
    ) -> TokenSpec:
        """Build a spec from a plain token, which is hashed here and not kept."""
        return cls(
            role=role,
            digest=digest(token),
            env=env,
            length=len(token),
            pools=None if pools is None else tuple(pools),
            labels=None if labels is None else tuple(labels),
            tenant=tenant,
        )

    def matches(self, token: str) -> bool:
        return self.digest is not None and token_matches(token, self.digest)

    def allows_pool(self, pool: str) -> bool:
        return _allows_pool(self.pools, pool)

    def allows_labels(self, labels: Mapping[str, str]) -> bool:
        """May a worker with this token register with ``labels``?"""
        return _allows_labels(self.labels, labels)


@dataclass(frozen=True, slots=True)
class CertSpec:
    """One ``[[auth.certs]]`` entry: a client certificate's DNS name mapped to a role."""

    dns_name: str
    role: Role
    pools: tuple[str, ...] | None = None
    labels: tuple[Label, ...] | None = None
    tenant: str | None = None

    def allows_pool(self, pool: str) -> bool:
        return _allows_pool(self.pools, pool)

    def allows_labels(self, labels: Mapping[str, str]) -> bool:
        return _allows_labels(self.labels, labels)


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """``[auth]``. With no token and no certificate mapping, authentication is off."""

    tokens: tuple[TokenSpec, ...] = ()
    certs: tuple[CertSpec, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.tokens or self.certs)

    def authenticate(self, token: str) -> TokenSpec | None:
        """The entry whose token this is, or ``None``.

        The presented token is hashed once and compared with every configured digest, without
        stopping at the first match, so the time taken says nothing about which entry matched.
        """
        presented = digest(token)
        found: TokenSpec | None = None
        for spec in self.tokens:
            if spec.digest is not None and hmac.compare_digest(presented, spec.digest) and found is None:
                found = spec
        return found

    def cert_for(self, dns_names: Iterable[str]) -> CertSpec | None:
        """The first mapping (in file order) whose ``dns_name`` is one of the certificate's DNS
        subject alternative names. DNS names compare without regard to case."""
        names = {name.lower().rstrip(".") for name in dns_names}
        for spec in self.certs:
            if spec.dns_name.lower().rstrip(".") in names:
                return spec
        return None
