"""What a person reads after the drills: a summary table per drill, and a Markdown report with an
SVG plot per drill (completions per second and submission latency over time, faults shaded)."""

from __future__ import annotations

import html
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checker import History, percentile
from .run import RunOutcome

__all__ = [
    "DrillSummary",
    "move_table",
    "plot_svg",
    "read_lines",
    "summarize",
    "summarize_lines",
    "summary_table",
    "write_report",
]


@dataclass(frozen=True, slots=True)
class DrillSummary:
    drill: str
    store: str
    runs: int
    failed_runs: int
    tasks: int
    acknowledged: int
    lost: int
    repeated: int
    stale_writes: int
    other_violations: int
    takeovers: tuple[float, ...]
    unavailable: tuple[float, ...]

    def takeover(self, q: float) -> float | None:
        return percentile(self.takeovers, q)


def summarize(outcomes: Sequence[RunOutcome]) -> list[DrillSummary]:
    by_drill: dict[tuple[str, str], list[RunOutcome]] = {}
    for outcome in outcomes:
        by_drill.setdefault((outcome.drill, outcome.options.store), []).append(outcome)
    summaries = []
    for (drill, store), runs in by_drill.items():
        results = [run.result for run in runs]
        counted = {"lost", "repeated-attempt", "stale-write"}
        summaries.append(
            DrillSummary(
                drill=drill,
                store=store,
                runs=len(runs),
                failed_runs=sum(1 for run in runs if not (run.result.ok and run.drained)),
                tasks=sum(r.tasks for r in results),
                acknowledged=sum(r.acknowledged for r in results),
                lost=sum(r.lost for r in results),
                repeated=sum(r.repeated for r in results),
                stale_writes=sum(r.stale_writes for r in results),
                other_violations=sum(1 for r in results for v in r.violations if v.rule not in counted),
                takeovers=tuple(m.leaderless_s for r in results for m in r.faults if m.leaderless_s is not None),
                unavailable=tuple(m.unavailable_s for r in results for m in r.faults),
            )
        )
    return summaries


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summary_table(summaries: Sequence[DrillSummary], *, markdown: bool = False) -> str:
    head = ("drill", "store", "runs", "failed", "tasks", "acked", "lost", "repeated", "stale writes", "other",
            "takeover p50 s", "p99 s", "max s", "unavailable max s")  # fmt: skip
    rows = [head]
    for s in summaries:
        rows.append(
            (
                s.drill,
                s.store,
                str(s.runs),
                str(s.failed_runs),
                str(s.tasks),
                str(s.acknowledged),
                str(s.lost),
                str(s.repeated),
                str(s.stale_writes),
                str(s.other_violations),
                _s(s.takeover(50)),
                _s(s.takeover(99)),
                _s(max(s.takeovers) if s.takeovers else None),
                _s(max(s.unavailable) if s.unavailable else None),
            )
        )
    return _render(rows, markdown)


def _render(rows: Sequence[Sequence[str]], markdown: bool) -> str:
    """A table: its head row, then the others; Markdown, or columns aligned for a terminal."""
    head = rows[0]
    if markdown:
        lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows[1:]]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in
                               enumerate(zip(row, widths, strict=True))) for row in rows)  # fmt: skip


def move_table(lines: Sequence[dict[str, Any]], *, markdown: bool = False) -> str | None:
    """The pool moves of recorded runs (``pool-move``), moves without a fault apart from those
    during which a leader was killed; None when no run moved a pool."""
    moves = [move for line in lines for move in line.get("moves", ())]
    if not moves:
        return None
    head = ("moves", "fault", "done", "duration p50 s", "max s", "admission gap p50 s", "p99 s", "max s",
            "others' throughput min", "p50")  # fmt: skip
    rows: list[tuple[str, ...]] = [head]
    for label, group in (
        ("none", [m for m in moves if not m["fault"]]),
        ("leader killed", [m for m in moves if m["fault"]]),
    ):
        if not group:
            continue
        durations = [m["duration_s"] for m in group if m["duration_s"] is not None]
        gaps = [m["admission_gap_s"] for m in group if m["admission_gap_s"] is not None]
        ratios = [m["others_ratio"] for m in group if m["others_ratio"] is not None]
        rows.append((str(len(group)), label, str(len(durations)), _s(percentile(durations, 50)),
                     _s(max(durations, default=None)), _s(percentile(gaps, 50)), _s(percentile(gaps, 99)),
                     _s(max(gaps, default=None)), _s(min(ratios, default=None)),
                     _s(percentile(ratios, 50))))  # fmt: skip
    return _render(rows, markdown)


