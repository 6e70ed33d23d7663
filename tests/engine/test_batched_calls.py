"""``submit_many`` and ``complete_many`` against one call per task.

Two engines with the same configuration play the same random rounds: one submits and completes
task by task, the other hands each round's tasks and reports over in one call. Every answer
(ids, duplicates, refusals with their code and message), every step's output (mutations,
dispatches, aborts, resolutions, events) and the final listings must be the same. The rounds mix
valid and refused submissions (unknown pools and resources, malformed kinds, unknown
dependencies, duplicate keys), a bounded pool that sheds, deadlines, fixed starts, dependencies
by key, a semaphore, and outcomes of every kind, including reports of stale leases.
"""

from __future__ import annotations

from dataclasses import dataclass

from cronoq.engine import (
    AdmissionError,
    Bounds,
    CancelledByExecutor,
    Core,
    CoreConfig,
    Dep,
    Failure,
    FixedStart,
    Outcome,
    OverflowPolicy,
    PoolConfig,
    Priority,
    ResourceConfig,
    RetryPolicy,
    StepOutput,
    Submitted,
    Success,
    TaskSpec,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .extremes import examples
from .sim import START, ns

KEYS = (None, None, None, "k1", "k2", "k3")
POOLS = (None, None, "small", "missing")
KINDS = ("default", "default", "report", "bad\0kind")
RESOURCES: tuple[dict[str, int], ...] = ({}, {}, {}, {"db": 1}, {"db": 5}, {"nope": 1})
OUTCOMES: tuple[Outcome, ...] = (
    Success("done"),
    Success(None),
    Failure("retry me"),
    Failure("give up", permanent=True),
    CancelledByExecutor("stop"),
)
STALE_LEASE = 12345


def make_core() -> Core:
    pools = (
        PoolConfig("default", max_workers=3, initial_workers=3, retry=RetryPolicy(max_attempts=2)),
        PoolConfig(
            "small",
            max_workers=1,
            initial_workers=1,
            bounds=Bounds(max_pending=3),
            overflow=OverflowPolicy.SHED_LOWEST,
        ),
    )
    config = CoreConfig(
        pools=pools,
        resources=(ResourceConfig.semaphore("db", 2),),
        persist=True,
        emit_transitions=True,
        seed=3,
    )
    return Core(config, now=START)


@st.composite
def specs(draw: st.DrawFn) -> TaskSpec:
    """A task spec, sometimes one the engine refuses."""
    offset = draw(st.sampled_from((None, None, 1, 30)))
    fixed = draw(st.sampled_from((None, None, None, 2)))
    dep = draw(st.sampled_from((None, None, "k1", "k2", "k3", "ghost")))
    return TaskSpec(
        payload=draw(st.integers(0, 9)),
        pool=draw(st.sampled_from(POOLS)),
        kind=draw(st.sampled_from(KINDS)),
        priority=draw(st.sampled_from(list(Priority))),
        key=draw(st.sampled_from(KEYS)),
        deadline=None if offset is None else START + ns(offset),
        fixed_start=None if fixed is None else FixedStart(START + ns(fixed), ns(1)),
        deps=() if dep is None else (Dep(dep),),
        resources=draw(st.sampled_from(RESOURCES)),
    )


@dataclass
class Round:
    submissions: list[TaskSpec]
    completions: list[tuple[int, int]]  # (index among the running leases or -1 for a stale one, outcome)
    advance: float


rounds = st.builds(
    Round,
    st.lists(specs(), max_size=8),
    st.lists(st.tuples(st.integers(-1, 5), st.integers(0, len(OUTCOMES) - 1)), max_size=6),
    st.sampled_from((0.0, 0.5, 3.0)),
)


def answer(result: Submitted | AdmissionError) -> tuple[object, ...]:
    if isinstance(result, AdmissionError):
        return ("refused", result.code, result.message)
    return ("admitted", result.id, result.duplicate)


def submit_each(core: Core, now: int, batch: list[TaskSpec]) -> list[tuple[object, ...]]:
    answers = []
    for spec in batch:
        try:
            answers.append(answer(core.submit(now, spec)))
        except AdmissionError as error:
            answers.append(answer(error))
    return answers


def submit_many(core: Core, now: int, batch: list[TaskSpec]) -> list[tuple[object, ...]]:
    results = core.submit_many(now, batch)
    for index, result in enumerate(results):
        if isinstance(result, AdmissionError):
            assert result.index == index  # a refusal names its task
    return [answer(result) for result in results]


def reports(plan: list[tuple[int, int]], running: list[int]) -> list[tuple[int, Outcome]]:
    chosen = []
    for position, outcome in plan:
        lease_id = running[position % len(running)] if running and position >= 0 else STALE_LEASE
        chosen.append((lease_id, OUTCOMES[outcome]))
    return chosen


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rounds, min_size=1, max_size=8))
def test_batched_calls_match_one_call_per_task(plan: list[Round]) -> None:
    single, batched = make_core(), make_core()
    now = START
    running: list[int] = []
    for step in plan:
        assert submit_each(single, now, step.submissions) == submit_many(batched, now, step.submissions)
        chosen = reports(step.completions, running)
        assert [single.complete(now, lease, outcome) for lease, outcome in chosen] == batched.complete_many(now, chosen)
        now += ns(step.advance)
        single.tick(now)
        batched.tick(now)
        output: StepOutput = single.drain()
        assert output == batched.drain()
        ended = {abort.lease_id for abort in output.aborts} | {lease for lease, _ in chosen}
        running = [lease for lease in running if lease not in ended] + [d.id for d in output.dispatches]
        single.check_invariants()
        batched.check_invariants()
    assert single.list_tasks(limit=1000) == batched.list_tasks(limit=1000)
    assert single.totals == batched.totals
