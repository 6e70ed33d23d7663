"""Engine benchmarks: one JSON object per case on stdout.

(a) submit -> dispatch -> complete cycles/s and µs per cycle (wall clock, and this process's CPU
    time: on a shared machine the CPU figure is the steadier one), steady state, over mixed-priority
    backlogs of 10^3, 10^4, 10^5 and 10^6 tasks (flat cost: the same µs at every size);
(b) the same over the largest backlog with deadlines, dependencies and a semaphore mixed in;
(c) the cost of one dispatch decision (one slot frees, ``tick`` picks the next task) per backlog.

(a) and (b) run twice on the same engine: once with one call per task (``submit``/``complete``)
and once with the batched calls (``submit_many``/``complete_many``), when the engine has them.
Task specs are built before the clock starts: the benchmark measures the engine, not TaskSpec
construction.

Every line names the engine measured: ``compiled`` (the modules mypyc built, scripts/build_engine.py)
or ``python`` (the sources: no current build, or ``CRONOQ_PURE_PYTHON=1``). Compare the two by
running the benchmark once each way.

Run: python loadtests/engine_bench.py [--quick] [--backlogs 1000,1000000] [--cycles N]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Callable

from cronoq.engine import (
    Core,
    CoreConfig,
    Dep,
    PoolConfig,
    Priority,
    ResourceConfig,
    Success,
    TaskSpec,
    _native,
)
from cronoq.engine.types import NS_PER_S

PRIORITIES = (Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW)
WORKERS = 64
_SUCCESS = Success(None)

Step = Callable[[Core, int, list[int], list[TaskSpec]], None]


def emit(**fields: object) -> None:
    engine = "compiled" if _native.COMPILED else "python"
    print(json.dumps({"bench": "engine", "engine": engine, **fields}), flush=True)


class Specs:
    """Task specs in submission order. Mixed specs name their dependency by the id it will get:
    ids grow by one per submitted task, so the id of the task submitted just before is known."""

    def __init__(self, rng: random.Random, mixed: bool, now: int, first_id: int) -> None:
        self.rng = rng
        self.mixed = mixed
        self.now = now
        self.first_id = self.next_id = first_id

    def take(self, count: int) -> list[TaskSpec]:
        specs = [self.make(self.next_id + i) for i in range(count)]
        self.next_id += count
        return specs

    def make(self, task_id: int) -> TaskSpec:
        rng = self.rng
        priority = PRIORITIES[rng.randrange(4)]
        if not self.mixed:
            return TaskSpec(payload=task_id, priority=priority)
        roll = rng.random()
        if roll < 0.2:
            deadline = self.now + rng.randrange(1, 600) * NS_PER_S
            return TaskSpec(payload=task_id, priority=priority, deadline=deadline)
        if roll < 0.3 and task_id > self.first_id:
            return TaskSpec(payload=task_id, priority=priority, deps=(Dep(task_id - 1),))
        if roll < 0.4:
            return TaskSpec(payload=task_id, priority=priority, resources={"db": 1})
        return TaskSpec(payload=task_id, priority=priority)


def build(backlog: int, mixed: bool) -> tuple[Core, int, Specs]:
    resources = (ResourceConfig.semaphore("db", 16),) if mixed else ()
    pool = PoolConfig("default", min_workers=0, max_workers=WORKERS, initial_workers=0)
    core = Core(CoreConfig(pools=(pool,), resources=resources))
    now = 1_700_000_000 * NS_PER_S
    specs = Specs(random.Random(7), mixed, now, core.last_id + 1)
    for spec in specs.take(backlog):
        core.submit(now, spec)
    core.drain()
    gc.collect()
    return core, now, specs


def one_at_a_time(core: Core, now: int, running: list[int], specs: list[TaskSpec]) -> None:
    for lease_id in running:
        core.complete(now, lease_id, _SUCCESS)
    for spec in specs:
        core.submit(now, spec)


def batched(core: Core, now: int, running: list[int], specs: list[TaskSpec]) -> None:
    core.complete_many(now, [(lease_id, _SUCCESS) for lease_id in running])  # type: ignore[attr-defined]
    core.submit_many(now, specs)  # type: ignore[attr-defined]


def run_cycles(core: Core, now: int, specs: Specs, cycles: int, step: Step) -> tuple[int, float, float]:
    """Steady state: every step completes the running attempts, submits as many, dispatches.
    Returns (now at the end, seconds of wall time, seconds of this process's CPU time)."""
    core.set_capacity(now, "default", WORKERS)
    core.tick(now)
    running = [d.id for d in core.drain().dispatches]
    # Every step submits as many tasks as it completes: WORKERS, once the first step is done.
    batches = [specs.take(WORKERS) for _ in range(cycles // WORKERS)]
    gc.collect()
    gc.disable()
    started = time.perf_counter()
    cpu_started = time.process_time()
    for batch in batches:
        now += 1_000_000
        step(core, now, running, batch)
        core.tick(now)
        running = [d.id for d in core.drain().dispatches]
    cpu = time.process_time() - cpu_started
    elapsed = time.perf_counter() - started
    gc.enable()
    # Leave no attempt running: the next run starts from the same backlog.
    for lease_id in running:
        core.complete(now, lease_id, _SUCCESS)
    core.set_capacity(now, "default", 0)
    core.tick(now)
    core.drain()
    return now, elapsed, cpu


def cycles_case(case: str, backlog: int, cycles: int, mixed: bool) -> None:
    core, now, specs = build(backlog, mixed)
    steps: list[tuple[str, Step]] = [("single", one_at_a_time)]
    if hasattr(core, "submit_many") and hasattr(core, "complete_many"):
        steps.append(("batched", batched))
    for calls, step in steps:
        now, elapsed, cpu = run_cycles(core, now, specs, cycles, step)
        done = cycles // WORKERS * WORKERS
        emit(
            case=case,
            calls=calls,
            backlog=backlog,
            cycles=done,
            cycles_per_s=round(done / elapsed),
            us_per_cycle=round(elapsed / done * 1e6, 3),
            cpu_us_per_cycle=round(cpu / done * 1e6, 3),
        )
    if len(steps) == 1:
        emit(case=case, calls="batched", backlog=backlog, unavailable="engine has no submit_many/complete_many")
    del core
    gc.collect()


def dispatch_cost(backlog: int, samples: int) -> float:
    """Seconds per dispatch decision: one slot frees, tick picks the next task."""
    core, now, specs = build(backlog, mixed=False)
    core.set_capacity(now, "default", 1)
    core.tick(now)
    lease = core.drain().dispatches[0].id
    fresh = specs.take(samples)
    total = 0.0
    gc.collect()
    gc.disable()
    for spec in fresh:
        now += 1_000
        core.complete(now, lease, _SUCCESS)
        core.submit(now, spec)
        started = time.perf_counter()
        core.tick(now)
        total += time.perf_counter() - started
        lease = core.drain().dispatches[0].id
    gc.enable()
    return total / samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="backlogs up to 10^5 and fewer cycles, a smoke run")
    parser.add_argument("--backlogs", help="comma-separated backlog sizes (default 10^3 to 10^6)")
    parser.add_argument("--cycles", type=int, help="cycles per run (default 300,000; --quick 50,000)")
    args = parser.parse_args()
    default = "1000,10000,100000" if args.quick else "1000,10000,100000,1000000"
    backlogs = [int(size) for size in (args.backlogs or default).split(",")]
    cycles = args.cycles or (50_000 if args.quick else 300_000)
    for backlog in backlogs:
        cycles_case("a_mixed_priority", backlog, cycles, mixed=False)
    cycles_case("b_deadlines_deps_semaphore", backlogs[-1], cycles, mixed=True)
    costs = {}
    for size in backlogs:
        costs[size] = dispatch_cost(size, 20_000)
        emit(case="c_dispatch_cost", backlog=size, dispatch_us=round(costs[size] * 1e6, 3))
    ratio = costs[backlogs[-1]] / costs[backlogs[0]]
    emit(case="c_dispatch_cost_ratio", backlogs=f"{backlogs[-1]}/{backlogs[0]}", ratio=round(ratio, 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
