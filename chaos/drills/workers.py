"""Faults of workers: killed mid-lease, silent (frozen, so no heartbeat) past the lease TTL, and
slow past the task's timeout. Each time the attempt must be given up and retried once, and the
late outcome of the abandoned attempt refused."""

from __future__ import annotations

import asyncio
import signal

from ..run import RunContext
from . import Drill, register

LEASE_TTL_S = 2.0
TASK_TIMEOUT_S = 1.0


async def worker_kill(ctx: RunContext) -> None:
    for fraction in (0.25, 0.55):
        await ctx.wait_load(fraction)
        worker = ctx.workers[ctx.rng.randrange(len(ctx.workers))]
        async with ctx.fault("worker-kill", worker.name, None, "SIGKILL, started again 0.5s later"):
            worker.signal(signal.SIGKILL)
            await worker.wait(5.0)
            await asyncio.sleep(0.5)
            worker.start()


async def worker_silent(ctx: RunContext) -> None:
    await ctx.wait_load(0.3)
    worker = ctx.workers[ctx.rng.randrange(len(ctx.workers))]
    silence = LEASE_TTL_S * 2.5
    async with ctx.fault("worker-silent", worker.name, None, f"SIGSTOP {silence:g}s (lease TTL {LEASE_TTL_S:g}s)"):
        worker.signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(silence)
        finally:
            worker.signal(signal.SIGCONT)


async def worker_slow(ctx: RunContext) -> None:
    # The slowness is in the tasks (their first attempt overruns its timeout); the fault window is
    # the whole load.
    async with ctx.fault("worker-slow", "5% of first attempts", None, f"run 2.5x the {TASK_TIMEOUT_S:g}s timeout"):
        for producer in ctx.producers:
            await producer.wait()


register(Drill("worker-kill", "SIGKILL a worker holding leases, twice; start it again", worker_kill))
register(
    Drill(
        "worker-silent",
        "freeze a worker (no heartbeats) past the lease TTL, then wake it: its leases are retried and its "
        "late outcomes refused",
        worker_silent,
        pool_settings={"lease_ttl_s": LEASE_TTL_S},
    )
)
register(
    Drill(
        "worker-slow",
        "5% of first attempts run past the task timeout: retried, late outcomes refused",
        worker_slow,
        task_timeout_s=TASK_TIMEOUT_S,
        slow_fraction=0.05,
        slow_s=TASK_TIMEOUT_S * 2.5,
    )
)
