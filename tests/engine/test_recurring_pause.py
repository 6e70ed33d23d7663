"""Pausing and resuming recurring schedules (an admin action of the web console).

A paused schedule creates no occurrence; one it had already created stays. Resumed, it continues
with its first occurrence after the present: occurrences that fell while it was paused are not run,
whatever the miss policy. The paused state is persisted, survives recovery and a replacement.

Times as in test_recurring: "*/10 * * * * *" from t = 0.5 s, so occurrences start at 10, 20, ...,
each created 2 s ahead (hold lead 1 s + tolerance 1 s).
"""

from __future__ import annotations

from cronoq.engine import MissPolicy, PutRecurring, RecurringSpec, TaskSpec

from .sim import Sim
from .test_recurring import START, add, advance_to, make, occurrences, starts, statuses, t
from .test_restore import crash_and_restore, persisting, pool


def pause(sim: Sim, name: str = "job", paused: bool = True) -> bool:
    found = sim.core.pause_recurring(sim.now, name, paused)
    sim.step()
    return found


def info(sim: Sim, name: str = "job") -> object:
    [found] = [entry for entry in sim.core.list_recurring() if entry.name == name]
    return found


def test_a_paused_schedule_creates_nothing() -> None:
    sim = make()
    add(sim)
    assert pause(sim)
    advance_to(sim, 45)
    assert occurrences(sim) == []
    listed = info(sim)
    assert listed.paused and listed.next_at is None and not listed.armed  # type: ignore[attr-defined]


def test_resumed_it_continues_from_the_next_occurrence_and_skips_the_paused_ones() -> None:
    # RunLate would run one missed occurrence late after downtime; after a pause none runs.
    sim = make()
    add(sim, on_miss=MissPolicy.RUN_LATE)
    pause(sim)
    advance_to(sim, 35)
    assert pause(sim, paused=False)
    listed = info(sim)
    assert not listed.paused and listed.next_at == t(40) and listed.armed  # type: ignore[attr-defined]
    advance_to(sim, 38)
    assert starts(sim) == [40]
    advance_to(sim, 40)
    assert statuses(sim) == ["running"]


def test_an_occurrence_created_before_the_pause_still_runs() -> None:
    sim = make()
    add(sim)
    advance_to(sim, 8)  # the 10 s occurrence exists from here
    pause(sim)
    advance_to(sim, 10)
    assert statuses(sim) == ["running"]
    advance_to(sim, 40)
    assert starts(sim) == [10]


def test_pausing_twice_or_resuming_a_running_schedule_changes_nothing() -> None:
    sim = make()
    add(sim)
    assert pause(sim, paused=False)
    assert info(sim).next_at == t(10)  # type: ignore[attr-defined]
    assert pause(sim) and pause(sim)
    assert pause(sim, paused=False)
    advance_to(sim, 10)
    assert starts(sim) == [10]


def test_unknown_schedules_are_reported() -> None:
    sim = make()
    assert not pause(sim, "nope") and not pause(sim, "nope", paused=False)


def test_replacing_a_paused_schedule_keeps_it_paused() -> None:
    sim = make()
    add(sim)
    pause(sim)
    add(sim, cron="*/5 * * * * *")
    advance_to(sim, 31)
    assert occurrences(sim) == []
    assert info(sim).cron == "*/5 * * * * *"  # type: ignore[attr-defined]
    pause(sim, paused=False)
    advance_to(sim, 35)
    assert starts(sim) == [35]


def test_the_paused_state_is_persisted_and_survives_recovery() -> None:
    old = persisting()
    old.advance(0.5)
    old.core.add_recurring(old.now, RecurringSpec("job", "*/10 * * * * *", TaskSpec(payload="job")))
    old.step()
    old.core.pause_recurring(old.now, "job", True)
    old.step()
    last = [m for m in old.persisted if isinstance(m, PutRecurring)][-1]
    assert last.paused and last.next_at is None
    new = crash_and_restore(old, pool(), at=60, persist=True)
    assert info(new).paused  # type: ignore[attr-defined]
    new.advance(60)
    assert occurrences(new) == []
    new.core.pause_recurring(new.now, "job", False)
    new.step()
    assert not info(new).paused  # type: ignore[attr-defined]
    next_at = info(new).next_at  # type: ignore[attr-defined]
    assert next_at is not None and next_at > new.now and (next_at - START) % 10_000_000_000 == 0
    resumed = [m for m in new.persisted if isinstance(m, PutRecurring)][-1]
    assert not resumed.paused and resumed.next_at == next_at
