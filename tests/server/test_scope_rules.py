"""The rules behind the auth matrix, one defect each, against the two-shard cluster of
``auth_cluster``: the default pool, totals a scoped reader may see, the keys of recurring runs."""

from __future__ import annotations

import re

import pytest
from cronoq.engine.recurring import RUN_KEY_SUFFIX_LEN, run_key

from cronoq.proto import cronoq_pb2 as pb
from tests.server.auth_cluster import (
    ADMIN,
    DEFAULT_CLIENT,
    HOLD,
    MAX_KEY_LEN,
    YEARLY,
    AuthCluster,
    Credential,
    running_cluster,  # noqa: F401 - the fixture ``cluster`` of this module
)

CLIENT = Credential("client")
SCOPED_METRICS = Credential("metrics", ("alpha",))
SCOPED_ADMIN = Credential("admin", ("alpha",))
RUN_FORM = "nightly@2026-03-08T07:30:00Z"


@pytest.mark.parametrize("node", ["s1", "s2"])
def test_a_call_without_a_pool_acts_on_the_pool_named_default(cluster: AuthCluster, node: str) -> None:
    """The pool named "default" is not the first configured here; every node resolves to it all the same,
    and a credential scoped to it may leave the pool out."""
    client = cluster.clients[node]
    for credential in (CLIENT, DEFAULT_CLIENT):
        key = cluster.unique("pool-less")
        outcome = client.call(credential, "tasks", "Submit", pb.SubmitRequest(task=pb.TaskSpec(key=key, labels=HOLD)))
        assert outcome.code == "OK", outcome
        found = cluster.find(key)
        assert found is not None and found.pool == "default"
    name = cluster.unique("pool-less-schedule")
    request = pb.RecurringRequest(name=name, cron=YEARLY, template=pb.TaskSpec())
    assert client.call(ADMIN, "admin", "AddRecurring", request).code == "OK"
    assert cluster.schedules()[name] == "default"
    cluster.remove_schedule(name)


def _snapshot(cluster: AuthCluster, node: str, credential: Credential) -> pb.SnapshotResponse:
    outcome = cluster.clients[node].call(credential, "admin", "Snapshot", pb.Empty())
    assert outcome.code == "OK", outcome
    response: pb.SnapshotResponse = outcome.body
    return response


def _figures(snapshot: pb.SnapshotResponse) -> dict[str, int]:
    totals = snapshot.totals
    return {
        "submitted": totals.submitted,
        "cancelled": totals.cancelled,
        "live": snapshot.live_tasks,
        "pending": snapshot.pending,
        "workers": snapshot.workers_connected,
    }


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found is not None, name
    return float(found.group(1))


def _scraped(cluster: AuthCluster) -> dict[str, float]:
    """What the scoped metrics credential scrapes from node s1."""
    outcome = cluster.clients["s1"].http(SCOPED_METRICS, "GET", "/metrics")
    assert outcome.code == "OK", outcome
    names = ("cronoq_tasks_submitted_total", "cronoq_live_tasks", "cronoq_pending", "cronoq_workers_connected")
    return {name: _metric(outcome.body, name) for name in names}


def test_a_scoped_reader_sees_totals_of_its_own_pools_only(cluster: AuthCluster) -> None:
    """Snapshot (local and merged, gRPC and HTTP) and /metrics: work in other pools changes
    nothing a pool-scoped credential sees; work in its pool counts."""

    def seen() -> tuple[dict[str, int], dict[str, int], object, dict[str, float]]:
        http = cluster.clients["s2"].http(SCOPED_METRICS, "GET", "/v1/snapshot").body
        local, merged = (_figures(_snapshot(cluster, node, SCOPED_METRICS)) for node in ("s1", "s2"))
        return local, merged, (http["totals"], http["live_tasks"], http["workers_connected"]), _scraped(cluster)

    before = seen()
    everything = _figures(_snapshot(cluster, "s1", ADMIN))
    for pool in ("default", "beta"):
        cluster.submit(pool, cluster.unique("elsewhere"))
        cluster.cancel(cluster.submit(pool, cluster.unique("elsewhere")))
    release, call = cluster.register("s1", ADMIN, "default", name="elsewhere")
    try:
        assert seen() == before
        grown = _figures(_snapshot(cluster, "s1", ADMIN))
        assert grown["submitted"] == everything["submitted"] + 4 and grown["workers"] == everything["workers"] + 1
    finally:
        release.set()
        call.cancel()

    mine = cluster.submit("alpha", cluster.unique("mine"))
    cluster.cancel(cluster.submit("alpha", cluster.unique("mine")))
    for node in ("s1", "s2"):
        now = _figures(_snapshot(cluster, node, SCOPED_METRICS))
        assert now == {
            **before[0],
            "submitted": before[0]["submitted"] + 2,
            "cancelled": before[0]["cancelled"] + 1,
            "live": before[0]["live"] + 1,
            "pending": before[0]["pending"] + 1,
        }
    scraped = _scraped(cluster)
    assert scraped["cronoq_tasks_submitted_total"] == before[3]["cronoq_tasks_submitted_total"] + 2
    assert scraped["cronoq_live_tasks"] == before[3]["cronoq_live_tasks"] + 1
    cluster.cancel(mine)


