"""Addresses and URLs that appear in the configuration: parsing and the checks on them.

Every checker here returns ``None`` when the value is fine and a short reason otherwise, so the
validator can prefix it with the key path. Nothing here prints a value that may hold a secret.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, parse_qs, urlsplit

__all__ = [
    "check_endpoint",
    "check_origin",
    "check_webhook_url",
    "is_loopback_host",
    "parse_socket_addr",
    "postgres_url_facts",
    "url_host",
]


def parse_socket_addr(text: str) -> tuple[str, int]:
    """Split ``"IP:PORT"`` into ``(ip, port)``; IPv6 goes in brackets (``"[::1]:7070"``).

    Host names are not accepted: a listener binds one address, and the loopback check must not
    depend on name resolution. Port 0 asks the OS for a free port. Raises ``ValueError``.
    """
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise ValueError("expected [IPv6]:PORT, e.g. [::1]:7070")
        host, port_text = text[1:close], text[close + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError("expected IP:PORT, e.g. 127.0.0.1:7070 or [::1]:7070")
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv4 address (use an IP literal; IPv6 goes in brackets)") from None
    if not (port_text.isascii() and port_text.isdigit()) or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port {port_text!r} is not a number between 0 and 65535")
    return host, int(port_text)


def is_loopback_host(host: str) -> bool:
    """True for ``localhost``, ``*.localhost``, 127.0.0.0/8 and ``::1`` (brackets allowed)."""
    name = host.strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _split_http_url(text: str) -> tuple[SplitResult | None, str | None]:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError as exc:
        return None, f"not a valid URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return None, "must start with http:// or https://"
    if not parts.hostname:
        return None, "has no host"
    if parts.username is not None or parts.password is not None:
        return None, "must not carry user information"
    return parts, None


def check_endpoint(text: str) -> str | None:
    """A shard endpoint: ``http(s)://host[:port]``, nothing after the authority but ``/``."""
    parts, problem = _split_http_url(text)
    if parts is None:
        return problem
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must be only a scheme, host and optional port (no path, query or fragment)"
    return None


def check_webhook_url(text: str) -> str | None:
    parts, problem = _split_http_url(text)
    if parts is None:
        return problem
    if parts.fragment:
        return "must not have a fragment"
    return None


def check_origin(text: str) -> str | None:
    """An exact browser origin: ``scheme://host[:port]`` with no wildcard, path or trailing slash."""
    if "*" in text:
        return "wildcards are not allowed; list each origin exactly"
    parts, problem = _split_http_url(text)
    if parts is None:
        return problem
    if parts.path or parts.query or parts.fragment or text.endswith("?") or text.endswith("#"):
        return "must be only a scheme, host and optional port (no path, not even a trailing slash)"
    return None


def url_host(text: str) -> str | None:
    """The host of a URL, or ``None`` when it has none or does not parse."""
    try:
        return urlsplit(text).hostname
    except ValueError:
        return None


_DSN_PAIR = re.compile(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)")


def postgres_url_facts(url: str) -> tuple[str | None, bool]:
    """``(sslmode, local)`` of a Postgres connection string (URI or ``key=value`` form).

    ``local`` is true when the server is reached over a Unix socket or a loopback address, where
    certificate verification protects nothing. Never include ``url`` in a message: it may hold a
    password.
    """
    if url.startswith(("postgres://", "postgresql://")):
        try:
            parts = urlsplit(url)
            query = parse_qs(parts.query)
            host = parts.hostname
        except ValueError:
            return None, False
        modes = query.get("sslmode")
        sslmode = modes[-1] if modes else None
        hosts = query.get("host")
        if not host and hosts:
            host = hosts[-1]
    else:
        pairs = {key: value.strip("'") for key, value in _DSN_PAIR.findall(url)}
        sslmode = pairs.get("sslmode")
        host = pairs.get("host") or pairs.get("hostaddr")
    local = not host or host.startswith("/") or is_loopback_host(host)
    return sslmode, local
