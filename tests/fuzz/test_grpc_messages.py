"""Random and mutated protobuf against every gRPC method of ``cronoq.v1``, on a real
``cronoq-server`` process: whatever the bytes, the answer is a status the method documents
(INVALID_ARGUMENT for bytes that are no message), never UNKNOWN or INTERNAL; nothing is logged
at ERROR and no traceback is; and the server keeps serving.

Mutations start from valid messages of each method and flip, insert, delete, duplicate or cut
bytes, or append fields the message does not have. A short run in ``make test``; ``make fuzz``
(``CRONOQ_FUZZ=long``) runs many more examples.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronoq.proto import cronoq_pb2 as pb
from tests.fuzz.budget import examples
from tests.server.harness import ADMIN_TOKEN
from tests.server.http_support import HttpServerProcess, process_config

CONFIG = process_config("max_wait_s = 0.2\nrequest_timeout_s = 2")

CALL_TIMEOUT_S = 10.0
STREAM_TIMEOUT_S = 1.0
"""A Watch that was accepted streams until the caller leaves; this caller leaves after a second."""

FORBIDDEN = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.DATA_LOSS,
}
BAD_LOG_LINE = re.compile(r"Traceback|\b(ERROR|CRITICAL)\b")

TASK = pb.TaskSpec(
    pool="default",
    kind="k",
    key="fuzz-key",
    payload=b"{}",
    priority=pb.PRIORITY_HIGH,
    deadline_in_s=30.0,
    tags={"a": "b"},
    retry=pb.RetryPolicy(max_attempts=2, multiplier=2.0),
    deps=[pb.Dep(target=pb.TaskRef(key="other-key"), cond=pb.EDGE_COND_ON_SUCCESS)],
)

SEEDS: dict[str, list[bytes]] = {
    name: [message.SerializeToString() for message in messages]
    for name, messages in {
        "Submit": [pb.SubmitRequest(task=TASK), pb.SubmitRequest(task=pb.TaskSpec(), wait=True, wait_timeout_s=0.1)],
        "SubmitBatch": [pb.SubmitBatchRequest(tasks=[TASK, pb.TaskSpec(pool="other", start_in_s=5.0)])],
        "Cancel": [pb.CancelRequest(task=pb.TaskRef(key="fuzz-key")), pb.CancelRequest(task=pb.TaskRef(id=1))],
        "Get": [pb.GetRequest(task=pb.TaskRef(id=281474976710657)), pb.GetRequest(task=pb.TaskRef(key="k"))],
        "ListTasks": [pb.ListTasksRequest(pools=["default"], statuses=[pb.TASK_STATUS_READY], limit=5, after=3)],
        "Wait": [pb.WaitRequest(task=pb.TaskRef(key="fuzz-key"), timeout_s=0.1)],
        "Watch": [pb.WatchRequest(pools=["default"], keys=["fuzz-key"], all_transitions=True)],
        "Snapshot": [pb.Empty()],
        "AddRecurring": [
            pb.RecurringRequest(
                name="nightly", cron="0 3 * * *", tz="Europe/Paris", template=TASK, overlap=pb.OVERLAP_SKIP
            )
        ],
        "RemoveRecurring": [pb.RemoveRecurringRequest(name="nightly")],
        "ListWorkers": [pb.Empty()],
        "ListRecurring": [pb.Empty()],
        "Work": [
            pb.WorkerMessage(
                register=pb.Register(
                    pool="default", slots=2, worker_name="fuzz", protocol_version=3, labels={"zone": "a"}
                )
            ),
            pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=7)),
            pb.WorkerMessage(complete=pb.Complete(lease=7, output=b"x", content_type="text/plain")),
        ],
        "Forward": [
            pb.ForwardRequest(
                calls=[
                    pb.ForwardedCall(
                        id=1,
                        method="/cronoq.v1.Tasks/Submit",
                        request=pb.SubmitRequest(task=TASK).SerializeToString(),
                        authorization=f"Bearer {ADMIN_TOKEN}",
                        timeout_s=1.0,
                    ),
                    pb.ForwardedCall(id=2, cancel=True),
                ]
            )
        ],
    }.items()
}
"""Valid messages of each method, to mutate."""

METHODS = [
    (f"/{service.full_name}/{method.name}", method.name, method.client_streaming, method.server_streaming)
    for service in pb.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServerProcess]:
    proc = HttpServerProcess(tmp_path_factory.mktemp("fuzz-grpc"), CONFIG, name="fuzz-grpc").start()
    try:
        yield proc
    finally:
        proc.stop()


@st.composite
def mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    """A valid message with a few byte-level changes."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        where = draw(st.integers(0, len(data)))
        change = draw(st.sampled_from(["flip", "insert", "delete", "cut", "repeat", "append"]))
        if change == "flip" and where < len(data):
            data[where] ^= 1 << draw(st.integers(0, 7))
        elif change == "insert":
            data[where:where] = draw(st.binary(min_size=1, max_size=8))
        elif change == "delete":
            del data[where : where + draw(st.integers(1, 8))]
        elif change == "cut":
            del data[where:]
        elif change == "repeat":
            data += data[where:]
        else:  # a field of any number and wire type, with a plausible value
            tag = draw(st.integers(1, 2**29 - 1)) << 3 | draw(st.sampled_from([0, 1, 2, 5]))
            data += _varint(tag) + draw(st.binary(max_size=12))
    return bytes(data)


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        out.append(low | (0x80 if number else 0))
        if not number:
            return bytes(out)


