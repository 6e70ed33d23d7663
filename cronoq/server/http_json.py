"""JSON in and out of the HTTP gateway (``cronoq.server.http``): request bodies turned into the
``cronoq.v1`` request messages a gRPC caller would send, and answers and errors turned into JSON
responses.

Request bodies are strict: UTF-8, no NaN or Infinity, no name twice in one object, no unknown
field; every refusal is an ``ApiError`` (INVALID_ARGUMENT unless said otherwise) naming the field.
A field that is ``null`` counts as absent. Ids and ``*_unix_ns`` times are accepted as decimal
strings or JSON numbers. The answers' shapes are in ``json_shapes`` (shared with the command line).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from aiohttp import web

from cronoq.proto import cronoq_pb2 as pb

from .errors import ApiError, Code
from .json_shapes import EDGE_CONDS, MISS_POLICIES, PRIORITIES, refuse_constants, submit_json

__all__ = ["DECIMAL_ID", "JSON_TYPE", "HttpError", "batch_request", "dumps", "error_response", "invalid",
           "json_bytes_response", "json_response", "parse_json", "submit_body", "submit_request", "task_id",
           "task_spec", "text_field"]  # fmt: skip

JSON_TYPE = "application/json"

_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
DECIMAL_ID = re.compile(r"[0-9]{1,20}")
_SIGNED_DECIMAL = re.compile(r"-?[0-9]{1,19}")


# ======================================================================================= errors


class HttpError(Exception):
    """A failure answered as ``{"error": message, "code": reason}`` with ``status``."""

    def __init__(self, status: int, reason: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.headers = dict(headers or {})

    @classmethod
    def of(cls, error: ApiError) -> HttpError:
        headers = dict(error.metadata)
        if error.code is Code.UNAUTHENTICATED:
            headers["www-authenticate"] = "Bearer"
        return cls(error.code.http, error.code.reason, error.message, headers)


def invalid(message: str) -> NoReturn:
    raise ApiError.invalid(message)


# ================================================================================ JSON: decoding


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise ValueError(f"the name {name!r} appears twice in one object")
            seen.add(name)
    return out


_DECODER = json.JSONDecoder(parse_constant=refuse_constants, object_pairs_hook=_unique_names)
"""Built once: ``json.loads`` with these options would build a decoder per body."""
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"))


def parse_json(data: bytes) -> Any:
    """A request body as JSON: UTF-8, no NaN/Infinity, no name twice in one object."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        invalid("the request body is not valid UTF-8")
    try:
        if text.startswith("\ufeff"):  # json.loads refuses a byte order mark, with its own message
            return json.loads(text)
        return _DECODER.decode(text)
    except RecursionError:
        invalid("malformed JSON: nested too deeply")
    except ValueError as exc:
        invalid(f"malformed JSON: {exc}")


