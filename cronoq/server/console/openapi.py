"""The console's API calls in ``/v1/openapi.json``: ``extend`` adds them to the gateway's document
(``cronoq.server.openapi``), which stays the one list of served operations."""

from __future__ import annotations

import copy
from typing import Any

from ..openapi import NO_NUL, signed_int64_pattern

__all__ = ["extend"]

Schema = dict[str, Any]

_V1 = "400 401 403 429 500 503 504"


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _list(kind: str) -> Schema:
    return {"type": "string", "pattern": NO_NUL, "description": f"Comma-separated {kind} (or the parameter repeated)."}


def _query(name: str, description: str, schema: Schema) -> Schema:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


_BOOLEAN: Schema = {"type": "string", "enum": ["true", "false", "1", "0"]}
_SIGNED_NS: Schema = {"type": "string", "pattern": signed_int64_pattern()}

SEARCH_PARAMETERS: list[Schema] = [
    _query("kind", "Only these kinds.", _list("kinds")),
    _query("tenant", "Only these tenants.", _list("tenants")),
    _query("key_prefix", "Only keys starting with this text.", {"type": "string", "pattern": NO_NUL}),
    _query("created_from_unix_ns", "Submitted at or after (Unix ns).", _SIGNED_NS),
    _query("created_to_unix_ns", "Submitted before (Unix ns).", _SIGNED_NS),
    _query("newest_first", "Highest ids first; after is then an upper bound.", _BOOLEAN),
]
"""``GET /v1/tasks`` beyond pool, status, limit and after: the history filters."""


def _responses(success: Schema | None, codes: str, media: str = "application/json") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if success is not None:
        out["200"] = {"description": "OK", "content": {media: {"schema": success}}}
    for code in codes.split():
        out[code] = {"$ref": f"#/components/responses/E{code}"}
    return out


def _operation(
    operation_id: str, summary: str, responses: dict[str, Any], parameters: list[Schema] | None = None
) -> Schema:
    op: Schema = {"operationId": operation_id, "summary": summary, "responses": responses}
    if parameters:
        op["parameters"] = parameters
    return op


def _schemas(unix_ns: Schema, id_out: Schema, shard_names: Schema) -> dict[str, Schema]:
    preview = _object(
        {
            "bytes": {"type": "integer", "minimum": 0},
            "content_type": {"type": "string"},
            "truncated": {"type": "boolean", "description": "Only the first 4 KiB are shown."},
            "preview_b64": {"type": "string", "contentEncoding": "base64"},
            "preview_text": {"type": "string", "description": "The preview decoded as UTF-8 (with replacements)."},
        }
    )
    transition = _object(
        {
            "status": {"type": "string"},
            "attempt": {"type": "integer", "minimum": 0},
            "at_unix_ns": unix_ns,
            "retry_unix_ns": unix_ns,
            "message": {"type": "string"},
        },
        ("status", "attempt"),
    )
    return {
        "TaskDetail": _object(
            {
                "task": _ref("TaskInfo"),
                "spec": {"type": "object", "description": "The stored task object, without its payload."},
                "transitions": {"type": "array", "items": transition},
                "payload": preview,
                "output": preview,
                "unavailable_shards": shard_names,
            },
            ("task", "transitions"),
        ),
        "Shards": _object(
            {
                "shards": {
                    "type": "array",
                    "items": _object(
                        {
                            "name": {"type": "string", "description": "Empty for an unsharded server."},
                            "number": {"type": "integer", "minimum": 0},
                            "pools": {"type": "array", "items": {"type": "string"}},
                            "endpoint": {"type": "string"},
                            "leader": {"type": "string", "description": "The leading replica's gRPC address."},
                            "host": {"type": "string"},
                            "pid": {"type": "integer", "minimum": 0},
                            "epoch": id_out,
                            "leading_since_unix_ns": unix_ns,
                            "version": {"type": "string"},
                            "store": {"type": "string", "enum": ["memory", "sqlite", "postgres"]},
                            "replicas": {
                                "type": "array",
                                "description": "The replicas [[shards]] replicas lists, as the "
                                "leader found them (empty when none are listed).",
                                "items": _object(
                                    {
                                        "endpoint": {"type": "string"},
                                        "state": {"type": "string", "enum": ["leader", "standby", "unavailable"]},
                                        "host": {"type": "string"},
                                        "pid": {"type": "integer", "minimum": 0},
                                        "version": {"type": "string"},
                                        "error": {"type": "string", "description": "Why it is unavailable."},
                                    },
                                    ("endpoint", "state", "host", "pid", "version", "error"),
                                ),
                            },
                            "topology_version": {**id_out, "description": "Highest version of the placements below."},
                            "placements": {
                                "type": "array",
                                "description": "The shard's durable pool placements.",
                                "items": _object(
                                    {"pool": {"type": "string"}, "shard": {"type": "string"}, "version": id_out},
                                    ("pool", "shard", "version"),
                                ),
                            },
                            "topology_differences": {
                                "type": "array",
                                "items": {"type": "string"},
                                "description": "Where the configuration file disagrees with the record.",
                            },
                        }
                    ),
                },
                "unavailable_shards": {
                    **shard_names,
                    "description": "Shards that could not be asked (always present).",
                },
            },
            ("shards", "unavailable_shards"),
        ),
        "WhoAmI": _object(
            {
                "role": {"type": "string", "enum": ["client", "worker", "metrics", "admin"]},
                "pools": {
                    "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                    "description": "The pools the credential may use; null: every pool.",
                },
                "tenant": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "authentication": {"type": "boolean", "description": "False when the server checks no credentials."},
            },
            ("role", "pools", "tenant", "authentication"),
        ),
        "ScheduleFound": _object({"found": {"type": "boolean"}}, ("found",)),
        "ScheduleRemoved": _object({"removed": {"type": "boolean"}}, ("removed",)),
    }


