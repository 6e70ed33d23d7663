"""The generated descriptor matches the cronoq.v1 wire contract fact sheet, field by field, plus
cronoq's own additions, which only add: new messages, new fields with numbers above every
published one of their message, and an internal service.

The sheet is transcribed below in a compact form:

* ``MESSAGES``: a message name at the start of a line, then one indented line per field:
  ``<number> <name> <type> [optional|repeated] [oneof:<name>]``. ``optional`` is proto3 explicit
  presence; a ``map<K,V>`` type is a map field. Top-level messages appear in sheet order.
* ``ENUMS``: value names in number order (every enum is numbered 0..n-1).
* ``SERVICES``: ``(rpc, request, response, client_streaming, server_streaming)``.
* ``ADDED_FIELDS`` / ``ADDED_MESSAGES`` / ``ADDED_SERVICES``: the additions, in the same forms.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import descriptor_pb2

from cronoq.proto import cronoq_pb2 as pb
from cronoq.proto import cronoq_pb2_grpc as pb_grpc

PACKAGE = "cronoq.v1"

MESSAGES = """
TaskRef
  1 id uint64 oneof:target
  2 key string oneof:target
Dep
  1 target TaskRef
  2 cond EdgeCond
RetryPolicy
  1 max_attempts uint32
  2 initial_backoff_s double
  3 multiplier double
  4 max_backoff_s double
  5 jitter bool
TaskSpec
  1 payload bytes
  2 content_type string
  3 kind string
  4 pool string
  5 priority Priority
  6 key string
  7 deadline_in_s double optional
  8 deadline_unix_ns int64 optional
  9 start_in_s double optional
  10 start_unix_ns int64 optional
  11 tolerance_s double optional
  12 on_miss MissPolicy
  13 duration_hint_s double optional
  14 timeout_s double optional
  15 retry RetryPolicy
  16 deps Dep repeated
  17 resources map<string,uint32>
  18 tags map<string,string>
  19 labels map<string,string>
  20 tenant string
SubmitRequest
  1 task TaskSpec
  2 wait bool
  3 wait_timeout_s double optional
SubmitResponse
  1 id uint64
  2 duplicate bool
  3 result TaskResult
SubmitBatchRequest
  1 tasks TaskSpec repeated
SubmitBatchResponse
  1 tasks SubmitResponse repeated
CancelRequest
  1 task TaskRef
CancelResponse
  1 cancelled bool
GetRequest
  1 task TaskRef
TaskInfo
  1 id uint64
  2 status TaskStatus
  3 pool string
  4 key string
  5 kind string
  6 attempt uint32
  7 max_attempts uint32
  8 created_unix_ns int64 optional
  9 started_unix_ns int64 optional
  10 finished_unix_ns int64 optional
  11 message string
  12 output_available bool
  13 tenant string
  14 priority Priority
ListTasksRequest
  1 pools string repeated
  2 statuses TaskStatus repeated
  3 after uint64
  4 limit uint32
ListTasksResponse
  1 tasks TaskInfo repeated
  2 next_after uint64
  3 unavailable_shards string repeated
TaskResult
  1 id uint64
  2 status TaskStatus
  3 output bytes optional
  4 message string
  5 output_available bool
WaitRequest
  1 task TaskRef
  2 timeout_s double optional
WatchRequest
  1 pools string repeated
  2 ids uint64 repeated
  3 keys string repeated
  4 all_transitions bool
StatusEvent
  1 id uint64
  2 pool string
  3 key string
  4 status TaskStatus
  5 attempt uint32
  6 at_unix_ns int64
  7 message string
Register
  1 pool string
  2 slots uint32
  3 worker_name string
  4 protocol_version uint32
  5 labels map<string,string>
Heartbeat
  1 lease uint64
Complete
  1 lease uint64
  2 output bytes
  3 content_type string
Fail
  1 lease uint64
  2 message string
  3 permanent bool
  4 retry_after_s double optional
SetSlots
  1 slots uint32
Nack
  1 lease uint64
  2 reason string
Cancelled
  1 lease uint64
WorkerMessage
  1 register Register oneof:msg
  2 heartbeat Heartbeat oneof:msg
  3 complete Complete oneof:msg
  4 fail Fail oneof:msg
  5 set_slots SetSlots oneof:msg
  6 nack Nack oneof:msg
  7 cancelled Cancelled oneof:msg
Registered
  1 worker_id uint64
  2 lease_ttl_s double optional
  3 slots uint32
  4 protocol_version uint32
  5 max_message_bytes uint64
