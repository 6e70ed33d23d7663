"""A typed reader over one parsed TOML table that reports, rather than raises, every problem.

Each ``Table`` hands out values of the expected type (reporting a wrong type with its key
path and falling back to a default), remembers which keys were asked for, and in ``finish``
reports every other key as unknown, with the nearest known key as a hint.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from datetime import date, datetime, time
from enum import Enum
from typing import TypeVar

from .validate import Issue, key_path

__all__ = ["Report", "Table"]

E = TypeVar("E", bound=Enum)


class _Missing:
    __slots__ = ()


_MISSING = _Missing()


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, datetime | date | time):
        return "a date/time"
    return type(value).__name__


class Report:
    """Problems found while reading, and the key paths that hold a value of the wrong type."""

    def __init__(self) -> None:
        self.items: list[Issue] = []
        self.bad: set[str] = set()

    def error(self, path: str, message: str) -> None:
        self.items.append(Issue(path, message))
        self.bad.add(path)

    def covers(self, path: str) -> bool:
        """Is ``path`` (or a table holding it) already reported as unreadable?"""
        while True:
            if path in self.bad:
                return True
            cut = max(path.rfind("."), path.rfind("["))
            if cut <= 0:
                return False
            path = path[:cut]


class Table:
    """One TOML table being read: hands out typed values and remembers the keys it was asked
    for, so that ``finish`` can report every other key as unknown."""

    def __init__(self, report: Report, data: Mapping[str, object], path: str) -> None:
        self.report = report
        self.data = data
        self.path = path
        self.known: list[str] = []
        self.context = ""

    def at(self, key: str) -> str:
        return key_path(self.path, key)

    def _raw(self, key: str) -> object:
        self.known.append(key)
        return self.data.get(key, _MISSING)

    def has(self, key: str) -> bool:
        return key in self.data

    def _wrong(self, key: str, expected: str, value: object) -> None:
        self.report.error(self.at(key), f"expected {expected}, got {_type_name(value)}")

    def missing(self, key: str, what: str) -> None:
        self.report.error(self.at(key), f"is required ({what})")

    # scalars

    def opt_str(self, key: str) -> str | None:
        value = self._raw(key)
        if value is _MISSING:
            return None
        if not isinstance(value, str):
            self._wrong(key, "a string", value)
            return None
        return value

    def req_str(self, key: str, what: str) -> str:
        if not self.has(key):
            self.known.append(key)
            self.missing(key, what)
            return ""
        return self.opt_str(key) or ""

    def str_or(self, key: str, default: str) -> str:
        value = self.opt_str(key)
        return default if value is None else value

    def bool_or(self, key: str, default: bool) -> bool:
        value = self._raw(key)
        if value is _MISSING:
            return default
        if not isinstance(value, bool):
            self._wrong(key, "a boolean (true or false)", value)
            return default
        return value

    def opt_int(self, key: str) -> int | None:
        value = self._raw(key)
        if value is _MISSING:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self._wrong(key, "an integer", value)
            return None
        return value

    def int_or(self, key: str, default: int) -> int:
        value = self.opt_int(key)
        return default if value is None else value

    def req_int(self, key: str, what: str) -> int:
        if not self.has(key):
            self.known.append(key)
            self.missing(key, what)
            return 0
        value = self.opt_int(key)
        return 0 if value is None else value

    def opt_num(self, key: str) -> float | None:
        value = self._raw(key)
        if value is _MISSING:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            self._wrong(key, "a number", value)
            return None
        return float(value)

    def num_or(self, key: str, default: float) -> float:
        value = self.opt_num(key)
        return default if value is None else value

    def req_num(self, key: str, what: str) -> float:
        if not self.has(key):
            self.known.append(key)
            self.missing(key, what)
            return 0.0
        value = self.opt_num(key)
        return 0.0 if value is None else value

    def opt_enum(self, key: str, kind: type[E]) -> E | None:
        text = self.opt_str(key)
        if text is None:
            return None
        for member in kind:
            if member.value == text:
                return member
        choices = ", ".join(str(member.value) for member in kind)
        self.report.error(self.at(key), f"expected one of {choices}; got {text!r}")
        return None

    # compounds

    def opt_strs(self, key: str) -> tuple[str, ...] | None:
        value = self._raw(key)
        if value is _MISSING:
            return None
        if not isinstance(value, list):
            self._wrong(key, "an array of strings", value)
            return None
        out: list[str] = []
        for index, item in enumerate(value):
            if isinstance(item, str):
                out.append(item)
            else:
                self.report.error(f"{self.at(key)}[{index}]", f"expected a string, got {_type_name(item)}")
        return tuple(out)

    def table(self, key: str) -> Table | None:
        value = self._raw(key)
        if value is _MISSING:
            return None
        if not isinstance(value, dict):
            self._wrong(key, "a table", value)
            return None
        return Table(self.report, value, self.at(key))

    def tables(self, key: str) -> list[Table] | None:
        value = self._raw(key)
        if value is _MISSING:
            return None
        if not isinstance(value, list):
            self._wrong(key, f"an array of tables ([[{self.at(key)}]])", value)
            return None
        out: list[Table] = []
        for index, item in enumerate(value):
            path = f"{self.at(key)}[{index}]"
            if isinstance(item, dict):
                out.append(Table(self.report, item, path))
            else:
                self.report.error(path, f"expected a table, got {_type_name(item)}")
        return out

    def finish(self) -> None:
        """Report every key nobody asked for."""
        for key in self.data:
            if key in self.known:
                continue
            hint = difflib.get_close_matches(key, self.known, n=1)
            message = "unknown key"
            if self.context:
                message += f" {self.context}"
            if hint:
                message += f" (did you mean {hint[0]!r}?)"
            self.report.error(self.at(key), message)
