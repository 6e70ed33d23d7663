"""The auth matrix: every role, unscoped and pool-scoped, against every gRPC method and HTTP route,
on the node of the shard concerned and on the other node (forwarded), with the exact status each
must get, and proof that nothing outside the caller's pools was written or shown.

One cluster (``auth_cluster``) serves every case. A case's expected status comes from the spec's
rules, stated once in ``expected``: no credentials -> UNAUTHENTICATED; a role without the right ->
PERMISSION_DENIED; a pool outside the scope, named or resolved as the default pool ->
PERMISSION_DENIED; a task of such a pool -> NOT_FOUND; listings -> OK with the visible part only;
a worker for another shard's pool -> FAILED_PRECONDITION with that shard's endpoint.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import pytest

from cronoq.proto import console_pb2 as cpb
from cronoq.proto import cronoq_pb2 as pb
from tests.server.auth_cluster import (
    CREDENTIALS,
    HOLD,
    HTTP_CODES,
    OWNER,
    POOLS,
    YEARLY,
    AuthCluster,
    Credential,
    NodeClient,
    Outcome,
    running_cluster,  # noqa: F401 - the fixture ``cluster`` of this module
)

NODES = ("s1", "s2")
SHARD_POOLS = {"s1": ("alpha", "default"), "s2": ("beta",)}


@dataclass
class Case:
    cluster: AuthCluster
    node: str
    credential: Credential
    target: str | None
    """The pool the call concerns; None for a call that names no pool (resolved: ``default``)."""

    @property
    def pool(self) -> str:
        return self.target or "default"

    @property
    def client(self) -> NodeClient:
        return self.cluster.clients[self.node]

    def grpc(self, service: str, method: str, request: object) -> Outcome:
        return self.client.call(self.credential, service, method, request)

    def http(self, method: str, path: str, body: object = None) -> Outcome:
        return self.client.http(self.credential, method, path, body)

    def visible(self, pools: object) -> None:
        """A listing shows only pools the caller may see."""
        hidden = {pool for pool in pools if not self.credential.sees(pool)}  # type: ignore[attr-defined]
        assert not hidden, f"{self.credential.name} was shown pools {sorted(hidden)}"


Verify = Callable[[Case, Outcome], None]


@dataclass(frozen=True)
class Op:
    name: str
    needs: str | None
    """The role the call needs; None: no credentials at all; "any": any valid credential."""
    scope: str
    """How the pool scope applies: "pool" (names a pool), "task" (a task of the target pool),
    "list" (covers what the caller may see), "remove" (a schedule of the target pool), "worker",
    or "none"."""
    targets: tuple[str | None, ...]
    run: Callable[[Case], tuple[Outcome, Verify | None]]


def expected(op: Op, case: Case) -> str:
    credential = case.credential
    if op.needs is None:
        return "OK"
    if credential.role is None:
        return "UNAUTHENTICATED"
    if op.needs == "any":
        return "OK"
    if not credential.grants(op.needs):
        return "PERMISSION_DENIED"
    inside = credential.sees(case.pool)
    if op.scope in ("pool", "worker") and not inside:
        return "PERMISSION_DENIED"
    if op.scope == "task" and not inside:
        return "NOT_FOUND"
    if op.scope == "worker" and OWNER[case.pool] != case.node:
        return "FAILED_PRECONDITION"
    return "OK"


# =============================================================================== Tasks (gRPC)


def _spec(case: Case, key: str) -> pb.TaskSpec:
    return pb.TaskSpec(pool=case.target or "", key=key, labels=HOLD)


def _written(keys: list[str]) -> Verify:
    """Every key exists in the pool the call resolved to when the call succeeded, and nowhere
    when it was refused."""

    def verify(case: Case, outcome: Outcome) -> None:
        for key in keys:
            found = case.cluster.find(key)
            if outcome.code == "OK":
                assert found is not None and found.pool == case.pool, (key, found)
            else:
                assert found is None, f"a refused call wrote {key!r} into pool {found.pool!r}"

    return verify


def submit(case: Case) -> tuple[Outcome, Verify]:
    key = case.cluster.unique("m-submit")
    return case.grpc("tasks", "Submit", pb.SubmitRequest(task=_spec(case, key))), _written([key])


def submit_batch(case: Case) -> tuple[Outcome, Verify]:
    keys = [case.cluster.unique("m-batch") for _ in range(2)]
    request = pb.SubmitBatchRequest(tasks=[_spec(case, key) for key in keys])
    return case.grpc("tasks", "SubmitBatch", request), _written(keys)


def _ref(case: Case, by: str, ids: dict[str, int], prefix: str) -> pb.TaskRef:
    return pb.TaskRef(id=ids[case.pool]) if by == "id" else pb.TaskRef(key=f"{prefix}-{case.pool}")


def get(by: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    def run(case: Case) -> tuple[Outcome, Verify]:
        outcome = case.grpc("tasks", "Get", pb.GetRequest(task=_ref(case, by, case.cluster.seed, "seed")))

        def verify(case: Case, outcome: Outcome) -> None:
            if outcome.code == "OK":
                assert outcome.body.id == case.cluster.seed[case.pool] and outcome.body.pool == case.pool

        return outcome, verify

    return run


def wait(by: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    def run(case: Case) -> tuple[Outcome, Verify]:
        request = pb.WaitRequest(task=_ref(case, by, case.cluster.done, "done"), timeout_s=0)

        def verify(case: Case, outcome: Outcome) -> None:
            if outcome.code == "OK":
                assert outcome.body.id == case.cluster.done[case.pool]
                assert outcome.body.status == pb.TASK_STATUS_CANCELLED

        return case.grpc("tasks", "Wait", request), verify

    return run


def _cancel_target(case: Case) -> tuple[int, str]:
    key = case.cluster.unique("m-cancel")
    return case.cluster.submit(case.pool, key), key


def _cancelled_only_if_ok(task_id: int) -> Verify:
    def verify(case: Case, outcome: Outcome) -> None:
        status = case.cluster.status(task_id)
        if outcome.code == "OK":
            assert status == pb.TASK_STATUS_CANCELLED
        else:
            assert status != pb.TASK_STATUS_CANCELLED, "a refused cancel cancelled the task"

    return verify


def cancel(by: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    def run(case: Case) -> tuple[Outcome, Verify]:
        task_id, key = _cancel_target(case)
        ref = pb.TaskRef(id=task_id) if by == "id" else pb.TaskRef(key=key)
        outcome = case.grpc("tasks", "Cancel", pb.CancelRequest(task=ref))
        if outcome.code == "OK":
            assert outcome.body.cancelled
        return outcome, _cancelled_only_if_ok(task_id)

    return run


def list_tasks(case: Case) -> tuple[Outcome, Verify]:
    request = pb.ListTasksRequest(pools=[case.target] if case.target else [], limit=50)

    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            pools = {task.pool for task in outcome.body.tasks}
            case.visible(pools)
            assert pools and (case.target is None or pools == {case.target}), pools
            assert not outcome.body.unavailable_shards

    return case.grpc("tasks", "ListTasks", request), verify


def watch(by: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    """Open a watch, then cancel one fresh task per pool, the ones it must not see first; read
    until every event it must see came, and fail on any other."""

    def run(case: Case) -> tuple[Outcome, Verify]:
        fresh = {pool: case.cluster.submit(pool, case.cluster.unique("m-watch")) for pool in POOLS}
        if by == "pools":
            request = pb.WatchRequest(pools=[case.target] if case.target else [])
        else:
            request = pb.WatchRequest(ids=list(fresh.values()))
        named = [case.target] if by == "pools" and case.target else list(POOLS)
        shown = [pool for pool in named if case.credential.sees(pool)]
        order = sorted(POOLS, key=lambda pool: (pool in shown, pool == "alpha"))
        events: list[pb.StatusEvent] = []
        with case.cluster.watching(case.node, case.credential, request) as call:
            for pool in order:
                case.cluster.cancel(fresh[pool])
            wanted = {fresh[pool] for pool in shown}
            try:
                for event in call:
                    events.append(event)
                    wanted.discard(event.id)
                    if not wanted:
                        break
            except grpc.RpcError as err:
                return Outcome(err.code().name, err.details() or "", dict(err.trailing_metadata() or ())), None  # type: ignore[attr-defined]

        def verify(case: Case, outcome: Outcome) -> None:
            assert {event.id for event in events} == {fresh[pool] for pool in shown}, events
            case.visible({event.pool for event in events})

        return Outcome("OK", body=events), verify

    return run


# =============================================================================== Admin (gRPC)


def snapshot(case: Case) -> tuple[Outcome, Verify]:
    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            assert {pool.name for pool in outcome.body.pools} == {p for p in POOLS if case.credential.sees(p)}
            assert not outcome.body.unavailable_shards

    return case.grpc("admin", "Snapshot", pb.Empty()), verify


def list_workers(case: Case) -> tuple[Outcome, Verify]:
    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            pools = {worker.pool for worker in outcome.body.workers if worker.name.startswith("resident-")}
            assert pools == {p for p in POOLS if case.credential.sees(p)}, pools
            case.visible({worker.pool for worker in outcome.body.workers})

    return case.grpc("admin", "ListWorkers", pb.Empty()), verify


def list_recurring(case: Case) -> tuple[Outcome, Verify]:
    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            names = {schedule.name for schedule in outcome.body.schedules}
            assert {f"sched-{p}" for p in POOLS if case.credential.sees(p)} <= names, names
            case.visible({schedule.pool for schedule in outcome.body.schedules})

    return case.grpc("admin", "ListRecurring", pb.Empty()), verify


def add_recurring(case: Case) -> tuple[Outcome, Verify]:
    name = case.cluster.unique("m-add")
    request = pb.RecurringRequest(name=name, cron=YEARLY, template=pb.TaskSpec(pool=case.target or ""))

    def verify(case: Case, outcome: Outcome) -> None:
        found = case.cluster.schedules().get(name)
        case.cluster.remove_schedule(name)
        if outcome.code == "OK":
            assert found == case.pool
        else:
            assert found is None, f"a refused AddRecurring added a schedule in pool {found!r}"

    return case.grpc("admin", "AddRecurring", request), verify


def remove_recurring(case: Case) -> tuple[Outcome, Verify]:
    name = case.cluster.unique("m-remove")
    case.cluster.add_schedule(name, case.pool)
    outcome = case.grpc("admin", "RemoveRecurring", pb.RemoveRecurringRequest(name=name))

    def verify(case: Case, outcome: Outcome) -> None:
        left = name in case.cluster.schedules()
        case.cluster.remove_schedule(name)
        removed = outcome.code == "OK" and outcome.body.removed
        assert removed == (outcome.code == "OK" and case.credential.sees(case.pool))
        assert left != removed

    return outcome, verify


# =============================================================================== Console (gRPC)


def search_tasks(case: Case) -> tuple[Outcome, Verify]:
    listing = pb.ListTasksRequest(pools=[case.target] if case.target else [], limit=50)
    request = cpb.SearchTasksRequest(list=listing, key_prefix="seed-")

    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            pools = {task.pool for task in outcome.body.tasks}
            case.visible(pools)
            assert pools and (case.target is None or pools == {case.target}), pools
            assert all(task.key.startswith("seed-") for task in outcome.body.tasks)

    return case.grpc("console", "SearchTasks", request), verify


def task_detail(by: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    def run(case: Case) -> tuple[Outcome, Verify]:
        request = pb.GetRequest(task=_ref(case, by, case.cluster.seed, "seed"))

        def verify(case: Case, outcome: Outcome) -> None:
            if outcome.code == "OK":
                assert outcome.body.info.id == case.cluster.seed[case.pool] and outcome.body.info.pool == case.pool
                assert outcome.body.spec.pool == case.pool

        return case.grpc("console", "GetTaskDetail", request), verify

    return run


def list_shards(case: Case) -> tuple[Outcome, Verify]:
    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            for shard in outcome.body.shards:
                case.visible(shard.pools)
            shown = {pool for shard in outcome.body.shards for pool in shard.pools}
            assert shown == {p for p in POOLS if case.credential.sees(p)}, shown
            assert not outcome.body.unavailable_shards

    return case.grpc("console", "ListShards", pb.Empty()), verify


def describe_replica(case: Case) -> tuple[Outcome, Verify]:
    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":  # the process called, never another shard's: no pool in it
            assert outcome.body.state == "leader" and outcome.body.pid > 0, outcome.body

    return case.grpc("console", "DescribeReplica", pb.Empty()), verify


def move_pool(case: Case) -> tuple[Outcome, None]:
    """Moves nothing: the target named is the shard already serving the pool, which a caller past
    the role and scope checks hears as INVALID_ARGUMENT naming ``to`` (counted as let through)."""
    request = cpb.MovePoolRequest(pool=case.target or "", to=OWNER[case.pool])
    outcome = case.grpc("console", "MovePool", request)
    if (
        outcome.code == "INVALID_ARGUMENT"
        and outcome.details.startswith("to: ")
        and "already served" in outcome.details
    ):
        outcome = dataclasses.replace(outcome, code="OK")
    return outcome, None


def get_move(case: Case) -> tuple[Outcome, Verify]:
    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            assert outcome.body.pool == case.pool, outcome.body

    return case.grpc("console", "GetMove", cpb.MoveRequest(pool=case.target or "")), verify


def _nothing_to_abort(outcome: Outcome) -> Outcome:
    """No move is under way in the matrix's cluster: an abort past the role and scope checks is
    refused naming that (counted as let through)."""
    if outcome.code == "FAILED_PRECONDITION" and "has no move to abort" in outcome.details:
        return dataclasses.replace(outcome, code="OK")
    return outcome


def abort_move(case: Case) -> tuple[Outcome, None]:
    return _nothing_to_abort(case.grpc("console", "AbortMove", cpb.MoveRequest(pool=case.target or ""))), None


def http_move(method: str) -> Callable[[Case], tuple[Outcome, Verify | None]]:
    """The HTTP route of a move: POST (moves nothing, as ``move_pool``), GET, DELETE (as
    ``abort_move``)."""

    def run(case: Case) -> tuple[Outcome, Verify | None]:
        path = f"/v1/admin/pools/{case.target or ''}/move"
        if method == "POST":
            outcome = case.http("POST", path, {"to": OWNER[case.pool]})
            if (
                outcome.code == "INVALID_ARGUMENT"
                and outcome.details.startswith("to: ")
                and ("already served" in outcome.details)
            ):
                outcome = dataclasses.replace(outcome, code="OK")
            return outcome, None
        if method == "DELETE":
            return _nothing_to_abort(case.http("DELETE", path)), None

        def verify(case: Case, outcome: Outcome) -> None:
            if outcome.code == "OK":
                assert outcome.body["pool"] == case.pool and outcome.body["shard"] == OWNER[case.pool], outcome.body

        return case.http("GET", path), verify

    return run


def list_schedules(case: Case) -> tuple[Outcome, Verify]:
    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            names = {schedule.info.name for schedule in outcome.body.schedules}
            assert {f"sched-{p}" for p in POOLS if case.credential.sees(p)} <= names, names
            case.visible({schedule.info.pool for schedule in outcome.body.schedules})

    return case.grpc("console", "ListSchedules", pb.Empty()), verify


def _switched(case: Case, name: str, found: bool) -> None:
    """A schedule is paused only when the call found it, and only in the caller's pools."""
    paused = name in case.cluster.paused()
    case.cluster.remove_schedule(name)
    assert found == (case.credential.grants("admin") and case.credential.sees(case.pool))
    assert paused == found


