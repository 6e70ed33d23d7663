"""The HTTP handlers of the console and of the API calls it uses, mixed into the gateway
(``cronoq.server.http._Gateway``), whose routes table names them.

API (always served; roles as in ``cronoq.server.http.ROUTES``):

- ``GET /v1/tasks`` with the history filters: ``pool``, ``status``, ``kind``, ``tenant`` (each
  comma-separated or repeated), ``key_prefix``, ``created_from_unix_ns`` (inclusive),
  ``created_to_unix_ns`` (exclusive), ``newest_first``, and the ``after``/``limit`` cursor. Without
  the console's filters the published ListTasks is asked; with them ``cronoq.console.v1``'s
  SearchTasks, over every shard either way.
- ``GET /v1/tasks/{id}/detail`` (and by key): spec, transitions, payload and output previews.
- ``GET /v1/events``: the Watch stream as newline-delimited JSON (``events``).
- ``GET /v1/shards``: each shard's leader; ``GET /v1/whoami``: the caller's role and scope.
- ``GET /v1/schedules`` (``/v1/recurring`` with the paused state and next runs), ``POST
  /v1/recurring/{name}/pause`` and ``/resume``, ``DELETE /v1/recurring/{name}``.

Console (only with ``[server.console] enabled = true``): ``/ui/`` and its files, no credentials
(they hold no data; every call the page makes needs the token the user types into it).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from aiohttp import web

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import cronoq_pb2 as pb
from cronoq.router import collect_unavailable

from ..errors import ApiError
from ..http2 import H2Request, StreamedResponse
from ..http_json import json_response
from ..json_shapes import STATUSES, list_json, recurring_json, with_unavailable_shards
from . import events
from .assets import SECURITY_HEADERS, Asset, load_assets
from .shapes import detail_json, schedules_json, shards_json, whoami_json

if TYPE_CHECKING:
    from cronoq.config import LimitsConfig
    from cronoq.router import Router

    from ..auth import Authenticator, Principal

__all__ = ["SEARCH_QUERY", "ConsoleHandlers"]

Request = web.BaseRequest | H2Request

SEARCH_QUERY = (
    "pool",
    "status",
    "limit",
    "after",
    "kind",
    "tenant",
    "key_prefix",
    "created_from_unix_ns",
    "created_to_unix_ns",
    "newest_first",
)
"""The query parameters of ``GET /v1/tasks``."""
EVENTS_QUERY = ("pool", "all_transitions")

_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1
_DECIMAL = re.compile(r"[0-9]{1,20}")
_SIGNED = re.compile(r"-?[0-9]{1,19}")
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def _json(value: Any) -> web.Response:
    return json_response(value)


class ConsoleHandlers:
    """Handlers of ``_Gateway``: ``(request, principal, path parameters) -> response``."""

    router: Router
    limits: LimitsConfig
    auth: Authenticator
    _assets: dict[str, Asset] | None = None

    if TYPE_CHECKING:

        def _ref(self, params: dict[str, str]) -> pb.TaskRef: ...

        @staticmethod
        def _single(request: Request, name: str) -> str | None: ...

    # ----------------------------------------------------------------------------- query values

    @staticmethod
    def _names(request: Request, name: str) -> list[str]:
        """A list parameter: comma-separated, repeated, or both."""
        return [part for value in request.rel_url.query.getall(name, []) for part in value.split(",") if part]

    def _flag(self, request: Request, name: str) -> bool:
        value = self._single(request, name)
        if value is None:
            return False
        if value.lower() not in _BOOLEANS:
            raise ApiError.invalid(f"{name} must be true or false")
        return _BOOLEANS[value.lower()]

    def _unix_ns(self, request: Request, name: str) -> int | None:
        value = self._single(request, name)
        if value is None:
            return None
        if not _SIGNED.fullmatch(value) or not -(2**63) <= int(value) < 2**63:
            raise ApiError.invalid(f"{name} must be whole Unix nanoseconds")
        return int(value)

    # ----------------------------------------------------------------------------- tasks

    async def list_tasks(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        listing = pb.ListTasksRequest(pools=self._names(request, "pool"))
        for name in self._names(request, "status"):
            if name not in STATUSES:
                raise ApiError.invalid(f"status: unknown value {name!r}; expected one of {', '.join(STATUSES)}")
            listing.statuses.append(STATUSES[name])
        if (limit := self._single(request, "limit")) is not None:
            if not (limit.isascii() and limit.isdigit()) or int(limit) > _UINT32_MAX:
                raise ApiError.invalid("limit must be a whole number (0 selects the default page size)")
            listing.limit = int(limit)
        if (after := self._single(request, "after")) is not None:
            if not _DECIMAL.fullmatch(after):
                raise ApiError.invalid("after must be a decimal task id")
            listing.after = min(int(after), _UINT64_MAX)  # nothing follows the largest id
        search = cpb.SearchTasksRequest(
            list=listing,
            kinds=self._names(request, "kind"),
            tenants=self._names(request, "tenant"),
            key_prefix=self._single(request, "key_prefix") or "",
            newest_first=self._flag(request, "newest_first"),
        )
        if (created_from := self._unix_ns(request, "created_from_unix_ns")) is not None:
            search.created_from_unix_ns = created_from
        if (created_to := self._unix_ns(request, "created_to_unix_ns")) is not None:
            search.created_to_unix_ns = created_to
        if search == cpb.SearchTasksRequest(list=listing):
            return _json(list_json(await self.router.list_tasks(principal, listing)))
        return _json(list_json(await self.router.search_tasks(principal, search)))

    async def task_detail(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        with collect_unavailable() as missing:
            detail = await self.router.task_detail(principal, pb.GetRequest(task=self._ref(params)))
        return _json(with_unavailable_shards(detail_json(detail), missing))

    async def watch_events(self, request: Request, principal: Principal, params: dict[str, str]) -> web.StreamResponse:
        message = pb.WatchRequest(
            pools=self._names(request, "pool"), all_transitions=self._flag(request, "all_transitions")
        )
        with collect_unavailable() as missing:
            stream = await self.router.watch(principal, message)
        chunks = events.lines(stream, list(missing), self.limits.max_wait_s)
        headers = {"Content-Type": events.MEDIA_TYPE, "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        if isinstance(request, H2Request):
            return StreamedResponse(chunks, headers=headers)
        response = web.StreamResponse(headers=headers)
        try:
            await response.prepare(request)
            async for chunk in chunks:
                await response.write(chunk)
        except ConnectionError:
            pass  # the client went away; nothing more to say to it
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        return response

    # ----------------------------------------------------------------------------- cluster

    async def list_shards(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        return _json(shards_json(await self.router.list_shards(principal, pb.Empty())))

    async def whoami(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        return _json(whoami_json(principal.role.value, principal.pools, principal.tenant, self.auth.enabled))

    # ----------------------------------------------------------------------------- schedules

    async def list_recurring(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        """The published shape (what ``cronoq schedule list -o json`` prints too)."""
        return _json(recurring_json(await self.router.list_recurring(principal, pb.Empty())))

    async def list_schedules(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        """``/v1/recurring``'s entries plus their paused state, key and next runs."""
        return _json(schedules_json(await self.router.list_schedules(principal, pb.Empty())))

    def _schedule_name(self, params: dict[str, str]) -> str:
        from urllib.parse import unquote

        try:
            name = unquote(params["name"], errors="strict")
        except UnicodeDecodeError:
            raise ApiError.invalid("the schedule name is not valid UTF-8 once percent-decoded") from None
        if not name or "\0" in name:
            raise ApiError.invalid("the schedule name must be a non-empty text without NUL characters")
        return name

    async def pause_schedule(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        request_message = cpb.ScheduleRequest(name=self._schedule_name(params))
        return _json({"found": (await self.router.pause_schedule(principal, request_message)).found})

    async def resume_schedule(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        request_message = cpb.ScheduleRequest(name=self._schedule_name(params))
        return _json({"found": (await self.router.resume_schedule(principal, request_message)).found})

    async def remove_schedule(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        request_message = pb.RemoveRecurringRequest(name=self._schedule_name(params))
        return _json({"removed": (await self.router.remove_recurring(principal, request_message)).removed})

    # ----------------------------------------------------------------------------- the console's files

    async def ui_redirect(self, request: Request, principal: Principal | None, params: dict[str, str]) -> web.Response:
        return web.Response(status=308, headers={"Location": "/ui/", **SECURITY_HEADERS})

    async def ui_index(self, request: Request, principal: Principal | None, params: dict[str, str]) -> web.Response:
        return self._asset(request, "index.html")

    async def ui_file(self, request: Request, principal: Principal | None, params: dict[str, str]) -> web.Response:
        return self._asset(request, params["file"])

    def _asset(self, request: Request, name: str) -> web.Response:
        if self._assets is None:
            self._assets = load_assets()
        asset = self._assets.get(name)
        if asset is None:
            raise ApiError.not_found("no such file")
        headers = {"ETag": asset.etag, **SECURITY_HEADERS}
        if request.headers.get("If-None-Match") == asset.etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=asset.body, headers={"Content-Type": asset.content_type, **headers})
