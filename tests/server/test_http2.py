"""The HTTP/JSON gateway over HTTP/2, against real ``cronoq-server`` processes: curl (built with
nghttp2) with prior knowledge on the plain listener and with ALPN over TLS, and the ``h2``
library as a raw client where a test needs several streams on one connection, resets or GOAWAY.
Every answer is compared with the same request over HTTP/1.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest
from cronoq.config import Config
from h2.errors import ErrorCodes
from hyperframe.frame import Frame, GoAwayFrame

from cronoq.client import Lease, Worker
from tests.server.harness import CLIENT_TOKEN, METRICS_TOKEN, WORKER_TOKEN
from tests.server.http_support import HttpServerProcess, config_text, request, serve

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="needs the curl command")

CLIENT = f"authorization: Bearer {CLIENT_TOKEN}"
METRICS = f"authorization: Bearer {METRICS_TOKEN}"
JSON = "content-type: application/json"


# ===================================================================================== helpers


@dataclass
class Answer:
    status: int
    version: str
    """curl's ``%{http_version}``: "2" or "1.1"."""
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


async def curl(*args: str, protocol: str = "--http2-prior-knowledge", stdin: bytes | None = None) -> Answer:
    """One curl transfer; ``protocol`` is the curl flag choosing the HTTP version."""
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--max-time", "60", protocol, "-w", "\n%{http_code} %{http_version}", *args,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin), 90)
    assert proc.returncode == 0, f"curl {args}: exit {proc.returncode}: {err.decode(errors='replace')}"
    text, _, trailer = out.decode().rpartition("\n")
    status, version = trailer.split()
    return Answer(int(status), version, text)


async def both(url: str, *args: str) -> tuple[Answer, Answer]:
    """The same request over HTTP/2 (prior knowledge) and HTTP/1.1; checks which was used."""
    over_h2 = await curl(*args, url)
    over_h1 = await curl(*args, url, protocol="--http1.1")
    assert (over_h2.version, over_h1.version) == ("2", "1.1")
    return over_h2, over_h1


async def wait_ready(base: str, *curl_args: str, protocol: str = "--http2-prior-knowledge") -> None:
    for _ in range(300):
        with contextlib.suppress(AssertionError, ValueError):
            if (await curl(*curl_args, f"{base}/readyz", protocol=protocol)).status == 200:
                return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{base} never became ready")


@contextlib.asynccontextmanager
async def server_process(tmp_path: Path, config: str, name: str = "h2") -> AsyncIterator[HttpServerProcess]:
    server = HttpServerProcess(tmp_path, config, name=name).start()
    try:
        yield server
    finally:
        server.stop()


def process_config(**kwargs: Any) -> str:
    """``config_text`` with fixed random ports (``{port}``/``{http_port}``) for a process."""
    return config_text(**kwargs).replace('"127.0.0.1:0"', '"127.0.0.1:{port}"', 1).replace(
        'http_addr = "127.0.0.1:0"', 'http_addr = "127.0.0.1:{http_port}"')  # fmt: skip


@contextlib.asynccontextmanager
async def serving(address: str, pool: str, handler: Callable[[Lease], Awaitable[Any]]) -> AsyncIterator[Worker]:
    worker = Worker(address, pool, handler, token=WORKER_TOKEN, backoff=(0.05, 0.2))
    task = asyncio.ensure_future(worker.run())
    try:
        await worker.wait_registered(20)
        yield worker
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(worker.stop(1), 20)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(task, 20)


async def shout(lease: Lease) -> bytes:
    return json.dumps({"shout": lease.json()["text"].upper()}).encode()


@dataclass
class StreamState:
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: ErrorCodes | int | None = None
    interim: list[int] = field(default_factory=list)
    """Statuses of informational (1xx) answers."""


