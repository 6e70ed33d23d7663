"""HTTP/2 for the HTTP/JSON gateway: h2c with prior knowledge on a plain listener, ``h2`` chosen
by ALPN on a TLS listener, next to aiohttp's HTTP/1.1 on the same socket (``http_listen`` picks
the protocol of each connection; ``Upgrade: h2c`` on HTTP/1.1 is ignored, which RFC 9113 allows).

aiohttp has no HTTP/2 server, so this module does the framing with the ``h2`` library and hands
each stream to the same request handler the HTTP/1.1 side uses. The pieces:

- ``Http2Connection``: one HTTP/2 connection. Every stream runs the handler in a task of its own;
  a reset stream cancels its task, a lost connection cancels all. Request bodies are credited
  back to the peer's flow-control window only as the handler reads them, so a connection holds
  at most one window of unread body. ``shutdown`` sends GOAWAY, lets running streams finish
  within a timeout, then cancels the rest. What a client may cost is bounded (``Http2Limits``):
  streams whose handlers still run (reset ones included), stream resets, pings and SETTINGS
  per second (GOAWAY ``ENHANCE_YOUR_CALM`` past the rate: "rapid reset"), the header list, time
  before the first request and between requests, and time an answer may wait for a window the
  client keeps at zero.
- ``H2Request``: what the gateway reads of a request (method, headers, ``rel_url``, ``path``,
  ``content_length``, ``content.readany()``, ``transport`` for the client certificate), plus
  ``send_continue`` for ``expect: 100-continue``.

Answers are the handler's ``web.Response`` (status, headers, bytes body) sent as HEADERS and DATA
frames, split to the peer's flow-control windows and frame size.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from email.utils import formatdate
from typing import cast

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from aiohttp import web
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

__all__ = [
    "PREFACE",
    "ControlBudget",
    "ControlFrames",
    "H2Request",
    "Http2Connection",
    "Http2Limits",
    "StreamedResponse",
    "reset",
    "retire",
]

log = logging.getLogger("cronoq.server")

# hpack logs every header it encodes or decodes at DEBUG, authorization values included: whatever
# level the process logs at, a credential must not reach a log line that way.
logging.getLogger("hpack").setLevel(logging.INFO)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""The first bytes of every HTTP/2 connection (RFC 9113, 3.4)."""

IDLE_TIMEOUT_S = 75.0
"""A connection with no request in progress for this long is closed (aiohttp's keep-alive
default, so both protocols treat idle clients alike)."""

_STREAM_WINDOW = 256 * 1024
_CONNECTION_WINDOW = 1024 * 1024
_DRAIN_LIMIT = 32 * 1024 * 1024
_READ_SLICE = 8 * 1024
"""Bytes handed to h2 at once (see ``data_received``)."""
_MAX_UNSENT = 1024 * 1024
"""Bytes written for a client that does not read (control frames h2 answers on its own, such
as PING and SETTINGS acknowledgements) past which the connection is dropped."""

# Connection-specific fields are forbidden in HTTP/2 (RFC 9113, 8.2.2).
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})

Handler = Callable[["H2Request"], Awaitable[web.StreamResponse]]


class StreamGone(Exception):
    """The stream was reset by the client or its connection closed while the body was read."""


class StreamStalled(Exception):
    """The client kept the stream's flow-control window at zero for too long."""


# ======================================================================================= requests


