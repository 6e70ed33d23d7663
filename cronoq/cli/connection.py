"""Where the server is and how to reach it: address, token, TLS files, and the gRPC stubs.

The token comes only from ``CRONOQ_TOKEN``: a value on the command line is visible to every user
of the machine (``ps``). TLS files given with an ``http://`` address are refused rather than
silently ignored, and a token about to travel in clear text to another machine earns a warning.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from cronoq.proto import cronoq_pb2_grpc

from .exits import CliError, Exit

# The generated service module carries no annotations.
_stubs: Any = cronoq_pb2_grpc

DEFAULT_ADDR = "http://127.0.0.1:7070"
DEFAULT_PORT = 7070
ADDR_ENV = "CRONOQ_ADDR"
TOKEN_ENV = "CRONOQ_TOKEN"
# Outputs can be as large as the server's message limit (16 MiB by default); allow some more.
MAX_RECEIVE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Target:
    """A parsed server address: ``secure`` for https, ``host``/``port`` for the channel."""

    url: str
    secure: bool
    host: str
    port: int

    @property
    def grpc_address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def parse_target(text: str) -> Target:
    """``http://host:port``, ``https://host:port`` or ``host:port`` (plain http); port defaults to 7070."""
    raw = text.strip()
    if not raw:
        raise CliError(Exit.USAGE, "the server address is empty")
    if "://" not in raw:
        raw = f"http://{raw}"
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as e:
        raise CliError(Exit.USAGE, f"bad server address {text!r}: {e}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise CliError(Exit.USAGE, f"bad server address {text!r}: use http:// or https://")
    if not parts.hostname or "@" in parts.netloc:
        raise CliError(Exit.USAGE, f"bad server address {text!r}: expected http(s)://host:port")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise CliError(Exit.USAGE, f"bad server address {text!r}: a gRPC address has no path")
    return Target(url=raw, secure=scheme == "https", host=parts.hostname, port=port or DEFAULT_PORT)


def is_loopback(host: str) -> bool:
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class TlsFiles:
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    @property
    def any(self) -> bool:
        return self.ca is not None or self.cert is not None or self.key is not None


@dataclass(frozen=True)
class Settings:
    """Everything needed to connect, checked; ``warnings`` are for the person running the command."""

    target: Target
    token: str | None
    tls: TlsFiles
    warnings: tuple[str, ...] = ()


def resolve(addr: str | None, tls: TlsFiles, environ: Mapping[str, str] | None = None) -> Settings:
    """Combine the flags with ``CRONOQ_ADDR`` and ``CRONOQ_TOKEN``; raise ``CliError`` on bad input."""
    env = os.environ if environ is None else environ
    target = parse_target(addr or env.get(ADDR_ENV) or DEFAULT_ADDR)
    token = env.get(TOKEN_ENV) or None
    if token is not None and (token != token.strip() or any(ord(c) < 0x21 or ord(c) == 0x7F for c in token)):
        raise CliError(Exit.USAGE, f"{TOKEN_ENV} contains spaces or control characters")
    if tls.any and not target.secure:
        raise CliError(
            Exit.USAGE,
            f"TLS options (--ca, --cert, --key-file) need an https:// server address, not {target.url}",
        )
    if (tls.cert is None) != (tls.key is None):
        raise CliError(Exit.USAGE, "a client certificate needs both --cert and --key-file")
    warnings: list[str] = []
    if token is not None and not target.secure and not is_loopback(target.host):
        warnings.append(
            f"sending the token in clear text to {target.host} over http://; use https:// outside a trusted network"
        )
    return Settings(target=target, token=token, tls=tls, warnings=tuple(warnings))


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise CliError(Exit.USAGE, f"cannot read the {what} {path}: {e.strerror or e}") from None


class Connection:
    """A channel to the server with the Tasks and Admin stubs and the caller's credentials."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {settings.token}"),) if settings.token else ()
        )
        options = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
        address = settings.target.grpc_address
        if settings.target.secure:
            tls = settings.tls
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls.ca, "CA certificate") if tls.ca else None,
                private_key=_read(tls.key, "client key") if tls.key else None,
                certificate_chain=_read(tls.cert, "client certificate") if tls.cert else None,
            )
            self.channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(address, options=options)
        self.tasks: Any = _stubs.TasksStub(self.channel)
        self.admin: Any = _stubs.AdminStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
