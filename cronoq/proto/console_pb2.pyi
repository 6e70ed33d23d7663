from . import cronoq_pb2 as _cronoq_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SearchTasksRequest(_message.Message):
    __slots__ = ("list", "kinds", "tenants", "key_prefix", "created_from_unix_ns", "created_to_unix_ns", "newest_first")
    LIST_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    KEY_PREFIX_FIELD_NUMBER: _ClassVar[int]
    CREATED_FROM_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    CREATED_TO_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    list: _cronoq_pb2.ListTasksRequest
    kinds: _containers.RepeatedScalarFieldContainer[str]
    tenants: _containers.RepeatedScalarFieldContainer[str]
    key_prefix: str
    created_from_unix_ns: int
    created_to_unix_ns: int
    newest_first: bool
    def __init__(self, list: _Optional[_Union[_cronoq_pb2.ListTasksRequest, _Mapping]] = ..., kinds: _Optional[_Iterable[str]] = ..., tenants: _Optional[_Iterable[str]] = ..., key_prefix: _Optional[str] = ..., created_from_unix_ns: _Optional[int] = ..., created_to_unix_ns: _Optional[int] = ..., newest_first: _Optional[bool] = ...) -> None: ...

class Transition(_message.Message):
    __slots__ = ("status", "attempt", "at_unix_ns", "message", "retry_unix_ns")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    status: _cronoq_pb2.TaskStatus
    attempt: int
    at_unix_ns: int
    message: str
    retry_unix_ns: int
    def __init__(self, status: _Optional[_Union[_cronoq_pb2.TaskStatus, str]] = ..., attempt: _Optional[int] = ..., at_unix_ns: _Optional[int] = ..., message: _Optional[str] = ..., retry_unix_ns: _Optional[int] = ...) -> None: ...

class TaskDetail(_message.Message):
    __slots__ = ("info", "spec", "transitions", "payload_preview", "payload_bytes", "output_preview", "output_bytes", "output_content_type")
    INFO_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_PREVIEW_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_PREVIEW_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    info: _cronoq_pb2.TaskInfo
    spec: _cronoq_pb2.TaskSpec
    transitions: _containers.RepeatedCompositeFieldContainer[Transition]
    payload_preview: bytes
    payload_bytes: int
    output_preview: bytes
    output_bytes: int
    output_content_type: str
    def __init__(self, info: _Optional[_Union[_cronoq_pb2.TaskInfo, _Mapping]] = ..., spec: _Optional[_Union[_cronoq_pb2.TaskSpec, _Mapping]] = ..., transitions: _Optional[_Iterable[_Union[Transition, _Mapping]]] = ..., payload_preview: _Optional[bytes] = ..., payload_bytes: _Optional[int] = ..., output_preview: _Optional[bytes] = ..., output_bytes: _Optional[int] = ..., output_content_type: _Optional[str] = ...) -> None: ...

class ShardInfo(_message.Message):
    __slots__ = ("name", "number", "pools", "endpoint", "leader", "host", "pid", "epoch", "leading_since_unix_ns", "version", "store", "replicas", "topology_version", "placements", "topology_differences")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADING_SINCE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    TOPOLOGY_DIFFERENCES_FIELD_NUMBER: _ClassVar[int]
    name: str
    number: int
    pools: _containers.RepeatedScalarFieldContainer[str]
    endpoint: str
    leader: str
    host: str
    pid: int
    epoch: int
    leading_since_unix_ns: int
    version: str
    store: str
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    topology_version: int
    placements: _containers.RepeatedCompositeFieldContainer[PoolPlacement]
    topology_differences: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., number: _Optional[int] = ..., pools: _Optional[_Iterable[str]] = ..., endpoint: _Optional[str] = ..., leader: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., epoch: _Optional[int] = ..., leading_since_unix_ns: _Optional[int] = ..., version: _Optional[str] = ..., store: _Optional[str] = ..., replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., topology_version: _Optional[int] = ..., placements: _Optional[_Iterable[_Union[PoolPlacement, _Mapping]]] = ..., topology_differences: _Optional[_Iterable[str]] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("endpoint", "state", "host", "pid", "version", "error")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    state: str
    host: str
    pid: int
    version: str
    error: str
    def __init__(self, endpoint: _Optional[str] = ..., state: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., version: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class PoolPlacement(_message.Message):
    __slots__ = ("pool", "shard", "version")
    POOL_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    pool: str
    shard: str
    version: int
    def __init__(self, pool: _Optional[str] = ..., shard: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ListShardsResponse(_message.Message):
    __slots__ = ("shards", "unavailable_shards")
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    shards: _containers.RepeatedCompositeFieldContainer[ShardInfo]
    unavailable_shards: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, shards: _Optional[_Iterable[_Union[ShardInfo, _Mapping]]] = ..., unavailable_shards: _Optional[_Iterable[str]] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("info", "paused", "key", "next_runs_unix_ns")
    INFO_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    NEXT_RUNS_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    info: _cronoq_pb2.RecurringInfo
    paused: bool
    key: str
    next_runs_unix_ns: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, info: _Optional[_Union[_cronoq_pb2.RecurringInfo, _Mapping]] = ..., paused: _Optional[bool] = ..., key: _Optional[str] = ..., next_runs_unix_ns: _Optional[_Iterable[int]] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules", "unavailable_shards")
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    unavailable_shards: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., unavailable_shards: _Optional[_Iterable[str]] = ...) -> None: ...

class ScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ScheduleResponse(_message.Message):
    __slots__ = ("found",)
    FOUND_FIELD_NUMBER: _ClassVar[int]
    found: bool
    def __init__(self, found: _Optional[bool] = ...) -> None: ...

class MovePoolRequest(_message.Message):
    __slots__ = ("pool", "to")
    POOL_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    pool: str
    to: str
    def __init__(self, pool: _Optional[str] = ..., to: _Optional[str] = ...) -> None: ...

class MoveRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class MoveStatus(_message.Message):
    __slots__ = ("pool", "shard", "placement_version", "move_id", "target", "version", "phase", "message", "updated_unix_ns")
    POOL_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MOVE_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    shard: str
    placement_version: int
    move_id: str
    target: str
    version: int
    phase: str
    message: str
    updated_unix_ns: int
    def __init__(self, pool: _Optional[str] = ..., shard: _Optional[str] = ..., placement_version: _Optional[int] = ..., move_id: _Optional[str] = ..., target: _Optional[str] = ..., version: _Optional[int] = ..., phase: _Optional[str] = ..., message: _Optional[str] = ..., updated_unix_ns: _Optional[int] = ...) -> None: ...