def pause_schedule(case: Case) -> tuple[Outcome, Verify]:
    name = case.cluster.unique("m-pause")
    case.cluster.add_schedule(name, case.pool)
    outcome = case.grpc("console", "PauseSchedule", cpb.ScheduleRequest(name=name))
    return outcome, lambda case, outcome: _switched(case, name, outcome.code == "OK" and outcome.body.found)


def resume_schedule(case: Case) -> tuple[Outcome, Verify]:
    name = case.cluster.unique("m-resume")
    case.cluster.add_schedule(name, case.pool)
    case.cluster.pause_schedule(name)
    outcome = case.grpc("console", "ResumeSchedule", cpb.ScheduleRequest(name=name))

    def verify(case: Case, outcome: Outcome) -> None:
        resumed = outcome.code == "OK" and outcome.body.found
        still_paused = name in case.cluster.paused()
        case.cluster.remove_schedule(name)
        assert resumed == (case.credential.grants("admin") and case.credential.sees(case.pool))
        assert still_paused != resumed

    return outcome, verify


# =============================================================================== Workers (gRPC)


def register(case: Case) -> tuple[Outcome, Verify | None]:
    try:
        release, call = case.cluster.register(case.node, case.credential, case.target or "")
    except grpc.RpcError as err:
        return Outcome(err.code().name, err.details() or "", dict(err.trailing_metadata() or ())), None  # type: ignore[attr-defined]
    release.set()
    call.cancel()
    return Outcome("OK"), None


