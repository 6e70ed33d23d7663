"""The ranges every number the engine accepts must lie in, and overflow-free arithmetic on them.

Times and durations are int nanoseconds and are persisted as signed 64-bit integers (Postgres
``BIGINT``, SQLite ``INTEGER``), so a number that fits Python but not int64 must be refused where
it enters, never at a commit. The bounds:

* an instant (a deadline, a fixed start) lies between the Unix epoch and the largest int64
  nanosecond (2262-04-11);
* a duration (tolerance, timeout, duration hint, backoff, retry hint, ...) lies between 0 and
  100 years, the century the published server allows client-supplied durations;
* counts that the wire carries as ``uint32`` (attempts, worker slots, permits, bursts,
  capacities) stay below 2**32;
* a float factor (retry multiplier, rates, weights, fractions) is finite.

Sums of an instant and a duration that get persisted (a retry time, an occurrence's deadline)
go through ``add_ns``, which saturates at the largest instant instead of leaving int64.
"""

from __future__ import annotations

import math
from typing import Final

from .types import NS_PER_S

MAX_INSTANT: Final = (1 << 63) - 1
"""The latest instant (ns since the Unix epoch) a task may name: the int64 maximum."""

MAX_DURATION: Final = round(100 * 365.25 * 86400) * NS_PER_S
"""The longest duration (ns) the engine accepts: a century."""

MAX_COUNT: Final = (1 << 32) - 1
"""The largest count (attempts, slots, permits, burst, capacity): the wire's uint32."""


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def instant_problem(value: object, what: str) -> str | None:
    """Why ``value`` is not an acceptable instant, or None."""
    if not is_int(value):
        return f"{what} must be an integer number of nanoseconds"
    if not 0 <= value <= MAX_INSTANT:  # type: ignore[operator]
        return f"{what} must lie between the Unix epoch and {MAX_INSTANT} ns (year 2262)"
    return None


def duration_problem(value: object, what: str, *, positive: bool = False) -> str | None:
    """Why ``value`` is not an acceptable duration (ns), or None."""
    if not is_int(value):
        return f"{what} must be an integer number of nanoseconds"
    low = 1 if positive else 0
    if not low <= value <= MAX_DURATION:  # type: ignore[operator]
        bound = "positive" if positive else "non-negative"
        return f"{what} must be {bound} and at most 100 years"
    return None


def count_problem(value: object, what: str, *, low: int = 0) -> str | None:
    """Why ``value`` is not an acceptable count, or None."""
    if not is_int(value) or not low <= value <= MAX_COUNT:  # type: ignore[operator]
        return f"{what} must be an integer between {low} and {MAX_COUNT}"
    return None


def factor_problem(value: object, what: str, *, low: float, high: float = math.inf,
                   low_open: bool = False) -> str | None:  # fmt: skip
    """Why ``value`` is not a finite number in [low, high] ((low, high] with ``low_open``), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{what} must be a number"
    number = float(value)
    if not math.isfinite(number) or number > high or number < low or (low_open and number == low):
        opening = "(" if low_open else "["
        closing = "]" if math.isfinite(high) else ")"
        return f"{what} must be a finite number in {opening}{low:g}, {high:g}{closing}"
    return None


def add_ns(instant: int, duration: int) -> int:
    """``instant + duration``, saturating at ``MAX_INSTANT`` (for times that get persisted)."""
    total = instant + duration
    return total if total <= MAX_INSTANT else MAX_INSTANT
