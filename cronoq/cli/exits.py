"""Exit codes of the ``cronoq`` command and the error that carries one up to ``main``.

Scripts branch on these numbers, so each outcome a caller may want to handle differently has its
own code, and every failed RPC is mapped here, in one place.
"""

from __future__ import annotations

import enum

import grpc


class Exit(enum.IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    NOT_FOUND = 3
    TASK_FAILED = 4
    TIMEOUT = 5
    UNAVAILABLE = 6
    DENIED = 7
    INTERRUPTED = 130


EXIT_CODES_HELP = """\
exit codes:
  0    success
  1    any other error (for example a reservation conflict or an ambiguous key)
  2    usage error: bad arguments, or a request the server rejected as invalid
  3    not found: unknown task, key, pool or schedule (or one outside the token's pools)
  4    the task ended unsuccessfully (failed, dead_lettered, cancelled, skipped, missed, shed)
  5    timeout: the task is still running (wait again later)
  6    unavailable: server unreachable, not the leader, or overloaded (retry later)
  7    permission: the token is missing or unknown, or its role may not do this
  130  interrupted (Ctrl-C), except for watch and top, which end with 0
"""


class CliError(Exception):
    """Stops the command: ``message`` goes to standard error and the process exits with ``code``."""

    def __init__(self, code: Exit, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_BY_STATUS: dict[grpc.StatusCode, Exit] = {
    grpc.StatusCode.NOT_FOUND: Exit.NOT_FOUND,
    grpc.StatusCode.DEADLINE_EXCEEDED: Exit.TIMEOUT,
    grpc.StatusCode.UNAVAILABLE: Exit.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Exit.UNAVAILABLE,
    grpc.StatusCode.UNAUTHENTICATED: Exit.DENIED,
    grpc.StatusCode.PERMISSION_DENIED: Exit.DENIED,
    grpc.StatusCode.INVALID_ARGUMENT: Exit.USAGE,
}


def rpc_status(error: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    """The status code and details of a failed call (``None`` when the error carries none)."""
    code_fn = getattr(error, "code", None)
    details_fn = getattr(error, "details", None)
    code = code_fn() if callable(code_fn) else None
    details = details_fn() if callable(details_fn) else None
    return (code if isinstance(code, grpc.StatusCode) else None), str(details or "")


def from_rpc(error: grpc.RpcError, what: str = "") -> CliError:
    """Turn a failed call into the error the command exits with; ``what`` says what was asked."""
    code, details = rpc_status(error)
    exit_code = _BY_STATUS.get(code, Exit.ERROR) if code is not None else Exit.ERROR
    name = code.name.lower() if code is not None else "error"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        hint = " (set CRONOQ_TOKEN to a token the server knows)"
    elif code == grpc.StatusCode.UNAVAILABLE and "connect" in details.lower():
        hint = " (is the server running? check --addr or CRONOQ_ADDR)"
    else:
        hint = ""
    prefix = f"{what}: " if what else ""
    return CliError(exit_code, f"{prefix}{name}: {details or 'no details'}{hint}")