# =============================================================================== HTTP routes


def _http_task(case: Case, key: str) -> dict[str, object]:
    body: dict[str, object] = {"key": key, "labels": HOLD}
    if case.target:
        body["pool"] = case.target
    return body


def http_submit(case: Case) -> tuple[Outcome, Verify]:
    key = case.cluster.unique("m-hsubmit")
    return case.http("POST", "/v1/tasks", _http_task(case, key)), _written([key])


def http_batch(case: Case) -> tuple[Outcome, Verify]:
    keys = [case.cluster.unique("m-hbatch") for _ in range(2)]
    return case.http("POST", "/v1/tasks:batch", {"tasks": [_http_task(case, key) for key in keys]}), _written(keys)


def http_list(case: Case) -> tuple[Outcome, Verify]:
    path = "/v1/tasks?limit=50" + (f"&pool={case.target}" if case.target else "")

    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            pools = {task["pool"] for task in outcome.body["tasks"]}
            case.visible(pools)
            assert pools and (case.target is None or pools == {case.target}), pools

    return case.http("GET", path), verify


def _http_ref(case: Case, by: str, ids: dict[str, int], prefix: str) -> str:
    if by == "id":
        return f"/v1/tasks/{ids[case.pool]}"
    return "/v1/tasks/by-key/" + urllib.parse.quote(f"{prefix}-{case.pool}", safe="")


