"""The package surface of the fact sheet: exports, signatures, option types and exceptions."""

from __future__ import annotations

import inspect
import pickle

import pytest

import cronoq
import cronoq.errors

EXPORTS = {
    "AutoscaleConfig",
    "Codec",
    "CronoqError",
    "Dep",
    "EventStream",
    "EventsLagged",
    "JsonCodec",
    "Permanent",
    "Pool",
    "PoolSnapshot",
    "Priority",
    "Resource",
    "Retryable",
    "RetryPolicy",
    "Scheduler",
    "SchedulerError",
    "Snapshot",
    "SqliteStore",
    "StatusEvent",
    "SubmitError",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskHandle",
    "__version__",
}

TASK_OPTIONS = [
    "priority",
    "pool",
    "kind",
    "key",
    "deadline_in",
    "deadline_at",
    "start_in",
    "start_at",
    "tolerance",
    "on_miss",
    "duration_hint",
    "timeout",
    "retry",
    "after",
    "deps",
    "resources",
    "tags",
    "labels",
    "tenant",
]


def test_exports() -> None:
    assert set(cronoq.__all__) == EXPORTS
    for name in EXPORTS:
        assert getattr(cronoq, name) is not None
    assert isinstance(cronoq.__version__, str)
    with pytest.raises(AttributeError):
        cronoq.does_not_exist  # noqa: B018
    for name in (
        "CronoqError",
        "SubmitError",
        "SchedulerError",
        "TaskFailed",
        "EventsLagged",
        "Retryable",
        "Permanent",
    ):
        assert getattr(cronoq, name) is getattr(cronoq.errors, name)


def _keyword_only(fn: object) -> list[str]:
    return [
        p.name
        for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]


def test_task_option_signatures() -> None:
    assert _keyword_only(cronoq.Scheduler.submit) == TASK_OPTIONS
    assert _keyword_only(cronoq.Scheduler.enqueue) == TASK_OPTIONS
    assert _keyword_only(cronoq.Task) == TASK_OPTIONS
    for fn in (cronoq.Scheduler.submit, cronoq.Scheduler.enqueue, cronoq.Task):
        assert all(inspect.signature(fn).parameters[name].default is None for name in TASK_OPTIONS)
    recurring = _keyword_only(cronoq.Scheduler.add_recurring)
    assert recurring == [
        "tz",
        "overlap",
        "tolerance",
        "on_miss",
        "priority",
        "pool",
        "kind",
        "key",
        "deadline_in",
        "duration_hint",
        "timeout",
        "retry",
        "resources",
        "tags",
        "labels",
        "tenant",
    ]
    params = inspect.signature(cronoq.Scheduler.add_recurring).parameters
    assert (params["overlap"].default, params["tolerance"].default, params["on_miss"].default) == (
        "skip",
        1.0,
        "run_late",
    )


def test_scheduler_signature() -> None:
    params = inspect.signature(cronoq.Scheduler).parameters
    assert list(params) == [
        "pools",
        "resources",
        "emit_transitions",
        "shutdown_grace",
        "event_capacity",
        "store",
        "codec",
    ]
    assert params["resources"].default is None
    assert params["emit_transitions"].default is False
    assert params["shutdown_grace"].default == 5.0
    assert params["event_capacity"].default == 1024
    assert inspect.signature(cronoq.Scheduler.shutdown).parameters["grace"].default == 5.0
    assert inspect.signature(cronoq.Scheduler.events).parameters["on_lag"].default == "skip"


def test_pool_signature_and_defaults() -> None:
    params = inspect.signature(cronoq.Pool).parameters
    expected = {
        "min": 1,
        "max": 10,
        "initial": None,
        "autoscale": None,
        "lease_ttl": None,
        "max_pending": None,
        "overflow": "wait",
        "retry": None,
        "unknown_dependency": "reject",
        "await_timeout": None,
        "default_duration": 1.0,
        "reservable_fraction": 0.5,
        "tenant_weights": None,
        "fair_share": False,
    }
    assert list(params) == ["name", "executor", *expected]
    for name, default in expected.items():
        assert params[name].default == default
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
    pool = cronoq.Pool("p", lambda ctx, x: x)
    assert pool.name == "p"


def test_retry_policy() -> None:
    policy = cronoq.RetryPolicy()
    assert (policy.max_attempts, policy.initial_backoff, policy.multiplier, policy.max_backoff, policy.jitter) == (
        3,
        1.0,
        2.0,
        60.0,
        True,
    )
    assert cronoq.RetryPolicy.none().max_attempts == 1
    assert cronoq.RetryPolicy(5, 0.5) == cronoq.RetryPolicy(max_attempts=5, initial_backoff=0.5)


def test_autoscale_config_defaults() -> None:
    names = [
        "interval",
        "target_utilization",
        "drain_time",
        "slo",
        "reservation_horizon",
        "stabilization_window",
        "cooldown",
        "max_step_up_abs",
        "max_step_down",
        "cost_per_worker_second",
    ]
    assert list(inspect.signature(cronoq.AutoscaleConfig).parameters) == names
    config = cronoq.AutoscaleConfig()
    assert (
        config.interval,
        config.target_utilization,
        config.drain_time,
        config.slo,
        config.reservation_horizon,
        config.stabilization_window,
        config.cooldown,
        config.max_step_up_abs,
        config.max_step_down,
        config.cost_per_worker_second,
    ) == (1.0, 0.75, 30.0, {}, 60.0, 60.0, 30.0, 4, 1, 0.0)
    assert cronoq.AutoscaleConfig(slo={cronoq.Priority.HIGH: 2, 0: 0.5}).slo == {"high": 2.0, "critical": 0.5}


