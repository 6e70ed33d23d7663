"""cronoq.compat: the synchronous ElasticPriorityScheduler stand-in on the native scheduler."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from cronoq import compat
from cronoq.compat import ElasticPriorityScheduler, Priority, QualityMetrics, ScalingConfig, ScheduledTask, Task

WAIT_LIMIT = 20.0  # a guard against hanging, not a performance expectation


def wait_for(condition: Callable[[], bool], what: str) -> None:
    give_up = time.monotonic() + WAIT_LIMIT
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def make_scheduler() -> Iterator[Callable[..., ElasticPriorityScheduler]]:
    made: list[ElasticPriorityScheduler] = []

    def make(**kwargs: object) -> ElasticPriorityScheduler:
        sched = ElasticPriorityScheduler(**kwargs)  # type: ignore[arg-type]
        made.append(sched)
        return sched

    yield make
    for sched in made:
        sched.stop()


def completed_ids(sched: ElasticPriorityScheduler) -> list[str]:
    return [done.task.id for done in sched.completed_tasks]


def compat_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == compat.THREAD_NAME]


# ----------------------------------------------------------------------------------------------
# The public surface


def test_public_surface() -> None:
    assert sorted(compat.__all__) == sorted(
        ["ElasticPriorityScheduler", "Priority", "QualityMetrics", "ScalingConfig", "ScheduledTask", "Task"]
    )
    assert compat.EPSILON == 0.001
    assert compat.FIXED_SCHEDULE_BUFFER_SECONDS == 1.0
    assert compat.RESERVABLE_FRACTION == 0.5
    assert [(p.name, int(p)) for p in Priority] == [("CRITICAL", 0), ("HIGH", 1), ("NORMAL", 2), ("LOW", 3)]

    task = Task(id="a", duration=1.0)
    assert task.priority is Priority.NORMAL
    assert task.arrival_time == 0.0
    assert task.fixed_start is None and task.deadline is None
    assert task.dependencies == [] and task.dependencies is not Task(id="b", duration=1.0).dependencies
    assert hash(task) == hash("a")
    assert len({task, Task(id="a", duration=1.0)}) == 1

    config = ScalingConfig()
    assert (config.min_workers, config.max_workers, config.cooldown_seconds) == (1, 10, 30.0)

    sched = ElasticPriorityScheduler(scale_up_threshold=0.5, scale_down_threshold=0.8)
    assert (sched.scale_up_threshold, sched.scale_down_threshold) == (0.5, 0.8)


# ----------------------------------------------------------------------------------------------
# Behaviour


def test_migration_example(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler(initial_workers=1, max_workers=4)
    sched.start()
    sched.start()  # idempotent
    assert len(compat_threads()) == 1
    assert compat_threads()[0].daemon

    assert sched.submit(Task(id="report", duration=0.05, priority=Priority.HIGH))
    assert sched.submit(Task(id="nightly", duration=0.02, fixed_start=time.time() + 0.2))
    assert sched.submit(Task(id="email", duration=0.02, dependencies=["report"]))
    wait_for(lambda: sched.completed_count == 3, "three completions")

    order = completed_ids(sched)
    assert sorted(order) == ["email", "nightly", "report"]
    assert order.index("report") < order.index("email")
    runs = {done.task.id: done for done in sched.completed_tasks}
    assert runs["email"].start_time >= runs["report"].end_time
    for done in runs.values():
        assert isinstance(done, ScheduledTask)
        assert done.worker_id >= 0
        assert done.end_time >= done.start_time
        assert done.task.arrival_time > 0  # 0 was replaced by the submission time
    assert sched.pending_tasks == []

    metrics = sched.get_metrics()
    assert isinstance(metrics, QualityMetrics)
    assert metrics.pending_count == 0
    assert metrics.worker_count >= 1
    for rate in (metrics.schedule_quality, metrics.priority_adherence, metrics.fixed_schedule_hits):
        assert 0.0 <= rate <= 1.0
    assert metrics.avg_wait_time >= 0.0
    assert sched.get_cost() > 0.0

    sched.stop()
    sched.stop()  # idempotent
    assert compat_threads() == []
    assert sched.get_metrics().worker_count == 0
    assert sched.get_cost() > 0.0  # the cost of the finished run is kept


def test_priorities_with_one_worker(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler(initial_workers=1, max_workers=1)
    # Queued before start, they reach the engine together: the single worker takes them by class.
    for name, priority in (
        ("low", Priority.LOW),
        ("normal", Priority.NORMAL),
        ("high", Priority.HIGH),
        ("critical", Priority.CRITICAL),
    ):
        assert sched.submit(Task(id=name, duration=0.02, priority=priority))
    assert sched.completed_count == 0
    assert [t.id for t in sched.pending_tasks] == ["low", "normal", "high", "critical"]
    sched.start()
    wait_for(lambda: sched.completed_count == 4, "four completions")
    assert completed_ids(sched) == ["critical", "high", "normal", "low"]
    assert {done.worker_id for done in sched.completed_tasks} == {0}
    assert sched.get_metrics().priority_adherence == 1.0


def test_released_dependents_start_by_priority(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler(initial_workers=1, max_workers=1)
    sched.start()
    # Nothing else can start before "gate": everything below waits for it.
    assert sched.submit(Task(id="first", duration=0.02, dependencies=["gate"], priority=Priority.LOW))
    assert sched.submit(Task(id="second", duration=0.02, dependencies=["gate"], priority=Priority.CRITICAL))
    assert sched.submit(Task(id="gate", duration=0.02))
    wait_for(lambda: sched.completed_count == 3, "three completions")
    assert completed_ids(sched) == ["gate", "second", "first"]


def test_cycles_are_refused(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler()
    # Before start: the compat layer checks on its own.
    assert not sched.submit(Task(id="self", duration=0.01, dependencies=["self"]))
    assert sched.submit(Task(id="a", duration=0.01, dependencies=["b"]))
    assert sched.submit(Task(id="b", duration=0.01, dependencies=["c"]))
    assert not sched.submit(Task(id="c", duration=0.01, dependencies=["a"]))
    assert [t.id for t in sched.pending_tasks] == ["a", "b"]

    sched.start()
    assert not sched.submit(Task(id="x", duration=0.01, dependencies=["b", "x"]))
    assert not sched.submit(Task(id="c", duration=0.01, dependencies=["a"]))
    # The refused ids were not taken: "c" can still come, without the cycle, and release the chain.
    assert sched.submit(Task(id="c", duration=0.01))
    wait_for(lambda: sched.completed_count == 3, "the chain")
    assert completed_ids(sched) == ["c", "b", "a"]


def test_fixed_start_conflict_is_refused(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler(initial_workers=1, max_workers=1)  # one reservable worker
    sched.start()
    start = time.time() + 3600.0
    assert sched.submit(Task(id="first", duration=0.05, fixed_start=start))
    assert not sched.submit(Task(id="overlapping", duration=0.05, fixed_start=start + 0.5))
    assert sched.submit(Task(id="later", duration=0.05, fixed_start=start + 60.0))
    assert sorted(t.id for t in sched.pending_tasks) == ["first", "later"]


def test_queued_fixed_start_conflict_is_dropped_on_start(
    make_scheduler: Callable[..., ElasticPriorityScheduler],
) -> None:
    sched = make_scheduler(initial_workers=1, max_workers=1)
    start = time.time() + 3600.0
    # While stopped there is no engine to ask: both are queued, and the engine decides on start().
    assert sched.submit(Task(id="first", duration=0.05, fixed_start=start))
    assert sched.submit(Task(id="clash", duration=0.05, fixed_start=start))
    assert sched.submit(Task(id="plain", duration=0.01))
    sched.start()
    wait_for(lambda: sched.completed_count == 1, "the plain task")
    assert completed_ids(sched) == ["plain"]
    assert [t.id for t in sched.pending_tasks] == ["first"]


def test_deadlines_are_passed_through(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler()
    sched.start()
    now = time.time()
    assert sched.submit(Task(id="overdue", duration=0.01, deadline=now - 10.0))
    assert sched.submit(Task(id="soon", duration=0.01, deadline=now + 5.0))
    wait_for(lambda: sched.completed_count == 2, "both tasks")  # a deadline is soft: late work still runs
    assert sorted(completed_ids(sched)) == ["overdue", "soon"]
    assert 0.0 <= sched.get_metrics().schedule_quality <= 1.0


def test_invalid_tasks_are_refused(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler()
    assert not sched.submit(Task(id="nan", duration=float("nan")))
    assert not sched.submit(Task(id="prio", duration=0.01, priority=9))  # type: ignore[arg-type]
    assert sched.pending_tasks == []


def test_pending_id_is_not_submitted_twice(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler()
    original = Task(id="job", duration=0.02, arrival_time=123.0)
    assert sched.submit(original)
    assert sched.submit(Task(id="job", duration=5.0))  # no-op: still pending
    assert sched.pending_tasks == [original]
    assert original.arrival_time == 123.0  # a non-zero arrival time is kept
    sched.start()
    wait_for(lambda: sched.completed_count == 1, "the job")
    assert sched.completed_tasks[0].task is original


def test_stop_keeps_unfinished_tasks_for_the_next_start(
    make_scheduler: Callable[..., ElasticPriorityScheduler],
) -> None:
    sched = make_scheduler(initial_workers=1, max_workers=1)
    sched.start()
    names = [f"t{i}" for i in range(6)]
    for name in names:
        assert sched.submit(Task(id=name, duration=0.05))
    assert sched.submit(Task(id="blocked", duration=0.01, dependencies=["gate"]))
    wait_for(lambda: sched.completed_count >= 1, "a first completion")
    sched.stop()
    assert compat_threads() == []

    done = set(completed_ids(sched))
    pending = {t.id for t in sched.pending_tasks}
    assert "blocked" in pending
    assert done.isdisjoint(pending)
    assert done | pending == {*names, "blocked"}
    assert sched.get_metrics().pending_count == len(pending)

    # Submitted while stopped: queued until the next start.
    assert sched.submit(Task(id="gate", duration=0.01))
    sched.start()
    wait_for(lambda: sched.completed_count == len(names) + 2, "every task")
    counts = Counter(completed_ids(sched))
    assert counts == Counter({*names, "blocked", "gate"})
    order = completed_ids(sched)
    assert order.index("gate") < order.index("blocked")
    assert sched.pending_tasks == []


def test_dependency_completed_before_a_restart(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler()
    sched.start()
    assert sched.submit(Task(id="parent", duration=0.01))
    wait_for(lambda: sched.completed_count == 1, "the parent")
    sched.stop()
    # The new engine never saw "parent"; the edge is already satisfied and must not wait for it.
    assert sched.submit(Task(id="child", duration=0.01, dependencies=["parent"]))
    sched.start()
    wait_for(lambda: sched.completed_count == 2, "the child")
    assert completed_ids(sched) == ["parent", "child"]


def test_submissions_from_many_threads(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler(initial_workers=2, max_workers=8)
    sched.start()
    threads_n, per_thread = 8, 25
    results: list[bool] = []
    results_lock = threading.Lock()
    barrier = threading.Barrier(threads_n)

    def producer(n: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            ok = sched.submit(Task(id=f"w{n}-{i}", duration=0.002, priority=Priority(i % 4)))
            with results_lock:
                results.append(ok)
            sched.pending_tasks  # noqa: B018 - concurrent reads alongside the writes
            sched.completed_count  # noqa: B018

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * (threads_n * per_thread)
    wait_for(lambda: sched.completed_count == threads_n * per_thread, "every task")
    counts = Counter(completed_ids(sched))
    assert len(counts) == threads_n * per_thread
    assert set(counts.values()) == {1}
    assert sched.pending_tasks == []
    # Slots are reused: no more slot numbers than the pool's maximum size.
    assert max(done.worker_id for done in sched.completed_tasks) < 8


def test_resubmitting_a_completed_id_runs_it_again(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler()
    sched.start()
    assert sched.submit(Task(id="again", duration=0.01))
    wait_for(lambda: sched.completed_count == 1, "the first run")
    assert sched.submit(Task(id="again", duration=0.01))
    wait_for(lambda: sched.completed_count == 2, "the second run")
    assert sched.submit(Task(id="again", duration=0.01))
    # A dependent of a re-submitted id waits for the run that is pending.
    assert sched.submit(Task(id="after", duration=0.01, dependencies=["again"]))
    wait_for(lambda: sched.completed_count == 4, "the third run and its dependent")
    assert completed_ids(sched) == ["again", "again", "again", "after"]
    first, second, third, _ = sched.completed_tasks
    assert first.end_time <= second.start_time <= third.start_time


def test_completed_tasks_are_copies(make_scheduler: Callable[..., ElasticPriorityScheduler]) -> None:
    sched = make_scheduler()
    sched.start()
    assert sched.submit(Task(id="one", duration=0.01))
    wait_for(lambda: sched.completed_count == 1, "the task")
    copy = sched.completed_tasks[0]
    copy.worker_id = 99
    sched.completed_tasks.clear()
    assert sched.completed_tasks[0].worker_id != 99
    sched.pending_tasks.append(Task(id="nope", duration=1.0))
    assert sched.pending_tasks == []