def test_keys_of_the_form_of_recurring_runs_are_refused(cluster: AuthCluster) -> None:
    """Such a key taken first by a client would silence that run of a schedule (of any pool)."""
    for node in ("s1", "s2"):
        client = cluster.clients[node]
        outcome = client.call(CLIENT, "tasks", "Submit", pb.SubmitRequest(task=pb.TaskSpec(pool="alpha", key=RUN_FORM)))
        assert outcome.code == "INVALID_ARGUMENT" and outcome.details.startswith("key: "), outcome
        fresh = cluster.unique("batch-fresh")
        batch = pb.SubmitBatchRequest(tasks=[pb.TaskSpec(pool="beta", key=key) for key in (fresh, RUN_FORM)])
        outcome = client.call(CLIENT, "tasks", "SubmitBatch", batch)
        assert outcome.code == "INVALID_ARGUMENT" and outcome.details.startswith("task 1: key: "), outcome
        assert cluster.find(fresh) is None
        outcome = client.http(CLIENT, "POST", "/v1/tasks", {"pool": "default", "key": RUN_FORM})
        assert outcome.http_status == 400 and "key" in outcome.details, outcome
    assert cluster.find(RUN_FORM) is None

    # Keys that merely look alike are a client's to use, and a run's key may still be depended on.
    for near in ("nightly@2026-03-08", "nightly@2026-03-08T07:30:00+00:00", RUN_FORM + "-copy"):
        request = pb.SubmitRequest(task=pb.TaskSpec(pool="alpha", key=near, labels=HOLD))
        outcome = cluster.clients["s1"].call(CLIENT, "tasks", "Submit", request)
        assert outcome.code == "OK", (near, outcome)
    after = pb.TaskSpec(pool="alpha", deps=[pb.Dep(target=pb.TaskRef(key=RUN_FORM))])
    assert cluster.clients["s1"].call(CLIENT, "tasks", "Submit", pb.SubmitRequest(task=after)).code == "NOT_FOUND"

    # The key of the next run of an actual schedule.
    name = cluster.unique("keyed")
    cluster.add_schedule(name, "beta", key="keyed-run")
    listed = cluster.clients["s1"].call(ADMIN, "admin", "ListRecurring", pb.Empty()).body.schedules
    upcoming = next(schedule.next_unix_ns for schedule in listed if schedule.name == name)
    taken = pb.SubmitRequest(task=pb.TaskSpec(pool="beta", key=run_key("keyed-run", upcoming)))
    assert cluster.clients["s2"].call(CLIENT, "tasks", "Submit", taken).code == "INVALID_ARGUMENT"
    cluster.remove_schedule(name)


def test_a_scoped_admin_cannot_share_the_key_of_another_pools_schedule(cluster: AuthCluster) -> None:
    """Two schedules with one key prefix make the same run keys; the first run created would
    silence the other's."""
    victim = cluster.unique("victim")
    cluster.add_schedule(victim, "default", key="shared-prefix")
    for node in ("s1", "s2"):
        intruder = pb.RecurringRequest(
            name=cluster.unique("intruder"), cron=YEARLY, template=pb.TaskSpec(pool="alpha", key="shared-prefix")
        )
        outcome = cluster.clients[node].call(SCOPED_ADMIN, "admin", "AddRecurring", intruder)
        assert outcome.code == "FAILED_PRECONDITION" and "'default'" not in outcome.details, outcome
        assert intruder.name not in cluster.schedules()
        # Taking its name would move it into the caller's pool.
        renamed = pb.RecurringRequest(name=victim, cron=YEARLY, template=pb.TaskSpec(pool="alpha"))
        assert cluster.clients[node].call(SCOPED_ADMIN, "admin", "AddRecurring", renamed).code == "FAILED_PRECONDITION"
    assert cluster.schedules()[victim] == "default"
    own = pb.RecurringRequest(name=cluster.unique("own"), cron=YEARLY, template=pb.TaskSpec(pool="alpha", key="own"))
    assert cluster.clients["s2"].call(SCOPED_ADMIN, "admin", "AddRecurring", own).code == "OK"
    cluster.remove_schedule(own.name)
    cluster.remove_schedule(victim)


def test_a_schedule_key_leaves_room_for_the_run_suffix(cluster: AuthCluster) -> None:
    """Run keys are ``<key>@<start>``: a template key is refused unless those fit max_key_len."""
    longest = MAX_KEY_LEN - RUN_KEY_SUFFIX_LEN
    too_long = pb.RecurringRequest(
        name=cluster.unique("long"), cron=YEARLY, template=pb.TaskSpec(pool="alpha", key="k" * (longest + 1))
    )
    outcome = cluster.clients["s2"].call(ADMIN, "admin", "AddRecurring", too_long)
    assert outcome.code == "INVALID_ARGUMENT" and outcome.details.startswith("template.key"), outcome
    assert f"at most {longest}" in outcome.details and too_long.name not in cluster.schedules()
    name = cluster.unique("fits")
    cluster.add_schedule(name, "alpha", key="k" * longest)
    assert len(run_key("k" * longest, 0)) == MAX_KEY_LEN
    cluster.remove_schedule(name)
