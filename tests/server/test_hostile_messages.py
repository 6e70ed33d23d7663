"""Malformed messages get a short INVALID_ARGUMENT / 400 and leave no traceback in the log
(issue 14), against a real ``cronoq-server`` process:

- bytes that are no protobuf message, on every gRPC method of ``cronoq.v1`` (unary, server
  streaming and the Work stream alike), with a credential that may call it;
- JSON bodies that are not JSON, not UTF-8, or not the object the route reads, on every route
  with a body.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from cronoq.proto import cronoq_pb2 as pb
from tests.server.harness import ADMIN_TOKEN, CLIENT_TOKEN
from tests.server.http_support import HttpServerProcess, process_config

PATIENCE_S = 30.0

CONFIG = process_config()

GARBAGE = {
    "invalid wire type": b"\xff\xff\xff\x07",
    "length past the end": b"\x0a\xff\x01",
}
"""Bytes no message of ``cronoq.v1`` can be read from (unknown fields must still be well-formed)."""

METHODS = [
    (f"/{service.full_name}/{method.name}", method.client_streaming, method.server_streaming)
    for service in pb.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]

BAD_LOG_LINE = re.compile(r"Traceback|\b(WARNING|ERROR|CRITICAL)\b")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServerProcess]:
    proc = HttpServerProcess(tmp_path_factory.mktemp("messages"), CONFIG, name="messages").start()
    try:
        yield proc
    finally:
        proc.stop()


def log_since(server: HttpServerProcess, offset: int) -> list[str]:
    """Lines the server logged past ``offset`` that are warnings, errors or tracebacks."""
    return [line for line in server.stderr()[offset:].splitlines() if BAD_LOG_LINE.search(line)]


def _call(
    channel: grpc.Channel, method: str, client_streaming: bool, server_streaming: bool, data: bytes
) -> grpc.RpcError | None:
    identity = {"request_serializer": lambda raw: raw, "response_deserializer": lambda raw: raw}
    metadata = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
    try:
        if client_streaming:
            for _ in channel.stream_stream(method, **identity)(iter([data]), metadata=metadata, timeout=PATIENCE_S):
                pass
        elif server_streaming:
            for _ in channel.unary_stream(method, **identity)(data, metadata=metadata, timeout=PATIENCE_S):
                pass
        else:
            channel.unary_unary(method, **identity)(data, metadata=metadata, timeout=PATIENCE_S)
    except grpc.RpcError as error:
        return error
    return None


@pytest.mark.parametrize(("method", "client_streaming", "server_streaming"), METHODS)
def test_garbage_on_every_grpc_method_is_invalid_argument(
    server: HttpServerProcess, method: str, client_streaming: bool, server_streaming: bool
) -> None:
    offset = len(server.stderr())
    with grpc.insecure_channel(server.address) as channel:
        for what, data in GARBAGE.items():
            error = _call(channel, method, client_streaming, server_streaming, data)
            assert error is not None, f"{method} accepted {what}"
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, error.code(), error.details())
            assert "malformed request" in (error.details() or ""), error.details()
    assert log_since(server, offset) == []


def test_garbage_from_an_unknown_caller_is_unauthenticated_first(server: HttpServerProcess) -> None:
    with grpc.insecure_channel(server.address) as channel:
        call = channel.unary_unary(
            "/cronoq.v1.Tasks/Submit", request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw
        )
        with pytest.raises(grpc.RpcError) as caught:
            call(
                GARBAGE["invalid wire type"],
                metadata=(("authorization", "Bearer nobody-0123456789abcdef"),),
                timeout=PATIENCE_S,
            )
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


MALFORMED_BODIES = {
    "truncated": (b'{"pool": "default"', "malformed JSON"),
    "not UTF-8": (b'{"pool": "\xff\xfe"}', "not valid UTF-8"),
    "NaN": (b'{"timeout_s": NaN}', "malformed JSON"),
    "a name twice": (b'{"pool": "default", "pool": "other"}', "appears twice"),
    "nested too deeply": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "not an object": (b'"a string"', "must be a JSON object"),
    "wrong type": (b'{"pool": 7}', "pool must be a string"),
    "unknown field": (b'{"pool": "default", "colour": "red"}', "unknown field"),
}


@pytest.mark.parametrize("route", ["/v1/tasks", "/v1/tasks:batch"])
@pytest.mark.parametrize("case", sorted(MALFORMED_BODIES))
def test_a_malformed_body_on_every_route_is_400_naming_the_problem(
    server: HttpServerProcess, route: str, case: str
) -> None:
    body, expected = MALFORMED_BODIES[case]
    if route.endswith(":batch") and case not in ("truncated", "not UTF-8", "NaN", "nested too deeply"):
        body = b'{"tasks": [' + body + b"]}"  # the task objects inside a batch are read the same way
    offset = len(server.stderr())
    request = urllib.request.Request(
        f"{server.http_url}{route}",
        data=body,
        method="POST",
        headers={"authorization": f"Bearer {CLIENT_TOKEN}", "content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=PATIENCE_S)
    answer = json.loads(caught.value.read())
    assert (caught.value.code, answer["code"]) == (400, "bad_request"), answer
    assert expected in answer["error"], answer
    assert len(answer["error"]) < 300
    assert log_since(server, offset) == []
