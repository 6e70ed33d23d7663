"""A shard process for the takeover benchmark (``store_bench.py``): leader or standby.

    python store_takeover_child.py --store sqlite:<path> | postgres:<dsn>#<schema>
        --role leader --submit N      # leads, submits N tasks to a pool of capacity 0, says READY
    python store_takeover_child.py --store ... --role standby
                                      # waits for leadership, recovers, dispatches, says DISPATCH
        [--serve]                     # ... then keeps leading (its attempts never finish), says PEAK
        [--lock-poll S] [--lease-ttl S] [--lease-renew S]   # leadership settings (defaults below)

Every line on stdout is ``<EVENT> <unix time> [details]``, flushed at once:

* ``LEADER <t> <epoch>``: the leader leads; ``READY <t> <n>``: it acknowledged all N tasks.
* ``STANDBY <t>``: the standby is up and competing for leadership.
* ``ACQUIRED <t>``: the standby's store granted it leadership.
* ``RECOVERED <t> <seconds> <tasks> <cpu seconds>``: its ``recover()`` returned (its duration,
  tasks read, and the CPU time this process spent meanwhile, all threads).
* ``SERVING <t> <cpu seconds>``: it leads, has restored the shard and accepts calls (CPU time
  spent since recovery ended). On a shared machine CPU times tell the work done where wall
  times also count the waits for a core.
* ``DISPATCH <t>``: its executor started the first attempt (a task it submits itself once it
  serves, if the backlog is empty).
* ``PEAK <t> <bytes> <bytes>``: (``--serve``) the process's peak resident set size so far
  (``VmHWM``), then its resident set once the takeover's garbage is collected (``VmRSS``).

The leader's pool has no slots, so every task stays live (Ready) until the standby takes over.
Lease and poll settings are short, and printed by the parent with the results.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from typing import Any

from cronoq.engine.actions import Recovered

import cronoq

LOCK_POLL = 0.1  # how often a standby tries to take leadership (both stores)
SQLITE_LEASE_TTL = 2.0  # a dead SQLite leader's lease runs out after at most this long
SQLITE_LEASE_RENEW = 0.5
RECOVERED_CPU = [0.0]  # process CPU time when recovery returned


def say(event: str, *details: object) -> None:
    sys.stdout.write(" ".join([event, f"{time.time():.6f}", *map(str, details)]) + "\n")
    sys.stdout.flush()


def resident(field: str = "VmHWM") -> int:
    """This process's peak (``VmHWM``) or current (``VmRSS``) resident set size in bytes (0
    where /proc has none)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def open_store(spec: str, timed: bool, leadership: dict[str, float] | None = None) -> Any:
    kind, _, rest = spec.partition(":")
    if kind == "sqlite":
        from cronoq.stores.sqlite import SqliteStore

        base: type = SqliteStore
        args: tuple[Any, ...] = (rest,)
        kw: dict[str, Any] = {
            "lease_ttl": SQLITE_LEASE_TTL,
            "lease_renew": SQLITE_LEASE_RENEW,
            "lock_poll": LOCK_POLL,
        }
    elif kind == "postgres":
        from cronoq.stores.postgres import PostgresStore

        dsn, _, schema = rest.rpartition("#")
        base, args, kw = PostgresStore, (dsn,), {"schema": schema, "lock_poll": LOCK_POLL}
    else:
        raise SystemExit(f"unknown store {spec!r}")
    kw.update(leadership or {})
    if not timed:
        return base(*args, **kw)

    class Timed(base):  # type: ignore[misc]
        """Reports when leadership is granted and how long recovery took."""

        async def acquire_leadership(self) -> int:
            epoch: int = await super().acquire_leadership()
            say("ACQUIRED", epoch)
            return epoch

        async def recover(self, now: int, retention: int | None = None) -> Recovered:
            started, cpu = time.perf_counter(), time.process_time()
            result: Recovered = await super().recover(now, retention)
            spent = time.process_time() - cpu
            say("RECOVERED", f"{time.perf_counter() - started:.6f}", len(result.tasks), f"{spent:.6f}")
            RECOVERED_CPU[0] = time.process_time()
            return result

    return Timed(*args, **kw)


async def lead(store_spec: str, total: int, leadership: dict[str, float]) -> None:
    async def never(ctx: cronoq.TaskContext, payload: Any) -> None:
        raise AssertionError("the leader's pool has no slots")

    pool = cronoq.Pool("default", never, min=0, max=1, initial=0, autoscale=False)
    async with cronoq.Scheduler([pool], store=open_store(store_spec, False, leadership)) as sched:
        driver = sched._driver
        say("LEADER", driver.epoch if driver is not None else "?")
        for base in range(0, total, 1000):
            await sched.submit_batch([cronoq.Task(i) for i in range(base, min(base + 1000, total))])
        say("READY", total)
        await asyncio.Event().wait()  # until SIGKILL


async def stand_by(store_spec: str, serve: bool, leadership: dict[str, float]) -> None:
    first = asyncio.Event()
    forever = asyncio.Event()

    async def run(ctx: cronoq.TaskContext, payload: Any) -> None:
        if not first.is_set():
            say("DISPATCH", ctx.id)
            first.set()
        if serve:
            await forever.wait()  # the backlog stays live for the next takeover

    pool = cronoq.Pool("default", run, max=64, autoscale=False)
    sched = cronoq.Scheduler([pool], store=open_store(store_spec, True, leadership))
    say("STANDBY")
    await sched.start()  # returns once this process leads and has restored the shard
    say("SERVING", f"{time.process_time() - RECOVERED_CPU[0]:.6f}")
    await sched.submit(-1)  # a task of its own, behind the backlog (the only one if none)
    await first.wait()
    if serve:
        gc.collect()  # what the shard keeps, without the garbage of the takeover
        say("PEAK", resident(), resident("VmRSS"))
        await forever.wait()  # until killed
    await sched.shutdown(0.5)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--role", choices=("leader", "standby"), required=True)
    parser.add_argument("--submit", type=int, default=0)
    parser.add_argument("--serve", action="store_true")
    parser.add_argument("--lock-poll", type=float)
    parser.add_argument("--lease-ttl", type=float)
    parser.add_argument("--lease-renew", type=float)
    args = parser.parse_args()
    given = (("lock_poll", args.lock_poll), ("lease_ttl", args.lease_ttl), ("lease_renew", args.lease_renew))
    leadership = {name: value for name, value in given if value is not None}
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    if args.role == "leader":
        asyncio.run(lead(args.store, args.submit, leadership))
    else:
        asyncio.run(stand_by(args.store, args.serve, leadership))


if __name__ == "__main__":
    main()