def _object(properties: dict[str, Schema], required: tuple[str, ...] = ()) -> Schema:
    schema: Schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def extend(document: dict[str, Any], unix_ns: Schema, id_out: Schema, shard_names: Schema) -> None:
    """Add the console's calls to ``document`` (in place)."""
    paths = document["paths"]
    paths["/v1/tasks"]["get"]["parameters"].extend(SEARCH_PARAMETERS)
    paths["/v1/tasks"]["get"]["summary"] = "List or search tasks, live and past ones (role client)"
    schemas = document["components"]["schemas"]
    schemas.update(_schemas(unix_ns, id_out, shard_names))
    schedules = copy.deepcopy(schemas["Schedules"])
    schemas["ConsoleSchedules"] = schedules
    schedule = schedules["properties"]["schedules"]["items"]
    schedule["properties"].update(
        {
            "paused": {"type": "boolean", "description": "Paused by an admin: it creates no run until resumed."},
            "key": {"type": "string", "description": "The template's key; each run's key is <key>@<start in UTC>."},
            "next_runs_unix_ns": {"type": "array", "items": unix_ns, "maxItems": 5},
        }
    )
    schedule["required"] = [*schedule["required"], "paused", "next_runs_unix_ns"]
    paths["/v1/schedules"] = {
        "get": _operation(
            "list_schedules",
            "Recurring schedules with their paused state and next runs (role metrics)",
            _responses(_ref("ConsoleSchedules"), _V1),
        )
    }
    id_param = {
        "name": "id",
        "in": "path",
        "required": True,
        "description": "Decimal task id.",
        "schema": {"type": "string", "pattern": "^[0-9]{1,20}$"},
    }
    key_param = {
        "name": "key",
        "in": "path",
        "required": True,
        "description": "Task key, percent-encoded (encode / as %2F).",
        "schema": {"type": "string", "minLength": 1},
    }
    for prefix, param, label in (("/v1/tasks/{id}", id_param, "id"), ("/v1/tasks/by-key/{key}", key_param, "key")):
        paths[f"{prefix}/detail"] = {
            "get": _operation(
                f"task_detail_by_{label}",
                f"A task's spec, transitions and previews by {label} (role client)",
                _responses(_ref("TaskDetail"), _V1 + " 404"),
                [param],
            )
        }
    events = _query("all_transitions", "Every status change, not only the final ones.", _BOOLEAN)
    paths["/v1/events"] = {
        "get": _operation(
            "watch_events",
            "Status changes as they happen, one JSON object per line (role client)",
            _responses({"type": "string"}, _V1 + " 404", media="application/x-ndjson"),
            [_query("pool", "Only these pools.", _list("pools")), events],
        )
    }
    paths["/v1/shards"] = {
        "get": _operation("list_shards", "Each shard's leader (role metrics)", _responses(_ref("Shards"), _V1))
    }
    paths["/v1/whoami"] = {
        "get": _operation(
            "whoami",
            "The caller's role, pools and tenant (any credential)",
            _responses(_ref("WhoAmI"), "401 403 429 500 504"),
        )
    }
    name = {
        "name": "name",
        "in": "path",
        "required": True,
        "description": "Schedule name, percent-encoded.",
        "schema": {"type": "string", "minLength": 1},
    }
    for action in ("pause", "resume"):
        paths[f"/v1/recurring/{{name}}/{action}"] = {
            "post": _operation(
                f"{action}_schedule",
                f"{action.capitalize()} a recurring schedule (role admin)",
                _responses(_ref("ScheduleFound"), _V1),
                [name],
            )
        }
    paths["/v1/recurring/{name}"] = {
        "delete": _operation(
            "remove_schedule",
            "Remove a recurring schedule (role admin)",
            _responses(_ref("ScheduleRemoved"), _V1),
            [name],
        )
    }
