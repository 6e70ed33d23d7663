"""Engine benchmarks: one JSON object per case on stdout.

(a) submit -> dispatch -> complete cycles/s over a 1,000,000-task mixed-priority backlog;
(b) the same with deadlines, dependencies and a semaphore mixed in;
(c) the cost of one dispatch decision at backlogs of 10^3, 10^5 and 10^6.

Run: python loadtests/engine_bench.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time

from cronoq.engine import (
    Core,
    CoreConfig,
    Dep,
    PoolConfig,
    Priority,
    ResourceConfig,
    Success,
    TaskSpec,
)
from cronoq.engine.types import NS_PER_S

PRIORITIES = (Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW)
WORKERS = 64
_SUCCESS = Success(None)


def emit(**fields: object) -> None:
    print(json.dumps({"bench": "engine", **fields}), flush=True)


def build(backlog: int, mixed: bool) -> tuple[Core, int, random.Random]:
    resources = (ResourceConfig.semaphore("db", 16),) if mixed else ()
    pool = PoolConfig("default", min_workers=0, max_workers=WORKERS, initial_workers=0)
    core = Core(CoreConfig(pools=(pool,), resources=resources))
    rng = random.Random(7)
    now = 1_700_000_000 * NS_PER_S
    for i in range(backlog):
        core.submit(now, make_spec(i, rng, mixed, now))
    core.drain()
    return core, now, rng


def make_spec(i: int, rng: random.Random, mixed: bool, now: int, last_id: int | None = None) -> TaskSpec:
    priority = PRIORITIES[rng.randrange(4)]
    if not mixed:
        return TaskSpec(payload=i, priority=priority)
    roll = rng.random()
    if roll < 0.2:
        return TaskSpec(payload=i, priority=priority, deadline=now + rng.randrange(1, 600) * NS_PER_S)
    if roll < 0.3 and last_id is not None:
        return TaskSpec(payload=i, priority=priority, deps=(Dep(last_id),))
    if roll < 0.4:
        return TaskSpec(payload=i, priority=priority, resources={"db": 1})
    return TaskSpec(payload=i, priority=priority)


def run_cycles(core: Core, now: int, rng: random.Random, cycles: int, mixed: bool) -> float:
    """Steady state: every step completes the running attempts, submits as many, dispatches."""
    core.set_capacity(now, "default", WORKERS)
    core.tick(now)
    running = [d.id for d in core.drain().dispatches]
    done = 0
    last_id: int | None = None
    # Specs are built up front: the benchmark measures the engine, not TaskSpec construction.
    plain = [make_spec(i, rng, False, now) for i in range(cycles + WORKERS)] if not mixed else []
    gc.collect()
    gc.disable()
    started = time.perf_counter()
    step = 0
    while done < cycles:
        step += 1
        now += 1_000_000
        for lease_id in running:
            core.complete(now, lease_id, _SUCCESS)
        batch = len(running)
        done += batch
        if mixed:
            for _ in range(batch):
                last_id = core.submit(now, make_spec(step, rng, mixed, now, last_id)).id
        else:
            for spec in plain[done - batch : done]:
                core.submit(now, spec)
        core.tick(now)
        running = [d.id for d in core.drain().dispatches]
    elapsed = time.perf_counter() - started
    gc.enable()
    return done / elapsed


def dispatch_cost(backlog: int, samples: int) -> float:
    """Seconds per dispatch decision: one slot frees, tick picks the next task."""
    core, now, rng = build(backlog, mixed=False)
    core.set_capacity(now, "default", 1)
    core.tick(now)
    lease = core.drain().dispatches[0].id
    total = 0.0
    gc.collect()
    gc.disable()
    for _ in range(samples):
        now += 1_000
        core.complete(now, lease, _SUCCESS)
        core.submit(now, make_spec(0, rng, False, now))
        started = time.perf_counter()
        core.tick(now)
        total += time.perf_counter() - started
        lease = core.drain().dispatches[0].id
    gc.enable()
    return total / samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller backlog, for a smoke run")
    args = parser.parse_args()
    backlog = 100_000 if args.quick else 1_000_000
    cycles = 50_000 if args.quick else 300_000
    for case, mixed in (("a_mixed_priority", False), ("b_deadlines_deps_semaphore", True)):
        core, now, rng = build(backlog, mixed)
        rate = run_cycles(core, now, rng, cycles, mixed)
        emit(case=case, store="none", backlog=backlog, cycles=cycles, cycles_per_s=round(rate))
        del core
        gc.collect()
    sizes = (1_000, 100_000) if args.quick else (1_000, 100_000, 1_000_000)
    costs = {}
    for size in sizes:
        cost = dispatch_cost(size, 20_000)
        costs[size] = cost
        emit(case="c_dispatch_cost", store="none", backlog=size, dispatch_us=round(cost * 1e6, 3))
        gc.collect()
    ratio = costs[sizes[-1]] / costs[sizes[0]]
    emit(case="c_dispatch_cost_ratio", store="none", backlogs=f"{sizes[-1]}/{sizes[0]}", ratio=round(ratio, 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
