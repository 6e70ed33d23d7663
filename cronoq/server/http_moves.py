"""Pool moves over HTTP (docs/pool-moves.md), mixed into the gateway (``cronoq.server.http._Gateway``),
whose routes table names the handlers. The same calls and roles as the console's gRPC ``MovePool``,
``GetMove`` and ``AbortMove``, forwarded by the router to the shard serving the pool:

- ``POST /v1/admin/pools/{pool}/move`` with ``{"to": SHARD}`` (role admin): start a move;
- ``GET /v1/admin/pools/{pool}/move`` (role metrics): where the pool is, and its latest move;
- ``DELETE /v1/admin/pools/{pool}/move`` (role admin): abort the move while nothing of it has
  reached the target (409 naming the move's phase otherwise).

Each answers the move's status (``move_status_json``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from cronoq.proto import console_pb2 as cpb

from .errors import ApiError
from .http2 import H2Request
from .http_json import json_response

if TYPE_CHECKING:
    from cronoq.router import Router

    from .auth import Principal

__all__ = ["MoveHandlers", "extend_openapi", "move_status_json"]

Request = web.BaseRequest | H2Request
Schema = dict[str, Any]

_PATH = "/v1/admin/pools/{pool}/move"


def move_status_json(status: cpb.MoveStatus) -> dict[str, Any]:
    """A move's status as JSON; the move's fields are absent when the shard has no move of the pool."""
    out: dict[str, Any] = {"pool": status.pool, "shard": status.shard, "placement_version": status.placement_version}
    if status.move_id:
        out.update(move_id=status.move_id, target=status.target, version=status.version, phase=status.phase,
                   message=status.message, updated_unix_ns=str(status.updated_unix_ns))  # fmt: skip
    return out


def _pool(params: dict[str, str]) -> str:
    try:
        pool = unquote(params["pool"], errors="strict")
    except UnicodeDecodeError:
        raise ApiError.invalid("pool: not valid UTF-8 once percent-decoded") from None
    if not pool:
        raise ApiError.invalid("pool: must not be empty")
    return pool


def _target(body: Any) -> str:
    if not isinstance(body, dict):
        raise ApiError.invalid('the body must be a JSON object: {"to": SHARD}')
    unknown = sorted(set(body) - {"to"})
    if unknown:
        raise ApiError.invalid(f"{unknown[0]}: unknown field (the body holds only 'to')")
    to = body.get("to")
    if not isinstance(to, str) or not to:
        raise ApiError.invalid("to: the name of the shard to move the pool to is required (a non-empty text)")
    return to


class MoveHandlers:
    """Handlers of ``_Gateway``: ``(request, principal, path parameters) -> response``."""

    router: Router

    if TYPE_CHECKING:

        async def _body(self, request: Request) -> Any: ...

    async def move_pool(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        message = cpb.MovePoolRequest(pool=_pool(params), to=_target(await self._body(request)))
        return json_response(move_status_json(await self.router.move_pool(principal, message)))

    async def get_move(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        message = cpb.MoveRequest(pool=_pool(params))
        return json_response(move_status_json(await self.router.get_move(principal, message)))

    async def abort_move(self, request: Request, principal: Principal, params: dict[str, str]) -> web.Response:
        message = cpb.MoveRequest(pool=_pool(params))
        return json_response(move_status_json(await self.router.abort_move(principal, message)))


def extend_openapi(document: dict[str, Any], unix_ns: Schema) -> None:
    """Add the move calls to the gateway's OpenAPI ``document`` (in place)."""
    from .openapi import error_responses, operation

    def ref(name: str) -> Schema:
        return {"$ref": f"#/components/schemas/{name}"}

    errors = "400 401 403 404 409 429 500 503 504"
    pool = {"name": "pool", "in": "path", "required": True, "description": "Pool name, percent-encoded.",
            "schema": {"type": "string", "minLength": 1}}  # fmt: skip
    document["paths"][_PATH] = {
        "post": operation(
            "move_pool",
            "Move a pool to another shard while it runs (role admin)",
            error_responses(ref("MoveStatus"), errors + " 413 415"),  # a body: too large, not JSON
            body=ref("MovePoolRequest"),
            parameters=[pool],
            description="The pool's running attempts end on its shard first; then it is handed "
            "over. Follow it with GET on the same path.",
        ),
        "get": operation(
            "get_move",
            "Where a pool is and its latest move (role metrics)",
            error_responses(ref("MoveStatus"), errors),
            parameters=[pool],
        ),
        "delete": operation(
            "abort_move",
            "Abort a pool's move while nothing of it has reached the target (role admin)",
            error_responses(ref("MoveStatus"), errors),
            parameters=[pool],
            description="409 naming the move's phase once it can no longer be aborted.",
        ),
    }
    text = {"type": "string"}
    document["components"]["schemas"].update({
        "MovePoolRequest": {"type": "object", "properties": {"to": {"type": "string", "minLength": 1}},
                            "required": ["to"], "additionalProperties": False},
        "MoveStatus": {
            "type": "object",
            "properties": {
                "pool": text, "shard": text, "placement_version": {"type": "integer", "minimum": 0},
                "move_id": text, "target": text, "version": {"type": "integer", "minimum": 0},
                "phase": {"type": "string", "enum": ["draining", "requested", "transferring", "done", "refused",
                                                     "aborted"]},
                "message": text, "updated_unix_ns": unix_ns,
            },
            "required": ["pool", "shard", "placement_version"],
            "additionalProperties": False,
        },
    })  # fmt: skip
