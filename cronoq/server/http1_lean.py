"""The lean HTTP/1.1 path for ``POST /v1/tasks``: the one request producers send most, read and
answered without aiohttp's request and response machinery.

aiohttp builds a parser message, a request with its payload stream, a response with a writer and
an access-log call for every request; for a single submit that is about as much CPU as the
gateway, the router and the engine spend on the task. A request takes this path only when it is
the plainest possible case, which needs no judgement that aiohttp's parser would make differently:

- the request line is exactly ``POST /v1/tasks HTTP/1.1`` (no query, no absolute form, no other
  method or version);
- every header line is a token, a colon and a value of visible ASCII and spaces (no obs-fold, no
  control or non-ASCII bytes, no space before the colon), at most ``max_headers`` of them, no name
  given twice;
- ``Content-Length`` is given, all digits, at most ``max_body`` (``LEAN_MAX_BODY_BYTES`` or
  ``limits.max_http_body_bytes`` if lower, so a 413 is aiohttp's to give) and the whole body has
  arrived;
- no ``Transfer-Encoding``, ``Expect``, ``Upgrade``, and no ``Connection`` other than keep-alive.

Anything else goes to aiohttp, which from then on serves the connection for its whole life (so
two HTTP engines never share the bytes of one request, nor answer out of order). The gateway's
handler is the same on both paths, so authentication, limits, time limits, tracing, every error
and its JSON shape are exactly those of aiohttp's path; only the head parsing and the writing of
the answer are done here, and the answer carries the same header fields aiohttp writes.
"""

from __future__ import annotations

import asyncio
import re
import time
from email.utils import formatdate
from typing import Any

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

__all__ = ["LEAN_MAX_BODY_BYTES", "LEAN_REQUEST_LINE", "LeanBody", "LeanRequest", "answer_bytes", "lean_head"]

LEAN_REQUEST_LINE = b"POST /v1/tasks HTTP/1.1"
LEAN_MAX_BODY_BYTES = 64 * 1024
"""The largest body the lean path takes. It holds a body whole before the gateway authenticates
the request, so this stays below what aiohttp's own read buffer holds unasked (128 KiB) rather
than ``limits.max_http_body_bytes`` (16 MiB by default): larger bodies go to aiohttp, which
reads them only once the handler does, after authentication."""
_URL = URL("/v1/tasks")
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?)?[ \t]*")
"""``name: value`` with a token name and a value of visible ASCII (inner spaces allowed)."""
_REFUSED_NAMES = frozenset({"transfer-encoding", "expect", "upgrade", "te", "trailer"})
"""Header fields whose handling is left to aiohttp (chunked bodies, 100-continue, upgrades)."""


class LeanBody:
    """A body that has fully arrived, read the way the gateway reads aiohttp's payload stream."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def readany(self) -> bytes:
        data, self._data = self._data, b""
        return data

    def at_eof(self) -> bool:
        return True  # it is all in memory: nothing of it is left on the connection


class LeanRequest:
    """One request of the lean path as the gateway's handlers see it: the attribute names of
    ``aiohttp.web.BaseRequest`` they read (like ``http2.H2Request``)."""

    __slots__ = ("content", "content_length", "headers", "transport")

    method = "POST"
    rel_url = _URL
    path = "/v1/tasks"
    raw_path = "/v1/tasks"

    def __init__(self, headers: CIMultiDictProxy[str], body: bytes, transport: asyncio.Transport) -> None:
        self.headers = headers
        self.content = LeanBody(body)
        self.content_length: int | None = len(body)
        self.transport: asyncio.Transport | None = transport


def lean_head(head: bytes, max_headers: int, max_body: int) -> tuple[CIMultiDictProxy[str], int] | None:
    """The header fields and body length of a request head (without its final blank line) that
    the lean path may serve, or None for any head aiohttp must see (see the module docstring)."""
    lines = head.split(b"\r\n")
    if lines[0] != LEAN_REQUEST_LINE or len(lines) - 1 > max_headers:
        return None
    fields: CIMultiDict[str] = CIMultiDict()
    seen: set[str] = set()
    for line in lines[1:]:
        match = _FIELD.fullmatch(line)
        if match is None:
            return None
        name = match[1].decode("ascii")
        lower = name.lower()
        if lower in seen or lower in _REFUSED_NAMES:
            return None
        seen.add(lower)
        value = (match[2] or b"").decode("ascii")
        if lower == "connection" and value.lower() != "keep-alive":
            return None
        fields.add(name, value)
    length = fields.get("content-length")
    if length is None or not length.isdigit() or len(length) > 12 or int(length) > max_body:
        return None
    return CIMultiDictProxy(fields), int(length)


class _Date:
    """The ``Date`` header value, formatted once a second (as aiohttp does)."""

    second = -1
    value = ""


def _date() -> str:
    now = int(time.time())
    if now != _Date.second:
        _Date.second, _Date.value = now, formatdate(now, usegmt=True)
    return _Date.value


def answer_bytes(response: Any) -> tuple[bytes, bool] | None:
    """``response`` as the bytes aiohttp would write for it, and whether the connection closes
    after it; None when it is not a plain ``web.Response`` with a bytes body (the gateway's
    submit route answers nothing else)."""
    if type(response) is not web.Response:
        return None
    body = response.body
    if body is None:
        body = b""
    elif not isinstance(body, bytes):
        return None
    closes = response.keep_alive is False
    head = [f"HTTP/1.1 {response.status} {response.reason}"]
    names: set[str] = set()
    for name, value in response.headers.items():
        lower = name.lower()
        if lower in ("content-length", "transfer-encoding", "connection"):
            continue
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            return None  # aiohttp refuses such a field; leave it to the caller's error path
        names.add(lower)
        head.append(f"{name}: {value}")
    head.append(f"Content-Length: {len(body)}")
    if "date" not in names:
        head.append(f"Date: {_date()}")
    if "server" not in names:
        head.append(f"Server: {SERVER_SOFTWARE}")
    if closes:
        head.append("Connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body, closes