class StreamedResponse(web.StreamResponse):
    """An answer whose body goes out chunk by chunk as ``chunks`` yields them, without a length
    (an event stream). The handler of an HTTP/1.1 request writes such a body itself."""

    def __init__(self, chunks: AsyncIterator[bytes], *, status: int = 200,
                 headers: Mapping[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(status=status, headers=headers)
        self.chunks = chunks


class H2Body:
    """The body of one request stream as it arrives. ``readany`` answers the next bytes (``b""``
    at the end) and credits what it hands out back to the sender's flow-control window."""

    def __init__(self, credit: Callable[[int], None]) -> None:
        self._credit = credit
        self._chunks: deque[tuple[bytes, int]] = deque()
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.uncredited = 0
        """Flow-controlled bytes received but not yet handed to the reader."""
        self.received = 0
        """Body bytes received so far."""

    @property
    def ended(self) -> bool:
        """The client sent END_STREAM (or the stream is gone)."""
        return self._ended

    def feed(self, data: bytes, flow_controlled: int) -> None:
        self._chunks.append((data, flow_controlled))
        self.received += len(data)
        self.uncredited += flow_controlled
        self._wake()

    def end(self) -> None:
        self._ended = True
        self._wake()

    def abort(self, error: BaseException) -> None:
        self._error = error
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def readany(self) -> bytes:
        while True:
            if self._error is not None:
                raise self._error
            if self._chunks:
                data, flow_controlled = self._chunks.popleft()
                self.uncredited -= flow_controlled
                self._credit(flow_controlled)
                if data:
                    return data
                continue  # a frame holding only padding
            if self._ended:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


class H2Request:
    """One HTTP/2 request as the gateway's handlers see it: the same attribute names as
    ``aiohttp.web.BaseRequest`` for what they read."""

    def __init__(self, *, method: str, rel_url: URL, headers: CIMultiDictProxy[str], content: H2Body,
                 transport: asyncio.Transport, send_continue: Callable[[], None]) -> None:  # fmt: skip
        self.method = method
        self.rel_url = rel_url
        self.headers = headers
        self.content = content
        self.transport: asyncio.Transport | None = transport
        self._send_continue = send_continue

    @property
    def path(self) -> str:
        """The percent-decoded path, like ``web.BaseRequest.path``."""
        return self.rel_url.path

    @property
    def raw_path(self) -> str:
        return self.rel_url.raw_path

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        if value is None or not (value.isascii() and value.isdigit()):
            return None
        return int(value)

    async def send_continue(self) -> None:
        """An interim ``100`` answer, for a client that waits for it before sending the body."""
        self._send_continue()


# ===================================================================================== connections


class Http2Limits:
    """What an HTTP/2 connection announces and enforces (``[limits]`` keys of the same meaning)."""

    def __init__(self, max_concurrent_streams: int, idle_timeout_s: float = IDLE_TIMEOUT_S, *,
                 first_request_timeout_s: float = 10.0, max_resets_per_s: int = 100,
                 write_stall_timeout_s: float = 30.0, max_header_bytes: int = 16384,
                 max_headers: int = 100) -> None:  # fmt: skip
        self.max_concurrent_streams = max_concurrent_streams
        self.idle_timeout_s = idle_timeout_s
        self.first_request_timeout_s = first_request_timeout_s
        """The first request must arrive this soon after the connection opened."""
        self.max_resets_per_s = max_resets_per_s
        """Stream resets, pings and SETTINGS frames per second (and as many at once)."""
        self.write_stall_timeout_s = write_stall_timeout_s
        self.max_header_bytes = max_header_bytes
        self.max_headers = max_headers


class ControlFrames:
    """Counts the frames that cost work without asking for an answer — RST_STREAM, and PING and
    SETTINGS that are not acknowledgements — by reading frame headers only, so a flood is caught
    before h2 parses it (h2 spends about 0.1 ms on each HEADERS frame). ``preface``: the bytes
    are a client's, which begin with the connection preface (a server's begin with a frame)."""

    __slots__ = ("_head", "_skip")

    def __init__(self, *, preface: bool = True) -> None:
        self._skip = len(PREFACE) if preface else 0
        """Bytes still to pass over: the preface, then the payload of the frame in progress."""
        self._head = b""
        """The first bytes of a frame header split between reads."""

    @property
    def between_frames(self) -> bool:
        """The bytes counted so far end with a whole frame (a frame may be put in here)."""
        return not self._skip and not self._head

    def count(self, data: bytes) -> int:
        found = 0
        offset, size = 0, len(data)
        while offset < size:
            if self._skip:
                step = min(self._skip, size - offset)
                self._skip -= step
                offset += step
                continue
            need = 9 - len(self._head)
            header = self._head + data[offset : offset + need]
            offset += len(header) - len(self._head)
            if len(header) < 9:
                self._head = header
                break
            self._head = b""
            kind, flags = header[3], header[4]
            if kind == _RST_STREAM or (kind in _ACKABLE and not flags & _ACK_FLAG):
                found += 1
            self._skip = int.from_bytes(header[:3], "big")
        return found


_RST_STREAM = 0x3
_ACKABLE = frozenset({0x4, 0x6})  # SETTINGS, PING
_ACK_FLAG = 0x1


class ControlBudget:
    """A token bucket: ``rate`` per second, at most ``rate`` saved up."""

    __slots__ = ("_at", "_left", "_rate")

    def __init__(self, rate: int) -> None:
        self._rate = float(rate)
        self._left = float(rate)
        self._at = time.monotonic()

    def spend(self, count: int = 1) -> bool:
        """Take ``count``; False when the bucket is overdrawn."""
        now = time.monotonic()
        self._left = min(self._rate, self._left + (now - self._at) * self._rate) - count
        self._at = now
        return self._left >= 0


class _Stream:
    def __init__(self, stream_id: int, request: H2Request) -> None:
        self.stream_id = stream_id
        self.request = request
        self.task: asyncio.Task[None] | None = None
        self.answered = False
        """The whole answer went out (END_STREAM sent)."""
        self.reset_by_client = False


class Http2Connection(asyncio.Protocol):
    """The server side of one HTTP/2 connection."""

    def __init__(self, handler: Handler, limits: Http2Limits,
                 on_closed: Callable[[Http2Connection], None]) -> None:  # fmt: skip
        self._handler = handler
        self._limits = limits
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self._h2 = h2.connection.H2Connection(config=config)
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, _Stream] = {}
        self._closed = False
        self._going_away = False
        """This side sent GOAWAY (shutdown)."""
        self._client_left = False
        """The client sent GOAWAY."""
        self._last_stream_id = 0
        """After GOAWAY: the highest stream this side still serves; later ones are refused."""
        self._draining: dict[int, int] = {}
        """Answered streams whose body still arrives: how many more bytes are read and dropped."""
        self._window_waiters: list[asyncio.Future[None]] = []
        self._drain_waiter: asyncio.Future[None] | None = None
        self._writing_paused = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self._all_done: asyncio.Event = asyncio.Event()
        self._all_done.set()
        self._served_any = False
        self._control_budget = ControlBudget(limits.max_resets_per_s)
        self._control_frames = ControlFrames()
        self._reset_in_batch: set[int] = set()
        """Streams the client reset within the bytes being handled: never started."""
        self._overdrawn = False
        """Streams were refused faster than ``max_resets_per_s`` (see ``_start_stream``)."""

    # ------------------------------------------------------------------------ asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small frames; latency matters
        self._h2.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self._limits.max_concurrent_streams,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: self._limits.max_header_bytes,
        })  # fmt: skip
        self._h2.initiate_connection()
        # h2 applies a header list limit only once the client acknowledges it; a client that never
        # does must not get more room for that, so it holds from the first frame on.
        self._h2.decoder.max_header_list_size = self._limits.max_header_bytes
        self._h2.increment_flow_control_window(_CONNECTION_WINDOW - 65535)
        self._flush()
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        # A read can hold thousands of frames; h2 parses all it is given before answering, so it
        # is given a slice at a time and a flood is stopped within one slice of the budget.
        view = memoryview(data)
        for start in range(0, len(data), _READ_SLICE):
            if self._closed or not self._receive(view[start : start + _READ_SLICE].tobytes()):
                return
        self._flush()

    def _receive(self, data: bytes) -> bool:
        """Handle some bytes from the client; False once the connection is being closed.

        Resets, pings and SETTINGS cost work and answer nothing: past their rate the client is
        told to calm down and let go, before h2 parses them."""
        control = self._control_frames.count(data)
        if control and not self._control_budget.spend(control):
            self._calm_down()
            return False
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            # h2 has queued a GOAWAY with the error code; send it and hang up. The message is not
            # logged: it may quote a header the client sent (a credential, say).
            log.debug("http2: protocol error from the client (%s)", type(exc).__name__)
            self._flush()
            self._close_transport()
            return False
        # A stream opened and reset in the same bytes is never started.
        self._reset_in_batch.update(event.stream_id for event in events if isinstance(event, h2.events.StreamReset))
        try:
            for event in events:
                try:
                    self._dispatch(event)
                except h2.exceptions.H2Error as exc:  # e.g. refusing a stream the client already closed
                    log.debug("http2: %s while handling %s", type(exc).__name__, type(event).__name__)
                if self._overdrawn:
                    self._calm_down()
                    return False
        finally:
            self._reset_in_batch.clear()
        return True

    def _calm_down(self) -> None:
        """GOAWAY(ENHANCE_YOUR_CALM) and close: the client floods the connection with frames."""
        log.debug("http2: a client sent resets, pings or SETTINGS faster than %d/s; closing",
                  self._limits.max_resets_per_s)  # fmt: skip
        with contextlib.suppress(h2.exceptions.H2Error):
            self._h2.close_connection(error_code=ErrorCodes.ENHANCE_YOUR_CALM)
        self._flush()
        self._close_transport()

    def eof_received(self) -> bool | None:
        return None  # close our side too; streams are cancelled in connection_lost

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        gone = StreamGone("the connection closed")
        for stream in list(self._streams.values()):
            stream.request.content.abort(gone)
            if stream.task is not None:
                stream.task.cancel()
        self._wake_writers(gone)
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)  # _drain sees the closed connection
        self._on_closed(self)

    # ------------------------------------------------------------------------ events

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._start_stream(event)
        elif isinstance(event, h2.events.DataReceived):
            stream = self._streams.get(event.stream_id)
            if stream is None:  # the answer is already sent; the rest of the body is not wanted
                self._discard(event.stream_id, event.flow_controlled_length)
            else:
                stream.request.content.feed(event.data, event.flow_controlled_length)
        elif isinstance(event, h2.events.StreamEnded):
            self._draining.pop(event.stream_id, None)
            if (stream := self._streams.get(event.stream_id)) is not None:
                stream.request.content.end()
        elif isinstance(event, h2.events.StreamReset):
            self._draining.pop(event.stream_id, None)
            self._reset_by_client(event.stream_id)
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._wake_writers(None)
        elif isinstance(event, h2.events.ConnectionTerminated):
            # The client opens no more streams: finish those it sent (unless it gave up), then close.
            self._client_left = True
            if event.error_code != ErrorCodes.NO_ERROR or not self._streams:
                self._close_transport()

    def _start_stream(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        if stream_id in self._reset_in_batch:
            return  # opened and reset at once: nothing to answer
        refused = self._going_away and stream_id > self._last_stream_id
        if refused or len(self._streams) >= self._limits.max_concurrent_streams:
            # Past GOAWAY; or as many handlers still run as streams are allowed (streams the client
            # reset count until their handlers have ended, so resetting does not make room). Each
            # refusal spends from the same budget as the client's resets.
            self._overdrawn = not self._control_budget.spend()
            self._h2.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
            return
        if len(event.headers or ()) > self._limits.max_headers + 4:  # the pseudo-headers come on top
            self._answer_at_once(stream_id, 431, f"more than {self._limits.max_headers} header fields")
            return
        pseudo: dict[str, str] = {}
        headers: CIMultiDict[str] = CIMultiDict()
        for raw_name, raw_value in event.headers or ():
            name = _text(raw_name)
            value = _text(raw_value)
            if name.startswith(":"):
                pseudo[name] = value
            else:
                headers.add(name, value)
        method, target = pseudo.get(":method", ""), pseudo.get(":path", "")
        if not target.startswith("/"):  # CONNECT and asterisk-form: nothing here serves them
            self._h2.reset_stream(stream_id, ErrorCodes.PROTOCOL_ERROR)
            return
        if "host" not in headers and ":authority" in pseudo:
            headers["Host"] = pseudo[":authority"]  # the guards read Host, which HTTP/2 carries as :authority
        raw_path, _, query = target.partition("?")
        try:
            rel_url = URL.build(path=raw_path, query_string=query, encoded=True)
        except ValueError:
            self._h2.reset_stream(stream_id, ErrorCodes.PROTOCOL_ERROR)
            return
        assert self._transport is not None
        body = H2Body(lambda size: self._credit(stream_id, size))
        request = H2Request(method=method, rel_url=rel_url, headers=CIMultiDictProxy(headers), content=body,
                            transport=self._transport,
                            send_continue=lambda: self._send_continue(stream_id))  # fmt: skip
        if event.stream_ended is not None:
            body.end()
        stream = _Stream(stream_id, request)
        self._streams[stream_id] = stream
        self._all_done.clear()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self._served_any = True
        stream.task = self._loop.create_task(self._serve(stream))

    def _answer_at_once(self, stream_id: int, status: int, message: str) -> None:
        """A JSON error answer for a stream refused before any handler ran."""
        code = {431: "request_header_fields_too_large"}.get(status, "bad_request")
        body = json.dumps({"error": message, "code": code}, separators=(",", ":")).encode()
        headers = [(":status", str(status)), ("content-type", "application/json"),
                   ("content-length", str(len(body)))]  # fmt: skip
        self._h2.send_headers(stream_id, headers)
        self._h2.send_data(stream_id, body, end_stream=True)

    def _reset_by_client(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is None:
            return
        stream.reset_by_client = True
        stream.request.content.abort(StreamGone("the client reset the stream"))
        if stream.task is not None:
            stream.task.cancel()
        self._wake_writers(None)  # a writer waiting for this stream's window must notice

    # ------------------------------------------------------------------------ streams

    async def _serve(self, stream: _Stream) -> None:
        try:
            response = await self._handler(stream.request)
            await self._respond(stream, response)
        except asyncio.CancelledError:
            pass  # reset by the client, the connection closed, or shutdown ran out of time
        except (StreamGone, h2.exceptions.StreamClosedError):
            pass
        except StreamStalled:
            log.debug("http2: stream %d: the client kept its window at zero; reset", stream.stream_id)
        except Exception:
            log.exception("http2: stream %d failed", stream.stream_id)
            with contextlib.suppress(h2.exceptions.H2Error):
                if not self._closed:
                    self._h2.reset_stream(stream.stream_id, ErrorCodes.INTERNAL_ERROR)
                    self._flush()
        finally:
            self._finish(stream)

    async def _respond(self, stream: _Stream, response: web.StreamResponse) -> None:
        streamed = response.chunks if isinstance(response, StreamedResponse) else None
        body = response.body if isinstance(response, web.Response) else None
        if body is not None and not isinstance(body, bytes | bytearray):
            raise TypeError(f"http2: only bytes bodies are supported, not {type(body).__name__}")
        data = bytes(body or b"")
        headers: list[tuple[str, str]] = [(":status", str(response.status))]
        for name, value in response.headers.items():
            lower = name.lower()
            if lower not in _HOP_BY_HOP and lower != "content-length":
                headers.append((lower, value))
        names = {name for name, _ in headers}
        if data and "content-type" not in names:
            headers.append(("content-type", "application/octet-stream"))  # what aiohttp sends too
        if streamed is None:
            headers.append(("content-length", str(len(data))))
        if "date" not in names:
            headers.append(("date", formatdate(usegmt=True)))
        if self._closed:
            raise StreamGone("the connection closed")
        ended = not data and streamed is None
        self._h2.send_headers(stream.stream_id, headers, end_stream=ended)
        stream.answered = ended
        self._flush()
        if streamed is None:
            await self._send_body(stream, data, end=True)
            return
        try:
            async for chunk in streamed:
                await self._send_body(stream, chunk, end=False)
        finally:
            close = getattr(streamed, "aclose", None)  # a generator's cleanup runs now, even when cancelled
            if close is not None:
                await close()
        if not self._closed:
            self._h2.send_data(stream.stream_id, b"", end_stream=True)
            stream.answered = True
            self._flush()

    async def _send_body(self, stream: _Stream, data: bytes, *, end: bool) -> None:
        """``data`` as DATA frames within the peer's windows; the last one ends the stream if ``end``."""
        view = memoryview(data)
        offset = 0
        while offset < len(data):
            window = min(self._h2.local_flow_control_window(stream.stream_id), self._h2.max_outbound_frame_size)
            if window <= 0:
                try:
                    async with asyncio.timeout(self._limits.write_stall_timeout_s):
                        await self._window_opened()
                except TimeoutError:
                    raise StreamStalled from None
                continue
            chunk = view[offset : offset + window]
            offset += len(chunk)
            last = end and offset == len(data)
            self._h2.send_data(stream.stream_id, chunk.tobytes(), end_stream=last)
            stream.answered = last
            self._flush()
            await self._drain()

    def _finish(self, stream: _Stream) -> None:
        """The stream's answer is sent (or abandoned): forget it and give back the window its
        unread body holds."""
        self._streams.pop(stream.stream_id, None)
        body = stream.request.content
        if not self._closed:
            with contextlib.suppress(h2.exceptions.H2Error):
                if not stream.answered and not stream.reset_by_client:
                    # Cancelled (shutdown ran out of time) or failed half-way: the answer is incomplete.
                    self._h2.reset_stream(stream.stream_id, ErrorCodes.CANCEL)
                elif stream.answered and not body.ended:
                    self._stop_body(stream)
            if body.uncredited:
                self._credit(stream.stream_id, body.uncredited)
                body.uncredited = 0
            self._flush()
        if not self._streams:
            self._all_done.set()
            if self._client_left:
                self._close_transport()
            else:
                self._arm_idle_timer()

    def _stop_body(self, stream: _Stream) -> None:
        """Answered before the whole body arrived (a 4xx before reading it). RFC 9113 allows
        RST_STREAM(NO_ERROR) here, but some clients (curl before 8) then drop the answer they
        already have, so a body of up to ``_DRAIN_LIMIT`` more bytes is received and dropped."""
        received = stream.request.content.received
        declared = stream.request.content_length
        left = _DRAIN_LIMIT if declared is None else declared - received
        if 0 <= left <= _DRAIN_LIMIT:
            self._draining[stream.stream_id] = left
        else:
            self._h2.reset_stream(stream.stream_id, ErrorCodes.NO_ERROR)

    def _discard(self, stream_id: int, size: int) -> None:
        self._credit(stream_id, size)
        left = self._draining.get(stream_id)
        if left is None:
            return
        if size > left:
            del self._draining[stream_id]
            with contextlib.suppress(h2.exceptions.H2Error):
                self._h2.reset_stream(stream_id, ErrorCodes.NO_ERROR)
        else:
            self._draining[stream_id] = left - size

    def _send_continue(self, stream_id: int) -> None:
        if not self._closed:
            self._h2.send_headers(stream_id, [(":status", "100")])
            self._flush()

    # ------------------------------------------------------------------------ flow control

    def _credit(self, stream_id: int, size: int) -> None:
        if size and not self._closed:
            with contextlib.suppress(h2.exceptions.H2Error):
                self._h2.acknowledge_received_data(size, stream_id)
                self._flush()

    async def _window_opened(self) -> None:
        waiter = self._loop.create_future()
        self._window_waiters.append(waiter)
        await waiter

    def _wake_writers(self, error: BaseException | None) -> None:
        waiters, self._window_waiters = self._window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(error)

    async def _drain(self) -> None:
        if self._closed:
            raise StreamGone("the connection closed")
        if self._writing_paused:
            if self._drain_waiter is None or self._drain_waiter.done():
                self._drain_waiter = self._loop.create_future()
            await asyncio.shield(self._drain_waiter)
            if self._closed:
                raise StreamGone("the connection closed")

    def _flush(self) -> None:
        data = self._h2.data_to_send()
        transport = self._transport
        if data and transport is not None and not transport.is_closing():
            transport.write(data)
            # Answers wait for the client to read (``_drain``); acknowledgements h2 writes on its
            # own do not, so a client that sends pings and never reads is dropped here.
            if self._writing_paused and transport.get_write_buffer_size() > _MAX_UNSENT:
                log.debug("http2: a client does not read what it asks for; closing")
                reset(transport)

    # ------------------------------------------------------------------------ closing

    def _arm_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        limits = self._limits
        timeout = limits.idle_timeout_s if self._served_any else limits.first_request_timeout_s
        self._idle_timer = self._loop.call_later(timeout, self._idle)

    def _idle(self) -> None:
        self._idle_timer = None
        if not self._streams and not self._closed:
            with contextlib.suppress(h2.exceptions.H2Error):
                self._h2.close_connection()
            self._flush()
            self._close_transport()

    def _close_transport(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    async def shutdown(self, timeout: float) -> None:
        """Graceful close: GOAWAY now (the client opens no more streams), running streams get
        ``timeout`` seconds to finish, then are cancelled and the connection closes."""
        if self._closed:
            return
        if not self._going_away:
            self._going_away = True
            self._last_stream_id = self._h2.highest_inbound_stream_id
            # h2 allows nothing more on a connection once it sent GOAWAY itself, so this first
            # GOAWAY is written past it; streams up to the last id keep answering through h2.
            goaway = GoAwayFrame(stream_id=0, last_stream_id=self._last_stream_id, error_code=ErrorCodes.NO_ERROR)
            self._flush()
            if self._transport is not None and not self._transport.is_closing():
                self._transport.write(goaway.serialize())
        if self._streams:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_done.wait(), timeout)
        tasks = [stream.task for stream in self._streams.values() if stream.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if not self._closed:
            with contextlib.suppress(h2.exceptions.H2Error):
                self._h2.close_connection(last_stream_id=self._last_stream_id)
            self._flush()
            self._close_transport()


def _text(raw: bytes | str) -> str:
    """A header name or value as aiohttp would decode it."""
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw


def reset(transport: asyncio.Transport) -> None:
    """Drop a connection at once: RST, and whatever is still buffered for the client (in the
    process and in the kernel) is thrown away instead of waiting for a reader that never comes."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


_retiring: set[asyncio.Task[None]] = set()
"""HTTP/2 shutdowns started by ``retire`` (kept referenced until they end)."""


def retire(protocol: asyncio.Protocol, grace_s: float) -> None:
    """Gracefully close a served connection, whichever protocol it speaks (see
    ``http_listen.Connection.retire``): ``shutdown`` of an ``Http2Connection`` or of aiohttp's HTTP/1.1
    handler (which answers the request in progress within ``grace_s``, then closes)."""
    shutdown = getattr(protocol, "shutdown", None)
    if not callable(shutdown):
        return
    task = asyncio.get_running_loop().create_task(shutdown(grace_s))
    _retiring.add(task)
    task.add_done_callback(_retiring.discard)