# ------------------------------------------------------------------------------------- plot

_W, _H, _PAD = 760, 300, 48
BUCKET_S = 0.5


def plot_svg(history: History, title: str) -> str:
    """Completions/s (blue) and median submission latency in ms (orange, right axis), faults shaded."""
    dones = sorted(e.finished_at for e in history.executions if e.outcome == "succeeded" and e.finished_at)
    acks = [(s.sent_at, s.acked_at - s.sent_at) for s in history.submissions if s.acked and s.acked_at]
    times = [*dones, *(a for a, _ in acks), *(f.started_at for f in history.faults)]
    if not times:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="60"><text x="10" y="30">no data</text></svg>'
        )
    start, end = min(times), max([*times, *(f.ended_at or f.started_at for f in history.faults)]) + BUCKET_S
    count = int((end - start) / BUCKET_S) + 1
    rate = [0.0] * count
    for when in dones:
        rate[int((when - start) / BUCKET_S)] += 1 / BUCKET_S
    lat_buckets: list[list[float]] = [[] for _ in range(count)]
    for sent, took in acks:
        lat_buckets[int((sent - start) / BUCKET_S)].append(took * 1000)
    latency = [statistics.median(b) if b else None for b in lat_buckets]
    top_rate = max(rate) or 1.0
    top_lat = max((v for v in latency if v is not None), default=1.0) or 1.0
    span = end - start

    def x(t: float) -> float:
        return _PAD + (t - start) / span * (_W - 2 * _PAD)

    def y(v: float, top: float) -> float:
        return _H - _PAD - v / top * (_H - 2 * _PAD)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" font-family="sans-serif" '
             f'font-size="11"><title>{html.escape(title)}</title>',
             f'<rect width="{_W}" height="{_H}" fill="white"/>']  # fmt: skip
    for fault in history.faults:
        x0, x1 = x(fault.started_at), x(fault.ended_at or end)
        parts.append(f'<rect x="{x0:.1f}" y="{_PAD}" width="{max(x1 - x0, 1.5):.1f}" height="{_H - 2 * _PAD}" '
                     f'fill="#d33" fill-opacity="0.15"><title>{html.escape(fault.name)} {html.escape(fault.target)}'
                     f'</title></rect>')  # fmt: skip
        parts.append(f'<text x="{x0 + 2:.1f}" y="{_PAD - 4}" fill="#a22">{html.escape(fault.name)}</text>')
    points = " ".join(f"{x(start + i * BUCKET_S):.1f},{y(v, top_rate):.1f}" for i, v in enumerate(rate))
    parts.append(f'<polyline points="{points}" fill="none" stroke="#2563eb" stroke-width="1.5"/>')
    lat_points = " ".join(
        f"{x(start + i * BUCKET_S):.1f},{y(v, top_lat):.1f}" for i, v in enumerate(latency) if v is not None
    )
    parts.append(f'<polyline points="{lat_points}" fill="none" stroke="#ea8a0c" stroke-width="1"/>')
    parts += [
        f'<line x1="{_PAD}" y1="{_H - _PAD}" x2="{_W - _PAD}" y2="{_H - _PAD}" stroke="#444"/>',
        f'<line x1="{_PAD}" y1="{_PAD}" x2="{_PAD}" y2="{_H - _PAD}" stroke="#444"/>',
        f'<text x="{_PAD}" y="{_H - _PAD + 16}">0 s</text>',
        f'<text x="{_W - _PAD - 30}" y="{_H - _PAD + 16}">{span:.0f} s</text>',
        f'<text x="4" y="{_PAD + 4}" fill="#2563eb">{top_rate:.0f}/s</text>',
        f'<text x="{_W - _PAD + 4}" y="{_PAD + 4}" fill="#ea8a0c">{top_lat:.0f} ms</text>',
        f'<text x="{_PAD}" y="{_H - 12}"><tspan fill="#2563eb">completions per second</tspan>  '
        f'<tspan fill="#ea8a0c">median submit latency (ms, by send time)</tspan>  '
        f'<tspan fill="#a22">fault</tspan></text>',
        "</svg>",
    ]
    return "\n".join(parts)


