"""The HTTP/JSON gateway: the Tasks service (without Watch), the read-only Admin calls, metrics
and health probes over HTTP/1.1 and HTTP/2 (h2c with prior knowledge on a plain listener, ALPN
``h2`` with TLS; ``cronoq.server.http2`` does the HTTP/2 side, on the same socket).

Each request is turned into the same ``cronoq.v1`` request message a gRPC caller would send and
handed to the transport-independent handlers of ``cronoq.server.api``; their protobuf answers
are turned into JSON by ``cronoq.server.json_shapes`` (which the command line shares for ``-o
json``); ``cronoq.server.http_json`` reads request bodies and writes the responses. JSON is
converted exactly once on the way in and once on the way out, and nothing in this module decides
scheduling questions.

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
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
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
from .http_json import (
    DECIMAL_ID,
    JSON_TYPE,
    HttpError,
    batch_request,
    dumps,
    error_response,
    invalid,
    json_bytes_response,
    json_response,
    parse_json,
    submit_body,
    submit_request,
    task_id,
    text_field,
)
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
from .http_moves import MoveHandlers
from .json_shapes import (
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

NOT_SERVING_LINGER_S = 1.0
"""A connection accepted while this node does not serve is let go this long after (see ``_add``)."""


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
    Route("POST", "/v1/admin/pools/{pool}/move", "move_pool", Role.ADMIN, body=True),  # http_moves
    Route("GET", "/v1/admin/pools/{pool}/move", "get_move", Role.METRICS),
    Route("DELETE", "/v1/admin/pools/{pool}/move", "abort_move", Role.ADMIN),
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
    return name if sep and (port.isascii() and port.isdigit()) else header


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
        invalid(f"{what} is not valid UTF-8 once percent-decoded")


Handler = Callable[[Request, Principal, dict[str, str]], Awaitable[web.StreamResponse]]


def _too_large(limit: int) -> HttpError:
    return HttpError(413, Code.PAYLOAD_TOO_LARGE.reason, f"the request body is larger than {limit} bytes")


_REMEMBERED_HOSTS = 64
"""How many ``Host`` values the loopback guard remembers its answer for."""


class _Gateway(ConsoleHandlers, MoveHandlers):
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
        # What _match answered for paths without parameters, and the Host headers seen (each
        # bounded: any client can send many different ones).
        self._static_paths = frozenset(route.path for route in routes if "{" not in route.path)
        self._matched: dict[tuple[str, str], Route] = {}
        self._loopback_hosts: dict[str, bool] = {}

    # ----------------------------------------------------------------------------- dispatch

    def _loopback(self, host_header: str) -> bool:
        known = self._loopback_hosts.get(host_header)
        if known is None:
            known = is_loopback_host(_host_name(host_header))
            if len(self._loopback_hosts) >= _REMEMBERED_HOSTS:
                self._loopback_hosts.clear()
            self._loopback_hosts[host_header] = known
        return known

    def _match(self, method: str, raw_path: str) -> tuple[Route, dict[str, str]]:
        if (route := self._matched.get((method, raw_path))) is not None:
            return route, {}
        route, params = self._search(method, raw_path)
        if raw_path in self._static_paths:
            self._matched[method, raw_path] = route
        return route, params

    def _search(self, method: str, raw_path: str) -> tuple[Route, dict[str, str]]:
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
            if self.guard_host and not self._loopback(request.headers.get("Host", "")):
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
            # HTTP handlers that report unavailable shards collect them themselves (in the body).
            response, _ = await self.unary.run(principal, serve, request, timeout=limit, collect=False)
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
            authorization = request.headers.get("Authorization")
            # The certificate is only looked at when there is no token (and authentication is on).
            certificate = () if authorization or not self.auth.enabled else _cert_names(request)
            principal = self.auth.authenticate(authorization, certificate)
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
                invalid(f"unknown query parameter {name!r} (accepted: {accepted})")
            if "\0" in value:
                invalid(f"query parameter {name} must not contain NUL characters")

    async def _body(self, request: Request) -> Any:
        """The JSON body, after the media type and the size limit are checked."""
        content_type = request.headers.get("Content-Type", "")
        if content_type != JSON_TYPE:  # exactly what nearly every client sends needs no more checks
            self._check_json_type(content_type)
        limit = self.limits.max_http_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _too_large(limit)
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
                raise _too_large(limit)
            chunks.append(chunk)
        return parse_json(b"".join(chunks))

    @staticmethod
    def _check_json_type(content_type: str) -> None:
        media, _, params = content_type.partition(";")
        if media.strip().lower() != JSON_TYPE:
            raise HttpError(415, "unsupported_media_type", "the request body must be JSON with "
                                                           "content-type: application/json")  # fmt: skip
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
                raise HttpError(415, "unsupported_media_type", "JSON bodies must be UTF-8")

    def _ref(self, params: dict[str, str]) -> pb.TaskRef:
        if "key" in params:
            key = _segment(params["key"], "the key")
            if not key:
                invalid("the key must not be empty")
            return pb.TaskRef(key=text_field(key, "the key"))
        raw = params["id"]
        if not DECIMAL_ID.fullmatch(raw):
            invalid(f"{raw!r} is not a decimal task id; look tasks up by key under /v1/tasks/by-key/{{key}}")
        return pb.TaskRef(id=task_id(raw))

    @staticmethod
    def _single(request: Request, name: str) -> str | None:
        values = request.rel_url.query.getall(name, [])
        if len(values) > 1:
            invalid(f"query parameter {name} given more than once")
        return values[0] if values else None

    # ----------------------------------------------------------------------------- Tasks

    async def submit(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        message = submit_request(await self._body(request))
        return json_bytes_response(submit_body(await self.router.submit(principal, message)))

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
                invalid("timeout_s must be a number of seconds")
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
            self._document = dumps(openapi.document(self.limits, self._resources))
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
        listener = Listener(trace_http(gateway.handle, gateway._match), ConnectionBounds.of(gateway.limits), lean=True)
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