def payloads(name: str) -> st.SearchStrategy[bytes]:
    deep = st.integers(1, 300).map(lambda depth: b"\x0b" * depth)  # nested groups past the parser's limit
    return st.one_of(st.binary(max_size=200), mutated(SEEDS[name]), deep)


def _call(
    channel: grpc.Channel, path: str, client_streaming: bool, server_streaming: bool, messages: list[bytes]
) -> grpc.StatusCode:
    identity: dict[str, Callable[[bytes], bytes]] = {"request_serializer": bytes, "response_deserializer": bytes}
    metadata = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
    try:
        if client_streaming:
            for _ in channel.stream_stream(path, **identity)(iter(messages), metadata=metadata, timeout=CALL_TIMEOUT_S):
                pass
        elif server_streaming:
            for _ in channel.unary_stream(path, **identity)(messages[0], metadata=metadata, timeout=STREAM_TIMEOUT_S):
                pass
        else:
            channel.unary_unary(path, **identity)(messages[0], metadata=metadata, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()  # type: ignore[attr-defined]
        return code
    return grpc.StatusCode.OK


@pytest.mark.parametrize(("path", "name", "client_streaming", "server_streaming"), METHODS)
def test_any_bytes_on_any_method_get_a_documented_status(
    server: HttpServerProcess, path: str, name: str, client_streaming: bool, server_streaming: bool
) -> None:
    offset = len(server.stderr())
    seen: set[grpc.StatusCode] = set()
    tried: list[grpc.StatusCode] = []
    with grpc.insecure_channel(server.address) as channel:
        stream = (
            st.lists(payloads(name), min_size=1, max_size=4)
            if client_streaming
            else payloads(name).map(lambda one: [one])
        )

        @settings(
            max_examples=examples(40),
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        )
        @given(messages=stream)
        def call(messages: list[bytes]) -> None:
            code = _call(channel, path, client_streaming, server_streaming, messages)
            seen.add(code)
            tried.append(code)
            assert code not in FORBIDDEN, (path, messages)

        call()
        # Still serving, and still answering this method's garbage with INVALID_ARGUMENT.
        assert (
            _call(channel, path, client_streaming, server_streaming, [b"\xff\xff\xff\x07"])
            == grpc.StatusCode.INVALID_ARGUMENT
        )
    print(json.dumps({"fuzz": "grpc", "method": path, "examples": len(tried),
                      "statuses": sorted(code.name for code in seen)}))  # fmt: skip
    assert grpc.StatusCode.INVALID_ARGUMENT in seen
    bad = [line for line in server.stderr()[offset:].splitlines() if BAD_LOG_LINE.search(line)]
    assert bad == []
