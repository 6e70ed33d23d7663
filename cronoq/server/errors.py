"""The one error type of the server's API layer, and how every domain error turns into it.

Handlers in ``cronoq.server.api`` raise ``ApiError`` only. Each ``Code`` knows its gRPC status and
its HTTP status and reason, so the gRPC servicers and the HTTP gateway report the same failure
the same way (book: "Error body and status mapping").
"""

from __future__ import annotations

import asyncio
import enum
import logging

import grpc

from cronoq.engine import AdmissionError, ConfigError, SubmitCode, UnknownTask
from cronoq.router.errors import RouteError
from cronoq.shard.driver import NotLeader, ShuttingDown, StoreUnavailable
from cronoq.shard.service import DataLoss, WaitTimeout, WorkerRefused

__all__ = ["NOT_LEADER_MESSAGE", "ApiError", "Code", "from_exception"]

log = logging.getLogger("cronoq.server")

NOT_LEADER_MESSAGE = "not the leader (standby or shutting down)"


class Code(enum.Enum):
    """A failure class: ``(gRPC status, HTTP status, HTTP reason code)``."""

    INVALID_ARGUMENT = (grpc.StatusCode.INVALID_ARGUMENT, 400, "bad_request")
    UNAUTHENTICATED = (grpc.StatusCode.UNAUTHENTICATED, 401, "unauthorized")
    PERMISSION_DENIED = (grpc.StatusCode.PERMISSION_DENIED, 403, "forbidden")
    NOT_FOUND = (grpc.StatusCode.NOT_FOUND, 404, "not_found")
    FAILED_PRECONDITION = (grpc.StatusCode.FAILED_PRECONDITION, 409, "conflict")
    PAYLOAD_TOO_LARGE = (grpc.StatusCode.RESOURCE_EXHAUSTED, 413, "payload_too_large")
    RESOURCE_EXHAUSTED = (grpc.StatusCode.RESOURCE_EXHAUSTED, 429, "too_many_requests")
    INTERNAL = (grpc.StatusCode.INTERNAL, 500, "internal_server_error")
    UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, 503, "service_unavailable")
    DEADLINE_EXCEEDED = (grpc.StatusCode.DEADLINE_EXCEEDED, 504, "gateway_timeout")
    CANCELLED = (grpc.StatusCode.CANCELLED, 504, "gateway_timeout")
    DATA_LOSS = (grpc.StatusCode.DATA_LOSS, 500, "internal_server_error")
    UNIMPLEMENTED = (grpc.StatusCode.UNIMPLEMENTED, 501, "not_implemented")

    @property
    def grpc(self) -> grpc.StatusCode:
        return self.value[0]

    @property
    def http(self) -> int:
        return self.value[1]

    @property
    def reason(self) -> str:
        """The HTTP body's ``code``: the lower-case reason phrase with underscores."""
        return self.value[2]


class ApiError(Exception):
    """A request failed with ``code``; ``message`` is safe to show the caller.

    ``metadata`` carries extra response metadata / headers (for example the shard of a pool).
    """

    def __init__(self, code: Code, message: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.metadata = metadata

    def __repr__(self) -> str:
        return f"ApiError({self.code.name}, {self.message!r})"

    @property
    def status(self) -> grpc.StatusCode:
        """The gRPC status (what the router reads from errors of the local shard)."""
        return self.code.grpc

    def http_body(self) -> dict[str, str]:
        """The JSON error body of the HTTP API."""
        return {"error": self.message, "code": self.code.reason}

    # Shorthands used all over the handlers.
    @classmethod
    def invalid(cls, message: str) -> ApiError:
        return cls(Code.INVALID_ARGUMENT, message)

    @classmethod
    def not_found(cls, message: str) -> ApiError:
        return cls(Code.NOT_FOUND, message)

    @classmethod
    def denied(cls, message: str) -> ApiError:
        return cls(Code.PERMISSION_DENIED, message)

    @classmethod
    def unavailable(cls, message: str = NOT_LEADER_MESSAGE) -> ApiError:
        return cls(Code.UNAVAILABLE, message)


_SUBMIT_CODES: dict[SubmitCode, Code] = {
    SubmitCode.UNKNOWN_POOL: Code.NOT_FOUND,
    SubmitCode.UNKNOWN_DEPENDENCY: Code.NOT_FOUND,
    SubmitCode.RESERVATION_CONFLICT: Code.FAILED_PRECONDITION,
    SubmitCode.FULL: Code.RESOURCE_EXHAUSTED,
    SubmitCode.OVERLOADED: Code.RESOURCE_EXHAUSTED,
    SubmitCode.UNKNOWN_RESOURCE: Code.INVALID_ARGUMENT,
    SubmitCode.RESOURCE_EXCEEDS_CAPACITY: Code.INVALID_ARGUMENT,
    SubmitCode.CYCLE: Code.INVALID_ARGUMENT,
    SubmitCode.DUPLICATE_KEY_IN_BATCH: Code.INVALID_ARGUMENT,
    SubmitCode.INVALID: Code.INVALID_ARGUMENT,
}

_WORKER_CODES: dict[str, Code] = {
    "invalid_argument": Code.INVALID_ARGUMENT,
    "not_found": Code.NOT_FOUND,
    "failed_precondition": Code.FAILED_PRECONDITION,
    "permission_denied": Code.PERMISSION_DENIED,
    "resource_exhausted": Code.RESOURCE_EXHAUSTED,
    "unavailable": Code.UNAVAILABLE,
}


def submit_code(code: SubmitCode) -> Code:
    return _SUBMIT_CODES.get(code, Code.INVALID_ARGUMENT)


# A peer's RESOURCE_EXHAUSTED is read as "too many requests" (429), not "payload too large".
_BY_GRPC = {code.grpc: code for code in Code if code is not Code.PAYLOAD_TOO_LARGE}


def from_exception(exc: BaseException) -> ApiError:
    """The ``ApiError`` for any exception a handler let through."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RouteError):
        # The router's own refusals, and the answers of other shards it forwarded to.
        return ApiError(_BY_GRPC.get(exc.code, Code.INTERNAL), exc.message, exc.metadata)
    if isinstance(exc, AdmissionError):
        # ``str(exc)`` names the offending index of a batch ("task 3: ...").
        return ApiError(submit_code(exc.code), str(exc))
    if isinstance(exc, UnknownTask):
        return ApiError(Code.NOT_FOUND, "task not found")
    if isinstance(exc, ConfigError):
        return ApiError(Code.INVALID_ARGUMENT, str(exc))
    if isinstance(exc, NotLeader | ShuttingDown):
        return ApiError(Code.UNAVAILABLE, NOT_LEADER_MESSAGE)
    if isinstance(exc, StoreUnavailable):
        return ApiError(Code.UNAVAILABLE, "the store is unavailable; the operation was not stored, retry it")
    if isinstance(exc, WaitTimeout):
        return ApiError(Code.DEADLINE_EXCEEDED, f"{exc}; wait again or poll")
    if isinstance(exc, DataLoss):
        return ApiError(Code.DATA_LOSS, str(exc) or "watch consumer fell too far behind")
    if isinstance(exc, WorkerRefused):
        return ApiError(_WORKER_CODES.get(exc.code, Code.INVALID_ARGUMENT), str(exc))
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return ApiError(Code.CANCELLED, "request timeout expired")
    log.error("internal error", exc_info=exc)
    return ApiError(Code.INTERNAL, "internal error")
