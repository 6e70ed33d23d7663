"""Pure client rules: targets, secure channels, redirects, heartbeats, argument checks."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from cronoq import client as c
from cronoq._client import channel, encoding
from cronoq._client.channel import check_redirect
from cronoq._client.worker import heartbeat_interval
from cronoq.client import MAX_REDIRECTS, Client, ClientError, Worker
from cronoq.proto import cronoq_pb2 as pb


@pytest.mark.parametrize(
    ("target", "address"),
    [
        ("localhost:7070", "localhost:7070"),
        ("http://localhost:7070", "localhost:7070"),
        ("https://cronoq.internal:443/", "cronoq.internal:443"),
        ("grpc://10.0.0.1:7070//", "10.0.0.1:7070"),
        ("HTTPS://Host:1", "Host:1"),
        ("unix:///tmp/sock", "unix:///tmp/sock"),
        ("dns:///svc:7070/", "dns:///svc:7070"),
    ],
)
def test_strip_target(target: str, address: str) -> None:
    assert channel.strip_target(target) == address


@pytest.mark.parametrize(
    ("target", "tls", "credentials", "secure"),
    [
        ("localhost:7070", False, None, False),
        ("http://localhost:7070", False, None, False),
        ("localhost:7070", True, None, True),
        ("localhost:7070", False, object(), True),
        ("https://cronoq:7070", False, None, True),
        ("grpc://cronoq:7070", False, None, False),
    ],
)
def test_secure_channel_rule(target: str, tls: bool, credentials: Any, secure: bool) -> None:
    assert channel.wants_tls(target, tls, credentials) is secure
    assert Client(target, tls=tls, credentials=credentials)._secure is secure


def test_auth_metadata() -> None:
    assert channel.auth_metadata(None) is None
    assert channel.auth_metadata("") is None
    assert channel.auth_metadata("s3cr3t-token-123456") == (("authorization", "Bearer s3cr3t-token-123456"),)
    assert Client("x:1", token="")._metadata is None


async def _no_handler(lease: Any) -> None:
    return None


def test_keepalive_defaults_yield_to_the_callers_options() -> None:
    chosen = [("grpc.keepalive_time_ms", 60_000), ("grpc.max_receive_message_length", 1 << 20)]
    merged = channel.with_keepalive(chosen)
    assert merged[: len(chosen)] == chosen
    assert [key for key, _ in merged].count("grpc.keepalive_time_ms") == 1
    assert dict(merged)["grpc.http2.ping_timeout_ms"] == dict(channel.KEEPALIVE)["grpc.http2.ping_timeout_ms"]
    assert Client("x:1", options=chosen)._options == merged
    assert Worker("x:1", "default", _no_handler, options=chosen)._options == merged
    assert Client("x:1")._options == list(channel.KEEPALIVE)


def _redirect(endpoint: str, **kw: Any) -> bool:
    args: dict[str, Any] = {
        "current_target": "localhost:7070",
        "tls": False,
        "credentials": None,
        "token": None,
        "insecure_redirect_http": False,
        "followed": 0,
    }
    args.update(kw)
    return check_redirect(endpoint, **args)


@pytest.mark.parametrize(
    "endpoint",
    [
        "10.0.0.2:7070",
        "grpc://10.0.0.2:7070",
        "ftp://shard-2:7070",
        "http://user@shard-2:7070",
        "https://user:pw@shard-2:7070",
        "http://",
        "http://[::1:7070",
    ],
)
def test_redirect_rejects_bad_endpoints(endpoint: str) -> None:
    with pytest.raises(ClientError) as info:
        _redirect(endpoint)
    assert info.value.code == "failed_precondition"


@pytest.mark.parametrize(
    ("endpoint", "kw", "warn"),
    [
        ("http://shard-2:7070", {}, False),
        ("https://shard-2:7070", {}, False),
        ("https://shard-2:7070", {"tls": True, "token": "t" * 16}, False),
        ("http://localhost:7071", {"token": "t" * 16}, False),
        ("http://127.0.0.5:7071", {"token": "t" * 16}, False),
        ("http://[::1]:7071", {"token": "t" * 16}, False),
        ("http://shard-2:7070", {"token": "t" * 16, "insecure_redirect_http": True}, True),
        ("HTTP://shard-2:7070", {}, False),
    ],
)
def test_redirect_allowed(endpoint: str, kw: dict[str, Any], warn: bool) -> None:
    assert _redirect(endpoint, **kw) is warn


@pytest.mark.parametrize(
    "kw",
    [
        {"tls": True},
        {"credentials": object()},
        {"current_target": "https://shard-1:7070"},
        {"tls": True, "insecure_redirect_http": True},
        {"token": "t" * 16},
        {"token": "t" * 16, "current_target": "http://localhost:7070"},
    ],
)
def test_redirect_refused_to_plain_http(kw: dict[str, Any]) -> None:
    with pytest.raises(ClientError) as info:
        _redirect("http://shard-2.example:7070", **kw)
    assert info.value.code == "failed_precondition"


def test_redirect_limit() -> None:
    for followed in range(MAX_REDIRECTS):
        assert _redirect("http://shard-2:7070", followed=followed) is False
    with pytest.raises(ClientError) as info:
        _redirect("http://shard-2:7070", followed=MAX_REDIRECTS)
    assert info.value.code == "failed_precondition"


def test_redirect_endpoint_from_metadata() -> None:
    def err(code: grpc.StatusCode, trailing: Any = (), initial: Any = ()) -> grpc.aio.AioRpcError:
        return grpc.aio.AioRpcError(code, grpc.aio.Metadata(*initial), grpc.aio.Metadata(*trailing), details="x")

    key = "cronoq-shard-endpoint"
    assert channel.redirect_endpoint(err(grpc.StatusCode.FAILED_PRECONDITION, trailing=[(key, "http://a:1")])) == (
        "http://a:1"
    )
    assert channel.redirect_endpoint(err(grpc.StatusCode.FAILED_PRECONDITION, initial=[(key, "http://b:1")])) == (
        "http://b:1"
    )
    assert channel.redirect_endpoint(err(grpc.StatusCode.FAILED_PRECONDITION)) is None
    assert channel.redirect_endpoint(err(grpc.StatusCode.UNAVAILABLE, trailing=[(key, "http://a:1")])) is None
    assert channel.redirect_endpoint(err(grpc.StatusCode.FAILED_PRECONDITION, trailing=[(key + "-bin", b"x")])) is None


@pytest.mark.parametrize(
    ("lease_ttl", "registered_ttl", "period"),
    [
        (None, None, None),
        (None, 0.0, None),
        (0.0, None, None),
        (None, 30.0, 10.0),
        (3.0, 30.0, 1.0),
        (0.0, 9.0, 3.0),
        (None, 0.003, 0.01),
        (0.02, None, 0.01),
    ],
)
def test_heartbeat_interval(lease_ttl: float | None, registered_ttl: float | None, period: float | None) -> None:
    got = heartbeat_interval(lease_ttl, registered_ttl)
    assert got == pytest.approx(period) if period is not None else got is None


async def _noop(lease: c.Lease) -> None:
    return None


def test_worker_constructor() -> None:
    w = Worker("localhost:7070", "gpu", _noop, labels={"gpu": "a100", "n": 2}, name="w1")
    assert (w.pool, w.slots, w.name, w.reconnect, w.backoff, w.grace) == ("gpu", 1, "w1", True, (0.1, 5.0), 10.0)
    assert w.labels == {"gpu": "a100", "n": "2"}
    assert w.handler is _noop
    assert (w.worker_id, w.lease_ttl, w.granted_slots, w.server_protocol, w.max_message_bytes) == (None,) * 5
    assert w.last_shutdown is None and w.connections == 0 and w.running == 0
    for bad in (0, -1):
        with pytest.raises(ValueError):
            Worker("localhost:7070", "gpu", _noop, slots=bad)


async def test_worker_stop_when_not_running_is_a_noop() -> None:
    w = Worker("localhost:1", "p", _noop)
    await w.stop()
    with pytest.raises(TimeoutError):
        await w.wait_registered(timeout=0.01)


async def test_argument_errors_raise_before_any_rpc() -> None:
    # Port 1 on loopback: nothing listens, but none of these calls gets as far as the network.
    async with Client("127.0.0.1:1") as client:
        with pytest.raises(ValueError):
            await client.submit("x", wait_timeout=1.0)
        with pytest.raises(ValueError):
            await client.submit("x", priority="urgent")
        with pytest.raises(TypeError):
            await client.list_tasks(pools="default")
        with pytest.raises(TypeError):
            await client.list_tasks(statuses="running")
        with pytest.raises(ValueError):
            await client.list_tasks(statuses=["running", "sleeping"])
        with pytest.raises(ValueError):
            await client.list_tasks(statuses=["unspecified"])
        with pytest.raises(TypeError):
            await client.add_recurring("n", "* * * * *", c.task("x"), pool="p")
        with pytest.raises(ValueError):
            await client.add_recurring("n", "* * * * *", "x", overlap="sometimes")
        with pytest.raises(TypeError):
            await client.cancel(True)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await client.get(1.0)  # type: ignore[arg-type]


def test_status_filter_names() -> None:
    assert encoding.status_to_wire("running") == pb.TASK_STATUS_RUNNING
    assert encoding.status_to_wire("DEAD_LETTERED") == pb.TASK_STATUS_DEAD_LETTERED


def test_client_channel_is_per_event_loop() -> None:
    client = Client("127.0.0.1:1")
    seen = []

    async def grab() -> None:
        client._stubs()
        first = client._channel
        client._stubs()
        assert client._channel is first  # same loop: reused
        seen.append(first)

    asyncio.run(grab())
    asyncio.run(grab())
    assert seen[0] is not seen[1]
    asyncio.run(client.close())
