"""Takeover benchmark on Postgres: one JSON object per case on stdout, ``{"bench": "takeover", ...}``.

For each number of live tasks (default 0, 100000 and 1000000):

1. a leader process (``store_takeover_child.py``) submits that many no-payload tasks to a pool
   with no slots, so all of them stay live (Ready);
2. standby A waits for leadership; the leader is killed with SIGKILL. Case ``kill_<n>``;
3. A, now leading, dispatches 64 attempts that never finish (the rest stay live), and standby B
   waits; A is frozen with SIGSTOP (its sessions stay open: only the lease tells B that A is
   gone). Case ``stop_<n>``. A is woken at the end and, fenced, writes nothing.

Figures (the unit is in each name): ``takeover_ms`` from the fault until the new leader serves
(it leads, has restored the shard and accepts calls); ``first_dispatch_ms`` until its executor
starts its first attempt (with no backlog, of a task it submits then); ``acquire_ms`` until its
store granted leadership; ``recover_ms`` its ``store.recover()``; ``restore_ms`` from the end of
recovery until it serves (engine restore); ``recover_cpu_ms`` and ``restore_cpu_ms`` the CPU
time the new leader spent in those two (on a busy machine wall times also count the waits for a
core, CPU times only the work); ``peak_rss_mib`` the new leader's
peak resident set (``VmHWM``) once it serves, ``rss_mib`` its resident set then, after a garbage
collection (memory the allocator freed but kept counts too); ``recovered_tasks``. The leadership settings are the
store's defaults unless given (``lock_poll_s``, ``lease_ttl_s`` and ``lease_renew_s`` are printed).

Case ``engine_memory_<n>``: bytes per pending no-payload task in the engine, in this process:
``bytes_per_task_traced`` (tracemalloc: what Python allocated, divided by n) and
``bytes_per_task_rss`` (growth of the resident set, divided by n).

Postgres: the DSN in ``CRONOQ_BENCH_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/test``);
every size gets a fresh schema, dropped afterwards. Targets (issues 15, 18): 100k live tasks taken
over in at most 3 s after a kill, 10^6 in at most 10 s; a frozen leader replaced within its lease
(8 s) plus that; at most 600 bytes per pending task.

Run (``make bench-takeover``; on a shared machine under ``flock /tmp/cronoq-bench.lock``):
    python loadtests/takeover_bench.py [--sizes 0,100000,1000000] [--faults kill,stop]
        [--memory 1000000] [--lock-poll S] [--lease-ttl S] [--lease-renew S]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import signal
import time
import tracemalloc
import uuid
from typing import Any

from store_bench import Child, drop_schema, dsn

MIB = 1024 * 1024
DEFAULTS = {"lock_poll": 0.5, "lease_ttl": 8.0, "lease_renew": 1.0}  # PostgresStore's defaults


def emit(**fields: Any) -> None:
    print(json.dumps({"bench": "takeover", **fields}), flush=True)


def standby(spec: str, leadership: dict[str, float]) -> Child:
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in leadership.items()]
    child = Child("--store", spec, "--role", "standby", "--serve", *flags)
    child.wait_for("STANDBY", 60)
    return child


def measure(case: str, live: int, fault_at: float, child: Child, leadership: dict[str, float], **extra: Any) -> None:
    serving_at, restore_cpu = child.wait_for("SERVING", 600)[:2]
    serving = float(serving_at)
    dispatched = float(child.wait_for("DISPATCH", 60)[0])
    child.wait_for("PEAK", 60)
    acquired = float(child.events["ACQUIRED"][0])
    recovered_at, recover_s, recovered_tasks, recover_cpu = child.events["RECOVERED"]
    emit(
        case=case,
        store="postgres",
        live_tasks=live,
        recovered_tasks=int(recovered_tasks),
        takeover_ms=round((serving - fault_at) * 1000),
        first_dispatch_ms=round((dispatched - fault_at) * 1000),
        acquire_ms=round((acquired - fault_at) * 1000),
        recover_ms=round(float(recover_s) * 1000),
        restore_ms=round((serving - float(recovered_at)) * 1000),
        recover_cpu_ms=round(float(recover_cpu) * 1000),
        restore_cpu_ms=round(float(restore_cpu) * 1000),
        peak_rss_mib=round(int(child.events["PEAK"][1]) / MIB, 1),
        rss_mib=round(int(child.events["PEAK"][2]) / MIB, 1),
        lock_poll_s=leadership["lock_poll"],
        lease_ttl_s=leadership["lease_ttl"],
        lease_renew_s=leadership["lease_renew"],
        **extra,
    )


def run_size(live: int, faults: list[str], leadership: dict[str, float]) -> None:
    schema = f"cronoq_bench_{uuid.uuid4().hex[:12]}"
    spec = f"postgres:{dsn()}#{schema}"
    children: list[Child] = []
    try:
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in leadership.items()]
        leader = Child("--store", spec, "--role", "leader", "--submit", str(live), *flags)
        children.append(leader)
        leader.wait_for("LEADER", 60)
        started = time.perf_counter()
        leader.wait_for("READY", 1800)
        submit_s = round(time.perf_counter() - started, 1)
        current = leader
        for fault in faults:
            successor = standby(spec, leadership)
            children.append(successor)
            time.sleep(1.0)  # let it settle into polling for leadership
            fault_at = time.time()
            os.kill(current.proc.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            measure(f"{fault}_{live}", live, fault_at, successor, leadership, leader_submit_s=submit_s)
            current = successor
    except (TimeoutError, RuntimeError) as exc:
        emit(case=f"takeover_{live}", store="postgres", live_tasks=live, error=str(exc))
    finally:
        for child in children:
            if child.proc.poll() is None:
                os.kill(child.proc.pid, signal.SIGCONT)
            child.kill()
        asyncio.run(drop_schema(schema))


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def engine_memory(n: int) -> None:
    """Bytes per pending no-payload task held by the engine, measured two ways."""
    from cronoq.engine import Core, CoreConfig, PoolConfig, TaskSpec
    from cronoq.engine.types import NS_PER_S

    now = 1_700_000_000 * NS_PER_S
    pool = PoolConfig("default", min_workers=0, max_workers=1, initial_workers=0)

    def fill() -> Core:
        core = Core(CoreConfig(pools=(pool,)))
        spec = TaskSpec()
        for start in range(0, n, 10_000):
            for _ in range(start, min(start + 10_000, n)):
                core.submit(now, spec)
            core.drain()
        return core

    gc.collect()
    base_rss = rss_bytes()
    core = fill()
    gc.collect()
    rss_growth = rss_bytes() - base_rss
    del core
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    core = fill()
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del core
    emit(
        case=f"engine_memory_{n}",
        pending_tasks=n,
        bytes_per_task_traced=round(traced / n),
        bytes_per_task_rss=round(rss_growth / n),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0,100000,1000000", help="live task counts")
    parser.add_argument("--faults", default="kill,stop", help="kill, stop or both, in that order")
    parser.add_argument("--memory", type=int, default=1_000_000, help="pending tasks for engine_memory (0: skip)")
    parser.add_argument("--lock-poll", type=float, default=DEFAULTS["lock_poll"])
    parser.add_argument("--lease-ttl", type=float, default=DEFAULTS["lease_ttl"])
    parser.add_argument("--lease-renew", type=float, default=DEFAULTS["lease_renew"])
    args = parser.parse_args()
    leadership = {"lock_poll": args.lock_poll, "lease_ttl": args.lease_ttl, "lease_renew": args.lease_renew}
    faults = [fault for fault in args.faults.split(",") if fault]
    if any(fault not in ("kill", "stop") for fault in faults):
        parser.error("--faults takes kill and/or stop")
    if args.memory:
        engine_memory(args.memory)
    for live in (int(size) for size in args.sizes.split(",") if size):
        run_size(live, faults, leadership)


if __name__ == "__main__":
    main()
