"""Embedded scheduler benchmark: one JSON object per case on stdout.

Pool("default", run, max=256) with a no-op async executor:
(a) submit_batch of N tasks in chunks of 1000; (b) N single ``await sched.enqueue(i)``; time from
the first submission until the snapshot shows every task succeeded (median of 3 fresh processes);
(c) single-task submit -> result latency p50/p99 on an idle scheduler.

Run: python loadtests/embedded_bench.py [--tasks N] [--runs R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time

import cronoq


async def run(ctx: cronoq.TaskContext, x: object) -> None:
    return None


def _install_uvloop() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


async def _wait_all(sched: cronoq.Scheduler, total: int) -> None:
    while True:
        snap = await sched.snapshot()
        if snap.totals["succeeded"] >= total:
            return
        await asyncio.sleep(0.005)


async def _throughput(case: str, total: int) -> float:
    async with cronoq.Scheduler([cronoq.Pool("default", run, max=256)]) as sched:
        started = time.perf_counter()
        if case == "batch":
            for base in range(0, total, 1000):
                await sched.submit_batch([cronoq.Task(i) for i in range(base, min(base + 1000, total))])
        else:
            for i in range(total):
                await sched.enqueue(i)
        await _wait_all(sched, total)
        return total / (time.perf_counter() - started)


async def _latency(samples: int) -> tuple[float, float]:
    async with cronoq.Scheduler([cronoq.Pool("default", run, max=256)]) as sched:
        times = []
        for i in range(samples):
            started = time.perf_counter()
            handle = await sched.submit(i)
            await handle
            times.append(time.perf_counter() - started)
        times.sort()
        return times[len(times) // 2], times[int(len(times) * 0.99)]


def child(case: str, total: int) -> None:
    _install_uvloop()
    print(asyncio.run(_throughput(case, total)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.tasks)
        return 0
    loop_name = _install_uvloop()
    for case, label in (("batch", "a_submit_batch_1000"), ("enqueue", "b_single_enqueue")):
        rates = []
        for _ in range(args.runs):
            out = subprocess.run(
                [sys.executable, __file__, "--child", case, "--tasks", str(args.tasks)],
                check=True,
                capture_output=True,
                text=True,
            )
            rates.append(float(out.stdout.strip().splitlines()[-1]))
        print(
            json.dumps(
                {
                    "bench": "embedded",
                    "case": label,
                    "store": "none",
                    "loop": loop_name,
                    "tasks": args.tasks,
                    "runs": args.runs,
                    "tasks_per_s": round(statistics.median(rates)),
                }
            ),
            flush=True,
        )
    p50, p99 = asyncio.run(_latency(2000))
    print(
        json.dumps(
            {
                "bench": "embedded",
                "case": "c_submit_to_result_latency",
                "store": "none",
                "loop": loop_name,
                "p50_ms": round(p50 * 1000, 3),
                "p99_ms": round(p99 * 1000, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
