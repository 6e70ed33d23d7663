"""The embedded API refuses invalid values when a value object is built, as the published package
does: ``ValueError`` for a bad value, ``TypeError`` for a wrong type, before any scheduler runs.

Spec: python-api.md (value objects and their parameters; ``Priority`` members ``CRITICAL``..
``LOW``), book "Python API" (durations are seconds; invalid durations or configuration, negative,
NaN or out of range, raise ValueError; absolute times are a datetime or Unix seconds).
"""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any

import pytest

import cronoq

NAN, INF = math.nan, math.inf


async def echo(ctx: cronoq.TaskContext, payload: Any) -> Any:
    return payload


@pytest.mark.parametrize(
    "options",
    [
        {"start_in": 5.0, "start_at": time.time() + 5},
        {"deadline_in": 5.0, "deadline_at": time.time() + 5},
        {"timeout": -1.0},
        {"timeout": 0.0},
        {"timeout": NAN},
        {"deadline_in": NAN},
        {"deadline_in": INF},
        {"deadline_in": -1.0},
        {"deadline_at": NAN},
        {"deadline_at": -INF},
        {"deadline_at": -1.0},  # before 1970
        {"deadline_at": 1e300},  # after 2262
        {"deadline_at": dt.datetime(1969, 12, 31, tzinfo=dt.UTC)},
        {"start_at": dt.datetime(2300, 1, 1, tzinfo=dt.UTC)},
        {"start_at": dt.datetime(2030, 1, 1)},  # naive
        {"start_in": 1e308},
        {"duration_hint": -0.5},
        {"start_in": 1.0, "tolerance": -1.0},
        {"tolerance": 1.0},  # a tolerance without a start
        {"on_miss": "skip"},  # an on_miss without a start
        {"start_in": 1.0, "on_miss": "sometimes"},
        {"priority": "urgent"},
        {"priority": 7},
        {"priority": -1},
        {"key": ""},
        {"key": "nul\0"},
        {"key": "lone \ud800"},
        {"kind": "nul\0"},
        {"tags": {"t": "\udc00"}},
    ],
)
def test_task_refuses_bad_values_at_construction(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        cronoq.Task("payload", **options)


@pytest.mark.parametrize(
    "options",
    [
        {"timeout": "5"},
        {"deadline_at": "tomorrow"},
        {"retry": {"max_attempts": 3}},
        {"deps": ["a"]},
        {"after": 1.5},
        {"resources": {"gpu": 1.5}},
        {"key": 5},
    ],
)
def test_task_refuses_wrong_types_at_construction(options: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        cronoq.Task("payload", **options)


def test_task_accepts_every_edge_of_the_ranges() -> None:
    cronoq.Task(1, start_at=dt.datetime(2262, 1, 1, tzinfo=dt.UTC), tolerance=0.0, on_miss="fail")
    cronoq.Task(1, deadline_at=0.0, timeout=100 * 365 * 86400.0, duration_hint=0.0)
    cronoq.Task(1, priority="HIGH")
    cronoq.Task(1, priority="low")
    cronoq.Task(1, priority=cronoq.Priority.CRITICAL)
    cronoq.Task(1, retry=cronoq.RetryPolicy(max_attempts=2**32 - 1, multiplier=1e308, max_backoff=0.0))
    cronoq.Task(1, after=[2**64 - 1, "parent"], key="ünïcode ✓")


@pytest.mark.parametrize(
    "make",
    [
        lambda: cronoq.Pool("p", echo, min=5, max=2),
        lambda: cronoq.Pool("p", echo, max=0),
        lambda: cronoq.Pool("p", echo, max=-1),
        lambda: cronoq.Pool("p", echo, min=-1),
        lambda: cronoq.Pool("p", echo, max=2**32),
        lambda: cronoq.Pool("p", echo, initial=11),
        lambda: cronoq.Pool("p", echo, reservable_fraction=2.0),
        lambda: cronoq.Pool("p", echo, reservable_fraction=-0.1),
        lambda: cronoq.Pool("p", echo, reservable_fraction=NAN),
        lambda: cronoq.Pool("p", echo, lease_ttl=0.0),
        lambda: cronoq.Pool("p", echo, lease_ttl=INF),
        lambda: cronoq.Pool("p", echo, await_timeout=-1.0),
        lambda: cronoq.Pool("p", echo, default_duration=-1.0),
        lambda: cronoq.Pool("p", echo, max_pending=-1),
        lambda: cronoq.Pool("p", echo, overflow="drop"),
        lambda: cronoq.Pool("p", echo, unknown_dependency="maybe"),
        lambda: cronoq.Pool("p", echo, tenant_weights={"a": 0.0}),
        lambda: cronoq.Pool("p", echo, tenant_weights={"a": NAN}),
        lambda: cronoq.Pool("p", echo, tenant_weights={"a": INF}),
        lambda: cronoq.Pool("", echo),
        lambda: cronoq.Pool("nul\0", echo),
        lambda: cronoq.RetryPolicy(max_attempts=0),
        lambda: cronoq.RetryPolicy(max_attempts=2**32),
        lambda: cronoq.RetryPolicy(multiplier=NAN),
        lambda: cronoq.RetryPolicy(multiplier=INF),
        lambda: cronoq.RetryPolicy(multiplier=0.5),
        lambda: cronoq.RetryPolicy(initial_backoff=-1.0),
        lambda: cronoq.RetryPolicy(max_backoff=NAN),
        lambda: cronoq.RetryPolicy(max_backoff=1e308),
        lambda: cronoq.AutoscaleConfig(interval=0.0),
        lambda: cronoq.AutoscaleConfig(target_utilization=0.0),
        lambda: cronoq.AutoscaleConfig(target_utilization=1.5),
        lambda: cronoq.AutoscaleConfig(target_utilization=NAN),
        lambda: cronoq.AutoscaleConfig(drain_time=-1.0),
        lambda: cronoq.AutoscaleConfig(cooldown=INF),
        lambda: cronoq.AutoscaleConfig(slo={"urgent": 1.0}),
        lambda: cronoq.AutoscaleConfig(slo={"high": 0.0}),
        lambda: cronoq.AutoscaleConfig(slo={"high": NAN}),
        lambda: cronoq.AutoscaleConfig(max_step_up_abs=-1),
        lambda: cronoq.AutoscaleConfig(max_step_down=-1),
        lambda: cronoq.AutoscaleConfig(cost_per_worker_second=NAN),
        lambda: cronoq.AutoscaleConfig(cost_per_worker_second=-1.0),
        lambda: cronoq.Dep(0),
        lambda: cronoq.Dep(-1),
        lambda: cronoq.Dep(2**64),
        lambda: cronoq.Dep(""),
        lambda: cronoq.Dep("a", on="sometimes"),  # type: ignore[arg-type]
        lambda: cronoq.Resource.semaphore("r", 0),
        lambda: cronoq.Resource.semaphore("r", 2**40),
        lambda: cronoq.Resource.semaphore("", 1),
        lambda: cronoq.Resource.token_bucket("r", 0.0, 1),
        lambda: cronoq.Resource.token_bucket("r", NAN, 1),
        lambda: cronoq.Resource.token_bucket("r", INF, 1),
        lambda: cronoq.Resource.token_bucket("r", 1.0, 0),
        lambda: cronoq.Scheduler([cronoq.Pool("p", echo)], shutdown_grace=-1.0),
        lambda: cronoq.Scheduler([cronoq.Pool("p", echo)], event_capacity=0),
    ],
)
def test_value_objects_refuse_bad_values_at_construction(make: Any) -> None:
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: cronoq.Pool("p", echo, min=1.5),
        lambda: cronoq.Pool("p", echo, max="10"),
        lambda: cronoq.Pool("p", echo, autoscale="yes"),
        lambda: cronoq.Pool("p", echo, retry={"max_attempts": 2}),
        lambda: cronoq.Pool(5, echo),
        lambda: cronoq.RetryPolicy(multiplier="2"),
        lambda: cronoq.AutoscaleConfig(max_step_up_abs=2.5),
        lambda: cronoq.Resource.semaphore("r", 1.5),
        lambda: cronoq.Scheduler([cronoq.Pool("p", echo)], resources=["gpu"]),
    ],
)
def test_value_objects_refuse_wrong_types(make: Any) -> None:
    with pytest.raises(TypeError):
        make()