class RawH2:
    """A minimal HTTP/2 client over one TCP connection (h2c with prior knowledge)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.streams: dict[int, StreamState] = {}
        self.goaway: GoAwayFrame | None = None
        self.closed = False
        self.changed = asyncio.Event()
        self.server_settings = asyncio.Event()
        self.max_concurrent_streams: int | None = None
        self._pump: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, host: str, port: int) -> RawH2:
        reader, writer = await asyncio.open_connection(host, port)
        client = cls(reader, writer)
        client.conn.initiate_connection()
        client.flush()
        client._pump = asyncio.ensure_future(client._read())
        return client

    def flush(self) -> None:
        if data := self.conn.data_to_send():
            self.writer.write(data)

    async def _read(self) -> None:
        pending = b""
        try:
            while data := await self.reader.read(65536):
                pending += data
                frames, pending = self._without_goaway(pending)
                for event in self.conn.receive_data(frames):
                    self._on(event)
                self.flush()
                self.changed.set()
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass
        finally:
            self.closed = True
            self.changed.set()

    def _without_goaway(self, data: bytes) -> tuple[bytes, bytes]:
        """Whole frames of ``data`` minus GOAWAY ones (recorded in ``goaway``), and the rest. h2
        as a client drops the connection on GOAWAY, but streams up to its last id go on."""
        kept = bytearray()
        while len(data) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(data[:9]))
            if len(data) < 9 + length:
                break
            if isinstance(frame, GoAwayFrame):
                frame.parse_body(memoryview(data[9 : 9 + length]))
                self.goaway = frame
            else:
                kept += data[: 9 + length]
            data = data[9 + length :]
        return bytes(kept), data

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            headers = dict(event.headers or ())
            state = self.streams[event.stream_id]
            state.status = int(headers.pop(":status"))
            state.headers = headers
        elif isinstance(event, h2.events.InformationalResponseReceived):
            self.streams[event.stream_id].interim.append(int(dict(event.headers or ())[":status"]))
        elif isinstance(event, h2.events.DataReceived):
            self.streams[event.stream_id].body.extend(event.data)
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.streams[event.stream_id].ended = True
        elif isinstance(event, h2.events.StreamReset):
            self.streams[event.stream_id].reset = event.error_code
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            changed = event.changed_settings.get(h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS)
            if changed is not None:
                self.max_concurrent_streams = changed.new_value
            self.server_settings.set()

    def request(self, method: str, path: str, *headers: tuple[str, str], body: bytes | None = None,
                body_follows: bool = False) -> int:  # fmt: skip
        """Open a stream; with ``body_follows`` its body is sent later with ``send_body``."""
        stream_id = self.conn.get_next_available_stream_id()
        self.streams[stream_id] = StreamState()
        fields = [(":method", method), (":path", path), (":scheme", "http"), (":authority", "127.0.0.1"), *headers]
        self.conn.send_headers(stream_id, fields, end_stream=body is None and not body_follows)
        if body is not None:
            self.send_body(stream_id, body)
        self.flush()
        return stream_id

    def send_body(self, stream_id: int, body: bytes) -> None:
        self.conn.send_data(stream_id, body, end_stream=True)
        self.flush()

    def reset(self, stream_id: int) -> None:
        self.conn.reset_stream(stream_id, ErrorCodes.CANCEL)
        self.flush()

    async def until(self, condition: Callable[[], bool], timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                if self.closed:
                    raise AssertionError("the connection closed")
                self.changed.clear()
                await self.changed.wait()

    async def answer(self, stream_id: int) -> tuple[int, Any]:
        state = self.streams[stream_id]
        await self.until(lambda: state.ended or state.reset is not None)
        assert state.reset is None, f"stream {stream_id} was reset ({state.reset!r})"
        assert state.status is not None
        return state.status, json.loads(state.body)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close_connection()
            self.flush()
        self.writer.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump


# ======================================================================================= h2c


async def test_h2c_with_prior_knowledge_answers_like_http11(tmp_path: Path) -> None:
    config = process_config(limits="max_http_body_bytes = 4096", max_wait_s=30)
    async with server_process(tmp_path, config) as server:
        base = server.http_url
        await wait_ready(base)
        async with serving(server.address, "default", shout):
            # Submit with wait: the worker's answer comes back over HTTP/2.
            submitted = await curl("-H", CLIENT, "-H", JSON, "-d",
                                   json.dumps({"payload": {"text": "hi"}, "key": "h2-1", "wait": True}),
                                   f"{base}/v1/tasks")  # fmt: skip
            assert (submitted.status, submitted.version) == (200, "2"), submitted.text
            body = submitted.json()
            assert body["result"]["status"] == "succeeded" and body["result"]["output"] == {"shout": "HI"}

            # Reads: the same status and the same JSON over both protocols.
            for path in (f"/v1/tasks/{body['id']}", "/v1/tasks/by-key/h2-1", "/v1/tasks/by-key/h2-1/result"):
                over_h2, over_h1 = await both(f"{base}{path}", "-H", CLIENT)
                assert over_h2.status == over_h1.status == 200
                assert over_h2.json() == over_h1.json()
                assert over_h2.json()["id"] == body["id"]

            # A result read that waits: submitted without waiting, then awaited over HTTP/2.
            later = await curl("-H", CLIENT, "-H", JSON, "-d", json.dumps({"payload": {"text": "later"},
                               "key": "h2-2"}), f"{base}/v1/tasks")  # fmt: skip
            assert later.status == 200, later.text
            waited = await curl("-H", CLIENT, f"{base}/v1/tasks/by-key/h2-2/result?timeout_s=20")
            assert (waited.status, waited.version) == (200, "2"), waited.text
            assert waited.json()["status"] == "succeeded" and waited.json()["output"] == {"shout": "LATER"}

            # A body announced with expect: 100-continue gets its interim answer and is read.
            go = json.dumps({"payload": {"text": "go"}, "wait": True})
            expected = await curl("-H", CLIENT, "-H", JSON, "-H", "expect: 100-continue", "-d", go, f"{base}/v1/tasks")
            assert expected.status == 200 and expected.json()["result"]["output"] == {"shout": "GO"}

        # /metrics with the metrics token (text, not JSON).
        metrics_h2, metrics_h1 = await both(f"{base}/metrics", "-H", METRICS)
        assert metrics_h2.status == metrics_h1.status == 200
        assert 'cronoq_tasks_total{status="succeeded"} 3.0' in metrics_h2.text

        # Errors: identical status and JSON.
        too_large = json.dumps({"payload": "x" * 10_000})
        cases: list[tuple[int, tuple[str, ...], str]] = [
            (400, ("-H", CLIENT, "-H", JSON, "-d", '{"payload": 1, "priorty": "high"}'), "/v1/tasks"),
            (400, ("-H", CLIENT, "-H", JSON, "-d", "{not json"), "/v1/tasks"),
            (415, ("-H", CLIENT, "-H", "content-type: text/plain", "-d", "{}"), "/v1/tasks"),
            (413, ("-H", CLIENT, "-H", JSON, "-d", too_large), "/v1/tasks"),
            (401, ("-H", JSON, "-d", "{}"), "/v1/tasks"),
            (401, ("-H", "authorization: Bearer not-a-known-token-0123456789",), "/v1/tasks/1"),
            (403, ("-H", CLIENT,), "/metrics"),
            (403, ("-H", METRICS,), "/v1/tasks/1"),
            (404, ("-H", CLIENT,), "/v1/tasks/424242"),
            (404, ("-H", CLIENT,), "/v1/no-such-route"),
            (405, ("-H", CLIENT, "-X", "PUT"), "/v1/tasks"),
            (400, ("-H", CLIENT,), "/v1/tasks?bogus=1"),
        ]  # fmt: skip
        for status, args, path in cases:
            over_h2, over_h1 = await both(f"{base}{path}", *args)
            assert over_h2.status == over_h1.status == status, (path, args, over_h2.text, over_h1.text)
            assert over_h2.json() == over_h1.json(), (path, args)
            assert set(over_h2.json()) == {"error", "code"}


async def test_the_dns_rebinding_guard_reads_the_authority(tmp_path: Path) -> None:
    # Authentication off: only loopback hosts are answered. HTTP/2 carries the host as :authority.
    async with server_process(tmp_path, process_config(auth=False)) as server:
        base = server.http_url
        await wait_ready(base)
        over_h2, over_h1 = await both(f"{base}/v1/tasks/by-key/none", "-H", "host: cronoq.example.com")
        assert over_h2.status == over_h1.status == 403
        assert over_h2.json() == over_h1.json()
        over_h2, over_h1 = await both(f"{base}/v1/tasks/by-key/none", "-H", f"host: localhost:{server.http_port}")
        assert over_h2.status == over_h1.status == 404


async def test_a_large_body_over_h2c_and_one_sent_without_a_length(tmp_path: Path) -> None:
    # 3 MiB of payload is far more than the flow-control windows, so both sides wait for
    # WINDOW_UPDATE many times; the answer (the payload echoed back) is as large.
    config = process_config(limits=f"max_http_body_bytes = {8 * 1024 * 1024}", max_wait_s=30)

    async def echo(lease: Lease) -> bytes:
        return lease.payload

    text = "0123456789abcdef" * (3 * 65536)
    async with server_process(tmp_path, config) as server:
        base = server.http_url
        await wait_ready(base)
        async with serving(server.address, "default", echo):
            body = json.dumps({"payload": {"text": text}, "wait": True}).encode()
            for args in (("--data-binary", "@-"), ("-T", "-", "-X", "POST")):  # the second streams it, unsized
                answer = await curl("-H", CLIENT, "-H", JSON, *args, f"{base}/v1/tasks", stdin=body)
                assert (answer.status, answer.version) == (200, "2"), answer.text[:300]
                assert answer.json()["result"]["output"] == {"text": text}
        # Larger than the limit without a content-length: 413 once the limit is passed.
        huge = json.dumps({"payload": "y" * (9 * 1024 * 1024)}).encode()
        answer = await curl("-H", CLIENT, "-H", JSON, "-T", "-", "-X", "POST", f"{base}/v1/tasks", stdin=huge)
        assert (answer.status, answer.version) == (413, "2")
        assert answer.json()["code"] == "payload_too_large"


async def test_concurrent_streams_on_one_connection(tmp_path: Path) -> None:
    config = process_config(limits="max_concurrent_streams = 16", max_wait_s=60)
    async with server_process(tmp_path, config) as server:
        base = server.http_url
        await wait_ready(base)
        for index in range(6):
            submitted = await curl("-H", CLIENT, "-H", JSON, "-d",
                                   json.dumps({"payload": {"text": f"t{index}"}, "key": f"c-{index}"}),
                                   f"{base}/v1/tasks")  # fmt: skip
            assert submitted.status == 200, submitted.text

        client = await RawH2.connect("127.0.0.1", server.http_port)
        try:
            await asyncio.wait_for(client.server_settings.wait(), 30)
            assert client.max_concurrent_streams == 16  # limits.max_concurrent_streams, announced
            # expect: 100-continue: the interim 100 comes first (after the credentials are checked),
            # the body only then.
            auth = ("authorization", f"Bearer {CLIENT_TOKEN}")
            announced = client.request("POST", "/v1/tasks", auth, ("content-type", "application/json"),
                                       ("expect", "100-continue"), body_follows=True)  # fmt: skip
            await client.until(lambda: client.streams[announced].interim == [100])
            assert client.streams[announced].status is None
            client.send_body(announced, b'{"payload": "late", "key": "announced"}')
            status, created = await client.answer(announced)
            assert status == 200 and created["duplicate"] is False
            # Six result waits stay open (no worker serves the pool yet) ...
            waits = [client.request("GET", f"/v1/tasks/by-key/c-{index}/result?timeout_s=50", ("authorization",
                     f"Bearer {CLIENT_TOKEN}")) for index in range(6)]  # fmt: skip
            # ... while later streams on the same connection are answered.
            probe = client.request("GET", "/healthz")
            assert await client.answer(probe) == (200, {"status": "ok"})
            read = client.request("GET", "/v1/tasks/by-key/c-0", ("authorization", f"Bearer {CLIENT_TOKEN}"))
            status, info = await client.answer(read)
            assert (status, info["status"]) == (200, "ready")
            assert not any(client.streams[stream].ended for stream in waits)
            # A worker completes the tasks and every waiting stream gets its own answer.
            async with serving(server.address, "default", shout):
                for index, stream in enumerate(waits):
                    status, result = await client.answer(stream)
                    assert status == 200 and result["output"] == {"shout": f"T{index}"}
            assert client.goaway is None
        finally:
            await client.close()


async def test_a_reset_stream_cancels_its_request(tmp_path: Path) -> None:
    # Two requests in flight at most: if resetting the two waiting streams did not cancel their
    # handlers, every further request would get 429 until their 50 s waits ran out.
    config = process_config(limits="max_concurrent_requests = 2", max_wait_s=60)
    async with server_process(tmp_path, config) as server:
        base = server.http_url
        await wait_ready(base)
        submitted = await curl("-H", CLIENT, "-H", JSON, "-d", '{"payload": 1, "key": "r-1"}', f"{base}/v1/tasks")
        assert submitted.status == 200
        auth = ("authorization", f"Bearer {CLIENT_TOKEN}")
        client = await RawH2.connect("127.0.0.1", server.http_port)
        try:
            waits = [client.request("GET", "/v1/tasks/by-key/r-1/result?timeout_s=50", auth) for _ in range(2)]
            # Both are in flight once a third request is refused.
            for _ in range(300):
                status, body = await client.answer(client.request("GET", "/v1/tasks/by-key/r-1", auth))
                if status == 429:
                    break
                await asyncio.sleep(0.1)
            assert (status, body["code"]) == (429, "too_many_requests"), body
            for stream in waits:
                client.reset(stream)
            for _ in range(300):
                status, body = await client.answer(client.request("GET", "/v1/tasks/by-key/r-1", auth))
                if status == 200:
                    break
                await asyncio.sleep(0.1)
            assert status == 200, body
            assert body["status"] == "ready"
            assert all(client.streams[stream].status is None for stream in waits)
        finally:
            await client.close()


async def test_stopping_the_server_sends_goaway_and_finishes_running_streams(tmp_path: Path) -> None:
    config = process_config(max_wait_s=60)
    async with server_process(tmp_path, config) as server:
        await wait_ready(server.http_url)
        client = await RawH2.connect("127.0.0.1", server.http_port)
        try:
            await asyncio.wait_for(client.server_settings.wait(), 30)
            # A request that is running when the server stops, on a task no worker runs.
            submitted = await curl("-H", CLIENT, "-H", JSON, "-d", '{"payload": 1, "key": "g-1"}',
                                   f"{server.http_url}/v1/tasks")  # fmt: skip
            assert submitted.status == 200
            stream = client.request("GET", "/v1/tasks/by-key/g-1/result?timeout_s=50",
                                    ("authorization", f"Bearer {CLIENT_TOKEN}"))  # fmt: skip
            probe = client.request("GET", "/healthz")
            assert (await client.answer(probe))[0] == 200
            server.signal(signal.SIGTERM)
            await client.until(lambda: client.goaway is not None or client.closed)
            goaway = client.goaway
            assert goaway is not None, "the connection closed without GOAWAY"
            assert goaway.error_code == ErrorCodes.NO_ERROR
            assert goaway.last_stream_id is not None and goaway.last_stream_id >= stream
            # The running stream ends one way or the other (answered while the server stops, or
            # cancelled when the shutdown timeout runs out), never left hanging.
            state = client.streams[stream]
            await client.until(lambda: state.ended or state.reset is not None or client.closed)
            assert state.ended or state.reset is not None
            assert server.proc is not None
            assert await asyncio.to_thread(server.proc.wait, 30) == 0
        finally:
            await client.close()


async def test_closing_the_gateway_lets_running_streams_finish_after_goaway() -> None:
    # In-process, so the test decides when the gateway closes: GOAWAY must come first, while both
    # streams still run; one then finishes normally, the other is cancelled when the shutdown
    # timeout runs out.
    config = Config.parse(config_text(max_wait_s=60))
    async with serve(config) as running:
        host, port = running.gateway.address.rsplit(":", 1)
        auth = ("authorization", f"Bearer {CLIENT_TOKEN}")
        async with running.session() as http:
            for key, pool in (("finishes", "other"), ("never", "fixed")):
                status, _ = await request(http, "POST", "/v1/tasks", json={"pool": pool, "key": key})
                assert status == 200
        client = await RawH2.connect(host, int(port))
        try:
            finishes = client.request("GET", "/v1/tasks/by-key/finishes/result?timeout_s=50", auth)
            never = client.request("GET", "/v1/tasks/by-key/never/result?timeout_s=50", auth)
            assert (await client.answer(client.request("GET", "/healthz")))[0] == 200
            closing = asyncio.ensure_future(running.gateway.close())
            await client.until(lambda: client.goaway is not None)
            assert client.goaway is not None and client.goaway.error_code == ErrorCodes.NO_ERROR
            assert client.goaway.last_stream_id is not None and client.goaway.last_stream_id >= never
            assert not client.streams[finishes].ended and not client.streams[never].ended
            # A worker completes one task while the gateway is closing: its stream is answered.
            await running.worker("other", shout_bytes)
            status, result = await client.answer(finishes)
            assert (status, result["status"]) == (200, "succeeded")
            # The other is cancelled at the end of the shutdown timeout, and the connection closes.
            await asyncio.wait_for(closing, 60)
            state = client.streams[never]
            await client.until(lambda: state.reset is not None or client.closed)
            assert state.status is None and not state.ended
        finally:
            await client.close()


async def shout_bytes(lease: Lease) -> bytes:
    return b'"done"'


# ======================================================================================= TLS


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_tls_negotiates_h2_with_alpn_and_still_serves_http11(tmp_path: Path) -> None:
    from tests.server.test_tls import make_certificates

    make_certificates(tmp_path)
    tls = f"""