def test_priority() -> None:
    # The published enum's member names; strings naming a priority stay case-insensitive.
    assert [
        p.name for p in (cronoq.Priority.CRITICAL, cronoq.Priority.HIGH, cronoq.Priority.NORMAL, cronoq.Priority.LOW)
    ] == ["CRITICAL", "HIGH", "NORMAL", "LOW"]
    assert [p.value for p in cronoq.Priority] == [int(p) for p in cronoq.Priority] == [0, 1, 2, 3]
    for spelling in ("high", "HIGH", "High", 1, cronoq.Priority.HIGH):
        cronoq.Task(None, priority=spelling)  # accepted
        assert cronoq.AutoscaleConfig(slo={spelling: 1.0}).slo == {"high": 1.0}
    assert cronoq.Priority.CRITICAL < cronoq.Priority.LOW
    assert len({cronoq.Priority.HIGH, cronoq.Priority.HIGH}) == 1


def test_task_and_dep_and_resource() -> None:
    task = cronoq.Task({"x": 1}, key="k", priority="high")
    assert task.payload == {"x": 1} and task.key == "k"
    assert cronoq.Task(2).key is None
    cronoq.Dep("a")
    cronoq.Dep(12, on="complete")
    for cond in ("success", "failure", "complete", "on_success", "on_failure", "on_complete"):
        cronoq.Dep("a", on=cond)  # type: ignore[arg-type]
    assert "gpu" in repr(cronoq.Resource.semaphore("gpu", 2))
    assert "openai" in repr(cronoq.Resource.token_bucket("openai", rate=50.0, burst=100))


# ----------------------------------------------------------------------------------------------
# Exceptions


def test_exception_hierarchy() -> None:
    for cls in (
        cronoq.SubmitError,
        cronoq.SchedulerError,
        cronoq.TaskFailed,
        cronoq.EventsLagged,
        cronoq.Retryable,
        cronoq.Permanent,
    ):
        assert issubclass(cls, cronoq.CronoqError)
    assert issubclass(cronoq.CronoqError, Exception)
    assert set(cronoq.errors.__all__) == {
        "CronoqError",
        "SubmitError",
        "SchedulerError",
        "TaskFailed",
        "EventsLagged",
        "Retryable",
        "Permanent",
    }


def test_exception_fields_and_messages() -> None:
    submit = cronoq.SubmitError("unknown_pool", "unknown pool 'x'")
    assert (submit.code, submit.message, str(submit)) == ("unknown_pool", "unknown pool 'x'", "unknown pool 'x'")
    failed = cronoq.TaskFailed("dead_lettered", "boom", 17)
    assert (failed.status, failed.message, failed.task_id) == ("dead_lettered", "boom", 17)
    assert str(failed) == "task 17 ended as dead_lettered: boom"
    assert cronoq.TaskFailed("shutdown", "stopped").task_id is None
    lagged = cronoq.EventsLagged(5)
    assert lagged.skipped == 5 and "5" in str(lagged)
    retry = cronoq.Retryable("429", retry_after=2.5)
    assert (str(retry), retry.retry_after) == ("429", 2.5)
    assert cronoq.Retryable().retry_after is None and str(cronoq.Retryable()) == ""
    assert cronoq.Retryable._cronoq_kind == "retryable"
    assert cronoq.Permanent._cronoq_kind == "permanent"
    assert str(cronoq.Permanent("bad")) == "bad"


@pytest.mark.parametrize(
    "error",
    [
        cronoq.CronoqError("base"),
        cronoq.SubmitError("cycle", "task 2: dependencies would form a cycle"),
        cronoq.SchedulerError("the scheduler is shut down"),
        cronoq.TaskFailed("failed", "bad request", 99),
        cronoq.TaskFailed("shutdown", "stopped first", None),
        cronoq.EventsLagged(3),
        cronoq.Retryable("rate limited", retry_after=1.5),
        cronoq.Retryable(),
        cronoq.Permanent("bad request"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_every_exception_pickles(error: cronoq.CronoqError) -> None:
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        copy = pickle.loads(pickle.dumps(error, protocol=protocol))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
        assert copy.args == error.args
        for name in ("code", "message", "status", "task_id", "skipped", "retry_after"):
            assert getattr(copy, name, None) == getattr(error, name, None)


def test_submit_errors_from_the_scheduler_pickle() -> None:
    error = cronoq.SubmitError("overloaded", "pool 'default' is overloaded")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, copy.message) == ("overloaded", "pool 'default' is overloaded")


async def test_errors_raised_by_the_scheduler_pickle() -> None:
    async def run(ctx: cronoq.TaskContext, payload: object) -> None:
        raise cronoq.Permanent("bad request")

    caught: list[BaseException] = []
    async with cronoq.Scheduler([cronoq.Pool("default", run)]) as sched:
        for call in (lambda: sched.submit(1, timeout=-1.0), lambda: sched.submit(1, pool="nope")):
            try:
                await call()
            except cronoq.SubmitError as err:
                caught.append(err)
        try:
            await (await sched.submit(1))
        except cronoq.TaskFailed as err:
            caught.append(err)
    try:
        await sched.submit(1)
    except cronoq.SchedulerError as err:
        caught.append(err)
    assert len(caught) == 4
    invalid = caught[0]
    assert isinstance(invalid, ValueError) and isinstance(invalid, cronoq.SubmitError)
    assert invalid.code == "invalid"  # type: ignore[attr-defined]
    for error in caught:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
        for name in ("code", "message", "status", "task_id"):
            assert getattr(copy, name, None) == getattr(error, name, None)
