"""``cronoq.client.task()``: every option against the client-side value-encoding table."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

import cronoq
from cronoq.client import task
from cronoq.proto import cronoq_pb2 as pb

UTC = dt.UTC


# (payload, expected bytes, expected default content type)
PAYLOADS: list[tuple[Any, bytes, str]] = [
    (b"\x00\x01", b"\x00\x01", "application/octet-stream"),
    (bytearray(b"ab"), b"ab", "application/octet-stream"),
    (memoryview(b"mv"), b"mv", "application/octet-stream"),
    ("héllo", "héllo".encode(), "text/plain; charset=utf-8"),
    ("", b"", "text/plain; charset=utf-8"),
    (None, b"", ""),
    ({"a": [1, 2]}, json.dumps({"a": [1, 2]}).encode(), "application/json"),
    ([1, "x"], json.dumps([1, "x"]).encode(), "application/json"),
    (42, b"42", "application/json"),
    (1.5, b"1.5", "application/json"),
    (True, b"true", "application/json"),
]


@pytest.mark.parametrize(("payload", "data", "ctype"), PAYLOADS)
def test_payload_encoding(payload: Any, data: bytes, ctype: str) -> None:
    spec = task(payload)
    assert spec.payload == data
    assert spec.content_type == ctype


def test_content_type_override() -> None:
    assert task({"x": 1}, content_type="application/vnd.x").content_type == "application/vnd.x"
    assert task(b"raw", content_type="").content_type == ""


def test_defaults_leave_everything_unset() -> None:
    spec = task()
    assert spec.priority == pb.PRIORITY_NORMAL
    assert spec.pool == spec.kind == spec.key == spec.tenant == ""
    for name in (
        "deadline_in_s",
        "deadline_unix_ns",
        "start_in_s",
        "start_unix_ns",
        "tolerance_s",
        "duration_hint_s",
        "timeout_s",
        "retry",
    ):
        assert not spec.HasField(name), name
    assert spec.on_miss == pb.MISS_POLICY_UNSPECIFIED
    assert list(spec.deps) == []
    assert dict(spec.resources) == dict(spec.tags) == dict(spec.labels) == {}


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (None, pb.PRIORITY_NORMAL),
        ("critical", pb.PRIORITY_CRITICAL),
        ("HIGH", pb.PRIORITY_HIGH),
        ("Normal", pb.PRIORITY_NORMAL),
        ("low", pb.PRIORITY_LOW),
        (0, pb.PRIORITY_CRITICAL),
        (1, pb.PRIORITY_HIGH),
        (2, pb.PRIORITY_NORMAL),
        (3, pb.PRIORITY_LOW),
    ],
)
def test_priority(value: Any, wire: int) -> None:
    assert task(priority=value).priority == wire


def test_priority_native_enum() -> None:
    for index, member in enumerate(
        [cronoq.Priority.CRITICAL, cronoq.Priority.HIGH, cronoq.Priority.NORMAL, cronoq.Priority.LOW]
    ):
        assert task(priority=member).priority == index + 1


@pytest.mark.parametrize("bad", ["urgent", "", 4, -1, True, 1.5, object()])
def test_priority_unknown(bad: Any) -> None:
    with pytest.raises(ValueError):
        task(priority=bad)


def test_strings_and_tenant() -> None:
    spec = task(pool="gpu", kind="infer", key="job-1", tenant="acme")
    assert (spec.pool, spec.kind, spec.key, spec.tenant) == ("gpu", "infer", "job-1", "acme")


def test_relative_times_and_durations_set_presence() -> None:
    spec = task(deadline_in=30, start_in=0, tolerance=2.5, duration_hint=0.25, timeout=10)
    assert spec.HasField("deadline_in_s") and spec.deadline_in_s == 30.0
    assert spec.HasField("start_in_s") and spec.start_in_s == 0.0
    assert spec.tolerance_s == 2.5
    assert spec.duration_hint_s == 0.25
    assert spec.timeout_s == 10.0
    assert not spec.HasField("deadline_unix_ns")
    assert not spec.HasField("start_unix_ns")


def test_absolute_times_from_seconds_and_datetimes() -> None:
    spec = task(deadline_at=1_700_000_000.5, start_at=dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC))
    assert spec.deadline_unix_ns == int(1_700_000_000.5 * 1e9)
    expected = int(dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp()) * 1_000_000_000 + 678_901_000
    assert spec.start_unix_ns == expected
    other_zone = dt.datetime(2024, 1, 2, 5, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert task(start_at=other_zone).start_unix_ns == expected
    assert not spec.HasField("deadline_in_s")


def test_naive_datetime_rejected() -> None:
    with pytest.raises(ValueError):
        task(deadline_at=dt.datetime(2024, 1, 1))


@pytest.mark.parametrize(
    "opts",
    [
        {"deadline_in": 1, "deadline_at": 2},
        {"start_in": 1, "start_at": 2},
    ],
)
def test_relative_and_absolute_conflict(opts: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        task(**opts)


@pytest.mark.parametrize("bad", ["10", True, None.__class__])
def test_durations_must_be_numbers(bad: Any) -> None:
    with pytest.raises(TypeError):
        task(timeout=bad)


def test_non_finite_duration_rejected() -> None:
    with pytest.raises(ValueError):
        task(deadline_in=float("inf"))


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        ("run_late", pb.MISS_POLICY_RUN_LATE),
        ("skip", pb.MISS_POLICY_SKIP),
        ("FAIL", pb.MISS_POLICY_FAIL),
    ],
)
def test_on_miss(value: str, wire: int) -> None:
    assert task(on_miss=value).on_miss == wire


def test_on_miss_unknown() -> None:
    with pytest.raises(ValueError):
        task(on_miss="later")


def test_retry_from_native_policy() -> None:
    spec = task(
        retry=cronoq.RetryPolicy(max_attempts=5, initial_backoff=0.5, multiplier=3.0, max_backoff=9.0, jitter=False)
    )
    assert spec.HasField("retry")
    r = spec.retry
    assert (r.max_attempts, r.initial_backoff_s, r.multiplier, r.max_backoff_s, r.jitter) == (5, 0.5, 3.0, 9.0, False)


def test_retry_from_mapping_with_defaults() -> None:
    r = task(retry={"initial_backoff": 2}).retry
    assert (r.max_attempts, r.initial_backoff_s, r.multiplier, r.max_backoff_s, r.jitter) == (3, 2.0, 0.0, 0.0, True)


def test_retry_from_bare_object_with_defaults() -> None:
    class Policy:
        max_attempts = 7

    r = task(retry=Policy()).retry
    assert (r.max_attempts, r.initial_backoff_s, r.multiplier, r.max_backoff_s, r.jitter) == (7, 0.0, 0.0, 0.0, True)


def _deps(spec: pb.TaskSpec) -> list[tuple[str, Any, int]]:
    out = []
    for d in spec.deps:
        which = d.target.WhichOneof("target")
        out.append((which, getattr(d.target, which), d.cond))
    return out


def test_after_single_and_many() -> None:
    assert _deps(task(after=5)) == [("id", 5, pb.EDGE_COND_ON_SUCCESS)]
    assert _deps(task(after="parent")) == [("key", "parent", pb.EDGE_COND_ON_SUCCESS)]
    assert _deps(task(after=[1, "k", 2])) == [
        ("id", 1, pb.EDGE_COND_ON_SUCCESS),
        ("key", "k", pb.EDGE_COND_ON_SUCCESS),
        ("id", 2, pb.EDGE_COND_ON_SUCCESS),
    ]


@pytest.mark.parametrize(
    ("cond", "wire"),
    [
        ("success", pb.EDGE_COND_ON_SUCCESS),
        ("on_success", pb.EDGE_COND_ON_SUCCESS),
        ("complete", pb.EDGE_COND_ON_COMPLETE),
        ("on_complete", pb.EDGE_COND_ON_COMPLETE),
        ("failure", pb.EDGE_COND_ON_FAILURE),
        ("ON_FAILURE", pb.EDGE_COND_ON_FAILURE),
    ],
)
def test_dep_conditions(cond: str, wire: int) -> None:
    assert _deps(task(deps=[(9, cond)])) == [("id", 9, wire)]
    assert _deps(task(deps=[{"ref": "k", "cond": cond}])) == [("key", "k", wire)]


def test_dep_mapping_default_cond_and_order_after_first() -> None:
    spec = task(after=1, deps=[{"ref": 2}, ("three", "failure")])
    assert _deps(spec) == [
        ("id", 1, pb.EDGE_COND_ON_SUCCESS),
        ("id", 2, pb.EDGE_COND_ON_SUCCESS),
        ("key", "three", pb.EDGE_COND_ON_FAILURE),
    ]


def test_dep_unknown_condition() -> None:
    with pytest.raises(ValueError):
        task(deps=[(1, "eventually")])


@pytest.mark.parametrize("bad_ref", [True, 1.5, b"key", None])
def test_bad_task_refs(bad_ref: Any) -> None:
    with pytest.raises(TypeError):
        task(after=[bad_ref])
    with pytest.raises(TypeError):
        task(deps=[(bad_ref, "success")])


def test_bool_after_rejected() -> None:
    with pytest.raises(TypeError):
        task(after=True)


def test_maps_are_coerced() -> None:
    spec = task(resources={"gpu": 2}, tags={"n": 1, "flag": True}, labels={"zone": "eu", "rank": 3})
    assert dict(spec.resources) == {"gpu": 2}
    assert dict(spec.tags) == {"n": "1", "flag": "True"}
    assert dict(spec.labels) == {"zone": "eu", "rank": "3"}


def test_spec_serialises() -> None:
    spec = task(
        {"k": "v"},
        pool="p",
        priority="high",
        key="a",
        deadline_in=5,
        after=[1],
        resources={"r": 1},
        tags={"t": "1"},
        labels={"l": "x"},
        tenant="t",
        retry={"max_attempts": 2},
    )
    assert pb.TaskSpec.FromString(spec.SerializeToString()) == spec