[server.tls]
cert = "{tmp_path / "server.pem"}"
key = "{tmp_path / "server.key"}"
client_ca = "{tmp_path / "ca.pem"}"

[[auth.certs]]
dns_name = "worker-1.internal"
role = "metrics"
"""
    config = process_config(max_wait_s=30) + tls
    certs = ("--cacert", str(tmp_path / "ca.pem"), "--cert", str(tmp_path / "client.pem"),
             "--key", str(tmp_path / "client.key"))  # fmt: skip
    async with server_process(tmp_path, config, name="h2tls") as server:
        base = f"https://127.0.0.1:{server.http_port}"
        await wait_ready(base, *certs, protocol="--http2")
        # The client certificate is a metrics credential on HTTP/2 as on HTTP/1.1.
        over_h2 = await curl(*certs, f"{base}/metrics", protocol="--http2")
        over_h1 = await curl(*certs, f"{base}/metrics", protocol="--http1.1")
        assert (over_h2.status, over_h2.version) == (200, "2")
        assert (over_h1.status, over_h1.version) == (200, "1.1")
        assert "cronoq_tasks_total" in over_h2.text
        # ... and not a client one; a token wins over it.
        refused = await curl(*certs, f"{base}/v1/tasks/1", protocol="--http2")
        assert (refused.status, refused.version, refused.json()["code"]) == (403, "2", "forbidden")
        submitted = await curl(*certs, "-H", CLIENT, "-H", JSON, "-d", '{"payload": {"text": "tls"}, "key": "t-1"}',
                               f"{base}/v1/tasks", protocol="--http2")  # fmt: skip
        assert (submitted.status, submitted.version) == (200, "2"), submitted.text
        for protocol, version in (("--http2", "2"), ("--http1.1", "1.1")):
            answer = await curl(*certs, "-H", CLIENT, f"{base}/v1/tasks/by-key/t-1", protocol=protocol)
            assert (answer.status, answer.version) == (200, version)
            assert answer.json()["id"] == submitted.json()["id"]

        # curl multiplexing several transfers over one negotiated connection. (Over h2c with prior
        # knowledge curl 7.88 cannot reuse a connection at all, curl issue 10634, so this is TLS.)
        paths = ["/v1/tasks/by-key/t-1", "/metrics", "/v1/tasks/by-key/t-1", "/healthz", "/v1/tasks/by-key/t-1"]
        targets: list[str] = []
        for index, path in enumerate(paths):
            targets += ["-o", str(tmp_path / f"parallel-{index}.json"), f"{base}{path}"]
        proc = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--http2", "--parallel", "--parallel-max", "5", *certs,
            "-H", CLIENT, "-w", "%{http_code} %{http_version} %{num_connects}\n", *targets,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        assert proc.returncode == 0, err
        trailers = [line.split() for line in out.decode().splitlines()]
        bodies = [json.loads((tmp_path / f"parallel-{index}.json").read_text()) for index in range(len(paths))]
        # /metrics needs the metrics role: the client token wins over the certificate, so 403.
        assert sorted(trailer[0] for trailer in trailers) == ["200"] * 4 + ["403"]
        assert {trailer[1] for trailer in trailers} == {"2"}
        assert sum(int(trailer[2]) for trailer in trailers) == 1  # one connection for all five
        assert [bodies[index]["id"] for index in (0, 2, 4)] == [submitted.json()["id"]] * 3
        assert bodies[1]["code"] == "forbidden" and bodies[3] == {"status": "ok"}


# ================================================================================== telemetry


async def test_http2_requests_get_the_same_server_spans(tmp_path: Path) -> None:
    from tests.server import test_telemetry as otel

    async with otel.otlp_receiver() as receiver, otel.server_process(tmp_path, otel.otel_env(receiver)) as server:
        await wait_ready(server.http_url)
        caller = otel.Traceparent.new()
        answer = await curl("-H", CLIENT, "-H", JSON, "-H", f"traceparent: {caller.header}",
                            "-d", '{"pool": "other", "key": "traced"}', f"{server.http_url}/v1/tasks")  # fmt: skip
        assert (answer.status, answer.version) == (200, "2"), answer.text
        span = (await receiver.until(lambda: receiver.spans_named("POST /v1/tasks", caller.trace_id),
                                     "the HTTP/2 request span"))[0]  # fmt: skip
        attributes = otel._attributes(span.attributes)
        assert span.parent_span_id == caller.span_id
        assert (attributes["http.route"], attributes["url.path"], attributes["http.response.status_code"]) == (
            "/v1/tasks", "/v1/tasks", 200)  # fmt: skip
