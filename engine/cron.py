"""Cron expressions for recurring schedules, evaluated in an IANA time zone.

The calendar matching (which wall-clock times an expression names) comes from ``croniter``; this
module only ever hands it naive datetimes, so none of croniter's own time-zone handling is used.
Turning a matching wall-clock time into an instant is done here with ``zoneinfo``:

* A wall-clock time that exists once maps to that instant.
* A wall-clock time that exists twice (the repeated range on a fall-back day) maps to its first
  occurrence only. The second pass through the repeated range produces nothing, so a schedule
  never runs twice for one wall-clock time. A consequence: an hourly schedule skips the repeated
  hour's second pass (01:00 EDT, then 02:00 EST in America/New_York).
* A wall-clock time that does not exist (the skipped range on a spring-forward day) maps to the
  first instant after the gap, the transition itself (03:00 EDT for 02:30 in America/New_York).
  Every skipped time maps to that one instant, so the schedule fires there once: a daily job
  still runs that day, and an every-minute job does not fire sixty times at once.

Without a time zone (``tz=None``) the expression is read in UTC, which has no transitions, so
occurrences are exactly what the expression says. Use UTC for work that needs exact intervals.

Syntax: five fields ``minute hour day-of-month month day-of-week`` (occurrences at second 0), or
six with a leading ``second`` field. Month and weekday names (``JAN``, ``mon``) are accepted in
any case, as are the nicknames ``@yearly``/``@annually``, ``@monthly``, ``@weekly``,
``@daily``/``@midnight`` and ``@hourly``. Lists, ranges, steps and croniter's ``L``, ``W`` and
``#`` forms work; hashed (``H``) and random (``R``) values do not. When both the day-of-month and
the day-of-week fields are restricted, a day matching either one matches (classic cron rule).

Schedules that can never fire (``0 0 30 2 *``) are rejected by :meth:`CronSchedule.parse`: it
looks for a first occurrence and gives up after ``MAX_YEARS_BETWEEN_OCCURRENCES`` years. Every
satisfiable five- or six-field expression fires at least once in any span that long (the rarest,
such as "the fifth Monday of February", recur within 40 years), so :meth:`CronSchedule.next_after` searches
the same bounded span and raises :class:`ConfigError` instead of looping if it ever finds nothing.

Pure computation: no clock reads, no logging. ``zoneinfo`` reads the tz database on first use
of a zone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from .types import NS_PER_S, ConfigError

__all__ = ["MAX_YEARS_BETWEEN_OCCURRENCES", "CronSchedule", "rfc3339_utc"]

MAX_YEARS_BETWEEN_OCCURRENCES: Final = 50
"""How far ahead a search for the next occurrence goes before the schedule is declared dead."""

MAX_EXPR_LEN: Final = 1024

# Occurrences are persisted as int64 nanoseconds: none may lie past the largest one.
_MAX_NS: Final = (1 << 63) - 1

_NICKNAMES: Final[dict[str, str]] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTHS: Final[dict[str, int]] = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1
    )
}
_WEEKDAYS: Final[dict[str, int]] = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}


@dataclass(frozen=True, slots=True)
class _Field:
    label: str
    low: int
    high: int
    names: dict[str, int]
    # Letters with a special meaning in this field besides names (croniter's L and W forms).
    specials: frozenset[str] = frozenset()


_SECOND: Final = _Field("second", 0, 59, {})
_MINUTE: Final = _Field("minute", 0, 59, {})
_HOUR: Final = _Field("hour", 0, 23, {})
_DAY: Final = _Field("day-of-month", 1, 31, {}, frozenset({"l", "w"}))
_MONTH: Final = _Field("month", 1, 12, _MONTHS)
_WEEKDAY: Final = _Field("day-of-week", 0, 7, _WEEKDAYS, frozenset({"l"}))
_FIVE: Final = (_MINUTE, _HOUR, _DAY, _MONTH, _WEEKDAY)

_ALLOWED_CHARS: Final = re.compile(r"[A-Za-z0-9*?,/#\- \t]*")
_LETTERS: Final = re.compile(r"[a-z]+")
_DIGITS: Final = re.compile(r"[0-9]+")
_PLAIN_RANGE: Final = re.compile(r"([0-9a-z]+)-([0-9a-z]+)")

_EPOCH: Final = datetime(1970, 1, 1)
_EPOCH_UTC: Final = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND_DELTA: Final = timedelta(seconds=1)
# Where parse() looks for a first occurrence. Any fixed point works: with no year field, an
# expression that fires at all fires within every MAX_YEARS_BETWEEN_OCCURRENCES-year span.
_PROBE_START: Final = datetime(2000, 1, 1)


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A validated cron expression and the zone it is read in (``tz=None`` means UTC).

    Build it with :meth:`parse` (constructing it directly validates the same way). Two schedules
    are equal when their expression text and zone name are equal.
    """

    expr: str
    tz: str | None = None
    # The expression as croniter reads it: lower case, seconds (if any) moved to the end.
    _croniter_expr: str = field(init=False, repr=False, compare=False)
    _zone: ZoneInfo | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        croniter_expr = _translate(self.expr)
        zone = None if self.tz is None else _load_zone(self.tz)
        try:
            _next_wall(croniter_expr, _PROBE_START)
        except (OverflowError, ValueError):
            raise ConfigError(
                f"cron expression {self.expr!r} never fires: no matching date within "
                f"{MAX_YEARS_BETWEEN_OCCURRENCES} years (does the day exist in the chosen months?)"
            ) from None
        object.__setattr__(self, "_croniter_expr", croniter_expr)
        object.__setattr__(self, "_zone", zone)

    @classmethod
    def parse(cls, expr: str, tz: str | None = None) -> CronSchedule:
        """Validate ``expr`` and ``tz`` (an IANA name, ``None`` for UTC); raise ConfigError if bad."""
        return cls(expr, tz)

    def next_after(self, after_ns: int) -> int:
        """The first occurrence strictly after ``after_ns``, in ns since the epoch (whole seconds)."""
        after_s = after_ns // NS_PER_S
        try:
            if self._zone is None:
                wall = _next_wall(self._croniter_expr, _naive(after_s))
                found = _seconds(wall) * NS_PER_S
            else:
                found = _next_in_zone(self._croniter_expr, self._zone, after_s) * NS_PER_S
        except (OverflowError, ValueError):
            found = None
        if found is None or not 0 <= found <= _MAX_NS:
            raise ConfigError(
                f"cron schedule {self.expr!r}: no occurrence after {after_ns} ns within "
                f"{MAX_YEARS_BETWEEN_OCCURRENCES} years and the supported range (1970 to 2262)"
            )
        return found


