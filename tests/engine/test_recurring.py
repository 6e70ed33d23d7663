"""Scenario tests for the spec chapter "Recurring schedules".

A schedule turns a cron expression into fixed-start occurrences: each is created hold_lead +
tolerance before its start (capped by the pool's max_hold), one at a time, tagged
cronoq.recurring=<name>, keyed <key>@<RFC 3339 UTC start> when the template has a key, with a
deadline deadline_after past its own start. Overlap policies: Skip (default), Allow, Queue,
QueueOnSuccess.

The tests start at 2023-11-14T22:13:20Z (Sim's START, "t = 0"), which is itself an occurrence of
"*/10 * * * * *"; schedules are added at t = 0.5 s so that their first occurrence is at 10 s.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from cronoq.engine import (
    RECURRING_TAG,
    AdmissionError,
    ConfigError,
    Dep,
    FixedStart,
    Lease,
    MissPolicy,
    OverlapPolicy,
    PoolConfig,
    Priority,
    RecurringSpec,
    ResourceConfig,
    RetryPolicy,
    SubmitCode,
    TaskInfo,
    TaskSpec,
)

from .sim import START, Sim, ns

EVERY_10S = "*/10 * * * * *"


def pool(max_workers: int = 4, **options: object) -> PoolConfig:
    return PoolConfig("default", max_workers=max_workers, initial_workers=max_workers, **options)  # type: ignore[arg-type]


def make(*pools: PoolConfig, **config: object) -> Sim:
    """A Sim half a second past START, so that "*/10" schedules next fire at 10 s."""
    sim = Sim.make(*(pools or (pool(),)), **config)
    sim.advance(0.5)
    return sim


def t(seconds: float) -> int:
    """The instant ``seconds`` after the beginning of the test."""
    return START + ns(seconds)


def advance_to(sim: Sim, seconds: float) -> None:
    assert seconds >= sim.t
    sim.advance(seconds - sim.t)


def add(
    sim: Sim, name: str = "job", cron: str = EVERY_10S, template: TaskSpec | None = None, **options: object
) -> None:
    spec = RecurringSpec(name, cron, template if template is not None else TaskSpec(payload=name), **options)  # type: ignore[arg-type]
    sim.core.add_recurring(sim.now, spec)
    sim.step()


def occurrences(sim: Sim, name: str = "job") -> list[TaskInfo]:
    """Tasks created by schedule ``name``, oldest first."""
    return [info for info in sim.core.list_tasks(limit=10_000) if info.tags.get(RECURRING_TAG) == name]


def starts(sim: Sim, name: str = "job") -> list[float]:
    return [(info.fixed_start - START) / 1e9 for info in occurrences(sim, name) if info.fixed_start is not None]


def statuses(sim: Sim, name: str = "job") -> list[str]:
    return [info.status.value for info in occurrences(sim, name)]


def lease_for(sim: Sim, info: TaskInfo) -> Lease:
    return sim.lease_of(info.id)


# ---------------------------------------------------------------------------------------------
# When occurrences are created


def test_occurrence_is_created_hold_lead_plus_tolerance_before_its_start() -> None:
    # No run history: hold lead = tolerance = 1 s; created 1 + 1 = 2 s ahead.
    sim = make(pool())
    add(sim)
    advance_to(sim, 7.999)
    assert occurrences(sim) == []
    advance_to(sim, 8)
    [first] = occurrences(sim)
    assert first.fixed_start == t(10)
    assert first.status.value == "scheduled"
    advance_to(sim, 10)
    assert statuses(sim) == ["running"]
    assert lease_for(sim, first).started_at == t(10)


def test_only_one_occurrence_exists_ahead_of_time() -> None:
    sim = make(pool())
    add(sim)
    advance_to(sim, 9)
    assert starts(sim) == [10]
    advance_to(sim, 12)
    sim.complete(sim.lease_of(occurrences(sim)[0].id))
    advance_to(sim, 17.999)
    assert starts(sim) == [10]
    advance_to(sim, 18)
    assert starts(sim) == [10, 20]
    advance_to(sim, 22)
    sim.complete(sim.lease_of(occurrences(sim)[1].id))
    advance_to(sim, 27.999)
    assert starts(sim) == [10, 20]
    advance_to(sim, 28)
    assert starts(sim) == [10, 20, 30]


def test_lead_grows_with_the_tolerance() -> None:
    # Tolerance 5 s: hold lead max(5 s, p90 = 0) = 5 s, plus 5 s = 10 s ahead of 22:14:00 (40 s).
    sim = make(pool())
    add(sim, cron="0 * * * * *", tolerance=ns(5))
    advance_to(sim, 29.999)
    assert occurrences(sim) == []
    advance_to(sim, 30)
    assert starts(sim) == [40]


def test_lead_is_capped_by_max_hold() -> None:
    # Tolerance 5 s would mean 10 s ahead, but the pool's max_hold is 3 s.
    sim = make(pool(max_hold=ns(3)))
    add(sim, cron="0 * * * * *", tolerance=ns(5))
    advance_to(sim, 36.999)
    assert occurrences(sim) == []
    advance_to(sim, 37)
    assert starts(sim) == [40]


def test_lead_follows_the_regular_run_time_p90() -> None:
    sim = make(pool())
    ids = [sim.submit("history") for _ in range(2)]
    advance_to(sim, 20)
    for task_id in ids:
        sim.complete(sim.lease_of(task_id))  # regular p90: 20 s
    # Next 22:14:05 is 45 s; hold lead 20 s + tolerance 1 s: created at 24 s.
    add(sim, cron="5 * * * * *")
    advance_to(sim, 23.5)
    assert occurrences(sim) == []
    advance_to(sim, 24.5)
    assert starts(sim) == [45]


# ---------------------------------------------------------------------------------------------
# What an occurrence looks like


def test_occurrence_carries_the_recurring_tag_and_the_template() -> None:
    template = TaskSpec(
        payload={"report": 1},
        kind="rollup",
        priority=Priority.HIGH,
        tags={"team": "data"},
        duration_hint=ns(2),
        timeout=ns(30),
        retry=RetryPolicy(max_attempts=5),
        tenant="acme",
    )
    sim = make(pool())
    add(sim, name="hourly-rollup", template=template)
    advance_to(sim, 10)
    [info] = occurrences(sim, "hourly-rollup")
    assert info.tags[RECURRING_TAG] == "hourly-rollup"
    assert info.tags["team"] == "data"
    assert info.kind == "rollup"
    assert info.priority is Priority.HIGH
    assert info.pool == "default"
    assert info.max_attempts == 5
    assert info.tenant == "acme"
    lease = sim.lease_of(info.id)
    assert lease.payload == {"report": 1}
    assert lease.tags[RECURRING_TAG] == "hourly-rollup"
    assert lease.kind == "rollup"
    assert lease.timeout == ns(30)


def test_occurrence_key_is_template_key_at_rfc3339_utc_start() -> None:
    sim = make(pool())
    add(sim, template=TaskSpec(payload="x", key="rollup"), overlap=OverlapPolicy.ALLOW)
    advance_to(sim, 25)
    infos = occurrences(sim)
    assert len(infos) == 2
    for info, start in zip(infos, (t(10), t(20)), strict=True):
        assert info.key is not None
        base, _, stamp = info.key.partition("@")
        assert base == "rollup"
        parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        offset = parsed.utcoffset()
        assert offset is not None and offset.total_seconds() == 0
        assert parsed == datetime.fromtimestamp(start // 10**9, tz=UTC)
    assert infos[0].key == "rollup@2023-11-14T22:13:30Z"
    assert sim.core.get("rollup@2023-11-14T22:13:40Z") is not None


def test_occurrences_without_a_template_key_have_no_key() -> None:
    sim = make(pool())
    add(sim)
    advance_to(sim, 10)
    [info] = occurrences(sim)
    assert info.key is None


def test_deadline_after_is_relative_to_each_start() -> None:
    sim = make(pool())
    add(sim, deadline_after=ns(30), overlap=OverlapPolicy.ALLOW)
    advance_to(sim, 25)
    infos = occurrences(sim)
    assert [info.deadline for info in infos] == [t(40), t(50)]
    assert sim.lease_of(infos[0].id).deadline == t(40)


def test_occurrence_tolerance_and_miss_policy_come_from_the_schedule() -> None:
    sim = make(pool(1))
    blocker = sim.submit("blocker")
    add(sim, tolerance=ns(2), on_miss=MissPolicy.SKIP)
    advance_to(sim, 11.999)
    assert statuses(sim) == ["ready"]
    advance_to(sim, 12.001)
    assert statuses(sim) == ["missed"]
    sim.complete(sim.lease_of(blocker))


def test_occurrence_is_a_fixed_start_task_that_gets_a_held_slot() -> None:
    sim = make(pool(1))
    blocker = sim.submit("blocker")
    queued = sim.submit("queued", priority=Priority.CRITICAL)
    add(sim)
    advance_to(sim, 9.5)  # inside the hold lead (1 s)
    sim.complete(sim.lease_of(blocker))
    assert sim.status(queued) == "ready"
    advance_to(sim, 10)
    [info] = occurrences(sim)
    assert lease_for(sim, info).started_at == t(10)
    snap = sim.core.snapshot(sim.now).pool("default")
    assert snap is not None and snap.fixed_start_hit_rate == 1.0


# ---------------------------------------------------------------------------------------------
# Overlap


def test_skip_skips_an_occurrence_while_the_previous_one_runs() -> None:
    sim = make(pool())
    add(sim, overlap=OverlapPolicy.SKIP)
    advance_to(sim, 20)
    assert statuses(sim) == ["running", "skipped"]
    first = occurrences(sim)[0]
    assert sim.core.totals["skipped"] == 1
    advance_to(sim, 25)
    sim.complete(sim.lease_of(first.id))
    advance_to(sim, 30)
    assert statuses(sim) == ["succeeded", "skipped", "running"]


def test_skip_is_the_default_overlap_policy() -> None:
    sim = make(pool())
    add(sim)
    advance_to(sim, 20)
    assert statuses(sim) == ["running", "skipped"]


def test_skip_runs_the_occurrence_when_the_previous_one_finished_before_its_start() -> None:
    # The previous occurrence is still running when the next one is created (18 s) but has
    # finished by the next one's start (20 s): there is no overlap, so it runs.
    sim = make(pool())
    add(sim, overlap=OverlapPolicy.SKIP)
    advance_to(sim, 18.5)
    first = occurrences(sim)[0]
    sim.complete(sim.lease_of(first.id))
    advance_to(sim, 20)
    assert statuses(sim) == ["succeeded", "running"]


def test_allow_runs_occurrences_concurrently() -> None:
    sim = make(pool())
    add(sim, overlap=OverlapPolicy.ALLOW)
    advance_to(sim, 20)
    assert statuses(sim) == ["running", "running"]
    assert [lease.started_at for lease in sim.running.values()] == [t(10), t(20)]


def test_queue_waits_for_the_previous_occurrence_to_complete() -> None:
    sim = make(pool())
    add(sim, overlap=OverlapPolicy.QUEUE)
    advance_to(sim, 20)
    assert statuses(sim) == ["running", "blocked"]
    advance_to(sim, 24)
    first, second = occurrences(sim)
    sim.complete(sim.lease_of(first.id))
    assert sim.status(second.id) == "running"
    assert sim.info(second.id).started_at == t(24)


def test_queue_runs_after_a_failed_previous_occurrence() -> None:
    sim = make(pool())
    add(sim, overlap=OverlapPolicy.QUEUE, template=TaskSpec(payload="job", retry=RetryPolicy.none()))
    advance_to(sim, 20)
    first, second = occurrences(sim)
    advance_to(sim, 24)
    sim.fail(sim.lease_of(first.id), permanent=True)
    assert sim.status(first.id) == "failed"
    assert sim.status(second.id) == "running"


def test_queue_on_success_runs_after_a_successful_previous_occurrence() -> None:
    sim = make(pool())
    add(sim, overlap=OverlapPolicy.QUEUE_ON_SUCCESS)
    advance_to(sim, 20)
    first, second = occurrences(sim)
    assert sim.status(second.id) == "blocked"
    advance_to(sim, 24)
    sim.complete(sim.lease_of(first.id))
    assert sim.status(second.id) == "running"


def test_queue_on_success_skips_after_a_failed_previous_occurrence() -> None:
    sim = make(pool())
    add(sim, overlap=OverlapPolicy.QUEUE_ON_SUCCESS, template=TaskSpec(payload="job", retry=RetryPolicy.none()))
    advance_to(sim, 20)
    first, second = occurrences(sim)
    advance_to(sim, 24)
    sim.fail(sim.lease_of(first.id), permanent=True)
    assert sim.status(second.id) == "skipped"


def test_queued_occurrence_waiting_past_its_tolerance_follows_the_miss_policy() -> None:
    sim = make(pool())
    add(sim, overlap=OverlapPolicy.QUEUE, on_miss=MissPolicy.SKIP)
    advance_to(sim, 21.5)
    first, second = occurrences(sim)
    assert sim.status(second.id) == "missed"
    assert sim.status(first.id) == "running"


def test_queue_without_a_running_previous_occurrence_starts_on_time() -> None:
    sim = make(pool())
    add(sim, overlap=OverlapPolicy.QUEUE)
    advance_to(sim, 12)
    first = occurrences(sim)[0]
    sim.complete(sim.lease_of(first.id))
    advance_to(sim, 20)
    assert statuses(sim) == ["succeeded", "running"]
    assert sim.info(occurrences(sim)[1].id).started_at == t(20)


# ---------------------------------------------------------------------------------------------
# Template validation


@pytest.mark.parametrize(
    "template",
    [
        TaskSpec(payload="x", deadline=START + ns(100)),
        TaskSpec(payload="x", fixed_start=FixedStart(START + ns(100))),
        TaskSpec(payload="x", deps=(Dep("other"),)),
        TaskSpec(payload="x", pool="nowhere"),
        TaskSpec(payload="x", resources={"tpu": 1}),
        TaskSpec(payload="x", resources={"gpu": 3}),
        TaskSpec(payload="x", retry=RetryPolicy(max_attempts=0)),
    ],
    ids=["deadline", "fixed-start", "deps", "unknown-pool", "unknown-resource", "too-much-resource", "no-attempts"],
)
def test_invalid_templates_are_rejected(template: TaskSpec) -> None:
    sim = make(pool(), resources=(ResourceConfig.semaphore("gpu", 2),))
    with pytest.raises(ConfigError):
        sim.core.add_recurring(sim.now, RecurringSpec("bad", EVERY_10S, template))
    assert sim.core.list_recurring() == []
    advance_to(sim, 30)
    assert sim.core.totals["submitted"] == 0


@pytest.mark.parametrize("cron,tz", [("not a cron", None), ("*/10 * * * * *", "Mars/Olympus")])
def test_invalid_cron_or_zone_is_rejected(cron: str, tz: str | None) -> None:
    sim = make(pool())
    with pytest.raises(ConfigError):
        sim.core.add_recurring(sim.now, RecurringSpec("bad", cron, TaskSpec(payload="x"), tz=tz))
    assert sim.core.list_recurring() == []


def test_valid_template_with_pool_and_resource_is_accepted() -> None:
    sim = make(
        pool(), PoolConfig("batch", max_workers=2, initial_workers=2), resources=(ResourceConfig.semaphore("gpu", 2),)
    )
    add(sim, template=TaskSpec(payload="x", pool="batch", resources={"gpu": 2}))
    [info] = sim.core.list_recurring()
    assert info.pool == "batch" and info.armed
    advance_to(sim, 10)
    [occurrence] = occurrences(sim)
    assert occurrence.pool == "batch" and occurrence.status.value == "running"


# ---------------------------------------------------------------------------------------------
# Replacing and removing schedules


@pytest.mark.parametrize("key", [None, "job"])
def test_replacing_a_schedule_does_not_duplicate_a_created_occurrence(key: str | None) -> None:
    sim = make(pool())
    add(sim, template=TaskSpec(payload="v1", key=key))
    advance_to(sim, 9)
    assert starts(sim) == [10]
    add(sim, template=TaskSpec(payload="v2", key=key))  # same name: replaces
    assert len(sim.core.list_recurring()) == 1
    advance_to(sim, 10)
    assert starts(sim) == [10]
    assert sim.order() == ["v1"]
    first = occurrences(sim)[0]
    sim.complete(sim.lease_of(first.id))
    advance_to(sim, 20)
    assert starts(sim) == [10, 20]
    assert sim.order() == ["v1", "v2"]


def test_replacing_a_schedule_keeps_the_overlap_guard() -> None:
    sim = make(pool())
    add(sim, template=TaskSpec(payload="v1"))
    advance_to(sim, 12)  # first occurrence running
    add(sim, template=TaskSpec(payload="v2"))
    advance_to(sim, 20)
    assert statuses(sim) == ["running", "skipped"]


def test_remove_stops_new_occurrences_but_keeps_a_created_one() -> None:
    sim = make(pool())
    add(sim)
    advance_to(sim, 9)
    assert starts(sim) == [10]
    assert sim.core.remove_recurring(sim.now, "job") is True
    sim.step()
    assert sim.core.list_recurring() == []
    advance_to(sim, 10)
    assert statuses(sim) == ["running"]
    first = occurrences(sim)[0]
    sim.complete(sim.lease_of(first.id))
    advance_to(sim, 60)
    assert starts(sim) == [10]
    assert statuses(sim) == ["succeeded"]
    assert sim.core.remove_recurring(sim.now, "job") is False


def test_list_recurring_reports_the_next_occurrence() -> None:
    sim = make(pool())
    add(sim, name="a")
    add(sim, name="b", cron="0 * * * * *", overlap=OverlapPolicy.QUEUE)
    infos = {info.name: info for info in sim.core.list_recurring()}
    assert infos["a"].next_at == t(10)
    assert infos["b"].next_at == t(40)
    assert infos["b"].overlap is OverlapPolicy.QUEUE
    assert infos["a"].armed and infos["b"].armed


# ---------------------------------------------------------------------------------------------
# Reservations


def test_occurrence_that_cannot_be_reserved_is_not_created() -> None:
    sim = make(pool(2))  # one reservation at a time
    other = sim.submit("one-off", fixed_start=FixedStart(t(10)))
    add(sim)
    advance_to(sim, 17)
    assert occurrences(sim) == []
    assert sim.core.totals["recurring_conflicts"] == 1
    assert sim.status(other) == "running"
    advance_to(sim, 20)
    assert starts(sim) == [20]  # the next one fits
    assert sim.core.totals["recurring_conflicts"] == 1


def test_occurrence_reservation_blocks_a_conflicting_submission() -> None:
    sim = make(pool(2))
    add(sim)
    advance_to(sim, 8.5)
    assert starts(sim) == [10]
    with pytest.raises(AdmissionError) as caught:
        sim.submit("one-off", fixed_start=FixedStart(t(10)))
    assert caught.value.code is SubmitCode.RESERVATION_CONFLICT


# ---------------------------------------------------------------------------------------------
# Time zones


def test_cron_in_a_time_zone() -> None:
    # 02:30 in New York on 2023-11-15 (EST, UTC-5) is 07:30Z.
    sim = make(pool())
    add(sim, cron="0 30 2 * * *", tz="America/New_York", template=TaskSpec(payload="x", key="nightly"))
    expected = int(datetime(2023, 11, 15, 7, 30, tzinfo=UTC).timestamp()) * 10**9
    [info] = sim.core.list_recurring()
    assert info.next_at == expected
    assert info.tz == "America/New_York"
    sim.advance((expected - sim.now) / 1e9)
    [occurrence] = occurrences(sim)
    assert occurrence.fixed_start == expected
    assert occurrence.key == "nightly@2023-11-15T07:30:00Z"
    assert sim.info(occurrence.id).started_at == expected
    [info] = sim.core.list_recurring()
    assert info.next_at == expected + 86_400 * 10**9


def test_cron_defaults_to_utc() -> None:
    sim = make(pool())
    add(sim, cron="0 30 2 * * *")
    expected = int(datetime(2023, 11, 15, 2, 30, tzinfo=UTC).timestamp()) * 10**9
    assert sim.core.list_recurring()[0].next_at == expected


def test_five_field_cron_fires_on_whole_minutes() -> None:
    sim = make(pool())
    add(sim, cron="*/5 * * * *")  # minute, hour, day, month, weekday
    assert sim.core.list_recurring()[0].next_at == t(100)  # 22:15:00
