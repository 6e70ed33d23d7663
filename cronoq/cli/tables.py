"""Plain text tables and the small formatting helpers the human-readable output shares.

Tables are plain columns separated by two spaces, with no colours and no box drawing, so they
read well on a terminal and stay easy to ``grep``/``awk`` when redirected.
"""

from __future__ import annotations

import datetime as dt
import unicodedata
from collections.abc import Mapping, Sequence

NS_PER_S = 1_000_000_000


def width(text: str) -> int:
    """Terminal cells ``text`` takes (wide East Asian characters take two)."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of an aligned table; the last column is not padded."""
    widths = [width(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], width(cell))
    lines = []
    for row in [list(headers), *rows]:
        cells = [cell + " " * (widths[i] - width(cell)) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return lines


def key_values(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """``name  value`` lines with the values aligned."""
    pad = max((len(name) for name, _ in pairs), default=0)
    return [f"{name.ljust(pad)}  {value}".rstrip() for name, value in pairs]


def local_time(unix_ns: int, *, millis: bool = False) -> str:
    """A Unix-nanosecond time as local ``YYYY-MM-DD HH:MM:SS`` (``HH:MM:SS.mmm`` with ``millis``)."""
    moment = dt.datetime.fromtimestamp(unix_ns / NS_PER_S).astimezone()
    if millis:
        return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float) -> str:
    """A compact, rounded duration: ``850ms``, ``12.5s``, ``4m05s``, ``3h02m``, ``2d04h``."""
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def labels(values: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(values.items())) or "-"


def percent(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"
