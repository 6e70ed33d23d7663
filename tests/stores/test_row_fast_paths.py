"""The shortcuts of the row encoding give exactly what the general paths give.

The codecs answer common scalars without the JSON encoder/parser, folding writes the spec text of
plain specs from a table, recovery recognises those texts without parsing them, and decodes the
rows of plain specs in bulk (``Recovery.add_rows``). Each shortcut is checked here against the
general path it stands in for.
"""

from __future__ import annotations

import copy
import enum
import json
import pickle
from typing import Any

import pytest
from cronoq.engine.actions import PutTask, SetStatus, TaskRecord
from cronoq.engine.types import Dep, Priority, RetryPolicy, TaskSpec, TaskStatus
from cronoq.stores import BytesOrJsonCodec, JsonCodec
from cronoq.stores import _row_decode as D
from cronoq.stores import _rows as R
from cronoq.stores.base import json_bytes, json_value
from hypothesis import given, settings
from hypothesis import strategies as st

T0 = 1_700_000_000_000_000_000


class Colour(enum.IntEnum):
    RED = 1


VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    7,
    -12,
    2**63,
    10**30,
    Colour.RED,
    1.5,
    float("nan"),
    float("inf"),
    "",
    'grüße "quoted" \\ \n \u2028 \x01',
    [1, None, "x"],
    {"a": [1, 2.5, None, True], "b": {"c": "d"}},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_json_bytes_is_json_dumps(value: Any) -> None:
    expected = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    assert json_bytes(value) == expected
    assert JsonCodec().encode(value) == expected
    assert BytesOrJsonCodec().encode(value) == expected


def test_json_bytes_refuses_what_json_refuses() -> None:
    with pytest.raises(TypeError):
        json_bytes(object())
    with pytest.raises(TypeError):
        JsonCodec().encode({1, 2})


@pytest.mark.parametrize(
    "data",
    [b"0", b"7", b"123456789012345678", b"1234567890123456789", b"00", b"01", b"-0", b"-5", b" 1", b"1 ",
     b"1.0", b"1e3", b"null", b"nul", b"nullx", b'"x"', b"[]", b"", b"\xff\xfe not json"],
    ids=repr,
)  # fmt: skip
def test_json_value_is_json_loads(data: bytes) -> None:
    def outcome(fn: Any) -> tuple[str, Any]:
        try:
            value = fn(data)
        except Exception as exc:  # the same kind of failure is what matters
            return "error", type(exc).__name__
        return type(value).__name__, value

    assert outcome(json_value) == outcome(json.loads)
    assert outcome(JsonCodec().decode) == outcome(json.loads)


@pytest.mark.parametrize("status", list(TaskStatus), ids=lambda s: s.value)
@pytest.mark.parametrize("spec_pool", [None, "default", "other"])
def test_plain_spec_text_is_the_general_text(status: TaskStatus, spec_pool: str | None) -> None:
    record = TaskRecord(1, "default", TaskSpec(payload=1, pool=spec_pool), T0, status, 3)
    row = R.fold([PutTask(record)], JsonCodec()).tasks[0]
    general = json.dumps(
        {"status": status.value, **R._spec_fields(record.spec, "default")},
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    )
    assert row[R.T_SPEC] == general


def read_row(full_row: list[Any]) -> list[Any]:
    return [*full_row[: R.T_OUTPUT_FULL], full_row[R.T_HAS_OUTPUT_FULL]]


SPECS = [
    TaskSpec(payload=5),
    TaskSpec(payload=None, pool="default", key="k", tenant="t", priority=Priority.HIGH),
    TaskSpec(payload={"x": [1, 2]}, pool="other", kind="etl"),
    TaskSpec(
        payload="p",
        retry=RetryPolicy(max_attempts=4, initial_backoff=1, multiplier=2.0, max_backoff=9, jitter=True),
        deps=(Dep(3), Dep("parent")),
        tags={"a": "b"},
    ),
]


@pytest.mark.parametrize("spec", SPECS, ids=range(len(SPECS)))
def test_decoding_with_and_without_the_shortcut_agree(spec: TaskSpec) -> None:
    codec = JsonCodec()
    record = TaskRecord(9, "default", spec, T0, TaskStatus.READY, 3)
    batch = R.fold([PutTask(record), SetStatus(9, TaskStatus.RUNNING, 1, T0 + 1)], codec)
    row = read_row(batch.tasks[0])
    fast = D.decode_task(row, codec)
    # The same spec written with spaces is not one of the known texts: it takes the parser.
    slow_row = list(row)
    slow_row[R.T_SPEC] = json.dumps(json.loads(row[R.T_SPEC]), separators=(", ", ": "))
    assert slow_row[R.T_SPEC] != row[R.T_SPEC]
    slow = D.decode_task(slow_row, codec)
    assert fast == slow
    assert fast.record == record
    assert (fast.status, fast.attempt, fast.started_at) == (TaskStatus.RUNNING, 1, T0 + 1)


