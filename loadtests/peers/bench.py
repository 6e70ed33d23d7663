"""cronoq side by side with other Python task queues: the same workloads, measured in one run.

For each workload, every system runs in turn (so the systems of one workload are measured
minutes apart, not hours), each case in a driver process of its own (``peers/driver.py``) with
``--workers`` worker processes. Workloads:

* ``noop``: ``--tasks`` no-op tasks, submitted as fast as the system takes them.
* ``sleep10``: ``--sleep-tasks`` tasks that each await 10 ms.
* ``backlog``: ``--backlog`` tasks queued with no worker running, then drained.
* ``sustained``: submit at half the rate the same system reached on ``noop`` in this run, for
  ``--sustain-s`` seconds; submit-to-start latency of every task.

Prints one JSON object per case (``{"bench": "peers", "case": ..., "system": ..., ...}``, units in
the figure names) as each finishes, then a table with cronoq's ratio to each peer. ``--jsonl``
and ``--markdown`` also write them to files.

Run: python loadtests/peers/bench.py [--systems cronoq,pgqueuer,...] [--workloads noop,...]
     [--tasks N] [--sleep-tasks N] [--backlog N] [--sustain-s S] [--workers W] [--concurrency C]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peers.systems import SYSTEMS
from peers.systems.base import child_env

WORKLOADS = ("noop", "sleep10", "backlog", "sustained")
REMOTE, IN_PROCESS = "cronoq", "cronoq-inprocess"
# The figure each workload is compared on, and whether more is better.
HEADLINE = {
    "noop": ("tasks_per_s", True),
    "sleep10": ("tasks_per_s", True),
    "backlog": ("drain_tasks_per_s", True),
    "sustained": ("latency_p99_ms", False),
}
CPU_PARTS = ("server", "workers", "postgres", "redis", "client")


def run_case(args: argparse.Namespace, system: str, workload: str, rate: float | None) -> dict[str, Any]:
    tasks = {"noop": args.tasks, "sleep10": args.sleep_tasks, "backlog": args.backlog}.get(workload, 0)
    command = [sys.executable, "-m", "peers.driver", system, workload, "--tasks", str(tasks),
               "--workers", str(args.workers), "--concurrency", str(args.concurrency),
               "--timeout", str(args.timeout), "--duration", str(args.sustain_s)]  # fmt: skip
    if rate is not None:
        command += ["--rate", str(rate)]
    started = time.monotonic()
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    try:
        stdout, stderr = driver.communicate(timeout=args.timeout * 2 + 300)
    except subprocess.TimeoutExpired:
        stdout, stderr = stop_driver(driver)
        return {"system": system, "error": f"the driver did not finish: {stderr[-1500:]}"}
    except BaseException:  # Ctrl-C or SIGTERM: the driver still cleans up (workers, server, database)
        stop_driver(driver)
        raise
    out = subprocess.CompletedProcess(command, driver.returncode, stdout, stderr)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"system": system, "error": f"driver exited {out.returncode}: {out.stderr[-2000:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    result["case_s"] = round(time.monotonic() - started, 1)
    return result


def stop_driver(driver: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM a driver (it stops its workers and drops its database), SIGKILL if it hangs."""
    driver.terminate()
    try:
        return driver.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        driver.kill()
        return driver.communicate()


def sustained_rate(results: dict[tuple[str, str], dict[str, Any]], system: str, share: float) -> float | None:
    noop = results.get(("noop", system), {})
    return share * noop["tasks_per_s"] if noop.get("tasks_per_s") else None


# ---------------------------------------------------------------------------------------------
# The table


def short_durability(result: dict[str, Any]) -> str:
    text = str(result.get("durability", ""))
    if "persists nothing" in text:
        return "none (Redis: no RDB, no AOF)"
    settings = re.search(r"fsync=\w+, synchronous_commit=\w+", text)
    if settings is not None:
        return f"Postgres commit ({settings.group(0)})" + ("; log tables unlogged" if "balanced" in text else "")
    return text or "?"


