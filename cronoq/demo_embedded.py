"""A short tour of the embedded scheduler: ``python -m cronoq.demo_embedded``.

It runs one pool with four slots, submits interactive and batch work, a small DAG, a flaky task
that succeeds on its third attempt and a fixed-start job, then prints what happened.
"""

from __future__ import annotations

import asyncio
import random
import time

import cronoq


async def work(ctx: cronoq.TaskContext, payload: dict[str, object]) -> str:
    await asyncio.sleep(float(payload.get("seconds", 0.05)))  # type: ignore[arg-type]
    if payload.get("flaky") and ctx.attempt < 3:
        raise cronoq.Retryable(f"transient failure on attempt {ctx.attempt}")
    return f"{payload['name']} done on attempt {ctx.attempt}"


async def main() -> None:
    pool = cronoq.Pool(
        "default", work, max=4, autoscale=False, retry=cronoq.RetryPolicy(max_attempts=5, initial_backoff=0.05)
    )
    started = time.monotonic()
    async with cronoq.Scheduler([pool], emit_transitions=False) as sched:
        counts: dict[str, int] = {}

        async def follow() -> None:
            async with sched.events() as events:
                async for event in events:
                    counts[event.status] = counts.get(event.status, 0) + 1

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0)
        print("submitting 20 low-priority batch tasks, then 3 high-priority ones ...")
        for i in range(20):
            await sched.enqueue({"name": f"batch-{i}", "seconds": random.uniform(0.05, 0.1)}, priority="low")
        urgent = [await sched.submit({"name": f"urgent-{i}"}, priority="high", deadline_in=1.0) for i in range(3)]
        pipeline = await sched.submit_batch(
            [
                cronoq.Task({"name": "extract"}, key="extract"),
                cronoq.Task({"name": "transform"}, key="transform", after="extract"),
                cronoq.Task({"name": "load"}, key="load", after="transform"),
                cronoq.Task({"name": "alert"}, deps=[cronoq.Dep("load", on="failure")]),
            ]
        )
        flaky = await sched.submit({"name": "flaky", "flaky": True})
        fixed = await sched.submit({"name": "at-start"}, start_in=0.5, tolerance=0.2)
        for handle in urgent:
            print("  ", await handle)
        for handle in pipeline[:3]:
            print("  ", await handle)
        try:
            await pipeline[3]
        except cronoq.TaskFailed as failed:
            print(f"   alert did not run: {failed.status} ({failed.message})")
        print("  ", await flaky)
        print("  ", await fixed)
        while (await sched.snapshot()).live_tasks:
            await asyncio.sleep(0.05)
        snap = await sched.snapshot()
        pool_snap = snap.pool("default")
        assert pool_snap is not None
        follower.cancel()
        print(f"\nfinished in {time.monotonic() - started:.2f}s; status events seen: {counts}")
        print(f"dispatched={pool_snap.dispatched} succeeded={pool_snap.succeeded} failed attempts={pool_snap.failed}")
        print(
            f"priority adherence={pool_snap.priority_adherence:.2f} "
            f"fixed-start hit rate={pool_snap.fixed_start_hit_rate:.2f} "
            f"utilization={pool_snap.utilization:.2f} wait p90={pool_snap.wait_p90 * 1000:.0f}ms"
        )
        print("totals:", {k: v for k, v in snap.totals.items() if v})


if __name__ == "__main__":
    asyncio.run(main())
