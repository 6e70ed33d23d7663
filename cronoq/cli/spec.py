"""Turning command-line values into ``cronoq.v1`` messages: payloads, durations, ``k=v`` pairs, task refs.

Everything is checked here, before anything is sent, so a typo ends the command with a usage
error that names the flag instead of a server round trip.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from cronoq.proto import cronoq_pb2 as pb

from .exits import CliError, Exit

TEXT_TYPE = "text/plain; charset=utf-8"
JSON_TYPE = "application/json"
BYTES_TYPE = "application/octet-stream"
PRIORITIES = ("critical", "high", "normal", "low")
OVERLAPS = {
    "skip": pb.OVERLAP_SKIP,
    "allow": pb.OVERLAP_ALLOW,
    "queue": pb.OVERLAP_QUEUE,
    "queue_on_success": pb.OVERLAP_QUEUE_ON_SUCCESS,
}

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|h|d)?\s*")
_UINT64_MAX = 2**64 - 1


def usage(message: str) -> CliError:
    return CliError(Exit.USAGE, message)


def seconds(text: str, flag: str) -> float:
    """``30``, ``1.5``, ``250ms``, ``10s``, ``5m``, ``2h`` or ``1d`` as seconds (finite, not negative)."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise usage(f"{flag} {text!r} is not a duration: use seconds (30, 1.5) or a unit (250ms, 10s, 5m, 2h, 1d)")
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not math.isfinite(value):
        raise usage(f"{flag} {text!r} is too large")
    return value


def task_id(text: str, what: str = "task id") -> int:
    """A decimal task id (what the server prints); anything else is a usage error."""
    if not text.isascii() or not text.isdigit():
        raise usage(f"{what} {text!r} is not a decimal task id (use --key to name a task by its key)")
    value = int(text)
    if value == 0 or value > _UINT64_MAX:
        raise usage(f"{what} {text!r} is out of range")
    return value


def task_ref(id_text: str | None, key: str | None) -> pb.TaskRef:
    """An id or a key, exactly one of them."""
    if (id_text is None) == (key is None):
        raise usage("name the task by its ID or with --key KEY (one of them)")
    if key is not None:
        if not key:
            raise usage("--key must not be empty")
        return pb.TaskRef(key=key)
    assert id_text is not None
    return pb.TaskRef(id=task_id(id_text))


def dep_ref(text: str) -> pb.TaskRef:
    """``--after``: digits are a task id, anything else a key."""
    if not text:
        raise usage("--after needs a task id or a key")
    if text.isascii() and text.isdigit():
        return pb.TaskRef(id=task_id(text, "--after"))
    return pb.TaskRef(key=text)


def pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    """Repeated ``k=v`` flags as a mapping; a missing ``=``, an empty name or a repeat is refused."""
    out: dict[str, str] = {}
    for item in values or ():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise usage(f"{flag} {item!r} must look like name=value")
        if name in out:
            raise usage(f"{flag} {name} is given twice")
        out[name] = value
    return out


def check_json(data: bytes, what: str) -> None:
    """Refuse anything that is not one strict JSON document (no NaN or Infinity)."""

    def no_constant(name: str) -> None:
        raise ValueError(f"{name} is not allowed in JSON")

    try:
        json.loads(data.decode("utf-8"), parse_constant=no_constant)
    except UnicodeDecodeError:
        raise usage(f"{what} is not valid UTF-8, so it cannot be JSON") from None
    except (ValueError, RecursionError) as e:
        raise usage(f"{what} is not valid JSON: {e}") from None


def read_file(path: str, stdin: BinaryIO | None = None) -> bytes:
    """The bytes of ``path``, or of standard input for ``-``."""
    if path == "-":
        return (stdin or sys.stdin.buffer).read()
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise usage(f"cannot read --file {path}: {e.strerror or e}") from None


def payload(value: str | None, file: str | None, as_json: bool) -> tuple[bytes, str]:
    """The payload bytes and their default content type, from VALUE or ``--file``."""
    if value is not None and file is not None:
        raise usage("give the payload as VALUE or with --file, not both")
    if file is not None:
        data = read_file(file)
        if as_json:
            check_json(data, f"--file {file}")
            return data, JSON_TYPE
        return data, BYTES_TYPE
    if value is None:
        raise usage("give the payload: a VALUE (text, or JSON with --json) or --file PATH (- for standard input)")
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:
        raise usage("the VALUE is not valid text (use --file for bytes)") from None
    if as_json:
        check_json(data, "the VALUE")
        return data, JSON_TYPE
    return data, TEXT_TYPE


def priority(name: str | None) -> int:
    if name is None:
        return int(pb.PRIORITY_NORMAL)
    return PRIORITIES.index(name) + 1