def test_priority_members_carry_the_published_names() -> None:
    assert [p.name for p in cronoq.Priority] == ["CRITICAL", "HIGH", "NORMAL", "LOW"]
    assert cronoq.Priority.HIGH.name == "HIGH" and cronoq.Priority.HIGH.value == int(cronoq.Priority.HIGH) == 1
    assert cronoq.Priority.CRITICAL < cronoq.Priority.HIGH


async def test_scheduler_calls_refuse_bad_values() -> None:
    async with cronoq.Scheduler([cronoq.Pool("default", echo)]) as sched:
        for bad in (-1, 2**32, NAN, INF, 2.5):
            with pytest.raises(ValueError):
                await sched.set_capacity("default", bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await sched.add_recurring("job", "* * * * *", None, overlap="sometimes")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            await sched.submit(None, retry=cronoq.RetryPolicy(max_attempts=3), timeout=-1.0)
        assert (await sched.snapshot()).live_tasks == 0
        assert await sched.remove_recurring("job") is False


async def test_a_tasks_relative_times_count_from_its_submission() -> None:
    seen: list[float | None] = []

    async def record(ctx: cronoq.TaskContext, payload: Any) -> None:
        seen.append(ctx.deadline)

    task = cronoq.Task("late", deadline_in=30.0)  # built now, submitted a little later
    time.sleep(0.05)
    async with cronoq.Scheduler([cronoq.Pool("default", record)]) as sched:
        before = time.time()
        handles = await sched.submit_batch([task, task])  # one Task object, submitted twice
        await handles[0]
        await handles[1]
        after = time.time()
    assert len(seen) == 2 and all(d is not None and before + 30 <= d <= after + 30 for d in seen)
    assert handles[0].id != handles[1].id


@pytest.mark.parametrize(
    "settings",
    [
        {"lease_ttl": NAN},
        {"lease_ttl": INF, "lease_renew": 1.0},
        {"lease_renew": 0.0},
        {"lease_renew": 20.0},  # not shorter than lease_ttl
        {"lock_poll": -1.0},
        {"retention": INF},
        {"retention": 1e300},  # would not fit the store's 64-bit columns
        {"retention": -1.0},
    ],
)
def test_sqlite_store_refuses_bad_settings(settings: dict[str, float], tmp_path: Any) -> None:
    with pytest.raises(ValueError):
        cronoq.SqliteStore(tmp_path / "s.db", **settings)