def http_get(by: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    def run(case: Case) -> tuple[Outcome, Verify]:
        def verify(case: Case, outcome: Outcome) -> None:
            if outcome.code == "OK":
                assert outcome.body["pool"] == case.pool and outcome.body["id"] == str(case.cluster.seed[case.pool])

        return case.http("GET", _http_ref(case, by, case.cluster.seed, "seed")), verify

    return run


def http_result(by: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    def run(case: Case) -> tuple[Outcome, Verify]:
        def verify(case: Case, outcome: Outcome) -> None:
            if outcome.code == "OK":
                assert outcome.body["status"] == "cancelled"

        return case.http("GET", _http_ref(case, by, case.cluster.done, "done") + "/result?timeout_s=0"), verify

    return run


def http_cancel(by: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    def run(case: Case) -> tuple[Outcome, Verify]:
        task_id, key = _cancel_target(case)
        path = f"/v1/tasks/{task_id}" if by == "id" else "/v1/tasks/by-key/" + urllib.parse.quote(key, safe="")
        outcome = case.http("DELETE", path)
        if outcome.code == "OK":
            assert outcome.body["cancelled"] is True
        return outcome, _cancelled_only_if_ok(task_id)

    return run


def http_listing(path: str, field: str, pool_field: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    def run(case: Case) -> tuple[Outcome, Verify]:
        def verify(case: Case, outcome: Outcome) -> None:
            if outcome.code == "OK":
                case.visible({entry[pool_field] for entry in outcome.body[field]})
                assert not outcome.body.get("unavailable_shards")

        return case.http("GET", path), verify

    return run


def http_metrics(case: Case) -> tuple[Outcome, Verify]:
    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            labelled = set(re.findall(r'pool="([^"]+)"', outcome.body))
            # Prometheus is scraped per server: its own shard's pools, as far as the caller sees.
            assert labelled == {p for p in SHARD_POOLS[case.node] if case.credential.sees(p)}, labelled

    return case.http("GET", "/metrics"), verify


def http_detail(by: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    def run(case: Case) -> tuple[Outcome, Verify]:
        def verify(case: Case, outcome: Outcome) -> None:
            if outcome.code == "OK":
                task = outcome.body["task"]
                assert task["pool"] == case.pool and task["id"] == str(case.cluster.seed[case.pool])

        return case.http("GET", _http_ref(case, by, case.cluster.seed, "seed") + "/detail"), verify

    return run


def http_events(case: Case) -> tuple[Outcome, Verify | None]:
    """As ``watch``, over ``GET /v1/events``: read until every event it must see came."""
    fresh = {pool: case.cluster.submit(pool, case.cluster.unique("m-events")) for pool in POOLS}
    path = "/v1/events" + (f"?pool={case.target}" if case.target else "")
    named = [case.target] if case.target else list(POOLS)
    shown = [pool for pool in named if case.credential.sees(pool)]
    events: list[dict[str, str]] = []
    with case.client.http_stream(case.credential, path) as (status, answer):
        if status != 200:
            return Outcome(HTTP_CODES.get(status, f"HTTP {status}"), answer["error"], None, answer, status), None
        assert json.loads(answer.readline()) == {"subscribed": {"unavailable_shards": []}}
        for pool in sorted(POOLS, key=lambda pool: (pool in shown, pool == "alpha")):
            case.cluster.cancel(fresh[pool])
        wanted = {str(fresh[pool]) for pool in shown}
        while wanted:
            line = json.loads(answer.readline())
            assert "end" not in line, line
            if "event" in line:
                events.append(line["event"])
                wanted.discard(line["event"]["id"])

    def verify(case: Case, outcome: Outcome) -> None:
        assert {event["id"] for event in events} == {str(fresh[pool]) for pool in shown}, events
        case.visible({event["pool"] for event in events})

    return Outcome("OK", body=events), verify


def http_shards(case: Case) -> tuple[Outcome, Verify]:
    def verify(case: Case, outcome: Outcome) -> None:
        if outcome.code == "OK":
            shown = {pool for shard in outcome.body["shards"] for pool in shard["pools"]}
            assert shown == {p for p in POOLS if case.credential.sees(p)}, shown
            assert outcome.body["unavailable_shards"] == []

    return case.http("GET", "/v1/shards"), verify


def http_switch(action: str) -> Callable[[Case], tuple[Outcome, Verify]]:
    """Pause, resume or remove a schedule of the target pool over HTTP."""

    def run(case: Case) -> tuple[Outcome, Verify]:
        name = case.cluster.unique(f"m-h{action}")
        case.cluster.add_schedule(name, case.pool)
        if action == "resume":
            case.cluster.pause_schedule(name)
        path = f"/v1/recurring/{name}" + ("" if action == "remove" else f"/{action}")
        outcome = case.http("DELETE" if action == "remove" else "POST", path)

        def verify(case: Case, outcome: Outcome) -> None:
            done = outcome.code == "OK" and outcome.body["removed" if action == "remove" else "found"]
            listed, paused = name in case.cluster.schedules(), name in case.cluster.paused()
            case.cluster.remove_schedule(name)
            assert done == (case.credential.grants("admin") and case.credential.sees(case.pool))
            if action == "remove":
                assert listed != done
            else:
                assert paused == (done if action == "pause" else not done)

        return outcome, verify

    return run


def http_plain(path: str) -> Callable[[Case], tuple[Outcome, None]]:
    def run(case: Case) -> tuple[Outcome, None]:
        return case.http("GET", path), None

    return run


# =============================================================================== the table

EVERY = (*POOLS, None)
"""Each pool, and no pool (the default pool)."""
OPS: tuple[Op, ...] = (
    Op("Submit", "client", "pool", EVERY, submit),
    Op("SubmitBatch", "client", "pool", EVERY, submit_batch),
    Op("Get(id)", "client", "task", POOLS, get("id")),
    Op("Get(key)", "client", "task", POOLS, get("key")),
    Op("Wait(id)", "client", "task", POOLS, wait("id")),
    Op("Wait(key)", "client", "task", POOLS, wait("key")),
    Op("Cancel(id)", "client", "task", POOLS, cancel("id")),
    Op("Cancel(key)", "client", "task", POOLS, cancel("key")),
    Op("ListTasks(pools)", "client", "pool", POOLS, list_tasks),
    Op("ListTasks", "client", "list", (None,), list_tasks),
    Op("Watch(pools)", "client", "pool", POOLS, watch("pools")),
    Op("Watch", "client", "list", (None,), watch("pools")),
    Op("Watch(ids)", "client", "list", (None,), watch("ids")),
    Op("Snapshot", "metrics", "list", (None,), snapshot),
    Op("ListWorkers", "metrics", "list", (None,), list_workers),
    Op("ListRecurring", "metrics", "list", (None,), list_recurring),
    Op("AddRecurring", "admin", "pool", EVERY, add_recurring),
    Op("RemoveRecurring", "admin", "remove", POOLS, remove_recurring),
    Op("Work(Register)", "worker", "worker", EVERY, register),
    Op("SearchTasks(pools)", "client", "pool", POOLS, search_tasks),
    Op("SearchTasks", "client", "list", (None,), search_tasks),
    Op("GetTaskDetail(id)", "client", "task", POOLS, task_detail("id")),
    Op("GetTaskDetail(key)", "client", "task", POOLS, task_detail("key")),
    Op("ListShards", "metrics", "list", (None,), list_shards),
    Op("DescribeReplica", "metrics", "none", (None,), describe_replica),
    Op("ListSchedules", "metrics", "list", (None,), list_schedules),
    Op("MovePool", "admin", "pool", POOLS, move_pool),
    Op("GetMove", "metrics", "pool", POOLS, get_move),
    Op("AbortMove", "admin", "pool", POOLS, abort_move),
    Op("POST /v1/admin/pools/{pool}/move", "admin", "pool", POOLS, http_move("POST")),
    Op("GET /v1/admin/pools/{pool}/move", "metrics", "pool", POOLS, http_move("GET")),
    Op("DELETE /v1/admin/pools/{pool}/move", "admin", "pool", POOLS, http_move("DELETE")),
    Op("PauseSchedule", "admin", "remove", POOLS, pause_schedule),
    Op("ResumeSchedule", "admin", "remove", POOLS, resume_schedule),
    Op("POST /v1/tasks", "client", "pool", EVERY, http_submit),
    Op("POST /v1/tasks:batch", "client", "pool", EVERY, http_batch),
    Op("GET /v1/tasks?pool", "client", "pool", POOLS, http_list),
    Op("GET /v1/tasks", "client", "list", (None,), http_list),
    Op("GET /v1/tasks/{id}", "client", "task", POOLS, http_get("id")),
    Op("GET /v1/tasks/by-key/{key}", "client", "task", POOLS, http_get("key")),
    Op("DELETE /v1/tasks/{id}", "client", "task", POOLS, http_cancel("id")),
    Op("DELETE /v1/tasks/by-key/{key}", "client", "task", POOLS, http_cancel("key")),
    Op("GET /v1/tasks/{id}/result", "client", "task", POOLS, http_result("id")),
    Op("GET /v1/tasks/by-key/{key}/result", "client", "task", POOLS, http_result("key")),
    Op("GET /v1/tasks/{id}/detail", "client", "task", POOLS, http_detail("id")),
    Op("GET /v1/tasks/by-key/{key}/detail", "client", "task", POOLS, http_detail("key")),
    Op("GET /v1/events?pool", "client", "pool", POOLS, http_events),
    Op("GET /v1/events", "client", "list", (None,), http_events),
    Op("GET /v1/snapshot", "metrics", "list", (None,), http_listing("/v1/snapshot", "pools", "name")),
    Op("GET /v1/workers", "metrics", "list", (None,), http_listing("/v1/workers", "workers", "pool")),
    Op("GET /v1/recurring", "metrics", "list", (None,), http_listing("/v1/recurring", "schedules", "pool")),
    Op("GET /v1/schedules", "metrics", "list", (None,), http_listing("/v1/schedules", "schedules", "pool")),
    Op("GET /v1/shards", "metrics", "list", (None,), http_shards),
    Op("POST /v1/recurring/{name}/pause", "admin", "remove", POOLS, http_switch("pause")),
    Op("POST /v1/recurring/{name}/resume", "admin", "remove", POOLS, http_switch("resume")),
    Op("DELETE /v1/recurring/{name}", "admin", "remove", POOLS, http_switch("remove")),
    Op("GET /v1/whoami", "any", "none", (None,), http_plain("/v1/whoami")),
    Op("GET /metrics", "metrics", "list", (None,), http_metrics),
    Op("GET /v1/openapi.json", "any", "none", (None,), http_plain("/v1/openapi.json")),
    Op("GET /healthz", None, "none", (None,), http_plain("/healthz")),
    Op("GET /readyz", None, "none", (None,), http_plain("/readyz")),
    # The console's files: no credentials (the page asks for a token); /ui redirects to /ui/.
    Op("GET /ui", None, "none", (None,), http_plain("/ui")),
    Op("GET /ui/", None, "none", (None,), http_plain("/ui/")),
    Op("GET /ui/{file}", None, "none", (None,), http_plain("/ui/app.js")),
)

CASES = [
    pytest.param(op, credential, node, target, id=f"{op.name}|{target or '-'}|{credential.name}|{node}")
    for op in OPS
    for target in op.targets
    for credential in CREDENTIALS
    for node in NODES
]


def _reveals_nothing(case: Case, outcome: Outcome) -> None:
    """A refusal names no pool but the one the call concerns, and no shard, unless it is the
    redirect a worker of a pool in its scope is owed."""
    if outcome.code == "OK":
        return
    for pool in POOLS:
        if pool != case.pool:
            assert f"'{pool}'" not in outcome.details, outcome
    if outcome.code != "FAILED_PRECONDITION":
        assert not any(key.startswith("cronoq-shard") for key in outcome.metadata or {}), outcome
        for shard in NODES:
            assert f"'{shard}'" not in outcome.details and case.cluster.endpoint(shard) not in outcome.details


@pytest.mark.parametrize(("op", "credential", "node", "target"), CASES)
def test_auth_matrix(cluster: AuthCluster, op: Op, credential: Credential, node: str, target: str | None) -> None:
    case = Case(cluster, node, credential, target)
    want = expected(op, case)
    outcome, verify = op.run(case)
    assert outcome.code == want, f"{op.name} by {credential.name} on {node}: {outcome}"
    if want == "FAILED_PRECONDITION":  # the worker's redirect to the shard of its pool
        shard = OWNER[case.pool]
        where = {"cronoq-shard": shard, "cronoq-shard-endpoint": cluster.endpoint(shard)}
        assert outcome.metadata is not None and where.items() <= outcome.metadata.items(), outcome.metadata
    _reveals_nothing(case, outcome)
    if verify is not None:
        verify(case, outcome)


def test_the_matrix_covers_every_method_and_route() -> None:
    """A method or route added later must get its row in ``OPS``."""
    from cronoq.proto import console_pb2, cronoq_pb2
    from cronoq.server.http import ROUTES, UI_ROUTES

    methods = {
        method.name
        for name in ("Tasks", "Admin", "Workers")
        for method in cronoq_pb2.DESCRIPTOR.services_by_name[name].methods
    }
    methods |= {method.name for method in console_pb2.DESCRIPTOR.services_by_name["Console"].methods}
    covered = {op.name.split("(")[0] for op in OPS}
    assert methods - {"Work"} <= covered and "Work(Register)" in {op.name for op in OPS}
    routes = {f"{route.method} {route.path}" for route in (*ROUTES, *UI_ROUTES)}
    names = {op.name.split("?")[0] for op in OPS}
    assert routes <= names, routes - names
