"""The screen of ``cronoq top``: a rich ``Layout`` of six panes built from a ``feed.View``.

Every string that comes from the server is passed through ``escape_controls`` and wrapped in a
``Text`` (never parsed as rich markup), so a key such as ``[bold]`` or ``\\x1b[2J`` shows as typed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.layout import Layout
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cronoq.proto import cronoq_pb2 as pb

from .. import tables
from ..render import priority_name, status_name
from ..tables import NS_PER_S
from ..text import escape_controls
from .feed import View

_STATUS_STYLE = {
    "running": "bold green",
    "succeeded": "green",
    "failed": "red",
    "dead_lettered": "bold red",
    "cancelled": "yellow",
    "retrying": "yellow",
    "ready": "cyan",
}


def _safe(text: str, style: str = "") -> Text:
    return Text(escape_controls(text), style=style)


def _status(number: int) -> Text:
    name = status_name(number)
    return Text(name, style=_STATUS_STYLE.get(name, ""))


def _table(*columns: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, expand=False, pad_edge=False, show_edge=False, header_style="bold")
    for column in columns:
        table.add_column(column, no_wrap=True, overflow="ellipsis")
    return table


def _pane(title: str, body: RenderableType, error: str | None = None, note: str = "") -> Panel:
    """A titled box; a failed pane shows its error above the last good data (if any)."""
    parts: list[RenderableType] = []
    if error is not None:
        parts.append(Text("! " + escape_controls(error), style="bold red"))
    parts.append(body)
    subtitle = Text(note, style="dim") if note else None
    return Panel(
        Group(*parts),
        title=Text(title, style="bold"),
        title_align="left",
        subtitle=subtitle,
        subtitle_align="right",
        box=box.ROUNDED,
    )


def _ago(unix_ns: int, now: float) -> str:
    return tables.duration(max(0.0, now - unix_ns / NS_PER_S))


def pools_pane(view: View) -> Panel:
    table = _table("POOL", "CAPACITY", "BUSY", "PENDING", "WAIT P50", "WAIT P90", "UTIL", "SUCCEEDED", "FAILED")
    snapshot = view.snapshot.data
    note = ""
    if snapshot is not None:
        for p in snapshot.pools:
            table.add_row(
                _safe(p.name),
                str(p.capacity),
                str(p.busy),
                str(sum(p.pending_by_class)),
                tables.duration(p.wait_p50_s),
                tables.duration(p.wait_p90_s),
                tables.percent(p.utilization),
                str(p.succeeded),
                Text(str(p.failed), style="red" if p.failed else ""),
            )
        note = f"live {snapshot.live_tasks}  running {snapshot.running}  pending {snapshot.pending}  (last minute)"
    return _pane("Pools", table, view.snapshot.error, note)


def workers_pane(view: View) -> Panel:
    table = _table("NAME", "POOL", "BUSY/SLOTS", "LABELS", "CONNECTED")
    if view.workers.data is not None:
        for w in view.workers.data.workers:
            table.add_row(
                _safe(w.name or f"#{w.id}"),
                _safe(w.pool),
                f"{w.busy}/{w.slots}",
                _safe(tables.labels(dict(w.labels))),
                tables.local_time(w.connected_unix_ns),
            )
    return _pane("Workers", table, view.workers.error)


def schedules_pane(view: View, now: float) -> Panel:
    table = _table("NAME", "CRON", "POOL", "NEXT")
    if view.schedules.data is not None:
        for s in view.schedules.data.schedules:
            upcoming = "-"
            if s.HasField("next_unix_ns"):
                upcoming = (
                    f"{tables.local_time(s.next_unix_ns)} (in {tables.duration(s.next_unix_ns / NS_PER_S - now)})"
                )
            cron = s.cron + (f" {s.tz}" if s.tz else "")
            table.add_row(_safe(s.name), _safe(cron), _safe(s.pool), upcoming)
    return _pane("Schedules", table, view.schedules.error)


def tasks_pane(view: View, now: float, limit: int) -> Panel:
    table = _table("ID", "STATUS", "POOL", "PRIO", "ATT", "KEY", "AGE")
    rows: Sequence[pb.TaskInfo] = view.tasks.data or []
    for t in rows:
        since = t.started_unix_ns if t.HasField("started_unix_ns") else t.created_unix_ns
        table.add_row(
            str(t.id),
            _status(t.status),
            _safe(t.pool),
            priority_name(t.priority),
            str(t.attempt),
            _safe(t.key or "-"),
            _ago(since, now) if since else "-",
        )
    note = f"{len(rows)} shown (at most {limit}), running first"
    return _pane("Live tasks", table, view.tasks.error, note)


def events_pane(view: View) -> Panel:
    table = _table("TIME", "ID", "STATUS", "POOL", "ATT", "KEY", "MESSAGE")
    for e in view.events.data or []:
        table.add_row(
            tables.local_time(e.at_unix_ns, millis=True),
            str(e.id),
            _status(e.status),
            _safe(e.pool),
            str(e.attempt),
            _safe(e.key or "-"),
            _safe(e.message),
        )
    note = "stream connected" if view.events_connected else "stream reconnecting"
    if view.events_missing:
        note += f"; no events from {escape_controls(', '.join(view.events_missing))}"
    return _pane("Recent events (newest first)", table, view.events.error, note)


def header(view: View, address: str, interval: float, pools: Sequence[str]) -> Text:
    text = Text()
    text.append("cronoq top", style="bold")
    text.append(f"  {escape_controls(address)}")
    if view.refreshed_at is not None:
        text.append(f"  refreshed {time.strftime('%H:%M:%S', time.localtime(view.refreshed_at))}")
    text.append(f"  every {tables.duration(interval)}")
    if pools:
        text.append(f"  pools: {escape_controls(','.join(pools))}")
    if view.unavailable_shards:
        text.append(f"  shards unavailable: {escape_controls(', '.join(view.unavailable_shards))}", style="bold red")
    text.append("\nq quit  r refresh", style="dim")
    return text


def screen(view: View, *, address: str, interval: float, pools: Sequence[str], task_limit: int) -> Layout:
    now = time.time()
    root = Layout(name="root")
    # Tasks and events get the full width: their ids, keys and messages need it more than the rest.
    root.split_column(
        Layout(header(view, address, interval, pools), name="header", size=2),
        Layout(pools_pane(view), name="pools", ratio=2),
        Layout(name="middle", ratio=2),
        Layout(tasks_pane(view, now, task_limit), name="tasks", ratio=3),
        Layout(events_pane(view), name="events", ratio=3),
    )
    root["middle"].split_row(
        Layout(workers_pane(view), name="workers"), Layout(schedules_pane(view, now), name="schedules")
    )
    return root
