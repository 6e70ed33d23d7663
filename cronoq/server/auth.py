"""Who is calling, and what they may do.

``Authenticator.authenticate`` turns the credentials of a request (the ``authorization`` header or
metadata value, and the DNS names of a verified client certificate) into a ``Principal``. A bearer
token is looked up by its SHA-256 digest in constant time and beats a certificate; a value that
matched is remembered (``VERIFIED_CREDENTIALS`` of them), so a client's later calls skip the
lookup. Without any configured credential every caller is an unscoped admin.

A ``Principal`` answers the authorization questions of every handler: role checks, pool scopes
(``pools``), forced tenant and the worker labels it may claim. The gRPC servicers and the HTTP
gateway share this module; no token ever reaches a log line or an error message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from cronoq.config import AuthConfig, CertSpec, Role, TokenSpec

from .errors import ApiError, Code

__all__ = ["ANONYMOUS_ADMIN", "Authenticator", "Principal", "Role"]

_BEARER = "bearer "
VERIFIED_CREDENTIALS = 1024
"""How many verified ``authorization`` values an ``Authenticator`` remembers (then it starts over)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller. ``pools`` None = every pool; ``labels`` None = any label."""

    role: Role
    pools: frozenset[str] | None = None
    labels: frozenset[tuple[str, str]] | None = None
    tenant: str | None = None
    name: str = "anonymous"
    """How logs refer to the caller ("token #2 (worker)", "cert worker-1.internal")."""
    authorization: str | None = field(default=None, repr=False, compare=False)
    """The caller's own ``authorization`` value, which a call forwarded to another shard carries."""
    certificate: bool = False
    """Authenticated by a client certificate: there is no token to forward for it."""
    forwarded: bool = False
    """The call came from another shard's router: answer it here, never forward it again."""

    @classmethod
    def of(cls, spec: TokenSpec | CertSpec, name: str, *, authorization: str | None = None) -> Principal:
        return cls(
            role=spec.role,
            pools=None if spec.pools is None else frozenset(spec.pools),
            labels=None if spec.labels is None else frozenset(spec.labels),
            tenant=spec.tenant,
            name=name,
            authorization=authorization,
            certificate=isinstance(spec, CertSpec),
        )

    def as_forwarded(self) -> Principal:
        return replace(self, forwarded=True)

    # -------------------------------------------------------------------------------- roles

    def has(self, role: Role) -> bool:
        return self.role.grants(role)

    def require(self, *roles: Role) -> None:
        """PERMISSION_DENIED unless this caller has one of ``roles`` (admin has them all)."""
        for role in roles:
            if self.role.grants(role):
                return
        needed = " or ".join(role.value for role in roles)
        raise ApiError(Code.PERMISSION_DENIED, f"this call needs the {needed} role")

    # -------------------------------------------------------------------------------- pools

    @property
    def scoped(self) -> bool:
        return self.pools is not None

    def sees(self, pool: str) -> bool:
        """May this caller use (and so see the tasks of) ``pool``?"""
        return self.pools is None or pool in self.pools

    def visible(self, pools: Iterable[str]) -> list[str]:
        """The subset of ``pools`` this caller may use, in the given order."""
        return [pool for pool in pools if self.sees(pool)]

    def check_pool(self, pool: str, known: Sequence[str] | frozenset[str] | set[str]) -> None:
        """For calls that name a pool or were given the default one (submit, list, watch, register,
        schedules): a pool outside the scope is PERMISSION_DENIED (checked first, so a scoped
        caller learns nothing about pools it may not use); an unknown one NOT_FOUND."""
        if not self.sees(pool):
            raise ApiError(Code.PERMISSION_DENIED, f"this credential may not use pool {pool!r}")
        if pool not in known:
            raise ApiError(Code.NOT_FOUND, f"unknown pool {pool!r}")

    # -------------------------------------------------------------------------------- tenants

    def tenant_for(self, requested: str | None) -> str | None:
        """The tenant a submission runs as: the pinned one (filled in when omitted); naming
        another tenant is PERMISSION_DENIED."""
        if self.tenant is None:
            return requested
        if requested is not None and requested != self.tenant:
            raise ApiError(Code.PERMISSION_DENIED, f"this credential may not submit as tenant {requested!r}")
        return self.tenant

    # -------------------------------------------------------------------------------- labels

    def check_labels(self, labels: Mapping[str, str]) -> None:
        if self.labels is None:
            return
        for name, value in labels.items():
            if (name, value) not in self.labels:
                raise ApiError(Code.PERMISSION_DENIED, f"this credential may not claim the worker label {name}={value}")


ANONYMOUS_ADMIN = Principal(Role.ADMIN, name="anonymous (authentication off)")


class Authenticator:
    """Maps request credentials to principals under one ``[auth]`` section."""

    def __init__(self, auth: AuthConfig) -> None:
        self._auth = auth
        self._names = {id(spec): f"token #{i + 1} ({spec.role.value})" for i, spec in enumerate(auth.tokens)}
        # Authorization values that matched a token, with their principal: a client sends the
        # same one with every call, and hashing it against every configured digest each time
        # costs more than the rest of a small request's checks. Refused values are not kept.
        self._verified: dict[str, Principal] = {}

    @property
    def enabled(self) -> bool:
        return self._auth.enabled

    def authenticate(self, authorization: str | None, cert_dns_names: Sequence[str] = ()) -> Principal:
        """The caller behind these credentials; UNAUTHENTICATED when they match nothing.

        ``authorization`` is the raw header / metadata value (``"Bearer <token>"``);
        ``cert_dns_names`` the DNS SANs of a client certificate the TLS layer verified.
        """
        if not self._auth.enabled:
            return ANONYMOUS_ADMIN
        if authorization:
            if (known := self._verified.get(authorization)) is not None:
                return known
            token = _bearer_token(authorization)
            if token is None:
                raise ApiError(Code.UNAUTHENTICATED, "the authorization value must be 'Bearer <token>'")
            if not _visible_ascii(token):
                # Configured tokens are visible ASCII; anything else (control characters, bytes
                # that were not UTF-8 and came in as surrogates) matches none and is not hashed.
                raise ApiError(Code.UNAUTHENTICATED, "malformed token")
            spec = self._auth.authenticate(token)
            if spec is None:
                raise ApiError(Code.UNAUTHENTICATED, "unknown token")
            principal = Principal.of(spec, self._names.get(id(spec), "token"), authorization=authorization)
            if len(self._verified) >= VERIFIED_CREDENTIALS:
                self._verified.clear()
            self._verified[authorization] = principal
            return principal
        if cert_dns_names:
            cert = self._auth.cert_for(cert_dns_names)
            if cert is not None:
                return Principal.of(cert, f"cert {cert.dns_name}")
            raise ApiError(Code.UNAUTHENTICATED, "the client certificate is not mapped to a role")
        raise ApiError(Code.UNAUTHENTICATED, "missing credentials: send 'authorization: Bearer <token>'")


def _visible_ascii(token: str) -> bool:
    return all("!" <= char <= "~" for char in token)


def _bearer_token(value: str) -> str | None:
    text = value.strip()
    if len(text) <= len(_BEARER) or text[: len(_BEARER)].lower() != _BEARER:
        return None
    token = text[len(_BEARER) :].strip()
    return token or None