def rfc3339_utc(ns: int) -> str:
    """``ns`` as an RFC 3339 UTC timestamp with whole seconds (rounded down) and a ``Z``.

    For example ``2026-03-08T07:30:00Z``; occurrence keys are ``<key>@<rfc3339_utc(start)>``.
    Raises OverflowError outside the years 1-9999.
    """
    return _naive(ns // NS_PER_S).isoformat(timespec="seconds") + "Z"


# ---------------------------------------------------------------------------------------------
# Parsing


def _translate(expr: object) -> str:
    """Check ``expr`` and return the equivalent expression in croniter's field order."""
    if not isinstance(expr, str):
        raise ConfigError(f"cron expression must be a string, not {type(expr).__name__}")
    if "\x00" in expr:
        raise ConfigError("cron expression contains a NUL character")
    if len(expr) > MAX_EXPR_LEN:
        raise ConfigError(f"cron expression is longer than {MAX_EXPR_LEN} characters")
    text = expr.strip(" \t")
    if not text:
        raise ConfigError("cron expression is empty")
    if text.startswith("@"):
        return _nickname(text)
    if not _ALLOWED_CHARS.fullmatch(text):
        bad = next(ch for ch in text if not _ALLOWED_CHARS.fullmatch(ch))
        raise ConfigError(f"cron expression {expr!r} contains an unexpected character {bad!r}")

    parts = text.split()
    if len(parts) == 5:
        fields: tuple[_Field, ...] = _FIVE
        texts = parts
    elif len(parts) == 6:
        # Ours: second first. croniter's six-field form: second last.
        fields = (*_FIVE, _SECOND)
        texts = [*parts[1:], parts[0]]
    else:
        raise ConfigError(
            f"cron expression {expr!r} has {len(parts)} field(s); expected 5 "
            "(minute hour day-of-month month day-of-week) or 6 with a leading second field"
        )

    normalised = [_check_field(expr, spec, part) for spec, part in zip(fields, texts, strict=True)]
    # Let croniter read each field on its own first, so that a malformed one can be named.
    for index, spec in enumerate(fields):
        probe = ["*"] * len(fields)
        probe[index] = normalised[index]
        try:
            croniter.expand(" ".join(probe))
        except Exception:
            raise ConfigError(
                f"cron expression {expr!r}: cannot read the {spec.label} field {texts[index]!r}"
            ) from None
    joined = " ".join(normalised)
    try:
        croniter.expand(joined)
    except Exception as exc:
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"cron expression {expr!r} is not valid: {detail}") from None
    return joined


