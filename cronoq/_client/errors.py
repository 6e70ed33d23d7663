"""The exceptions the client raises and a handler may raise, and how a failed call maps to them."""

from __future__ import annotations

import grpc
import grpc.aio

from cronoq.errors import CronoqError

_RETRYABLE_CODES = frozenset({"unavailable", "resource_exhausted"})

FATAL_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


class ClientError(CronoqError):
    """An RPC failed. ``code`` is the lower-case gRPC status name, ``message`` the server's details."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __reduce__(self) -> tuple[type[ClientError], tuple[str, str]]:
        return (type(self), (self.code, self.message))

    @property
    def retryable(self) -> bool:
        """True when trying again later may succeed (``unavailable``, ``resource_exhausted``)."""
        return self.code in _RETRYABLE_CODES

    @classmethod
    def from_rpc(cls, e: grpc.RpcError) -> ClientError:
        """Build from a failed gRPC call (its status code and details)."""
        code_fn = getattr(e, "code", None)
        code = code_fn() if callable(code_fn) else None
        details_fn = getattr(e, "details", None)
        details = details_fn() if callable(details_fn) else None
        name = getattr(code, "name", None)
        return cls(name.lower() if isinstance(name, str) else "unknown", details or "")


class Reject(CronoqError):
    """Raise from a worker handler to hand the lease back unrun, so another worker can take it."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason

    def __reduce__(self) -> tuple[type[Reject], tuple[str]]:
        return (type(self), (self.reason,))


class CancelTask(CronoqError):
    """Raise from a worker handler to end the task as cancelled (no retry)."""


def rpc_error(e: grpc.aio.AioRpcError) -> Exception:
    """The exception a failed call surfaces as: ``TimeoutError`` for deadlines, else ``ClientError``."""
    code = e.code()
    details = e.details() or ""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
        code == grpc.StatusCode.CANCELLED and "timeout expired" in details.lower()
    ):
        return TimeoutError(details or "deadline exceeded")
    return ClientError.from_rpc(e)
