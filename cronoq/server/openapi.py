"""The OpenAPI 3.1 description of the HTTP gateway, served at ``GET /v1/openapi.json``.

Built as plain Python data so it can use the server's limits and stay next to the code it
describes (``cronoq.server.http``). A test checks that the operations here and the routes the
gateway serves are the same set.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from cronoq.config import LimitsConfig
from cronoq.proto import cronoq_pb2 as pb

__all__ = ["document", "error_responses", "operation"]

Schema = dict[str, Any]

_UINT64_MAX = 2**64 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _names(enum: Any, prefix: str) -> list[str]:
    return [name[len(prefix) :].lower() for name, number in enum.items() if number]


PRIORITIES = _names(pb.Priority, "PRIORITY_")
STATUSES = _names(pb.TaskStatus, "TASK_STATUS_")
MISS_POLICIES = _names(pb.MissPolicy, "MISS_POLICY_")
EDGE_CONDS = _names(pb.EdgeCond, "EDGE_COND_")
OVERLAPS = _names(pb.Overlap, "OVERLAP_")


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    """Request fields may be ``null``, which means the same as leaving them out."""
    return {"anyOf": [schema, {"type": "null"}]}


def _object(properties: dict[str, Schema], required: tuple[str, ...] = (), **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    schema.update(extra)
    return schema


def _optional(properties: dict[str, Schema]) -> dict[str, Schema]:
    return {name: _nullable(schema) for name, schema in properties.items()}


ID_OUT: Schema = {"type": "string", "pattern": "^[0-9]+$", "description": "A 64-bit task id as a decimal string."}
UNIX_NS_OUT: Schema = {"type": "string", "pattern": "^-?[0-9]+$", "description": "Unix nanoseconds as a string."}
MAX_SECONDS = 100 * 365.25 * 86400.0
"""Durations in requests are at most a century (larger ones are "invalid duration")."""
SECONDS: Schema = {"type": "number", "minimum": 0, "maximum": MAX_SECONDS}
BASE64 = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
COUNT: Schema = {"type": "integer", "minimum": 0}
STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string"}}
NO_NUL = "^[^\\u0000]*$"
"""Strings in requests must not contain NUL characters."""


def signed_int64_pattern() -> str:
    """A regular expression for the decimal strings of int64 values (Unix nanoseconds in queries)."""
    return f"^(?:{_decimal_at_most(_INT64_MAX)}|-{_decimal_at_most(-_INT64_MIN)})$"


def _decimal_at_most(bound: int) -> str:
    """A regular expression for the decimal numbers from 0 to ``bound`` (leading zeros allowed,
    as the server reads them), so a schema-valid string is always in range."""
    digits = str(bound)
    width = len(digits)
    options = [f"[0-9]{{1,{width - 1}}}"] if width > 1 else []
    for index, digit in enumerate(digits):
        if digit != "0":
            rest = width - index - 1
            smaller = "0" if digit == "1" else f"[0-{int(digit) - 1}]"
            options.append(digits[:index] + smaller + (f"[0-9]{{{rest}}}" if rest else ""))
    options.append(digits)
    return "(?:" + "|".join(options) + ")"


def _exclusive(first: str, second: str) -> Schema:
    """Not both ``first`` and ``second`` with a value (``null`` counts as absent)."""
    return {
        "anyOf": [{"not": {"required": [name]}} for name in (first, second)]
        + [{"properties": {name: {"type": "null"}}, "required": [name]} for name in (first, second)]
    }


SHARD_NAMES: Schema = {
    "type": "array",
    "items": {"type": "string"},
    "description": "Shards that could not be asked (only when one was missing).",
}


def _schemas(limits: LimitsConfig, resources: Mapping[str, int]) -> dict[str, Schema]:
    unix_ns_in: Schema = {
        "description": "Unix nanoseconds, not before the epoch: a decimal string or a JSON integer.",
        "oneOf": [
            {"type": "string", "pattern": f"^{_decimal_at_most(_INT64_MAX)}$"},
            {"type": "integer", "minimum": 0, "maximum": _INT64_MAX},
        ],
    }
    # A dependency names an existing task: ids start at 1.
    dep_id_in: Schema = {
        "description": "A task id (at least 1): a decimal string or a JSON number.",
        "oneOf": [
            {"type": "string", "pattern": "^(?=[0-9]{1,20}$)0*[1-9][0-9]*$"},
            {"type": "integer", "minimum": 1, "maximum": _UINT64_MAX},
        ],
    }
    text: Schema = {"type": "string", "pattern": NO_NUL, "description": "Must not contain NUL characters."}
    name: Schema = {**text, "maxLength": limits.max_key_len}
    key_ref: Schema = {**name, "minLength": 1}
    dep_ref = {
        "description": "Exactly one of id and key.",
        "oneOf": [_object({"id": dep_id_in}, ("id",)), _object({"key": key_ref}, ("key",))],
    }
    tag: Schema = {**text, "maxLength": limits.max_tag_len}
    string_map: Schema = {
        "type": "object",
        "propertyNames": tag,
        "additionalProperties": tag,
        "maxProperties": limits.max_tags,
    }
    task_fields: dict[str, Schema] = {
        "payload": {"description": "Any JSON value; sent to the worker as application/json."},
        "payload_b64": {
            "type": "string",
            "contentEncoding": "base64",
            "pattern": BASE64,
            "description": "A binary payload in standard base64 (instead of payload).",
        },
        "content_type": {
            "type": "string",
            "pattern": NO_NUL,
            "maxLength": 128,
            "description": "Overrides the payload's content type (application/json for payload, "
            "application/octet-stream for payload_b64).",
        },
        "pool": {
            **name,
            "description": "Pool to run in (default: the pool named default, else the first configured one).",
        },
        "kind": {**text, "maxLength": limits.max_kind_len, "description": "Category for duration learning."},
        "priority": {"type": "string", "enum": PRIORITIES, "default": "normal"},
        "key": {
            **name,
            "description": "Idempotency key and dependency name; resubmitting returns the same id. "
            "Keys ending in '@<UTC RFC 3339 time>' are reserved for recurring runs.",
        },
        "deadline_in_s": {**SECONDS, "description": "Soft deadline, relative (not with deadline_unix_ns)."},
        "deadline_unix_ns": {**unix_ns_in, "description": "Soft deadline, absolute (not with deadline_in_s)."},
        "start_in_s": {**SECONDS, "description": "Fixed start, relative (not with start_unix_ns)."},
        "start_unix_ns": {**unix_ns_in, "description": "Fixed start, absolute (not with start_in_s)."},
        "tolerance_s": {**SECONDS, "default": 1, "description": "Allowed lateness of a fixed start."},
        "on_miss": {"type": "string", "enum": MISS_POLICIES, "default": "run_late"},
        "duration_hint_s": {**SECONDS, "description": "Expected run time."},
        "timeout_s": {**SECONDS, "minimum": 1e-9, "description": "Time limit of one attempt (at least 1 ns)."},
        "retry": _nullable(_ref("Retry")),
        "after": {
            "type": "array",
            "maxItems": limits.max_deps,
            "description": 'Tasks that must succeed first: keys (strings), ids (numbers) or {"id": ...}.',
            "items": {"oneOf": [key_ref, {"type": "integer", "minimum": 1, "maximum": _UINT64_MAX}, dep_ref]},
        },
        "deps": {"type": "array", "maxItems": limits.max_deps, "items": _ref("Dep")},
        "resources": {
            "type": "object",
            "description": "Units of the configured resources to hold while running (at most each one's "
            "permits or burst).",
            "properties": {
                resource: {"type": "integer", "minimum": 1, "maximum": capacity}
                for resource, capacity in resources.items()
            },
            "additionalProperties": False,
            "maxProperties": limits.max_resources,
        },
        "tags": {**string_map, "description": "Free tags, given to the worker."},
        "labels": {**string_map, "description": "Required worker labels."},
        "tenant": {**name, "description": "Fair-share tenant (credentials with a tenant force theirs)."},
    }
    task = {
        name: _nullable(schema) if "$ref" not in schema and "anyOf" not in schema else schema
        for name, schema in task_fields.items()
    }
    submit = dict(task)
    submit["wait"] = _nullable({"type": "boolean", "description": "Answer after the task finished, with result."})
    submit["wait_timeout_s"] = _nullable(
        {**SECONDS, "description": "Cap on the wait (at most limits.max_wait_s); only together with wait."}
    )
    status = {"type": "string", "enum": STATUSES}
    # Fields that exclude each other; JSON Schema cannot say so inside each property.
    exclusive = [
        _exclusive(*pair)
        for pair in (("payload", "payload_b64"), ("deadline_in_s", "deadline_unix_ns"), ("start_in_s", "start_unix_ns"))
    ]
    waits = {
        "anyOf": [
            {"not": {"required": ["wait_timeout_s"]}},
            {"properties": {"wait_timeout_s": {"type": "null"}}, "required": ["wait_timeout_s"]},
            {"properties": {"wait": {"const": True}}, "required": ["wait"]},
        ]
    }
    return {
        "Task": _object(
            task,
            description="A task to submit. Every field is optional; null means absent. "
            "payload and payload_b64, deadline_in_s and deadline_unix_ns, start_in_s "
            "and start_unix_ns exclude each other.",
            allOf=exclusive,
        ),
        "SubmitRequest": _object(
            submit,
            description="A task object plus wait and wait_timeout_s (which needs wait: true).",
            allOf=[*exclusive, waits],
        ),
        "BatchRequest": _object(
            {"tasks": {"type": "array", "maxItems": limits.max_tasks_per_batch, "items": _ref("Task")}},
            ("tasks",),
        ),
        "Retry": _object(
            _optional(
                {
                    "max_attempts": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": 2**32 - 1,
                        "description": "Attempts including the first; 0 keeps the default (3).",
                    },
                    "initial_backoff_s": SECONDS,
                    "multiplier": {
                        "description": "At least 1; 0 keeps the default (2).",
                        "anyOf": [{"const": 0}, {"type": "number", "minimum": 1}],
                    },
                    "max_backoff_s": {**SECONDS, "description": "0 keeps the default (60 s)."},
                    "jitter": {"type": "boolean", "default": True},
                }
            )
        ),
        "Dep": {
            "description": "A conditional dependency: exactly one of id and key, and cond.",
            "oneOf": [
                _object({"id": dep_id_in, "cond": _nullable({"type": "string", "enum": EDGE_CONDS})}, ("id",)),
                _object({"key": key_ref, "cond": _nullable({"type": "string", "enum": EDGE_CONDS})}, ("key",)),
            ],
        },
        "Submitted": _object(
            {"id": ID_OUT, "duplicate": {"type": "boolean"}, "result": _ref("Result")}, ("id", "duplicate")
        ),
        "BatchSubmitted": _object({"tasks": {"type": "array", "items": _ref("Submitted")}}, ("tasks",)),
        "Result": _object(
            {
                "id": ID_OUT,
                "status": status,
                "output_available": {"type": "boolean"},
                "output": {"description": "The output as JSON, when its bytes are a JSON document."},
                "output_b64": {"type": "string", "contentEncoding": "base64"},
                "message": {"type": "string"},
                "unavailable_shards": SHARD_NAMES,
            },
            ("id", "status", "output_available"),
        ),
        "TaskInfo": _object(
            {
                "id": ID_OUT,
                "status": status,
                "pool": {"type": "string"},
                "key": {"type": "string"},
                "kind": {"type": "string"},
                "priority": {"type": "string", "enum": PRIORITIES},
                "tenant": {"type": "string"},
                "attempt": COUNT,
                "max_attempts": COUNT,
                "output_available": {"type": "boolean"},
                "message": {"type": "string"},
                "created_unix_ns": UNIX_NS_OUT,
                "started_unix_ns": UNIX_NS_OUT,
                "finished_unix_ns": UNIX_NS_OUT,
                "unavailable_shards": SHARD_NAMES,
            },
            ("id", "status", "pool", "kind", "priority", "attempt", "max_attempts", "output_available"),
            description="Only id and status are authoritative; the rest is best effort.",
        ),
        "TaskList": _object(
            {
                "tasks": {"type": "array", "items": _ref("TaskInfo")},
                "next_after": {**ID_OUT, "description": "Pass as after for the next page; absent on the last."},
                "unavailable_shards": SHARD_NAMES,
            },
            ("tasks",),
        ),
        "Cancelled": _object({"cancelled": {"type": "boolean"}}, ("cancelled",)),
        "Snapshot": _object(
            {
                "live_tasks": COUNT,
                "running": COUNT,
                "pending": COUNT,
                "workers_connected": COUNT,
                "unavailable_shards": SHARD_NAMES,
                "pools": {"type": "array", "items": _ref("PoolSnapshot")},
                "totals": _ref("Totals"),
            },
            ("live_tasks", "running", "pending", "workers_connected", "unavailable_shards", "pools", "totals"),
        ),
        "PoolSnapshot": _object(
            {
                "name": {"type": "string"},
                **{name: COUNT for name in ("capacity", "busy", "held", "desired", "pending")},
                "pending_by_class": {
                    "type": "array",
                    "items": COUNT,
                    "minItems": 4,
                    "maxItems": 4,
                    "description": "Pending tasks per class: critical, high, normal, low.",
                },
                **{name: COUNT for name in ("reservations", "dispatched", "succeeded", "failed")},
                **{
                    name: {"type": "number"}
                    for name in (
                        "priority_adherence",
                        "fixed_start_hit_rate",
                        "utilization",
                        "schedule_efficiency",
                        "wait_p50_s",
                        "wait_p90_s",
                        "wait_p99_s",
                        "cost",
                    )
                },
                "workers_connected": COUNT,
                "groups": {
                    "type": "array",
                    "items": _object(
                        {"labels": STRING_MAP, "capacity": COUNT, "busy": COUNT}, ("labels", "capacity", "busy")
                    ),
                },
            },
            ("name", "capacity", "busy", "pending", "pending_by_class", "groups"),
        ),
        "Totals": _object(
            {field.name: COUNT for field in pb.Totals.DESCRIPTOR.fields},
            tuple(field.name for field in pb.Totals.DESCRIPTOR.fields),
        ),
        "Workers": _object(
            {
                "workers": {
                    "type": "array",
                    "items": _object(
                        {
                            "id": {**ID_OUT, "description": "Assigned per connection."},
                            "name": {"type": "string"},
                            "pool": {"type": "string"},
                            "labels": STRING_MAP,
                            "slots": COUNT,
                            "busy": COUNT,
                            "connected_unix_ns": UNIX_NS_OUT,
                        },
                        ("id", "name", "pool", "labels", "slots", "busy", "connected_unix_ns"),
                    ),
                },
                "unavailable_shards": SHARD_NAMES,
            },
            ("workers",),
        ),
        "Schedules": _object(
            {
                "schedules": {
                    "type": "array",
                    "items": _object(
                        {
                            "name": {"type": "string"},
                            "cron": {"type": "string"},
                            "tz": {"type": "string", "description": "Absent for UTC."},
                            "pool": {"type": "string"},
                            "kind": {"type": "string"},
                            "overlap": {"type": "string", "enum": OVERLAPS},
                            "next_unix_ns": UNIX_NS_OUT,
                            "last_task_id": ID_OUT,
                        },
                        ("name", "cron", "pool", "kind", "overlap"),
                    ),
                },
                "unavailable_shards": SHARD_NAMES,
            },
            ("schedules",),
        ),
        "Status": _object({"status": {"type": "string"}}, ("status",)),
        "Error": _object(
            {
                "error": {"type": "string", "description": "What went wrong, for people."},
                "code": {"type": "string", "description": "The lower-case HTTP reason phrase, e.g. not_found."},
            },
            ("error", "code"),
        ),
    }


_ERRORS = {
    "400": "Malformed JSON, an unknown field or query parameter, a bad value, a NUL character, a non-decimal "
    "id, a cycle, a key twice in one batch, ...",
    "401": "Missing, malformed or unknown credentials.",
    "403": "The credential lacks the role, names another tenant or a pool outside its scope; or, with "
    "authentication off, the Host is not a loopback name.",
    "404": "Unknown task (or outside the credential's pools), pool or dependency.",
    "409": "Reservation conflict, or a key in use outside the credential's pools.",
    "413": "The body is larger than limits.max_http_body_bytes.",
    "415": "The body is not application/json.",
    "429": "Queue full, or too many requests in flight (limits.max_concurrent_requests, or "
    "limits.max_concurrent_requests_per_caller for this credential); retry later.",
    "431": "More than limits.max_headers header fields, or a request head past limits.max_header_bytes.",
    "500": "Internal error.",
    "503": "Not the leader (standby or shutting down), or the store is unavailable; retry.",
    "504": "A wait ran out (POST /v1/tasks with wait, GET .../result), or the request's time limit "
    "(limits.request_timeout_s, plus limits.max_wait_s for those routes); the task keeps running.",
}

_V1 = "400 401 403 429 431 500 503 504"
"""What every authenticated route may answer besides 200."""


def _responses(success: Schema | None, codes: str, description: str = "OK") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if success is not None:
        out["200"] = {"description": description, "content": {"application/json": {"schema": success}}}
    for code in codes.split():
        out[code] = {"$ref": f"#/components/responses/E{code}"}
    return out


def _operation(
    operation_id: str,
    summary: str,
    responses: dict[str, Any],
    *,
    body: Schema | None = None,
    parameters: list[Schema] | None = None,
    public: bool = False,
    description: str | None = None,
) -> Schema:
    op: Schema = {"operationId": operation_id, "summary": summary, "responses": responses}
    if description is not None:
        op["description"] = description
    if body is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if parameters:
        op["parameters"] = parameters
    if public:
        op["security"] = []
    return op


_CANCEL = (
    "Cancelling is not deleting: the task ends as cancelled (a running attempt is aborted) and stays "
    "readable, with status cancelled, under the same id and key until finished tasks are pruned. "
    "cancelled is false when the task had already finished."
)
_WAIT = "Answers 504 when the wait (timeout_s, at most limits.max_wait_s) runs out first; the task keeps running."


def _paths(limits: LimitsConfig) -> dict[str, Any]:
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
        "schema": {"type": "string", "minLength": 1, "pattern": NO_NUL},
    }
    timeout = {
        "name": "timeout_s",
        "in": "query",
        "required": False,
        "description": "Seconds to wait (default and maximum limits.max_wait_s; 0 = do not wait).",
        "schema": SECONDS,
    }
    one_status = f"(?:{'|'.join(STATUSES)})"
    list_params = [
        {
            "name": "pool",
            "in": "query",
            "required": False,
            "description": "Comma-separated pools.",
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:,-]*$"},
        },
        {
            "name": "status",
            "in": "query",
            "required": False,
            "description": f"Comma-separated statuses: {', '.join(STATUSES)}.",
            "schema": {"type": "string", "pattern": f"^(?:{one_status}(?:,{one_status})*)?$"},
        },
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": f"Page size (0 = 100; at most limits.max_list = {limits.max_list}).",
            "schema": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
        },
        {
            "name": "after",
            "in": "query",
            "required": False,
            "description": "Only ids above this cursor.",
            "schema": {"type": "string", "pattern": "^[0-9]{1,20}$"},
        },
    ]
    body_errors = _V1 + " 404 409 413 415"
    task_errors = _V1 + " 404"
    paths: dict[str, Any] = {
        "/v1/tasks": {
            "post": _operation(
                "submit",
                "Submit a task (role client)",
                _responses(_ref("Submitted"), body_errors),
                body=_ref("SubmitRequest"),
                description="With wait: true the answer comes once the task finished, with its result. " + _WAIT,
            ),
            "get": _operation(
                "list_tasks",
                "List tasks in id order (role client)",
                _responses(_ref("TaskList"), task_errors),
                parameters=list_params,
            ),
        },
        "/v1/tasks:batch": {
            "post": _operation(
                "submit_batch",
                "Submit tasks atomically (role client)",
                _responses(_ref("BatchSubmitted"), body_errors),
                body=_ref("BatchRequest"),
                description="All tasks are admitted or none; keys must differ within a batch.",
            ),
        },
    }
    for prefix, param, label in (("/v1/tasks/{id}", id_param, "id"), ("/v1/tasks/by-key/{key}", key_param, "key")):
        paths[prefix] = {
            "get": _operation(
                f"get_task_by_{label}",
                f"A task by {label} (role client)",
                _responses(_ref("TaskInfo"), task_errors),
                parameters=[param],
            ),
            "delete": _operation(
                f"cancel_task_by_{label}",
                f"Cancel a task by {label} (role client)",
                _responses(_ref("Cancelled"), task_errors),
                parameters=[param],
                description=_CANCEL,
            ),
        }
        paths[f"{prefix}/result"] = {
            "get": _operation(
                f"task_result_by_{label}",
                f"Wait for a task's result by {label} (role client)",
                _responses(_ref("Result"), task_errors),
                parameters=[param, timeout],
                description=_WAIT,
            ),
        }
    for path, operation_id, summary, schema in (
        ("/v1/snapshot", "snapshot", "Scheduler snapshot (role metrics)", "Snapshot"),
        ("/v1/workers", "list_workers", "Connected workers (role metrics)", "Workers"),
        ("/v1/recurring", "list_recurring", "Recurring schedules (role metrics)", "Schedules"),
    ):
        paths[path] = {"get": _operation(operation_id, summary, _responses(_ref(schema), _V1))}
    paths["/v1/openapi.json"] = {
        "get": _operation("openapi", "This document (any credential)", _responses({"type": "object"}, _V1))
    }
    metrics = _responses(None, _V1)
    metrics["200"] = {
        "description": "Prometheus text exposition",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    paths["/metrics"] = {"get": _operation("metrics", "Prometheus metrics (role metrics)", metrics)}
    paths["/healthz"] = {
        "get": _operation("healthz", "200 while the process runs", _responses(_ref("Status"), "403 431"), public=True)
    }
    paths["/readyz"] = {
        "get": _operation(
            "readyz",
            "200 on the serving leader, 503 otherwise",
            _responses(_ref("Status"), "403 431 503"),
            public=True,
        )
    }
    return paths


operation = _operation
"""``_operation`` for the modules that add their calls to the document (``http_moves``)."""
error_responses = _responses
"""``_responses`` for the same modules."""


def document(limits: LimitsConfig | None = None, resources: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The OpenAPI document for a server with these limits (the defaults when ``None``) and these
    resources (name: the most units one task may ask for)."""
    limits = limits if limits is not None else LimitsConfig()
    error = {"application/json": {"schema": _ref("Error")}}
    responses: dict[str, Any] = {
        f"E{code}": {"description": text, "content": copy.deepcopy(error)} for code, text in _ERRORS.items()
    }
    responses["E401"]["headers"] = {"www-authenticate": {"schema": {"type": "string", "const": "Bearer"}}}
    out = {
        "openapi": "3.1.0",
        "info": {
            "title": "cronoq HTTP API",
            "version": "v1",
            "description": "JSON gateway of cronoq-server: the Tasks service (without Watch), the read-only "
            "Admin calls, metrics and health probes. Ids and *_unix_ns times are strings in "
            "answers and strings or numbers in requests; durations (*_s) are seconds.",
        },
        "security": [{"bearer": []}],
        "paths": _paths(limits),
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": _schemas(limits, resources or {}),
            "responses": responses,
        },
    }
    from .console.openapi import extend  # the console's calls: history filters, details, events, ...

    extend(out, UNIX_NS_OUT, ID_OUT, SHARD_NAMES)
    from .http_moves import extend_openapi  # pool moves

    extend_openapi(out, UNIX_NS_OUT)
    return out
