"""The HTTP/JSON gateway: the Tasks service (without Watch), the read-only Admin calls, metrics
and health probes over HTTP/1.1 and HTTP/2 (h2c with prior knowledge on a plain listener, ALPN
``h2`` with TLS; ``cronoq.server.http2`` does the HTTP/2 side, on the same socket).

Each request is turned into the same ``cronoq.v1`` request message a gRPC caller would send and
handed to the transport-independent handlers of ``cronoq.server.api``; their protobuf answers
are turned into JSON by ``cronoq.server.json_shapes`` (which the command line shares for ``-o
json``). JSON is converted exactly once on the way in and once on the way out, and nothing in
this module decides scheduling questions.

What the gateway itself enforces, in this order, before a handler runs:

1. The connection's bounds (``cronoq.server.http_listen``): connections per listener, time and
   size of a request head, idle and stalled connections, HTTP/2 resets and windows.
2. At most ``limits.max_headers`` header fields (431); the DNS-rebinding guard: with
   authentication off (and no ``insecure_no_auth``) a request whose ``Host`` is not a loopback
   name or address gets 403.
3. The route: unknown paths 404, known paths with another method 405.
4. Credentials (``authorization: Bearer`` or a mapped client certificate), 401 otherwise;
   only the serving leader answers ``/v1`` and ``/metrics`` (503 otherwise); the route's role
   (403); the query parameters the route accepts (400).
5. The server's in-flight limits, shared with the gRPC listener (``UnaryRunner``): at most
   ``limits.max_concurrent_requests`` in all and ``limits.max_concurrent_requests_per_caller``
   for one credential (429 beyond; probes do not count), each within its time limit:
   ``limits.request_timeout_s``, and ``POST``/``GET /v1/tasks`` and every ``/result`` route get
   ``limits.max_wait_s`` on top (504 when it runs out, also while a body is still arriving).
6. Bodies: ``content-type: application/json`` (415), at most ``limits.max_http_body_bytes``
   (413), valid UTF-8 JSON with no unknown fields and no duplicate names (400).

Ids and ``*_unix_ns`` times are JSON strings in every answer and are accepted as strings or
numbers. Errors are ``{"error": message, "code": reason}`` with the status of ``ApiError``.

``start_http`` binds ``server.http_addr`` (and ``server.metrics_addr`` when set) and returns an
``HttpGateway``; the process starts it once and keeps it across leadership changes, because
``Api`` itself knows whether this server is serving.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import math
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import unquote

from aiohttp import web

from cronoq.config import Config, Role, is_loopback_host
from cronoq.proto import cronoq_pb2 as pb
from cronoq.router import Router, collect_unavailable

from . import openapi
from .api import Api
from .auth import Authenticator, Principal
from .console.handlers import EVENTS_QUERY, SEARCH_QUERY, ConsoleHandlers
from .errors import NOT_LEADER_MESSAGE, ApiError, Code, from_exception
from .http2 import H2Request
from .http_listen import (
    SHUTDOWN_TIMEOUT_S,
    Connection,
    ConnectionBounds,
    Listener,
    ListenError,
    bind,
    format_address,
    request_finished,
    request_started,
    ssl_context,
)
from .json_shapes import (
    EDGE_CONDS,
    MISS_POLICIES,
    PRIORITIES,
    refuse_constants,
    result_json,
    snapshot_json,
    submit_json,
    task_info_json,
    with_unavailable_shards,
    workers_json,
)
from .unary import UnaryRunner

__all__ = ["METRICS_ROUTES", "ROUTES", "UI_ROUTES", "HttpError", "HttpGateway", "ListenError", "Route", "start_http"]

log = logging.getLogger("cronoq.server")

JSON_TYPE = "application/json"
NOT_SERVING_LINGER_S = 1.0
"""A connection accepted while this node does not serve is let go this long after (see ``_add``)."""

_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_DECIMAL = re.compile(r"[0-9]{1,20}")
_SIGNED_DECIMAL = re.compile(r"-?[0-9]{1,19}")


# ======================================================================================= routes


@dataclass(frozen=True, slots=True)
class Route:
    """One operation of the gateway. ``path`` uses OpenAPI templating (``{id}``, ``{key}``)."""

    method: str
    path: str
    handler: str
    """Name of the ``_Gateway`` coroutine that serves it (also the OpenAPI ``operationId``)."""
    role: Role | None
    """Role the caller needs; ``None`` with ``authenticated`` means any valid credential."""
    authenticated: bool = True
    leader_only: bool = True
    """Only the serving leader answers (503 on a standby or while stopping)."""
    waits: bool = False
    """Gets ``limits.max_wait_s`` on top of ``limits.request_timeout_s``."""
    body: bool = False
    """Reads a JSON request body."""
    query: tuple[str, ...] = ()
    """Query parameters it accepts; any other is a 400."""

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.split("/")[1:])


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/tasks", "submit", Role.CLIENT, waits=True, body=True),
    Route("GET", "/v1/tasks", "list_tasks", Role.CLIENT, waits=True, query=SEARCH_QUERY),
    Route("POST", "/v1/tasks:batch", "submit_batch", Role.CLIENT, body=True),
    # The by-key routes come first: ``/v1/tasks/by-key/result`` names the key "result".
    Route("GET", "/v1/tasks/by-key/{key}", "get_task", Role.CLIENT),
    Route("DELETE", "/v1/tasks/by-key/{key}", "cancel_task", Role.CLIENT),
    Route("GET", "/v1/tasks/by-key/{key}/result", "task_result", Role.CLIENT, waits=True, query=("timeout_s",)),
    Route("GET", "/v1/tasks/by-key/{key}/detail", "task_detail", Role.CLIENT),
    Route("GET", "/v1/tasks/{id}", "get_task", Role.CLIENT),
    Route("DELETE", "/v1/tasks/{id}", "cancel_task", Role.CLIENT),
    Route("GET", "/v1/tasks/{id}/result", "task_result", Role.CLIENT, waits=True, query=("timeout_s",)),
    Route("GET", "/v1/tasks/{id}/detail", "task_detail", Role.CLIENT),
    Route("GET", "/v1/events", "watch_events", Role.CLIENT, waits=True, query=EVENTS_QUERY),
    Route("GET", "/v1/snapshot", "snapshot", Role.METRICS),
    Route("GET", "/v1/shards", "list_shards", Role.METRICS),
    Route("GET", "/v1/workers", "list_workers", Role.METRICS),
    Route("GET", "/v1/recurring", "list_recurring", Role.METRICS),
    Route("GET", "/v1/schedules", "list_schedules", Role.METRICS),
    Route("POST", "/v1/recurring/{name}/pause", "pause_schedule", Role.ADMIN),
    Route("POST", "/v1/recurring/{name}/resume", "resume_schedule", Role.ADMIN),
    Route("DELETE", "/v1/recurring/{name}", "remove_schedule", Role.ADMIN),
    Route("GET", "/v1/whoami", "whoami", None, leader_only=False),
    Route("GET", "/v1/openapi.json", "openapi", None, leader_only=False),
    Route("GET", "/metrics", "metrics", Role.METRICS),
    Route("GET", "/healthz", "healthz", None, authenticated=False, leader_only=False),
    Route("GET", "/readyz", "readyz", None, authenticated=False, leader_only=False),
)
"""Every operation of the main listener (``server.http_addr``), in matching order."""

METRICS_ROUTES: tuple[Route, ...] = (
    Route("GET", "/metrics", "metrics", None, authenticated=False),
    Route("GET", "/healthz", "healthz", None, authenticated=False, leader_only=False),
    Route("GET", "/readyz", "readyz", None, authenticated=False, leader_only=False),
)
"""The operations of the optional ``server.metrics_addr`` listener: no credentials, no TLS."""

UI_ROUTES: tuple[Route, ...] = (
    Route("GET", "/ui", "ui_redirect", None, authenticated=False, leader_only=False),
    Route("GET", "/ui/", "ui_index", None, authenticated=False, leader_only=False),
    Route("GET", "/ui/{file}", "ui_file", None, authenticated=False, leader_only=False),
)
"""The web console's pages (``cronoq.server.console``), on the main listener when
``[server.console] enabled = true``. They need no credentials: the page asks for a token."""


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


def _bad(message: str) -> NoReturn:
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


def parse_json(data: bytes) -> Any:
    """A request body as JSON: UTF-8, no NaN/Infinity, no name twice in one object."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        _bad("the request body is not valid UTF-8")
    try:
        return json.loads(text, parse_constant=refuse_constants, object_pairs_hook=_unique_names)
    except RecursionError:
        _bad("malformed JSON: nested too deeply")
    except ValueError as exc:
        _bad(f"malformed JSON: {exc}")


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        _bad(f"{what} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        _bad(f"{what} is not valid Unicode (lone surrogate)")
    if "\0" in value:
        _bad(f"{what} must not contain NUL characters")
    return value


def _boolean(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        _bad(f"{what} must be true or false")
    return value


def _seconds(value: Any, what: str) -> float:
    """A duration in seconds (a JSON number). Its range is checked where it is used."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        _bad(f"{what} must be a number of seconds")
    try:
        seconds = float(value)
    except OverflowError:
        _bad(f"invalid duration: {what} is out of range")
    if not math.isfinite(seconds) or seconds < 0:
        _bad(f"invalid duration: {what} must be a finite number of seconds, not negative")
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
        _bad(f"{what} must be a whole number")
    if not 0 <= number <= maximum:
        _bad(f"{what} must be between 0 and {maximum}")
    return number


def task_id(value: Any, what: str = "id") -> int:
    """A task id given as a decimal string or a JSON number. A whole number above the 64-bit
    range is well-formed but names no task: NOT_FOUND."""
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            _bad(f"{what} must be a decimal task id")
        number = int(value)
    elif (whole := _whole(value)) is None:
        _bad(f"{what} must be a task id (a decimal string or a number)")
    else:
        number = whole
    if number < 0:
        _bad(f"{what} must not be negative")
    if number > _UINT64_MAX:
        raise ApiError.not_found(f"{what}: no task has the id {number}")
    return number


def _unix_ns(value: Any, what: str) -> int:
    """Unix nanoseconds given as a decimal string or a JSON integer."""
    if isinstance(value, str):
        if not _SIGNED_DECIMAL.fullmatch(value):
            _bad(f"{what} must be whole Unix nanoseconds (a decimal string or an integer)")
        number = int(value)
    elif (whole := _whole(value)) is None:
        _bad(f"{what} must be whole Unix nanoseconds (a decimal string or an integer)")
    else:
        number = whole
    if not _INT64_MIN <= number <= _INT64_MAX:
        _bad(f"{what} is out of range")
    return number


class _Fields:
    """A JSON object read field by field: ``take`` each known one, then ``done`` refuses the rest.
    A field that is ``null`` counts as absent."""

    def __init__(self, value: Any, what: str) -> None:
        if not isinstance(value, dict):
            _bad(f"{what} must be a JSON object")
        self._left = dict(value)
        self.what = what

    def take(self, name: str) -> Any:
        return self._left.pop(name, None)

    def done(self) -> None:
        if self._left:
            names = ", ".join(sorted(repr(name) for name in self._left))
            _bad(f"unknown field{'s' if len(self._left) > 1 else ''} {names} in {self.what}")


def _choice(value: Any, names: Mapping[str, int], what: str) -> int:
    text = _string(value, what)
    number = names.get(text)
    if number is None:
        _bad(f"{what}: unknown value {text!r}; expected one of {', '.join(names)}")
    return number


def _string_map(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict):
        _bad(f"{what} must be an object of strings")
    return {_string(name, f"{what} name"): _string(item, f"{what}[{name!r}]") for name, item in value.items()}


def _task_ref(value: Any, what: str) -> pb.TaskRef:
    """A dependency target: a key (string), an id (number) or ``{"id": ...}`` / ``{"key": ...}``."""
    if isinstance(value, str):
        return pb.TaskRef(key=_string(value, what))
    if isinstance(value, int | float) and not isinstance(value, bool):
        return pb.TaskRef(id=task_id(value, what))
    fields = _Fields(value, what)
    ref = _ref_fields(fields, what)
    fields.done()
    return ref


def _ref_fields(fields: _Fields, what: str) -> pb.TaskRef:
    task, key = fields.take("id"), fields.take("key")
    if (task is None) == (key is None):
        _bad(f"{what}: give exactly one of id and key")
    if task is not None:
        return pb.TaskRef(id=task_id(task, f"{what}.id"))
    return pb.TaskRef(key=_string(key, f"{what}.key"))


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        _bad(f"{what} must be a list")
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
        _bad("give payload or payload_b64, not both")
    content_type = ""
    if payload is not None:
        try:
            spec.payload = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except UnicodeEncodeError:
            _bad("payload is not valid Unicode (lone surrogate)")
        content_type = JSON_TYPE
    elif encoded is not None:
        try:
            spec.payload = base64.b64decode(_string(encoded, "payload_b64"), validate=True)
        except (binascii.Error, ValueError):
            _bad("payload_b64 is not valid base64")
        content_type = "application/octet-stream"
    if (given := fields.take("content_type")) is not None:
        content_type = _string(given, "content_type")
    spec.content_type = content_type
    for name in _TEXT_FIELDS:
        if (text := fields.take(name)) is not None:
            setattr(spec, name, _string(text, name))
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
            _bad("resources must be an object of whole numbers")
        for name, amount in resources.items():
            spec.resources[_string(name, "resource name")] = _unsigned(amount, f"resources[{name!r}]", _UINT32_MAX)
    for name in ("tags", "labels"):
        if (mapping := fields.take(name)) is not None:
            getattr(spec, name).update(_string_map(mapping, name))
    return spec


def submit_request(value: Any) -> pb.SubmitRequest:
    """The body of ``POST /v1/tasks``: a task object plus ``wait`` and ``wait_timeout_s``."""
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
        _bad("the batch needs a tasks list")
    items = _list(tasks, "tasks")
    if len(items) > max_tasks:
        _bad(f"a batch may hold at most {max_tasks} tasks, not {len(items)}")
    request = pb.SubmitBatchRequest()
    for index, item in enumerate(items):
        try:
            request.tasks.append(task_spec(item, "the task"))
        except ApiError as err:
            raise ApiError(err.code, f"task {index}: {err.message}") from None
    return request


# ================================================================================ JSON: encoding
# The answers' shapes are in ``json_shapes`` (shared with the command line); this is the HTTP side.


def _dumps(value: Any) -> bytes:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate inside a worker's JSON output
        return json.dumps(value, separators=(",", ":")).encode("ascii")


def json_response(value: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    response = web.Response(body=_dumps(value), status=status, headers=headers)
    response.content_type = JSON_TYPE
    return response


def error_response(error: HttpError) -> web.Response:
    return json_response({"error": error.message, "code": error.reason}, error.status, error.headers)


# ======================================================================================= serving


Request = web.BaseRequest | H2Request
"""A request over HTTP/1.1 (aiohttp's) or HTTP/2 (``http2.H2Request``): the handlers read only
what both have (method, headers, rel_url, path, content_length, content.readany, transport)."""


def _host_name(header: str) -> str:
    """The host part of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``)."""
    header = header.strip()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    name, sep, port = header.rpartition(":")
    return name if sep and port.isdigit() else header


def _cert_names(request: Request) -> list[str]:
    """DNS names of a verified client certificate (none without mTLS)."""
    transport = request.transport
    if transport is None:
        return []
    cert = transport.get_extra_info("peercert")
    if not cert:
        return []
    return [value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"]


def _segment(raw: str, what: str) -> str:
    """A percent-decoded path segment."""
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        _bad(f"{what} is not valid UTF-8 once percent-decoded")


Handler = Callable[[Request, Principal, dict[str, str]], Awaitable[web.StreamResponse]]


class _Gateway(ConsoleHandlers):
    """The request handler of one listener (the console's handlers come from ``ConsoleHandlers``)."""

    def __init__(self, api: Api, config: Config, authenticator: Authenticator, routes: tuple[Route, ...],
                 *, guard_host: bool, router: Router | None = None,
                 unary: UnaryRunner | None = None) -> None:  # fmt: skip
        self.api = api
        self.router = router if router is not None else Router(config, api)
        self.limits = config.limits
        self.auth = authenticator
        self.routes = routes
        self.guard_host = guard_host
        self.unary = unary if unary is not None else UnaryRunner(config.limits)
        self._resources = {resource.name: resource.capacity for resource in config.resources}
        self._templates: list[tuple[tuple[str, ...], list[Route]]] = []
        for route in routes:
            for segments, group in self._templates:
                if segments == route.segments:
                    group.append(route)
                    break
            else:
                self._templates.append((route.segments, [route]))
        self._document: bytes | None = None

    # ----------------------------------------------------------------------------- dispatch

    def _match(self, method: str, raw_path: str) -> tuple[Route, dict[str, str]]:
        parts = raw_path.split("/")[1:]
        for segments, group in self._templates:
            if len(segments) != len(parts):
                continue
            params: dict[str, str] = {}
            for template, part in zip(segments, parts, strict=True):
                if template.startswith("{"):
                    if not part:
                        break
                    params[template[1:-1]] = part
                elif template != part and template != unquote(part):
                    break
            else:
                for route in group:
                    if route.method == method:
                        return route, params
                allowed = ", ".join(route.method for route in group)
                raise HttpError(405, "method_not_allowed", f"{method} is not allowed here; use {allowed}",
                                {"allow": allowed})  # fmt: skip
        raise HttpError(404, "not_found", "no such route")

    async def handle(self, request: Request) -> web.StreamResponse:
        request_started(request)
        try:
            return await self._handle(request)
        finally:
            request_finished(request)

    async def _handle(self, request: Request) -> web.StreamResponse:
        try:
            if len(request.headers) > self.limits.max_headers:
                raise HttpError(431, "request_header_fields_too_large",
                                f"more than {self.limits.max_headers} header fields")  # fmt: skip
            if self.guard_host and not is_loopback_host(_host_name(request.headers.get("Host", ""))):
                raise HttpError(403, "forbidden", "authentication is off, so only requests for a loopback host "
                                                  "(localhost, 127.0.0.1, [::1]) are answered")  # fmt: skip
            route, params = self._match(request.method, request.rel_url.raw_path)
            if not route.leader_only and not route.authenticated:
                return await getattr(self, route.handler)(request, None, params)  # type: ignore[no-any-return]
            principal = self._authorize(route, request)
            handler: Handler = getattr(self, route.handler)

            async def serve(caller: Principal, http_request: Request) -> web.StreamResponse:
                return await handler(http_request, caller, params)

            # The server's one set of in-flight limits (shared with gRPC), and this route's time limit.
            limit = self.limits.request_timeout_s + (self.limits.max_wait_s if route.waits else 0.0)
            response, _ = await self.unary.run(principal, serve, request, timeout=limit)
            return response
        except ApiError as error:
            return error_response(HttpError.of(error))
        except HttpError as error:
            return error_response(error)
        except Exception as exc:  # the router's refusals and other shards' answers; the rest is logged
            return error_response(HttpError.of(from_exception(exc)))

    def _authorize(self, route: Route, request: Request) -> Principal:
        """The caller of an authenticated route, once it may make this request (ApiError otherwise)."""
        principal: Principal | None = None
        if route.authenticated:
            principal = self.auth.authenticate(request.headers.get("Authorization"), _cert_names(request))
        if route.leader_only and not self.api.serving:
            raise ApiError.unavailable()
        if principal is not None and route.role is not None:
            principal.require(route.role)
        self._check_query(route, request)
        return principal or _METRICS_LISTENER

    @staticmethod
    def _check_query(route: Route, request: Request) -> None:
        for name, value in request.rel_url.query.items():
            if name not in route.query:
                accepted = ", ".join(route.query) or "none"
                _bad(f"unknown query parameter {name!r} (accepted: {accepted})")
            if "\0" in value:
                _bad(f"query parameter {name} must not contain NUL characters")

    async def _body(self, request: Request) -> Any:
        """The JSON body, after the media type and the size limit are checked."""
        media, _, params = request.headers.get("Content-Type", "").partition(";")
        if media.strip().lower() != JSON_TYPE:
            raise HttpError(415, "unsupported_media_type", "the request body must be JSON with "
                                                           "content-type: application/json")  # fmt: skip
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
                raise HttpError(415, "unsupported_media_type", "JSON bodies must be UTF-8")
        limit = self.limits.max_http_body_bytes
        too_large = HttpError(413, Code.PAYLOAD_TOO_LARGE.reason, f"the request body is larger than {limit} bytes")
        if request.content_length is not None and request.content_length > limit:
            raise too_large
        if request.headers.get("Expect", "").lower() == "100-continue":
            if isinstance(request, H2Request):
                await request.send_continue()
            else:
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limit:
                raise too_large
            chunks.append(chunk)
        return parse_json(b"".join(chunks))

    def _ref(self, params: dict[str, str]) -> pb.TaskRef:
        if "key" in params:
            key = _segment(params["key"], "the key")
            if not key:
                _bad("the key must not be empty")
            return pb.TaskRef(key=_string(key, "the key"))
        raw = params["id"]
        if not _DECIMAL.fullmatch(raw):
            _bad(f"{raw!r} is not a decimal task id; look tasks up by key under /v1/tasks/by-key/{{key}}")
        return pb.TaskRef(id=task_id(raw))

    @staticmethod
    def _single(request: Request, name: str) -> str | None:
        values = request.rel_url.query.getall(name, [])
        if len(values) > 1:
            _bad(f"query parameter {name} given more than once")
        return values[0] if values else None

    # ----------------------------------------------------------------------------- Tasks

    async def submit(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        message = submit_request(await self._body(request))
        return json_response(submit_json(await self.router.submit(principal, message)))

    async def submit_batch(self, request: Request, principal: Principal,
                           params: dict[str, str]) -> web.Response:  # fmt: skip
        message = batch_request(await self._body(request), self.limits.max_tasks_per_batch)
        response = await self.router.submit_batch(principal, message)
        return json_response({"tasks": [submit_json(item) for item in response.tasks]})

    async def get_task(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        with collect_unavailable() as missing:
            info = await self.router.get(principal, pb.GetRequest(task=self._ref(params)))
        return json_response(with_unavailable_shards(task_info_json(info), missing))

    async def cancel_task(self, request: Request, principal: Principal,
                          params: dict[str, str]) -> web.Response:  # fmt: skip
        response = await self.router.cancel(principal, pb.CancelRequest(task=self._ref(params)))
        return json_response({"cancelled": response.cancelled})

    async def task_result(self, request: Request, principal: Principal,
                          params: dict[str, str]) -> web.Response:  # fmt: skip
        message = pb.WaitRequest(task=self._ref(params))
        if (timeout := self._single(request, "timeout_s")) is not None:
            try:
                seconds = float(timeout)
            except ValueError:
                _bad("timeout_s must be a number of seconds")
            message.timeout_s = seconds
        with collect_unavailable() as missing:
            result = await self.router.wait(principal, message)
        return json_response(with_unavailable_shards(result_json(result), missing))

    # ----------------------------------------------------------------------------- Admin

    async def snapshot(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        return json_response(snapshot_json(await self.router.snapshot(principal, pb.Empty())))

    async def list_workers(self, request: Request, principal: Principal,
                           params: dict[str, str]) -> web.Response:  # fmt: skip
        return json_response(workers_json(await self.router.list_workers(principal, pb.Empty())))

    async def metrics(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        body, content_type = await self.api.metrics_text(principal)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def openapi(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        if self._document is None:
            self._document = _dumps(openapi.document(self.limits, self._resources))
        response = web.Response(body=self._document)
        response.content_type = JSON_TYPE
        return response

    # ----------------------------------------------------------------------------- probes

    async def healthz(self, request: Request, principal: Principal | None,
                      params: dict[str, str]) -> web.Response:  # fmt: skip
        return json_response({"status": "ok"})

    async def readyz(self, request: Request, principal: Principal | None,
                     params: dict[str, str]) -> web.Response:  # fmt: skip
        if self.api.serving:
            return json_response({"status": "ready"})
        return error_response(HttpError(503, Code.UNAVAILABLE.reason, NOT_LEADER_MESSAGE))


_METRICS_LISTENER = Principal(Role.METRICS, name="metrics listener")
"""The caller of every request on ``server.metrics_addr``, which has no credentials."""


# ===================================================================================== listeners


class HttpGateway:
    """The running HTTP listeners. ``address`` is ``host:port`` of ``server.http_addr`` (the
    bound port when it was 0), ``metrics_address`` that of ``server.metrics_addr`` if set."""

    def __init__(self) -> None:
        self.address = ""
        self.metrics_address: str | None = None
        self.scheme = "http"
        self._listeners: list[Listener] = []

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    @property
    def listeners(self) -> tuple[Listener, ...]:
        """The main listener, then the metrics one when there is one."""
        return tuple(self._listeners)

    async def _add(self, gateway: _Gateway, sock: socket.socket, context: ssl.SSLContext | None) -> None:
        from .telemetry import trace_http  # OpenTelemetry: a span per request, only when it is on

        # The same (traced) handler serves both protocols; it reads only what H2Request has too.
        listener = Listener(trace_http(gateway.handle, gateway._match), ConnectionBounds.of(gateway.limits))
        self._listeners.append(listener)
        loop = asyncio.get_running_loop()

        def accepted(connection: Connection) -> None:
            if not gateway.api.serving:
                # A standby (or a node between leaderships) answers 503 and lets each connection go
                # about a second after accepting it, so a client that retries reconnects and its
                # load balancer picks a replica again, as on the gRPC listener.
                loop.call_later(NOT_SERVING_LINGER_S, connection.retire, SHUTDOWN_TIMEOUT_S)

        await listener.start(sock, context, accepted)

    def retire_connections(self, after_s: float = 1.0) -> None:
        """After ``after_s``, close every open connection gracefully (see ``Connection.retire``):
        a leader that steps down lets its clients go, so that they reconnect to the new leader."""
        for listener in self._listeners:
            listener.retire_all(after_s, SHUTDOWN_TIMEOUT_S)

    async def close(self) -> None:
        """Stop listening; requests still running get ``SHUTDOWN_TIMEOUT_S``, then are cancelled
        (HTTP/2 clients get GOAWAY first, so they open no new streams meanwhile)."""
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            with contextlib.suppress(Exception):
                await listener.close()


async def start_http(api: Api, config: Config, *, authenticator: Authenticator | None = None,
                     router: Router | None = None, unary: UnaryRunner | None = None) -> HttpGateway:  # fmt: skip
    """Serve the HTTP API on ``server.http_addr`` (TLS with ``[server.tls]``) and, when set,
    ``/metrics``, ``/healthz`` and ``/readyz`` without credentials on ``server.metrics_addr``.
    ``unary`` bounds the requests in flight; pass the gRPC servicers' one, so the limits are
    the server's.

    Raises ``ListenError`` (an ``OSError`` whose message names the address and the reason, e.g.
    "cannot listen on 127.0.0.1:7071: Address already in use") when a listener cannot bind.
    """
    auth = authenticator if authenticator is not None else Authenticator(config.auth)
    unary = unary if unary is not None else UnaryRunner(config.limits)
    server = config.server
    guard = not auth.enabled and not server.insecure_no_auth
    gateway = HttpGateway()
    sockets = [bind(server.http_addr)]
    try:
        if server.metrics_addr is not None:
            sockets.append(bind(server.metrics_addr))
        context = ssl_context(server.tls) if server.tls is not None else None
        routes = ROUTES + (UI_ROUTES if server.console.enabled else ())
        main = _Gateway(api, config, auth, routes, guard_host=guard, router=router, unary=unary)
        await gateway._add(main, sockets[0], context)
        gateway.address = format_address(sockets[0])
        if context is not None:
            gateway.scheme = "https"
        if len(sockets) > 1:
            metrics = _Gateway(api, config, auth, METRICS_ROUTES, guard_host=False, router=router, unary=unary)
            await gateway._add(metrics, sockets[1], None)
            gateway.metrics_address = format_address(sockets[1])
    except BaseException:
        await gateway.close()
        for sock in sockets:
            sock.close()
        raise
    log.info("listening http=%s%s", gateway.url,
             f" metrics={gateway.metrics_address}" if gateway.metrics_address else "")  # fmt: skip
    return gateway