def figure(result: dict[str, Any] | None, workload: str) -> float | None:
    if not result or "error" in result or "skipped" in result:
        return None
    value = result.get(HEADLINE[workload][0])
    return float(value) if value is not None else None


def ratio(ours: float | None, theirs: float | None, more_is_better: bool) -> str:
    """How many times better cronoq's figure is than the peer's (above 1: cronoq better)."""
    if not ours or not theirs:
        return "-"
    return f"{(ours / theirs if more_is_better else theirs / ours):.2f}x"


def failed(result: dict[str, Any] | None) -> str | None:
    """What to show instead of figures for a case that has none."""
    if result is None:
        return "-"
    if "skipped" in result:
        return "skipped"
    if "error" in result:
        return "error"
    return None


def cell(result: dict[str, Any] | None, workload: str) -> str:
    if (text := failed(result)) is not None:
        return text
    assert result is not None
    if workload == "sustained":
        text = f"{result['achieved_submit_tasks_per_s']:,}/s: {result['latency_p50_ms']} / {result['latency_p99_ms']}"
    elif workload == "backlog":
        text = f"{result['enqueue_tasks_per_s']:,} / {result['drain_tasks_per_s']:,}"
        if result.get("enqueue_timed_out"):
            text += f" ({result['tasks']:,} queued in time)"
    else:
        text = f"{result['tasks_per_s']:,}"
    if result.get("timed_out"):
        text += " (drain timed out)" if workload == "backlog" else " (not all done in time)"
    return text


def cpu_cell(result: dict[str, Any] | None) -> str:
    if (text := failed(result)) is not None:
        return text
    assert result is not None
    parts = [f"{part} {result[f'{part}_cpu_us_per_task']:.0f}" for part in CPU_PARTS
             if result.get(f"{part}_cpu_us_per_task")]  # fmt: skip
    return ", ".join(parts) + f" = **{result.get('total_cpu_us_per_task', 0):.0f}**"


def cpu_per_task(result: dict[str, Any] | None) -> float | None:
    return None if failed(result) is not None or result is None else result.get("total_cpu_us_per_task")


def markdown(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows]) + "\n"


def table(results: dict[tuple[str, str], dict[str, Any]], systems: list[str], workloads: list[str]) -> str:
    """Three tables: the figures, cronoq's ratios to every row, and the CPU per task by part."""
    names = {
        "noop": "no-op tasks/s",
        "sleep10": "10 ms tasks/s",
        "backlog": "backlog: queued/s / drained/s",
        "sustained": "50 % load: submitted/s: p50 / p99 ms",
    }
    figures = []
    for system in systems:
        any_result = next((results[(w, system)] for w in workloads if (w, system) in results), {})
        figures.append([system, short_durability(any_result)] + [cell(results.get((w, system)), w) for w in workloads])
    ratio_head = ["system"] + [f"cronoq x: {w}" for w in workloads] + ["cronoq x: CPU/task, no-op"]
    ratio_head += [f"in-process x: {w}" for w in workloads if w in ("noop", "backlog")]
    ratio_head += ["in-process x: CPU/task, no-op"]
    ratios = []
    for system in systems:
        row = [system]
        for ours in (REMOTE, IN_PROCESS):
            compared = workloads if ours == REMOTE else [w for w in workloads if w in ("noop", "backlog")]
            for workload in compared:
                theirs = figure(results.get((workload, system)), workload)
                row.append(ratio(figure(results.get((workload, ours)), workload), theirs, HEADLINE[workload][1]))
            cpu_ours, cpu_theirs = (
                cpu_per_task(results.get(("noop", ours))),
                cpu_per_task(results.get(("noop", system))),
            )
            row.append(ratio(cpu_ours, cpu_theirs, more_is_better=False))
        ratios.append(row)
    cpu_workloads = [w for w in workloads if w in ("noop", "backlog")]
    cpu_rows = [[system] + [cpu_cell(results.get((w, system))) for w in cpu_workloads] for system in systems]
    return (
        markdown(["system", "durability"] + [names[w] for w in workloads], figures)
        + "\ncronoq's ratio to each row, above 1 when cronoq is better: its figure divided by the row's for "
        "throughput, the row's divided by cronoq's for p99 latency and for CPU per task (all parts together). "
        "`cronoq x` is the remote-worker row, `in-process x` the embedded scheduler's.\n\n"
        + markdown(ratio_head, ratios)
        + "\nCPU microseconds per task by part (backlog: the drain; `client` is the load generator, and for "
        "cronoq-inprocess the whole application):\n\n"
        + markdown(["system"] + [f"{w}: CPU µs/task" for w in cpu_workloads], cpu_rows)
    )


