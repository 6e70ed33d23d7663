"""Client exceptions: hierarchy, attributes, str, pickling and the gRPC status mapping."""

from __future__ import annotations

import pickle
import subprocess
import sys

import grpc
import pytest

import cronoq
from cronoq._client.errors import rpc_error
from cronoq.client import CancelTask, ClientError, Reject
from cronoq.errors import CronoqError


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode | None, details: str | None) -> None:
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str | None:
        return self._details


def aio_error(code: grpc.StatusCode, details: str = "") -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def test_hierarchy() -> None:
    for cls in (ClientError, Reject, CancelTask):
        assert issubclass(cls, CronoqError)
    assert issubclass(CronoqError, Exception)


def test_client_error_fields_and_str() -> None:
    e = ClientError("not_found", "no task 7")
    assert (e.code, e.message, str(e)) == ("not_found", "no task 7", "not_found: no task 7")


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        ("unavailable", True),
        ("resource_exhausted", True),
        ("not_found", False),
        ("internal", False),
        ("deadline_exceeded", False),
    ],
)
def test_retryable(code: str, retryable: bool) -> None:
    assert ClientError(code, "").retryable is retryable


def test_from_rpc() -> None:
    e = ClientError.from_rpc(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "pool full"))
    assert (e.code, e.message, e.retryable) == ("resource_exhausted", "pool full", True)
    e = ClientError.from_rpc(FakeRpcError(None, None))
    assert (e.code, e.message) == ("unknown", "")
    e = ClientError.from_rpc(grpc.RpcError())
    assert (e.code, e.message) == ("unknown", "")


def test_pickling() -> None:
    for original in (ClientError("unavailable", "leader moved"), Reject("busy"), Reject(), CancelTask("bye")):
        clone = pickle.loads(pickle.dumps(original))
        assert type(clone) is type(original)
        assert str(clone) == str(original)
        assert clone.args == original.args
    clone = pickle.loads(pickle.dumps(ClientError("unavailable", "x")))
    assert (clone.code, clone.message) == ("unavailable", "x")
    assert pickle.loads(pickle.dumps(Reject("gpu busy"))).reason == "gpu busy"


def test_reject_defaults() -> None:
    assert Reject().reason == "" and str(Reject()) == ""
    assert str(Reject("busy")) == "busy"


@pytest.mark.parametrize(
    ("code", "details", "expected"),
    [
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", TimeoutError),
        (grpc.StatusCode.CANCELLED, "Timeout Expired while waiting", TimeoutError),
        (grpc.StatusCode.CANCELLED, "client cancelled", ClientError),
        (grpc.StatusCode.NOT_FOUND, "no such task", ClientError),
        (grpc.StatusCode.UNAVAILABLE, "", ClientError),
    ],
)
def test_status_mapping(code: grpc.StatusCode, details: str, expected: type) -> None:
    mapped = rpc_error(aio_error(code, details))
    assert type(mapped) is expected
    if isinstance(mapped, ClientError):
        assert mapped.code == code.name.lower()
        assert mapped.message == details


def test_cronoq_client_attribute_is_lazy() -> None:
    import cronoq.client

    assert cronoq.client is cronoq.__getattr__("client")


def test_import_without_grpc_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['grpc'] = None\n"
        "try:\n"
        "    import cronoq.client\n"
        "except ImportError as e:\n"
        "    assert 'client' in str(e) and 'cronoq[client]' in str(e), str(e)\n"
        "    assert e.__cause__ is not None\n"
        "    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_import_without_protobuf_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['google.protobuf'] = None\n"
        "try:\n"
        "    import cronoq.client\n"
        "except ImportError as e:\n"
        "    assert 'cronoq[client]' in str(e), str(e)\n"
        "    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_module_surface() -> None:
    import cronoq.client as mod

    assert set(mod.__all__) == {
        "CancelTask",
        "Client",
        "ClientError",
        "Event",
        "Lease",
        "PROTOCOL_VERSION",
        "PoolSnapshot",
        "RecurringInfo",
        "Reject",
        "Result",
        "Snapshot",
        "Submitted",
        "TaskInfo",
        "TaskPage",
        "Totals",
        "Worker",
        "WorkerGroup",
        "WorkerInfo",
        "task",
    }
    for name in mod.__all__:
        assert hasattr(mod, name)
    assert mod.PROTOCOL_VERSION == 3
    assert mod.MAX_REDIRECTS == 3
    assert mod.log.name == "cronoq.client"
    assert cronoq.client is mod
