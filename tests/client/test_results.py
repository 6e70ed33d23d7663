"""Wire messages → client dataclasses: field order, renames, presence, enum spellings."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cronoq import client as c
from cronoq.proto import cronoq_pb2 as pb

S = 1_000_000_000


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


FIELD_ORDER = {
    c.Result: "id status output message output_available",
    c.Submitted: "id duplicate result",
    c.TaskInfo: (
        "id status pool key kind attempt max_attempts created_at started_at finished_at message "
        "output_available tenant priority"
    ),
    c.TaskPage: "tasks next_after unavailable_shards",
    c.WorkerInfo: "id name pool labels slots busy connected_at",
    c.RecurringInfo: "name cron tz pool kind overlap next_at last_task_id",
    c.Event: "id pool key status attempt at message",
    c.WorkerGroup: "labels capacity busy",
    c.PoolSnapshot: (
        "name capacity busy held desired pending_by_class reservations dispatched succeeded failed "
        "priority_adherence fixed_start_hit_rate utilization schedule_efficiency wait_p50 wait_p90 wait_p99 cost "
        "workers_connected groups"
    ),
    c.Totals: (
        "submitted dispatched succeeded failed dead_lettered cancelled skipped missed shed retries timeouts "
        "lease_expiries stale_completions"
    ),
    c.Snapshot: "pools live_tasks running pending totals workers_connected unavailable_shards",
    c.Lease: (
        "id task_id attempt payload content_type kind key tags timeout deadline pool priority lease_ttl cancelled"
    ),
}


@pytest.mark.parametrize("cls", list(FIELD_ORDER), ids=lambda cls: cls.__name__)
def test_field_order(cls: type) -> None:
    assert _field_names(cls) == FIELD_ORDER[cls].split()


@pytest.mark.parametrize("cls", [k for k in FIELD_ORDER if k is not c.Lease], ids=lambda cls: cls.__name__)
def test_frozen(cls: type) -> None:
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_lease_is_mutable() -> None:
    assert not c.Lease.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_defaults() -> None:
    assert c.Result(1, "succeeded", None) == c.Result(1, "succeeded", None, "", False)
    assert c.Submitted(1, False).result is None
    info = c.TaskInfo(1, "ready")
    assert (info.pool, info.attempt, info.created_at, info.priority, info.done) == ("", 0, None, None, False)
    assert c.TaskPage((), None).unavailable_shards == ()
    assert c.Totals() == c.Totals(*([0] * 13))
    snap = c.Snapshot((), 0, 0, 0)
    assert snap.totals == c.Totals() and snap.workers_connected == 0 and snap.unavailable_shards == ()


def test_result_from_pb_and_helpers() -> None:
    done = c.Result.from_pb(
        pb.TaskResult(id=3, status=pb.TASK_STATUS_SUCCEEDED, output=b'{"a": 1}', output_available=True)
    )
    assert done == c.Result(3, "succeeded", b'{"a": 1}', "", True)
    assert done.ok and done.json() == {"a": 1} and done.text() == '{"a": 1}'

    empty = c.Result.from_pb(pb.TaskResult(id=4, status=pb.TASK_STATUS_SUCCEEDED, output=b""))
    assert empty.output == b"" and empty.json() is None and empty.text() == ""

    absent = c.Result.from_pb(pb.TaskResult(id=5, status=pb.TASK_STATUS_FAILED, message="boom"))
    assert absent.output is None and not absent.ok and absent.message == "boom"
    assert absent.text() == ""
    with pytest.raises(ValueError):
        absent.json()


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (pb.TASK_STATUS_BLOCKED, "blocked"),
        (pb.TASK_STATUS_SCHEDULED, "scheduled"),
        (pb.TASK_STATUS_READY, "ready"),
        (pb.TASK_STATUS_RUNNING, "running"),
        (pb.TASK_STATUS_RETRYING, "retrying"),
        (pb.TASK_STATUS_SUCCEEDED, "succeeded"),
        (pb.TASK_STATUS_FAILED, "failed"),
        (pb.TASK_STATUS_DEAD_LETTERED, "dead_lettered"),
        (pb.TASK_STATUS_CANCELLED, "cancelled"),
        (pb.TASK_STATUS_SKIPPED, "skipped"),
        (pb.TASK_STATUS_MISSED, "missed"),
        (pb.TASK_STATUS_SHED, "shed"),
    ],
)
def test_status_names_and_done(number: int, text: str) -> None:
    info = c.TaskInfo.from_pb(pb.TaskInfo(id=1, status=number))  # type: ignore[arg-type]
    assert info.status == text
    assert info.done == (text in {"succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"})


def test_task_info_from_pb() -> None:
    m = pb.TaskInfo(
        id=7,
        status=pb.TASK_STATUS_RUNNING,
        pool="p",
        key="k",
        kind="x",
        attempt=2,
        max_attempts=3,
        created_unix_ns=1_500_000_000,
        started_unix_ns=0,
        message="m",
        output_available=False,
        tenant="t",
        priority=pb.PRIORITY_LOW,
    )
    info = c.TaskInfo.from_pb(m)
    assert info == c.TaskInfo(7, "running", "p", "k", "x", 2, 3, 1.5, 0.0, None, "m", False, "t", "low")


def test_task_info_unspecified_priority_is_none() -> None:
    assert c.TaskInfo.from_pb(pb.TaskInfo(id=1)).priority is None


def test_task_page_from_pb() -> None:
    page = c.TaskPage.from_pb(
        pb.ListTasksResponse(tasks=[pb.TaskInfo(id=1), pb.TaskInfo(id=2)], next_after=2, unavailable_shards=["s1"])
    )
    assert [t.id for t in page.tasks] == [1, 2] and page.next_after == 2 and page.unavailable_shards == ("s1",)
    assert c.TaskPage.from_pb(pb.ListTasksResponse()).next_after is None


def test_submitted_from_pb() -> None:
    resp = pb.SubmitResponse(id=9, duplicate=True, result=pb.TaskResult(id=9, status=pb.TASK_STATUS_SUCCEEDED))
    sub = c.Submitted.from_pb(resp)
    assert sub.id == 9 and sub.duplicate and sub.result is not None and sub.result.status == "succeeded"
    assert c.Submitted.from_pb(pb.SubmitResponse(id=1)).result is None


def test_worker_info_from_pb() -> None:
    w = c.WorkerInfo.from_pb(
        pb.WorkerInfo(
            id=4, name="w", pool="p", labels={"gpu": "a100"}, slots=8, busy=3, connected_unix_ns=2 * S + 250_000_000
        )
    )
    assert w == c.WorkerInfo(4, "w", "p", {"gpu": "a100"}, 8, 3, 2.25)


@pytest.mark.parametrize(
    ("overlap", "text"),
    [
        (pb.OVERLAP_UNSPECIFIED, "skip"),
        (pb.OVERLAP_SKIP, "skip"),
        (pb.OVERLAP_ALLOW, "allow"),
        (pb.OVERLAP_QUEUE, "queue"),
        (pb.OVERLAP_QUEUE_ON_SUCCESS, "queue_on_success"),
    ],
)
def test_recurring_info_overlap(overlap: int, text: str) -> None:
    r = c.RecurringInfo.from_pb(pb.RecurringInfo(name="n", overlap=overlap))  # type: ignore[arg-type]
    assert r.overlap == text


def test_recurring_info_presence() -> None:
    r = c.RecurringInfo.from_pb(
        pb.RecurringInfo(name="n", cron="* * * * *", tz="", pool="p", kind="k", next_unix_ns=3 * S, last_task_id=0)
    )
    assert r == c.RecurringInfo("n", "* * * * *", "", "p", "k", "skip", 3.0, 0)
    bare = c.RecurringInfo.from_pb(pb.RecurringInfo(name="n"))
    assert bare.next_at is None and bare.last_task_id is None


def test_event_from_pb() -> None:
    e = c.Event.from_pb(
        pb.StatusEvent(id=1, pool="p", key="k", status=pb.TASK_STATUS_FAILED, attempt=2, at_unix_ns=S // 2, message="x")
    )
    assert e == c.Event(1, "p", "k", "failed", 2, 0.5, "x")


def test_snapshot_from_pb() -> None:
    pool = pb.PoolSnapshot(
        name="p",
        capacity=4,
        busy=1,
        held=1,
        desired=5,
        pending_by_class=[1, 2, 3, 4],
        reservations=1,
        dispatched=10,
        succeeded=8,
        failed=1,
        priority_adherence=0.9,
        fixed_start_hit_rate=1.0,
        utilization=0.5,
        schedule_efficiency=0.7,
        wait_p50_s=0.1,
        wait_p90_s=0.2,
        wait_p99_s=0.3,
        cost=1.25,
        workers_connected=2,
        groups=[pb.WorkerGroup(labels={"a": "b"}, capacity=4, busy=1)],
    )
    totals = pb.Totals(**{name: i + 1 for i, name in enumerate(FIELD_ORDER[c.Totals].split())})
    snap = c.Snapshot.from_pb(
        pb.SnapshotResponse(
            pools=[pool],
            live_tasks=5,
            running=1,
            pending=10,
            totals=totals,
            workers_connected=2,
            unavailable_shards=["x"],
        )
    )
    p = snap.pool("p")
    assert p is not None and snap.pool("nope") is None
    assert p.pending_by_class == (1, 2, 3, 4) and p.pending == 10
    assert (p.wait_p50, p.wait_p90, p.wait_p99, p.cost) == (0.1, 0.2, 0.3, 1.25)
    assert p.groups == (c.WorkerGroup({"a": "b"}, 4, 1),)
    assert snap.totals == c.Totals(*range(1, 14))
    assert (snap.live_tasks, snap.running, snap.pending, snap.workers_connected) == (5, 1, 10, 2)
    assert snap.unavailable_shards == ("x",)


def test_lease_from_pb_presence_and_defaults() -> None:
    m = pb.Lease(
        lease=11,
        task_id=5,
        attempt=2,
        payload=b'{"q": 1}',
        content_type="application/json",
        kind="k",
        key="key",
        tags={"traceparent": "00-x"},
        timeout_s=3.0,
        deadline_unix_ns=4 * S,
        pool="",
        priority=pb.PRIORITY_HIGH,
        lease_ttl_s=1.5,
    )
    lease = c.Lease.from_pb(m, "default-pool")
    assert (lease.id, lease.task_id, lease.attempt) == (11, 5, 2)
    assert lease.pool == "default-pool" and lease.priority == "high"
    assert (lease.timeout, lease.deadline, lease.lease_ttl) == (3.0, 4.0, 1.5)
    assert lease.tags == {"traceparent": "00-x"}
    assert lease.json() == {"q": 1} and lease.text() == '{"q": 1}'
    assert not lease.cancelled.is_set()

    bare = c.Lease.from_pb(pb.Lease(lease=1, pool="own"), "fallback")
    assert bare.pool == "own" and bare.priority is None
    assert bare.timeout is None and bare.deadline is None and bare.lease_ttl is None
    assert bare.json() is None and bare.text() == ""


def test_result_json_roundtrip_of_encoded_values() -> None:
    for value in ({"x": [1, 2]}, [1], 3, "s"):
        data = json.dumps(value).encode()
        assert c.Result(1, "succeeded", data).json() == value
