"""``cronoq chaos list | run DRILL... [options]``: failover drills against real clusters.

Each run starts a fresh cluster of real ``cronoq-server`` processes, loads it with producer and
worker processes, injects the drill's fault, drains, and checks the recorded history. One JSON
line per run goes to stdout; a summary table per drill follows; ``--report DIR`` also writes a
Markdown report with plots. The exit code is 0 only when every run kept every promise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cronoq chaos", description="Failover drills against real cronoq clusters.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{list,run,table,check}")
    commands.add_parser("list", help="the drills and what each does")
    recheck = commands.add_parser("check", help="judge kept runs again from their ledgers (ledger.db files)")
    recheck.add_argument("ledgers", nargs="+", type=Path, metavar="LEDGER.db")
    table = commands.add_parser("table", help="the summary table of recorded runs (runs.jsonl files)")
    table.add_argument("files", nargs="+", type=Path, metavar="RUNS.jsonl")
    table.add_argument("--markdown", action="store_true", help="a Markdown table")
    run = commands.add_parser("run", help="run drills (`all` for every drill)")
    run.add_argument("drills", nargs="+", metavar="DRILL")
    run.add_argument("--runs", type=int, default=1, help="runs per drill, seeds SEED, SEED+1, ... (default 1)")
    run.add_argument("--shards", type=int, default=1, help="shards (default 1; drills that need more get more)")
    run.add_argument("--replicas", type=int, default=2, help="replicas per shard (default 2)")
    run.add_argument("--tasks", type=int, default=2000, help="tasks per run (default 2000)")
    run.add_argument("--rate", type=float, default=200.0, help="tasks submitted per second (default 200)")
    run.add_argument("--seed", type=int, default=1, help="seed of the first run (default 1)")
    run.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite",
                     help="store of the shards (default sqlite; Postgres-only drills always use Postgres)")  # fmt: skip
    run.add_argument("--dsn", metavar="URL",
                     help="a Postgres to make schemas in (default: a throwaway server per run)")  # fmt: skip
    run.add_argument("--pause", type=float, default=15.0,
                     help="seconds leader-pause freezes the leader; outages scale from it (default 15)")  # fmt: skip
    run.add_argument("--backlog", type=int, default=0, metavar="N",
                     help="live tasks (due in an hour) put in shard s1 first: what a new leader recovers")  # fmt: skip
    run.add_argument("--net", choices=("netns", "proxy"),
                     help="how partition drills cut nodes: network namespaces and routes, or loopback proxies "
                          "(default netns where `ip netns add` works, else proxy)")  # fmt: skip
    run.add_argument("--report", type=Path, metavar="DIR", help="write report.md, runs.jsonl and plots here")
    run.add_argument("--keep", action="store_true", help="keep each run's ledger and logs under --report DIR")
    return parser


def _validate(args: argparse.Namespace) -> str | None:
    if not 1 <= args.runs <= 10_000:
        return "--runs must be between 1 and 10000"
    if not 1 <= args.shards <= 16 or not 1 <= args.replicas <= 8:
        return "--shards must be 1..16 and --replicas 1..8"
    if not 10 <= args.tasks <= 1_000_000:
        return "--tasks must be between 10 and 1000000"
    if not 1 <= args.rate <= 100_000:
        return "--rate must be between 1 and 100000"
    if not 1 <= args.pause <= 600:
        return "--pause must be between 1 and 600 seconds"
    if args.dsn is not None and not args.dsn.startswith(("postgres://", "postgresql://")):
        return "--dsn must be a postgres:// or postgresql:// URL"
    if not 0 <= args.backlog <= 1_000_000:
        return "--backlog must be between 0 and 1000000"
    if args.keep and args.report is None:
        return "--keep needs --report DIR"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    from .drills import load

    drills = load()
    if args.command == "list":
        width = max(len(name) for name in drills)
        for drill in drills.values():
            only = "" if len(drill.stores) > 1 else f" [{next(iter(drill.stores))} only]"
            print(f"{drill.name.ljust(width)}  {drill.summary}{only}")
        return 0
    if args.command == "table":
        return _table(args.files, markdown=args.markdown)
    if args.command == "check":
        return _check(args.ledgers)
    problem = _validate(args)
    if problem is None and args.net == "netns":
        from .netns import available

        if not available():
            problem = "--net netns needs root and iproute2 (`ip netns add` failed here); use --net proxy"
    names = list(drills) if args.drills == ["all"] else args.drills
    unknown = [name for name in names if name not in drills]
    if unknown:
        problem = f"unknown drill(s) {', '.join(unknown)}; `cronoq chaos list` shows them"
    if problem:
        print(f"cronoq chaos run: {problem}", file=sys.stderr)
        return 2
    return asyncio.run(_run(args, [drills[name] for name in names]))


def _check(paths: Sequence[Path]) -> int:
    """One JSON line per ledger: the counts, the violations and the measures of each fault."""
    from .checker import check
    from .ledger import Ledger
    from .run import history_from_ledger

    clean = True
    for path in paths:
        if not path.is_file():
            print(f"cronoq chaos check: no ledger at {path}", file=sys.stderr)
            return 1
        ledger = Ledger(path)
        try:
            result = check(history_from_ledger(ledger))
        finally:
            ledger.close()
        clean = clean and result.ok
        print(json.dumps({
            "ledger": str(path), "ok": result.ok, "tasks": result.tasks, "acknowledged": result.acknowledged,
            "lost": result.lost, "repeated": result.repeated, "stale_writes": result.stale_writes,
            "stale_outcomes": result.stale_outcomes, "late_leases": result.late_leases,
            "violations": [{"rule": v.rule, "detail": v.detail} for v in result.violations],
            "takeover_s": [m.leaderless_s for m in result.faults if m.leaderless_s is not None],
        }))  # fmt: skip
    return 0 if clean else 1


def _table(files: Sequence[Path], *, markdown: bool) -> int:
    from .report import move_table, read_lines, summarize_lines, summary_table

    lines = []
    for path in files:
        try:
            lines += read_lines(path)
        except (OSError, ValueError) as exc:
            print(f"cronoq chaos table: cannot read {path}: {exc}", file=sys.stderr)
            return 1
    try:
        print(summary_table(summarize_lines(lines), markdown=markdown))
        moves = move_table(lines, markdown=markdown)
        if moves is not None:
            print(f"\n{moves}")
    except (KeyError, TypeError) as exc:
        print(f"cronoq chaos table: not a runs.jsonl line of `cronoq chaos run` ({exc})", file=sys.stderr)
        return 1
    return 0


async def _run(args: argparse.Namespace, drills: Sequence[object]) -> int:
    from .drills import Drill
    from .report import move_table, summarize, summary_table, write_report
    from .run import RunOptions, RunOutcome, outcome_json, run_drill

    outcomes: list[RunOutcome] = []
    failures = 0
    lines: list[str] = []
    base = RunOptions(shards=args.shards, replicas=args.replicas, tasks=args.tasks, rate=args.rate, seed=args.seed,
                      store=args.store, dsn=args.dsn, pause_s=args.pause, backlog=args.backlog,
                      net=args.net or "auto")  # fmt: skip
    for drill in drills:
        assert isinstance(drill, Drill)
        store = args.store if args.store in drill.stores else sorted(drill.stores)[0]
        for run in range(1, args.runs + 1):
            options = replace(
                base,
                seed=args.seed + run - 1,
                store=store,
                shards=max(base.shards, drill.min_shards),
                replicas=max(base.replicas, drill.min_replicas),
            )
            keep = args.report / "runs" if args.keep else None
            try:
                outcome = await run_drill(drill, options, run=run, keep_dir=keep)
            except Exception as exc:  # one run that could not even start must not end the others
                print(json.dumps({"drill": drill.name, "run": run, "seed": options.seed, "store": store, "ok": False,
                                  "error": f"{type(exc).__name__}: {exc}"[:2000]}), flush=True)  # fmt: skip
                failures += 1
                continue
            line = outcome_json(outcome)
            print(line, flush=True)
            outcomes.append(outcome)
            lines.append(line)
    print()
    print(summary_table(summarize(outcomes)))
    moves = move_table([json.loads(line) for line in lines])
    if moves is not None:
        print(f"\n{moves}")
    if args.report is not None:
        command = "cronoq chaos " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        path = write_report(args.report, outcomes, lines, command)
        print(f"\nreport: {path}")
    return 0 if not failures and all(o.result.ok and o.drained for o in outcomes) else 1
