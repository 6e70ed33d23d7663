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
    __slots__ = ("info", "spec", "transitions", "payload_preview", "payload_bytes")
    INFO_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    TRANSITIONS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_PREVIEW_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    info: _cronoq_pb2.TaskInfo
    spec: _cronoq_pb2.TaskSpec
    transitions: _containers.RepeatedCompositeFieldContainer[Transition]
    payload_preview: bytes
    payload_bytes: int
    def __init__(self, info: _Optional[_Union[_cronoq_pb2.TaskInfo, _Mapping]] = ..., spec: _Optional[_Union[_cronoq_pb2.TaskSpec, _Mapping]] = ..., transitions: _Optional[_Iterable[_Union[Transition, _Mapping]]] = ..., payload_preview: _Optional[bytes] = ..., payload_bytes: _Optional[int] = ...) -> None: ...