def test_checked_names_are_still_refused_when_bad() -> None:
    assert R.check_text("pool-a", "pool name") == "pool-a"
    assert R.check_text("pool-a", "pool name") == "pool-a"  # now remembered
    with pytest.raises(ValueError, match="NUL"):
        R.check_text("po\0ol", "pool name")
    with pytest.raises(ValueError, match="Unicode"):
        R.check_text("lone \ud800", "pool name")
    with pytest.raises(ValueError, match="string"):
        R.check_text(5, "pool name")
    with pytest.raises(ValueError, match="string"):
        R.check_text(["list"], "pool name")


# Column values a damaged row might hold instead of the right ones (wrong types, bad payloads).
DAMAGE: list[Any] = [None, "text", 5, -1, True, 2.5, b"\xff not json", b"\x00raw", ["list"], {"status": "ready"}]


@st.composite
def read_rows(draw: st.DrawFn) -> list[list[Any]]:
    """Rows as recovery reads them: mostly plain, some with a full spec, some damaged."""
    codec = BytesOrJsonCodec()
    rows: list[list[Any]] = []
    for task_id in draw(st.lists(st.integers(1, 60), max_size=25)):
        spec = draw(st.sampled_from(SPECS))
        status = draw(st.sampled_from(list(TaskStatus)))
        record = TaskRecord(task_id, draw(st.sampled_from(["default", "other"])), spec, T0, status, 3)
        row = read_row(R.fold([PutTask(record)], codec).tasks[0])
        row[R.T_ID] = draw(st.sampled_from([task_id, R.to_db_id(2**64 - task_id)]))
        if draw(st.booleans()):
            later = draw(st.sampled_from(list(TaskStatus)))
            row[R.T_STATUS], row[R.T_ATTEMPT], row[R.T_STARTED] = later.value, 1, T0 + 1
            row[R.T_MESSAGE] = draw(st.sampled_from([None, "m"]))
        for _ in range(draw(st.integers(0, 2))):  # any column but the id (a non-null bigint key)
            row[draw(st.integers(R.T_ID + 1, len(row) - 1))] = draw(st.sampled_from(DAMAGE))
        rows.append(row)
    return rows


@settings(max_examples=300, deadline=None)
@given(read_rows())
def test_bulk_decoding_is_adding_each_row(rows: list[list[Any]]) -> None:
    codec = BytesOrJsonCodec()
    one_by_one, bulk = D.Recovery(codec, T0), D.Recovery(codec, T0)
    for row in rows:
        one_by_one.add(row)
    bulk.add_rows(rows)
    assert bulk.tasks == one_by_one.tasks
    assert list(bulk.tasks) == list(one_by_one.tasks)
    assert bulk.keys == one_by_one.keys
    assert bulk.quarantined == one_by_one.quarantined
    assert bulk.missing_parents() == one_by_one.missing_parents()
    assert bulk.ordered() == one_by_one.ordered() == sorted(bulk.tasks.values(), key=lambda t: t.record.id)


def test_the_shared_maps_of_recovered_specs_refuse_changes_but_read_like_dicts() -> None:
    codec = BytesOrJsonCodec()
    record = TaskRecord(9, "default", SPECS[3], T0, TaskStatus.READY, 3)
    rows = [read_row(R.fold([PutTask(record)], codec).tasks[0]) for _ in range(2)]
    rows[1][R.T_ID] = 10
    rec = D.Recovery(codec, T0)
    rec.add_rows(rows)
    first, second = (rec.tasks[i].record.spec for i in (9, 10))
    assert first.tags is second.tags  # one spec text, one map
    assert first.tags == {"a": "b"} and json.dumps(first.tags) == '{"a": "b"}'
    assert copy.deepcopy(first.tags) == pickle.loads(pickle.dumps(first.tags)) == {"a": "b"}
    for change in (
        lambda m: m.__setitem__("x", "y"),
        lambda m: m.update(x="y"),
        lambda m: m.pop("a"),
        lambda m: m.clear(),
        lambda m: m.setdefault("x", "y"),
    ):
        with pytest.raises(TypeError, match="shared"):
            change(first.tags)
    assert second.tags == {"a": "b"} and first.resources == {} and first.labels == {}