def text_field(value: Any, what: str) -> str:
    if not isinstance(value, str):
        invalid(f"{what} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        invalid(f"{what} is not valid Unicode (lone surrogate)")
    if "\0" in value:
        invalid(f"{what} must not contain NUL characters")
    return value


def _boolean(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        invalid(f"{what} must be true or false")
    return value


def _seconds(value: Any, what: str) -> float:
    """A duration in seconds (a JSON number). Its range is checked where it is used."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        invalid(f"{what} must be a number of seconds")
    try:
        seconds = float(value)
    except OverflowError:
        invalid(f"invalid duration: {what} is out of range")
    if not math.isfinite(seconds) or seconds < 0:
        invalid(f"invalid duration: {what} must be a finite number of seconds, not negative")
    return seconds


def _whole(value: Any) -> int | None:
    """A JSON number that is a whole number (``3`` or ``3.0``) as an int, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _unsigned(value: Any, what: str, maximum: int) -> int:
    number = _whole(value)
    if number is None:
        invalid(f"{what} must be a whole number")
    if not 0 <= number <= maximum:
        invalid(f"{what} must be between 0 and {maximum}")
    return number


def task_id(value: Any, what: str = "id") -> int:
    """A task id given as a decimal string or a JSON number. A whole number above the 64-bit
    range is well-formed but names no task: NOT_FOUND."""
    if isinstance(value, str):
        if not DECIMAL_ID.fullmatch(value):
            invalid(f"{what} must be a decimal task id")
        number = int(value)
    elif (whole := _whole(value)) is None:
        invalid(f"{what} must be a task id (a decimal string or a number)")
    else:
        number = whole
    if number < 0:
        invalid(f"{what} must not be negative")
    if number > _UINT64_MAX:
        raise ApiError.not_found(f"{what}: no task has the id {number}")
    return number


def _unix_ns(value: Any, what: str) -> int:
    """Unix nanoseconds given as a decimal string or a JSON integer."""
    if isinstance(value, str):
        if not _SIGNED_DECIMAL.fullmatch(value):
            invalid(f"{what} must be whole Unix nanoseconds (a decimal string or an integer)")
        number = int(value)
    elif (whole := _whole(value)) is None:
        invalid(f"{what} must be whole Unix nanoseconds (a decimal string or an integer)")
    else:
        number = whole
    if not _INT64_MIN <= number <= _INT64_MAX:
        invalid(f"{what} is out of range")
    return number


class _Fields:
    """A JSON object read field by field: ``take`` each known one, then ``done`` refuses the rest.
    A field that is ``null`` counts as absent."""

    def __init__(self, value: Any, what: str) -> None:
        if not isinstance(value, dict):
            invalid(f"{what} must be a JSON object")
        self._left = dict(value)
        self.what = what

    def take(self, name: str) -> Any:
        return self._left.pop(name, None)

    def done(self) -> None:
        if self._left:
            names = ", ".join(sorted(repr(name) for name in self._left))
            invalid(f"unknown field{'s' if len(self._left) > 1 else ''} {names} in {self.what}")


def _choice(value: Any, names: Mapping[str, int], what: str) -> int:
    text = text_field(value, what)
    number = names.get(text)
    if number is None:
        invalid(f"{what}: unknown value {text!r}; expected one of {', '.join(names)}")
    return number


def _string_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict):
        invalid(f"{what} must be an object of strings")
    return {text_field(name, f"{what} name"): text_field(item, f"{what}[{name!r}]") for name, item in value.items()}


def _task_ref(value: Any, what: str) -> pb.TaskRef:
    """A dependency target: a key (string), an id (number) or ``{"id": ...}`` / ``{"key": ...}``."""
    if isinstance(value, str):
        return pb.TaskRef(key=text_field(value, what))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return pb.TaskRef(id=task_id(value, what))
    fields = _Fields(value, what)
    ref = _ref_fields(fields, what)
    fields.done()
    return ref


def _ref_fields(fields: _Fields, what: str) -> pb.TaskRef:
    task, key = fields.take("id"), fields.take("key")
    if (task is None) == (key is None):
        invalid(f"{what}: give exactly one of id and key")
    if task is not None:
        return pb.TaskRef(id=task_id(task, f"{what}.id"))
    return pb.TaskRef(key=text_field(key, f"{what}.key"))


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        invalid(f"{what} must be a list")
    return value


def _retry(value: Any) -> pb.RetryPolicy:
    fields = _Fields(value, "retry")
    policy = pb.RetryPolicy(jitter=True)  # the engine's default when the field is left out
    if (attempts := fields.take("max_attempts")) is not None:
        policy.max_attempts = _unsigned(attempts, "retry.max_attempts", _UINT32_MAX)
    for name in ("initial_backoff_s", "multiplier", "max_backoff_s"):
        if (number := fields.take(name)) is not None:
            setattr(policy, name, _seconds(number, f"retry.{name}"))
    if (jitter := fields.take("jitter")) is not None:
        policy.jitter = _boolean(jitter, "retry.jitter")
    fields.done()
    return policy


_TEXT_FIELDS = ("pool", "kind", "key", "tenant")
_DURATION_FIELDS = ("deadline_in_s", "start_in_s", "tolerance_s", "duration_hint_s", "timeout_s")
_UNIX_FIELDS = ("deadline_unix_ns", "start_unix_ns")


def task_spec(value: Any, what: str = "the task") -> pb.TaskSpec:
    """The HTTP task object as a ``cronoq.v1.TaskSpec``."""
    fields = _Fields(value, what)
    spec = _task_fields(fields)
    fields.done()
    return spec


def _task_fields(fields: _Fields) -> pb.TaskSpec:
    spec = pb.TaskSpec()
    payload, encoded = fields.take("payload"), fields.take("payload_b64")
    if payload is not None and encoded is not None:
        invalid("give payload or payload_b64, not both")
    content_type = ""
    if payload is not None:
        try:
            spec.payload = _COMPACT.encode(payload).encode("utf-8")
        except UnicodeEncodeError:
            invalid("payload is not valid Unicode (lone surrogate)")
        content_type = JSON_TYPE
    elif encoded is not None:
        try:
            spec.payload = base64.b64decode(text_field(encoded, "payload_b64"), validate=True)
        except (binascii.Error, ValueError):
            invalid("payload_b64 is not valid base64")
        content_type = "application/octet-stream"
    if (given := fields.take("content_type")) is not None:
        content_type = text_field(given, "content_type")
    spec.content_type = content_type
    for name in _TEXT_FIELDS:
        if (text := fields.take(name)) is not None:
            setattr(spec, name, text_field(text, name))
    if (priority := fields.take("priority")) is not None:
        spec.priority = _choice(priority, PRIORITIES, "priority")  # type: ignore[assignment]
    for name in _DURATION_FIELDS:
        if (number := fields.take(name)) is not None:
            setattr(spec, name, _seconds(number, name))
    for name in _UNIX_FIELDS:
        if (at := fields.take(name)) is not None:
            setattr(spec, name, _unix_ns(at, name))
    if (on_miss := fields.take("on_miss")) is not None:
        spec.on_miss = _choice(on_miss, MISS_POLICIES, "on_miss")  # type: ignore[assignment]
    if (retry := fields.take("retry")) is not None:
        spec.retry.CopyFrom(_retry(retry))
    if (after := fields.take("after")) is not None:
        for index, item in enumerate(_list(after, "after")):
            spec.deps.add(target=_task_ref(item, f"after[{index}]"), cond=pb.EDGE_COND_ON_SUCCESS)
    if (deps := fields.take("deps")) is not None:
        for index, item in enumerate(_list(deps, "deps")):
            what = f"deps[{index}]"
            dep_fields = _Fields(item, what)
            target = _ref_fields(dep_fields, what)
            cond = dep_fields.take("cond")
            dep_fields.done()
            number = pb.EDGE_COND_ON_SUCCESS if cond is None else _choice(cond, EDGE_CONDS, f"{what}.cond")
            spec.deps.add(target=target, cond=number)
    if (resources := fields.take("resources")) is not None:
        if not isinstance(resources, dict):
            invalid("resources must be an object of whole numbers")
        for name, amount in resources.items():
            spec.resources[text_field(name, "resource name")] = _unsigned(amount, f"resources[{name!r}]", _UINT32_MAX)
    for name in ("tags", "labels"):
        if (mapping := fields.take(name)) is not None:
            getattr(spec, name).update(_string_map(mapping, name))
    return spec


_COMMON_TEXT_FIELDS = frozenset(("pool", "kind", "key", "tenant"))
_COMMON_FIELDS = _COMMON_TEXT_FIELDS | {"payload", "priority"}


def _common_submit(value: Any) -> pb.SubmitRequest | None:
    """The most common body (text fields, a priority, a JSON payload) read in one pass; None for
    any other field or any value in doubt, which ``submit_request`` then reads field by field
    (so every refusal is that reader's own)."""
    if type(value) is not dict:
        return None
    request = pb.SubmitRequest()
    spec = request.task
    spec.SetInParent()  # present even when empty, as the field-by-field reader leaves it
    for name, item in value.items():
        if item is None:
            if name in _COMMON_FIELDS:
                continue
            return None  # unknown, even when null
        if name in _COMMON_TEXT_FIELDS:
            if type(item) is not str or not item.isascii() or "\0" in item:
                return None
            setattr(spec, name, item)
        elif name == "payload":
            try:
                spec.payload = _COMPACT.encode(item).encode("utf-8")
            except (UnicodeEncodeError, RecursionError, ValueError):
                return None
            spec.content_type = JSON_TYPE
        elif name == "priority" and type(item) is str and item in PRIORITIES:
            spec.priority = PRIORITIES[item]  # type: ignore[assignment]
        else:
            return None
    return request


def submit_request(value: Any) -> pb.SubmitRequest:
    """The body of ``POST /v1/tasks``: a task object plus ``wait`` and ``wait_timeout_s``."""
    common = _common_submit(value)
    return common if common is not None else _read_submit(value)


def _read_submit(value: Any) -> pb.SubmitRequest:
    """``submit_request`` field by field: every shape, every refusal."""
    fields = _Fields(value, "the task")
    request = pb.SubmitRequest()
    if (wait := fields.take("wait")) is not None:
        request.wait = _boolean(wait, "wait")
    if (timeout := fields.take("wait_timeout_s")) is not None:
        request.wait_timeout_s = _seconds(timeout, "wait_timeout_s")
    request.task.CopyFrom(_task_fields(fields))
    fields.done()
    return request


def batch_request(value: Any, max_tasks: int) -> pb.SubmitBatchRequest:
    """The body of ``POST /v1/tasks:batch``: ``{"tasks": [task object, ...]}``."""
    fields = _Fields(value, "the batch")
    tasks = fields.take("tasks")
    fields.done()
    if tasks is None:
        invalid("the batch needs a tasks list")
    items = _list(tasks, "tasks")
    if len(items) > max_tasks:
        invalid(f"a batch may hold at most {max_tasks} tasks, not {len(items)}")
    request = pb.SubmitBatchRequest()
    for index, item in enumerate(items):
        try:
            request.tasks.append(task_spec(item, "the task"))
        except ApiError as err:
            raise ApiError(err.code, f"task {index}: {err.message}") from None
    return request


# ================================================================================ JSON: encoding
# The answers' shapes are in ``json_shapes`` (shared with the command line); this is the HTTP side.


def dumps(value: Any) -> bytes:
    text = _COMPACT.encode(value)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate inside a worker's JSON output
        return _COMPACT_ASCII.encode(value).encode("ascii")


def json_response(value: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return json_bytes_response(dumps(value), status, headers)


def json_bytes_response(body: bytes, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A response whose body is JSON already."""
    if not headers:
        return web.Response(body=body, status=status, content_type=JSON_TYPE)
    response = web.Response(body=body, status=status, headers=headers)
    response.content_type = JSON_TYPE
    return response


def submit_body(response: pb.SubmitResponse) -> bytes:
    """``json_shapes.submit_json`` of ``response`` as bytes; the answer without a result (by far
    the most common) is written directly."""
    if response.HasField("result"):
        return dumps(submit_json(response))
    return b'{"id":"%d","duplicate":%s}' % (response.id, b"true" if response.duplicate else b"false")


def error_response(error: HttpError) -> web.Response:
    return json_response({"error": error.message, "code": error.reason}, error.status, error.headers)