Lease
  1 lease uint64
  2 task_id uint64
  3 attempt uint32
  4 payload bytes
  5 content_type string
  6 kind string
  7 key string
  8 tags map<string,string>
  9 timeout_s double optional
  10 deadline_unix_ns int64 optional
  11 pool string
  12 priority Priority
  13 lease_ttl_s double optional
Abort
  1 lease uint64
  2 reason string
Shutdown
  1 reason string
  2 not_leader bool
ServerMessage
  1 registered Registered oneof:msg
  2 lease Lease oneof:msg
  3 abort Abort oneof:msg
  4 shutdown Shutdown oneof:msg
Empty
PoolSnapshot
  1 name string
  2 capacity uint32
  3 busy uint32
  4 held uint32
  5 desired uint32
  6 pending_by_class uint64 repeated
  7 reservations uint64
  8 dispatched uint64
  9 succeeded uint64
  10 failed uint64
  11 priority_adherence double
  12 fixed_start_hit_rate double
  13 utilization double
  14 schedule_efficiency double
  15 wait_p50_s double
  16 wait_p90_s double
  17 wait_p99_s double
  18 cost double
  19 workers_connected uint64
  20 groups WorkerGroup repeated
WorkerGroup
  1 labels map<string,string>
  2 capacity uint32
  3 busy uint32
Totals
  1 submitted uint64
  2 dispatched uint64
  3 succeeded uint64
  4 failed uint64
  5 dead_lettered uint64
  6 cancelled uint64
  7 skipped uint64
  8 missed uint64
  9 shed uint64
  10 retries uint64
  11 timeouts uint64
  12 lease_expiries uint64
  13 stale_completions uint64
SnapshotResponse
  1 pools PoolSnapshot repeated
  2 live_tasks uint64
  3 running uint64
  4 pending uint64
  5 totals Totals
  6 workers_connected uint64
  7 unavailable_shards string repeated
RecurringRequest
  1 name string
  2 cron string
  3 tz string
  4 template TaskSpec
  6 overlap Overlap
RemoveRecurringRequest
  1 name string
RemoveRecurringResponse
  1 removed bool
WorkerInfo
  1 id uint64
  2 name string
  3 pool string
  4 labels map<string,string>
  5 slots uint32
  6 busy uint32
  7 connected_unix_ns int64
ListWorkersResponse
  1 workers WorkerInfo repeated
  2 unavailable_shards string repeated
RecurringInfo
  1 name string
  2 cron string
  3 tz string
  4 pool string
  5 kind string
  6 overlap Overlap
  7 next_unix_ns int64 optional
  8 last_task_id uint64 optional
ListRecurringResponse
  1 schedules RecurringInfo repeated
  2 unavailable_shards string repeated
"""

ADDED_FIELDS = """
Register
  6 batch_bytes uint64
WorkerMessage
  8 batch WorkerBatch oneof:msg
Registered
  6 batching bool
ServerMessage
  5 batch ServerBatch oneof:msg
"""

ADDED_MESSAGES = """
WorkerBatch
  1 heartbeats Heartbeat repeated
  2 completes Complete repeated
  3 fails Fail repeated
  4 nacks Nack repeated
  5 cancelled Cancelled repeated
ServerBatch
  1 leases Lease repeated
  2 aborts Abort repeated
ForwardedCall
  1 id uint64
  2 method string
  3 request bytes
  4 authorization string
  5 timeout_s double
  6 traceparent string
  7 cancel bool
ForwardedReply
  1 id uint64
  2 code uint32
  3 message string
  4 metadata map<string,string>
  5 response bytes
ForwardRequest
  1 calls ForwardedCall repeated
ForwardResponse
  1 replies ForwardedReply repeated
