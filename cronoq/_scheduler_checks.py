"""Checks of the embedded scheduler's call arguments that are not task options (those are in
``_options``): task references, capacities and the policies of a recurring schedule."""

from __future__ import annotations

from cronoq.engine import OverlapPolicy
from cronoq.engine.limits import MAX_COUNT
from cronoq.engine.types import MissPolicy


def capacity_slots(value: object) -> int:
    """A capacity argument as a slot count; TypeError or ValueError naming what is wrong."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"capacity must be an int, not {type(value).__name__}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"capacity must be a whole number, not {value!r}")
    slots = int(value)
    if not 0 <= slots <= MAX_COUNT:
        raise ValueError(f"capacity must be between 0 and {MAX_COUNT}, not {slots}")
    return slots


def check_ref(target: object) -> None:
    """A task reference must be an id (int) or a key (str)."""
    if isinstance(target, bool) or not isinstance(target, int | str):
        raise TypeError("a task is named by its id (int) or key (str)")


def schedule_policies(
    name: object, cron: object, tz: object, overlap: str, on_miss: str
) -> tuple[OverlapPolicy, MissPolicy]:
    """Check a schedule's name, expression and zone types; its overlap and miss policies."""
    if not isinstance(name, str) or not isinstance(cron, str) or (tz is not None and not isinstance(tz, str)):
        raise TypeError("name, cron and tz must be strings")
    if not name:
        raise ValueError("a schedule needs a name")
    try:
        overlap_policy = OverlapPolicy(overlap)
    except ValueError:
        raise ValueError(f"invalid overlap {overlap!r}: expected skip, allow, queue or queue_on_success") from None
    try:
        miss = MissPolicy(on_miss)
    except ValueError:
        raise ValueError(f"invalid on_miss {on_miss!r}: expected run_late, skip or fail") from None
    return overlap_policy, miss