def _nickname(text: str) -> str:
    lowered = text.lower()
    if lowered in _NICKNAMES:
        return _NICKNAMES[lowered]
    if lowered == "@reboot":
        raise ConfigError("@reboot is not supported: a recurring schedule needs a time-based expression")
    known = ", ".join(sorted(_NICKNAMES))
    raise ConfigError(f"unknown cron nickname {text!r}; known nicknames: {known}")


def _check_field(expr: str, spec: _Field, text: str) -> str:
    """Range- and name-check one field; return it in lower case with ``a-a`` ranges collapsed."""
    where = f"cron expression {expr!r}, {spec.label} field {text!r}"
    out: list[str] = []
    for item in text.lower().split(","):
        if not item:
            raise ConfigError(f"{where}: empty list element")
        base, slash, step = item.partition("/")
        if slash and (not (step.isascii() and step.isdigit()) or int(step) == 0):
            raise ConfigError(f"{where}: step {step!r} must be a whole number of at least 1")
        if spec is _WEEKDAY and "#" in base:
            base, _, nth = base.partition("#")
            if not (nth.isascii() and nth.isdigit()) or not 1 <= int(nth) <= 5:
                raise ConfigError(f"{where}: the number after '#' must be 1 to 5, not {nth!r}")
        for word in _LETTERS.findall(base):
            if word in spec.names or word in spec.specials:
                continue
            if word[0] in "hr":
                raise ConfigError(f"{where}: hashed (H) and random (R) values are not supported")
            raise ConfigError(f"{where}: unknown name {word!r}")
        for digits in _DIGITS.findall(base):
            if not spec.low <= int(digits) <= spec.high:
                raise ConfigError(f"{where}: {int(digits)} is out of range ({spec.low}-{spec.high})")
        # croniter reads a one-value range such as 5-5 or MON-MON as the whole field; cron means
        # the single value, so pass it on as just that value.
        bounds = _PLAIN_RANGE.fullmatch(base)
        if bounds is not None:
            first, last = (_value(spec, bound) for bound in bounds.groups())
            if first is not None and first == last:
                item = bounds.group(1)
        out.append(item)
    return ",".join(out)


def _value(spec: _Field, token: str) -> int | None:
    if token.isascii() and token.isdigit():
        return int(token)
    return spec.names.get(token)