"""

ADDED_SERVICES = {"Peers": [("Forward", "ForwardRequest", "ForwardResponse", True, True)]}

RESERVED = {"RecurringRequest": [(5, 5)]}

ENUMS = {
    "Priority": "PRIORITY_UNSPECIFIED PRIORITY_CRITICAL PRIORITY_HIGH PRIORITY_NORMAL PRIORITY_LOW",
    "TaskStatus": (
        "TASK_STATUS_UNSPECIFIED TASK_STATUS_BLOCKED TASK_STATUS_SCHEDULED TASK_STATUS_READY TASK_STATUS_RUNNING "
        "TASK_STATUS_RETRYING TASK_STATUS_SUCCEEDED TASK_STATUS_FAILED TASK_STATUS_DEAD_LETTERED "
        "TASK_STATUS_CANCELLED TASK_STATUS_SKIPPED TASK_STATUS_MISSED TASK_STATUS_SHED"
    ),
    "EdgeCond": "EDGE_COND_UNSPECIFIED EDGE_COND_ON_SUCCESS EDGE_COND_ON_COMPLETE EDGE_COND_ON_FAILURE",
    "MissPolicy": "MISS_POLICY_UNSPECIFIED MISS_POLICY_RUN_LATE MISS_POLICY_SKIP MISS_POLICY_FAIL",
    "Overlap": "OVERLAP_UNSPECIFIED OVERLAP_SKIP OVERLAP_ALLOW OVERLAP_QUEUE OVERLAP_QUEUE_ON_SUCCESS",
}

SERVICES = {
    "Tasks": [
        ("Submit", "SubmitRequest", "SubmitResponse", False, False),
        ("SubmitBatch", "SubmitBatchRequest", "SubmitBatchResponse", False, False),
        ("Cancel", "CancelRequest", "CancelResponse", False, False),
        ("Get", "GetRequest", "TaskInfo", False, False),
        ("ListTasks", "ListTasksRequest", "ListTasksResponse", False, False),
        ("Wait", "WaitRequest", "TaskResult", False, False),
        ("Watch", "WatchRequest", "StatusEvent", False, True),
    ],
    "Workers": [
        ("Work", "WorkerMessage", "ServerMessage", True, True),
    ],
    "Admin": [
        ("Snapshot", "Empty", "SnapshotResponse", False, False),
        ("AddRecurring", "RecurringRequest", "Empty", False, False),
        ("RemoveRecurring", "RemoveRecurringRequest", "RemoveRecurringResponse", False, False),
        ("ListWorkers", "Empty", "ListWorkersResponse", False, False),
        ("ListRecurring", "Empty", "ListRecurringResponse", False, False),
    ],
}

F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    "double": F.TYPE_DOUBLE,
    "int64": F.TYPE_INT64,
    "uint64": F.TYPE_UINT64,
    "uint32": F.TYPE_UINT32,
    "bool": F.TYPE_BOOL,
    "string": F.TYPE_STRING,
    "bytes": F.TYPE_BYTES,
}


def _parse_messages(text: str = MESSAGES) -> dict[str, list[dict[str, Any]]]:
    messages: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            current = messages.setdefault(line.strip(), [])
            continue
        assert current is not None
        number, name, type_, *flags = line.split()
        spec: dict[str, Any] = {"number": int(number), "name": name, "type": type_, "label": "singular"}
        for flag in flags:
            if flag.startswith("oneof:"):
                spec["oneof"] = flag.removeprefix("oneof:")
            else:
                spec["label"] = flag
        if type_.startswith("map<"):
            spec["label"] = "map"
        current.append(spec)
    return messages


SHEET = _parse_messages()
"""The published messages."""
ADDED = _parse_messages(ADDED_FIELDS)
NEW = _parse_messages(ADDED_MESSAGES)
EXPECTED = {**{name: fields + ADDED.get(name, []) for name, fields in SHEET.items()}, **NEW}
"""Every message of the generated descriptor: the published ones with their added fields, then the new ones."""
ALL_SERVICES = {**SERVICES, **ADDED_SERVICES}


@pytest.fixture(scope="module")
def fdp() -> descriptor_pb2.FileDescriptorProto:
    """The descriptor embedded in the generated module, exactly as protoc serialized it."""
    return descriptor_pb2.FileDescriptorProto.FromString(pb.DESCRIPTOR.serialized_pb)


def _messages(fdp: descriptor_pb2.FileDescriptorProto) -> dict[str, descriptor_pb2.DescriptorProto]:
    return {m.name: m for m in fdp.message_type}


def test_file_level_facts(fdp: descriptor_pb2.FileDescriptorProto) -> None:
    assert fdp.name == "cronoq/v1/cronoq.proto"
    assert pb.DESCRIPTOR.name == "cronoq/v1/cronoq.proto"
    assert fdp.package == PACKAGE
    assert fdp.syntax == "proto3"
    assert list(fdp.dependency) == []
    assert not fdp.HasField("options")
    assert not fdp.HasField("source_code_info")
    # The message module registers under the published module name.
    assert pb.TaskSpec.__module__ == "cronoq.v1.cronoq_pb2"


def test_counts(fdp: descriptor_pb2.FileDescriptorProto) -> None:
    # The published contract: 3 services, 13 RPCs, 43 messages (+7 map entries), 198 fields.
    assert len(SHEET) == 43
    assert sum(len(fields) for fields in SHEET.values()) == 198
    assert sum(len(methods) for methods in SERVICES.values()) == 13
    # The descriptor: that plus the additions (one more map entry: ForwardedReply.metadata).
    assert len(fdp.service) == 3 + len(ADDED_SERVICES)
    assert sum(len(s.method) for s in fdp.service) == 13 + sum(len(m) for m in ADDED_SERVICES.values())
    assert len(fdp.message_type) == 43 + len(NEW)
    assert sum(len(m.nested_type) for m in fdp.message_type) == 7 + 1
    added = sum(len(fields) for fields in ADDED.values()) + sum(len(fields) for fields in NEW.values())
    assert sum(len(m.field) for m in fdp.message_type) == 198 + added
    assert len(fdp.enum_type) == 5
    assert sum(len(e.value) for e in fdp.enum_type) == 31


def test_message_names_in_sheet_order(fdp: descriptor_pb2.FileDescriptorProto) -> None:
    names = [m.name for m in fdp.message_type]
    assert [name for name in names if name in SHEET] == list(SHEET)
    assert set(names) == set(EXPECTED)


def test_additions_only_add() -> None:
    """Added fields take numbers above every published field of their message, and no addition
    reuses a published name."""
    for name, fields in ADDED.items():
        published = SHEET[name]
        assert min(f["number"] for f in fields) > max(f["number"] for f in published), name
        assert not {f["name"] for f in fields} & {f["name"] for f in published}, name
    assert not set(NEW) & set(SHEET)
    assert not set(ADDED_SERVICES) & set(SERVICES)


def _entry_name(field_name: str) -> str:
    return "".join(part.capitalize() for part in field_name.split("_")) + "Entry"


def _check_type(message: descriptor_pb2.DescriptorProto, f: descriptor_pb2.FieldDescriptorProto, type_: str) -> None:
    where = f"{message.name}.{f.name}"
    if type_ in SCALARS:
        assert f.type == SCALARS[type_], where
        assert not f.type_name, where
    elif type_ in ENUMS:
        assert f.type == F.TYPE_ENUM, where
        assert f.type_name == f".{PACKAGE}.{type_}", where
    else:
        assert type_ in EXPECTED, f"{where}: sheet type {type_} is not a message"
        assert f.type == F.TYPE_MESSAGE, where
        assert f.type_name == f".{PACKAGE}.{type_}", where


@pytest.mark.parametrize("name", list(EXPECTED))
def test_message_fields(fdp: descriptor_pb2.FileDescriptorProto, name: str) -> None:
    message = _messages(fdp)[name]
    expected = EXPECTED[name]
    assert [(f.number, f.name) for f in message.field] == [(e["number"], e["name"]) for e in expected]
    assert not message.HasField("options")
    assert [(r.start, r.end - 1) for r in message.reserved_range] == RESERVED.get(name, [])
    assert list(message.reserved_name) == []
    assert list(message.enum_type) == []
    assert list(message.extension) == []
    entries = {n.name: n for n in message.nested_type}
    used_entries = set()
    real_oneofs = set()
    for f, e in zip(message.field, expected, strict=True):
        where = f"{name}.{f.name}"
        assert not f.HasField("options"), where
        assert not f.HasField("json_name"), where
        assert not f.HasField("default_value"), where
        label = e["label"]
        if label == "map":
            key_type, value_type = e["type"].removeprefix("map<").removesuffix(">").split(",")
            entry_name = _entry_name(f.name)
            assert f.label == F.LABEL_REPEATED, where
            assert f.type == F.TYPE_MESSAGE, where
            assert f.type_name == f".{PACKAGE}.{name}.{entry_name}", where
            entry = entries[entry_name]
            used_entries.add(entry_name)
            assert entry.options.map_entry is True, where
            assert entry.options.ListFields() == [(entry.options.DESCRIPTOR.fields_by_name["map_entry"], True)]
            key, value = entry.field
            assert (key.number, key.name, key.type) == (1, "key", SCALARS[key_type]), where
            assert (value.number, value.name, value.type) == (2, "value", SCALARS[value_type]), where
            assert not f.proto3_optional and not f.HasField("oneof_index"), where
            continue
        _check_type(message, f, e["type"])
        if label == "repeated":
            assert f.label == F.LABEL_REPEATED, where
        else:
            assert f.label == F.LABEL_OPTIONAL, where  # proto3 singular fields carry LABEL_OPTIONAL
        if label == "optional":
            assert f.proto3_optional, where
            assert f.HasField("oneof_index"), where
            assert message.oneof_decl[f.oneof_index].name == f"_{f.name}", where
        else:
            assert not f.proto3_optional, where
        if "oneof" in e:
            assert f.HasField("oneof_index"), where
            assert message.oneof_decl[f.oneof_index].name == e["oneof"], where
            real_oneofs.add(e["oneof"])
        elif label != "optional":
            assert not f.HasField("oneof_index"), where
    assert used_entries == set(entries), f"{name}: unexpected nested types {set(entries) - used_entries}"
    synthetic = {f"_{e['name']}" for e in expected if e["label"] == "optional"}
    assert {o.name for o in message.oneof_decl} == real_oneofs | synthetic
    for o in message.oneof_decl:
        assert not o.HasField("options")


def test_real_oneofs_are_the_three_of_the_sheet() -> None:
    real = set()
    for message in pb.DESCRIPTOR.message_types_by_name.values():
        for oneof in message.oneofs:
            if not oneof.name.startswith("_"):
                real.add(f"{message.name}.{oneof.name}")
    assert real == {"TaskRef.target", "WorkerMessage.msg", "ServerMessage.msg"}


@pytest.mark.parametrize("name", list(ENUMS))
def test_enum_values(fdp: descriptor_pb2.FileDescriptorProto, name: str) -> None:
    enums = {e.name: e for e in fdp.enum_type}
    enum = enums[name]
    assert [(v.number, v.name) for v in enum.value] == list(enumerate(ENUMS[name].split()))
    assert not enum.HasField("options")
    for v in enum.value:
        assert not v.HasField("options")


def test_enum_set(fdp: descriptor_pb2.FileDescriptorProto) -> None:
    assert {e.name for e in fdp.enum_type} == set(ENUMS)
    assert sum(len(v.split()) for v in ENUMS.values()) == 31


@pytest.mark.parametrize("service", list(ALL_SERVICES))
def test_service_methods(fdp: descriptor_pb2.FileDescriptorProto, service: str) -> None:
    services = {s.name: s for s in fdp.service}
    s = services[service]
    assert not s.HasField("options")
    got = [
        (
            m.name,
            m.input_type.removeprefix(f".{PACKAGE}."),
            m.output_type.removeprefix(f".{PACKAGE}."),
            m.client_streaming,
            m.server_streaming,
        )
        for m in s.method
    ]
    assert got == ALL_SERVICES[service]
    for m in s.method:
        assert not m.HasField("options")


def test_service_order(fdp: descriptor_pb2.FileDescriptorProto) -> None:
    assert [s.name for s in fdp.service] == ["Tasks", "Workers", "Admin", *ADDED_SERVICES]


class _RecordingChannel:
    """Stands in for a grpc.Channel to see which method paths and call kinds the stubs use."""

    def __init__(self) -> None:
        self.calls: dict[str, str] = {}

    def _record(self, kind: str) -> Any:
        def make(path: str, **_: Any) -> str:
            self.calls[path] = kind
            return path

        return make

    def __getattr__(self, kind: str) -> Any:
        if kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            return self._record(kind)
        raise AttributeError(kind)


def test_stub_method_paths_and_kinds() -> None:
    channel = _RecordingChannel()
    pb_grpc.TasksStub(channel)
    pb_grpc.WorkersStub(channel)
    pb_grpc.AdminStub(channel)
    pb_grpc.PeersStub(channel)
    expected = {}
    for service, methods in ALL_SERVICES.items():
        for name, _req, _resp, client_stream, server_stream in methods:
            kind = f"{'stream' if client_stream else 'unary'}_{'stream' if server_stream else 'unary'}"
            expected[f"/{PACKAGE}.{service}/{name}"] = kind
    assert channel.calls == expected


def test_servicer_bases_exist() -> None:
    for service, methods in ALL_SERVICES.items():
        servicer = getattr(pb_grpc, f"{service}Servicer")
        adder = getattr(pb_grpc, f"add_{service}Servicer_to_server")
        assert callable(adder)
        for name, *_ in methods:
            assert callable(getattr(servicer, name))


def test_presence_semantics_round_trip() -> None:
    """Explicit-presence fields distinguish unset from zero on the wire."""
    result = pb.TaskResult(id=1, status=pb.TASK_STATUS_SUCCEEDED)
    assert not result.HasField("output")
    result.output = b""
    again = pb.TaskResult.FromString(result.SerializeToString())
    assert again.HasField("output") and again.output == b""
    ref = pb.TaskRef(key="k")
    assert ref.WhichOneof("target") == "key"
    ref.id = 7
    assert ref.WhichOneof("target") == "id"
