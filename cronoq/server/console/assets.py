"""The console's files (``static/``, shipped in the wheel as package data), served from memory.

Every answer carries a strict Content-Security-Policy: scripts, styles and requests only from the
page's own origin, no inline script or style, no ``eval``, no plugins, no framing, no form posts,
and Trusted Types required for every DOM sink that parses HTML, so even a mistake in the page
cannot turn text another tenant controls (keys, messages, payloads) into markup. Files are
looked up by exact name in a table built at start-up: a request can never name a path on disk.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

__all__ = ["CSP", "SECURITY_HEADERS", "Asset", "load_assets"]

CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "font-src 'none'",
        "object-src 'none'",
        "media-src 'none'",
        "frame-src 'none'",
        "worker-src 'none'",
        "manifest-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    )
)

SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
    "Cache-Control": "no-cache",
}
"""Headers of every ``/ui/`` answer."""

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """Every file of ``static/`` by name (``index.html``, ``app.js``, ...)."""
    out: dict[str, Asset] = {}
    for entry in resources.files(__package__).joinpath("static").iterdir():
        name = entry.name
        suffix = name[name.rfind(".") :] if "." in name else ""
        if not entry.is_file() or suffix not in _TYPES:
            continue
        body = entry.read_bytes()
        out[name] = Asset(body, _TYPES[suffix], '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    if "index.html" not in out:
        raise RuntimeError("the console's files are missing from this installation (cronoq/server/console/static)")
    return out