def write_report(directory: Path, outcomes: Sequence[RunOutcome], lines: Sequence[str], command: str) -> Path:
    """``report.md``, ``runs.jsonl`` and one SVG per drill (of its last run) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "runs.jsonl").write_text("".join(line + "\n" for line in lines))
    summaries = summarize(outcomes)
    text = [
        "# cronoq failover drills",
        "",
        f"Command: `{command}`",
        "",
        summary_table(summaries, markdown=True),
        "",
        "takeover: time from the fault until the shard was served again; unavailable: first to last error a "
        "producer saw around the fault. Every run's details are in `runs.jsonl`.",
        "",
    ]
    last: dict[str, RunOutcome] = {}
    for outcome in outcomes:
        last[outcome.drill] = outcome
    for drill, outcome in last.items():
        svg = f"{drill}.svg"
        (directory / svg).write_text(plot_svg(outcome.history, f"{drill} run {outcome.run}"))
        text += [f"## {drill}", "", f"![{drill}, run {outcome.run}]({svg})", ""]
        failures = [o for o in outcomes if o.drill == drill and not (o.result.ok and o.drained)]
        for failed in failures:
            text.append(f"- run {failed.run} (seed {failed.seed}): " + ("not drained; " if not failed.drained else "")
                        + "; ".join(f"{v.rule}: {v.detail}" for v in failed.result.violations[:5]))  # fmt: skip
        for note in sorted({n for o in outcomes if o.drill == drill for n in o.notes if not n.startswith(" ")}):
            if "no leader" in note or "took over" in note or "found no" in note:
                text.append(f"- note: {note}")
        text.append("")
        measures = [m for o in outcomes if o.drill == drill for m in o.result.faults]
        if measures:
            text.append("| fault | target | leaderless s | unavailable s | dip | backlog recovery s |")
            text.append("|---|---|---|---|---|---|")
            for m in measures[:12]:
                text.append(f"| {m.name} | {m.target} | {_s(m.leaderless_s)} | {m.unavailable_s:.2f} | "
                            f"{'-' if m.dip is None else f'{m.dip:.0%}'} | {_s(m.recovery_s)} |")  # fmt: skip
            text.append("")
    path = directory / "report.md"
    path.write_text("\n".join(text))
    return path


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().startswith("{")]


def summarize_lines(lines: Sequence[dict[str, Any]]) -> list[DrillSummary]:
    """The summaries of recorded runs (JSON lines, possibly from several invocations)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for line in lines:
        if "error" in line:
            continue  # a run that never started (counted by the caller, not in the figures)
        groups.setdefault((line["drill"], line["store"]), []).append(line)
    counted = {"lost", "repeated-attempt", "stale-write"}
    return [
        DrillSummary(
            drill=drill,
            store=store,
            runs=len(runs),
            failed_runs=sum(1 for run in runs if not run["ok"]),
            tasks=sum(run["tasks"] for run in runs),
            acknowledged=sum(run["acknowledged"] for run in runs),
            lost=sum(run["lost"] for run in runs),
            repeated=sum(run["repeated"] for run in runs),
            stale_writes=sum(run["stale_writes"] for run in runs),
            other_violations=sum(1 for run in runs for v in run["violations"] if v["rule"] not in counted),
            takeovers=tuple(t for run in runs for t in run["takeover_s"]),
            unavailable=tuple(f["unavailable_s"] for run in runs for f in run["faults"]),
        )
        for (drill, store), runs in groups.items()
    ]