def _load_zone(tz: object) -> ZoneInfo:
    if not isinstance(tz, str):
        raise ConfigError(f"time zone must be a string, not {type(tz).__name__}")
    if "\x00" in tz:
        raise ConfigError("time zone contains a NUL character")
    # Names of the host's own zone files rather than IANA zones: their meaning varies by machine.
    if tz in ("localtime", "posixrules"):
        raise ConfigError(f"time zone {tz!r} is not an IANA time zone name")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ConfigError(f"unknown time zone {tz!r}: expected an IANA name such as 'Europe/Lisbon'") from None


# ---------------------------------------------------------------------------------------------
# Evaluation. Instants are int seconds since the epoch; wall-clock times are naive datetimes.


def _naive(seconds: int) -> datetime:
    return _EPOCH + timedelta(seconds=seconds)


def _seconds(wall: datetime) -> int:
    return (wall - _EPOCH) // _SECOND_DELTA


def _next_wall(croniter_expr: str, after: datetime) -> datetime:
    """The first wall-clock time matching the expression strictly after ``after`` (naive).

    Raises croniter's ValueError subclass when nothing matches within the search span, and
    OverflowError or ValueError past the end of the datetime range.
    """
    it = croniter(
        croniter_expr,
        after,
        ret_type=datetime,
        max_years_between_matches=MAX_YEARS_BETWEEN_OCCURRENCES,
    )
    return it.get_next(datetime)


def _local(zone: ZoneInfo, seconds: int) -> datetime:
    return (_EPOCH_UTC + timedelta(seconds=seconds)).astimezone(zone)


def _offset(moment: datetime) -> int:
    offset = moment.utcoffset()
    return 0 if offset is None else offset // _SECOND_DELTA


def _first_change(zone: ZoneInfo, before: int, after: int) -> int:
    """The first instant in (before, after] whose UTC offset differs from the one at ``before``.

    The caller knows a transition lies in between; the span is at most a transition's size
    (usually an hour), so a bisection takes a dozen steps.
    """
    offset_before = _offset(_local(zone, before))
    while after - before > 1:
        middle = (before + after) // 2
        if _offset(_local(zone, middle)) == offset_before:
            before = middle
        else:
            after = middle
    return after


def _instant(zone: ZoneInfo, wall: datetime) -> int:
    """The instant a matching wall-clock time fires at (see the module docstring)."""
    # fold=0 picks the earlier of two instants for a repeated wall time. For a skipped one it
    # uses the offset from before the gap, which lands after the gap.
    later = _seconds(wall) - _offset(wall.replace(tzinfo=zone))
    if _local(zone, later).replace(tzinfo=None) == wall:
        return later
    # Skipped: fold=1 uses the offset from after the gap, which lands before it. The
    # transition lies in between, and that is when the skipped time fires.
    earlier = _seconds(wall) - _offset(wall.replace(tzinfo=zone, fold=1))
    return _first_change(zone, earlier, later)


def _search_start(zone: ZoneInfo, after_s: int) -> datetime:
    """The wall-clock time to search forward from (exclusive) for occurrences after ``after_s``."""
    here = _local(zone, after_s)
    wall = here.replace(tzinfo=None)
    if not here.fold:
        return wall
    # ``after_s`` is in the second pass through a repeated range. Every wall time up to the end
    # of that range had its occurrence in the first pass, so resume where the range ends.
    offset_now = _offset(here)
    offset_first_pass = _offset(here.replace(fold=0))
    change = _first_change(zone, after_s - (offset_first_pass - offset_now), after_s)
    range_end = _naive(change + offset_first_pass)
    return max(wall, range_end - _SECOND_DELTA)


def _next_in_zone(croniter_expr: str, zone: ZoneInfo, after_s: int) -> int:
    start = _search_start(zone, after_s)
    while True:
        wall = _next_wall(croniter_expr, start)
        instant = _instant(zone, wall)
        if instant > after_s:
            return instant
        # Only reachable around unusual transitions; walls strictly increase, so this ends.
        start = wall
