"""A shard process for crash drills: an embedded scheduler on a durable store.

Prints one line per event on stdout (flushed): ``LEADER <epoch>``, ``ACK <id>`` for each
acknowledged (durably committed) submission, ``IDLE`` when no live task is left, ``DOWN <reason>``
when it stops leading. Appends ``start <id> <attempt>`` / ``done <id> <attempt>`` to the log file
from its executor, so the test can check attempt numbers across processes.

    python shard_child.py --store sqlite:/path/db | postgres:<dsn>#<schema>
        [--submit N] [--run-seconds S] [--slots K] [--log PATH] [--exit-when-idle]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from typing import Any

from cronoq.stores.postgres import PostgresStore
from cronoq.stores.sqlite import SqliteStore

import cronoq


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def open_store(spec: str, session_timeout: float) -> Any:
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        return SqliteStore(rest, lease_ttl=1.0, lease_renew=0.2, lock_poll=0.1)
    if kind == "postgres":
        dsn, _, schema = rest.rpartition("#")
        return PostgresStore(dsn, schema=schema, lock_poll=0.1, keepalive=0.2, session_timeout=session_timeout)
    raise SystemExit(f"unknown store {spec!r}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--submit", type=int, default=0)
    parser.add_argument("--run-seconds", type=float, default=0.05)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--log", default=os.devnull)
    parser.add_argument("--exit-when-idle", action="store_true")
    parser.add_argument("--session-timeout", type=float, default=2.0)
    args = parser.parse_args()
    log_fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def note(line: str) -> None:
        os.write(log_fd, (line + "\n").encode())

    async def work(ctx: cronoq.TaskContext, payload: Any) -> int:
        note(f"start {ctx.id} {ctx.attempt} {os.getpid()}")
        await asyncio.sleep(args.run_seconds)
        note(f"done {ctx.id} {ctx.attempt} {os.getpid()}")
        return int(payload)

    pool = cronoq.Pool(
        "default",
        work,
        max=args.slots,
        autoscale=False,
        retry=cronoq.RetryPolicy(max_attempts=5, initial_backoff=0.01, max_backoff=0.05),
    )
    sched = cronoq.Scheduler([pool], store=open_store(args.store, args.session_timeout))
    await sched.start()
    driver = sched._driver
    assert driver is not None
    say(f"LEADER {driver.epoch}")
    down = asyncio.Event()
    previous = driver.on_step_down

    def stepped_down(reason: str) -> None:
        say(f"DOWN {reason}")
        if previous is not None:
            previous(reason)
        down.set()

    driver.on_step_down = stepped_down
    for base in range(0, args.submit, 50):
        batch = [cronoq.Task(i, key=f"job-{i}") for i in range(base, min(base + 50, args.submit))]
        handles = await sched.submit_batch(batch)
        for handle in handles:
            say(f"ACK {handle.id}")
    while not down.is_set():
        snap = await sched.snapshot()
        if snap.live_tasks == 0:
            say("IDLE")
            if args.exit_when_idle:
                await sched.shutdown(1.0)
                return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(down.wait(), 0.05)


if __name__ == "__main__":
    asyncio.run(main())