def load_results(path: str) -> tuple[dict[tuple[str, str], dict[str, Any]], list[str], list[str]]:
    """The results of an earlier run from its ``--jsonl`` file, with its systems and workloads in order."""
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            results[(result["case"], result["system"])] = result
    systems = list(dict.fromkeys(system for _, system in results))
    workloads = list(dict.fromkeys(workload for workload, _ in results))
    return results, systems, workloads


# ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--tasks", type=int, default=100_000, help="no-op tasks")
    parser.add_argument("--sleep-tasks", type=int, default=50_000, help="10 ms tasks")
    parser.add_argument("--backlog", type=int, default=1_000_000, help="tasks queued before the workers start")
    parser.add_argument("--sustain-s", type=float, default=15.0, help="seconds of submitting at 50 %% load")
    parser.add_argument("--load-share", type=float, default=0.5, help="sustained rate / the system's no-op rate")
    parser.add_argument("--workers", type=int, default=4, help="worker processes of every system")
    parser.add_argument("--concurrency", type=int, default=64, help="tasks at once per worker process")
    parser.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds a case may spend queueing a backlog, and completing; past it the case reports what it did",
    )
    parser.add_argument("--jsonl", help="also write the JSON lines to this file")
    parser.add_argument("--markdown", help="also write the table to this file")
    parser.add_argument("--from-jsonl", metavar="PATH", help="run nothing: print the table of an earlier run's --jsonl")
    args = parser.parse_args()
    if args.from_jsonl:
        print(table(*load_results(args.from_jsonl)), end="")
        return 0
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops the run like Ctrl-C
    systems = [s for s in args.systems.split(",") if s]
    workloads = [w for w in args.workloads.split(",") if w]
    for name in systems:
        if name not in SYSTEMS:
            parser.error(f"unknown system {name!r} ({', '.join(SYSTEMS)})")
    for name in workloads:
        if name not in WORKLOADS:
            parser.error(f"unknown workload {name!r} ({', '.join(WORKLOADS)})")
    if "sustained" in workloads and "noop" not in workloads:
        parser.error("the sustained workload needs the noop workload (its rate is half of the noop rate)")
    results: dict[tuple[str, str], dict[str, Any]] = {}
    sink = open(args.jsonl, "w") if args.jsonl else None  # noqa: SIM115 - written as cases finish
    try:
        for workload in workloads:
            for system in systems:
                rate = sustained_rate(results, system, args.load_share) if workload == "sustained" else None
                if workload == "sustained" and rate is None:
                    result: dict[str, Any] = {"system": system, "skipped": "no noop rate in this run"}
                else:
                    result = run_case(args, system, workload, rate)
                result = {"bench": "peers", "case": workload, **result, "worker_processes": args.workers,
                          "cpus": os.cpu_count()}  # fmt: skip
                results[(workload, system)] = result
                line = json.dumps(result)
                print(line, flush=True)
                if sink is not None:
                    sink.write(line + "\n")
                    sink.flush()
    finally:
        if sink is not None:
            sink.close()
    text = table(results, systems, workloads)
    print("\n" + text, flush=True)
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
