from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from cronoq.engine.cron import MAX_YEARS_BETWEEN_OCCURRENCES, CronSchedule, rfc3339_utc
from cronoq.engine.types import NS_PER_S, ConfigError

NY = "America/New_York"
LISBON = "Europe/Lisbon"


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    """A UTC calendar time as ns since the epoch."""
    return int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()) * NS_PER_S


def iso(ns: int) -> str:
    return rfc3339_utc(ns)


def run(expr: str, tz: str | None, after_ns: int, count: int) -> list[str]:
    schedule = CronSchedule.parse(expr, tz)
    out: list[str] = []
    t = after_ns
    for _ in range(count):
        t = schedule.next_after(t)
        out.append(iso(t))
    return out


# ---------------------------------------------------------------------------------------------
# Syntax


def test_five_fields_fire_on_second_zero() -> None:
    assert run("*/15 * * * *", None, utc(2026, 5, 1, 10, 7, 42), 3) == [
        "2026-05-01T10:15:00Z",
        "2026-05-01T10:30:00Z",
        "2026-05-01T10:45:00Z",
    ]
    assert run("30 2 * * *", None, utc(2026, 5, 1), 2) == ["2026-05-01T02:30:00Z", "2026-05-02T02:30:00Z"]


def test_next_after_is_strictly_after() -> None:
    schedule = CronSchedule.parse("0 12 * * *")
    noon = utc(2026, 5, 1, 12)
    assert schedule.next_after(noon) == utc(2026, 5, 2, 12)
    assert schedule.next_after(noon - 1) == noon
    assert schedule.next_after(noon - NS_PER_S) == noon


def test_sub_second_input_gives_whole_second_output() -> None:
    schedule = CronSchedule.parse("* * * * * *")
    start = utc(2026, 5, 1, 12) + 250_000_000
    assert schedule.next_after(start) == utc(2026, 5, 1, 12, 0, 1)
    assert schedule.next_after(utc(2026, 5, 1, 12) + NS_PER_S - 1) == utc(2026, 5, 1, 12, 0, 1)
    assert schedule.next_after(start) % NS_PER_S == 0


def test_six_fields_have_leading_seconds() -> None:
    assert run("30 0 12 * * *", None, utc(2026, 5, 1), 2) == ["2026-05-01T12:00:30Z", "2026-05-02T12:00:30Z"]
    assert run("15,45 * * * * *", None, utc(2026, 5, 1, 8, 0, 20), 3) == [
        "2026-05-01T08:00:45Z",
        "2026-05-01T08:01:15Z",
        "2026-05-01T08:01:45Z",
    ]
    # Seconds 0 in six fields is the same as five fields.
    five = CronSchedule.parse("5 4 * * *")
    six = CronSchedule.parse("0 5 4 * * *")
    t = utc(2026, 1, 1)
    for _ in range(5):
        assert five.next_after(t) == six.next_after(t)
        t = five.next_after(t)


def test_every_n_seconds() -> None:
    schedule = CronSchedule.parse("*/10 * * * * *")
    t = utc(2026, 5, 1, 23, 59, 41)
    seen = []
    for _ in range(8):
        t = schedule.next_after(t)
        seen.append(t)
    assert seen[0] == utc(2026, 5, 1, 23, 59, 50)
    assert all(b - a == 10 * NS_PER_S for a, b in itertools.pairwise(seen))
    assert iso(seen[1]) == "2026-05-02T00:00:00Z"

    # A step that does not divide 60 restarts at the top of each minute, as in any cron.
    assert run("*/25 * * * * *", None, utc(2026, 5, 1, 0, 0, 30), 3) == [
        "2026-05-01T00:00:50Z",
        "2026-05-01T00:01:00Z",
        "2026-05-01T00:01:25Z",
    ]


def test_every_second() -> None:
    # Straight through New York's spring-forward instant (07:00Z): one run per real second.
    assert run("* * * * * *", NY, utc(2026, 3, 8, 6, 59, 58), 3) == [
        "2026-03-08T06:59:59Z",
        "2026-03-08T07:00:00Z",
        "2026-03-08T07:00:01Z",
    ]


@pytest.mark.parametrize(
    ("expr", "same_as"),
    [
        ("0 9 * JAN MON", "0 9 * 1 1"),
        ("0 9 * jan mon", "0 9 * 1 1"),
        ("0 9 * Jan Mon", "0 9 * 1 1"),
        ("0 9 1 MAR-MAY *", "0 9 1 3-5 *"),
        ("0 9 * * MON-FRI", "0 9 * * 1-5"),
        ("0 9 * * SAT,SUN", "0 9 * * 6,0"),
        ("0 9 * * 7", "0 9 * * 0"),
        ("0 9 * * sun", "0 9 * * 0"),
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
        ("  @Hourly ", "0 * * * *"),
        # An equal range is its single value (croniter alone would read it as the whole field).
        ("0 5-5 * * *", "0 5 * * *"),
        ("0 0 * * 7-7", "0 0 * * 0"),
        ("0 0 * JAN-JAN *", "0 0 * 1 *"),
        ("0 0 * * MON-MON/2", "0 0 * * 1"),
        # 0-7 covers Sunday to Sunday: every day.
        ("0 0 * * 0-7", "0 0 * * *"),
        ("0 0 ? * *", "0 0 * * *"),
        ("0\t0  *   * *", "0 0 * * *"),
    ],
)
def test_equivalent_expressions(expr: str, same_as: str) -> None:
    schedule = CronSchedule.parse(expr, NY)
    reference = CronSchedule.parse(same_as, NY)
    t = utc(2026, 1, 1)
    for _ in range(30):
        nxt = schedule.next_after(t)
        assert nxt == reference.next_after(t)
        t = nxt


def test_names_resolve_to_the_right_days() -> None:
    # 2026-05-01 is a Friday.
    assert run("0 9 * * MON", None, utc(2026, 5, 1), 2) == ["2026-05-04T09:00:00Z", "2026-05-11T09:00:00Z"]
    assert run("0 0 1 feb *", None, utc(2026, 5, 1), 1) == ["2027-02-01T00:00:00Z"]


def test_day_of_month_or_day_of_week() -> None:
    # Both restricted: either matches (classic cron). 2026-05-01 is a Friday.
    assert run("0 0 13 * FRI", None, utc(2026, 4, 30), 4) == [
        "2026-05-01T00:00:00Z",
        "2026-05-08T00:00:00Z",
        "2026-05-13T00:00:00Z",
        "2026-05-15T00:00:00Z",
    ]


def test_croniter_extensions() -> None:
    assert run("0 0 L * *", None, utc(2026, 1, 15), 2) == ["2026-01-31T00:00:00Z", "2026-02-28T00:00:00Z"]
    assert run("0 0 * * MON#2", None, utc(2026, 1, 1), 2) == ["2026-01-12T00:00:00Z", "2026-02-09T00:00:00Z"]


def test_rare_but_valid_schedules() -> None:
    assert run("0 0 29 2 *", None, utc(2026, 1, 1), 2) == ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"]
    # The fifth Monday of February needs a Monday 29 February.
    assert run("0 0 * 2 MON#5", None, utc(2026, 1, 1), 1) == ["2044-02-29T00:00:00Z"]


def test_attributes_and_equality() -> None:
    schedule = CronSchedule.parse("0 30 2 * * *", NY)
    assert schedule.expr == "0 30 2 * * *"
    assert schedule.tz == NY
    assert CronSchedule.parse("0 0 * * *").tz is None
    assert schedule == CronSchedule.parse("0 30 2 * * *", NY)
    assert schedule != CronSchedule.parse("0 30 2 * * *", LISBON)
    assert hash(schedule) == hash(CronSchedule.parse("0 30 2 * * *", NY))
    assert "America/New_York" in repr(schedule)
    # Constructing directly validates too.
    with pytest.raises(ConfigError):
        CronSchedule("61 * * * *")


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("* * * *", "has 4 field(s); expected 5"),
        ("* * * * * * *", "has 7 field(s)"),
        ("0 0 * * * * 2030", "has 7 field(s)"),
        ("0 0 0 0 0 0 0 0", "has 8 field(s)"),
        ("60 * * * *", "minute field '60': 60 is out of range (0-59)"),
        ("* 24 * * *", "hour field '24': 24 is out of range (0-23)"),
        ("* * 0 * *", "day-of-month field '0': 0 is out of range (1-31)"),
        ("* * 32 * *", "day-of-month field '32': 32 is out of range"),
        ("* * * 13 *", "month field '13': 13 is out of range (1-12)"),
        ("* * * 0 *", "month field '0'"),
        ("* * * * 8", "day-of-week field '8': 8 is out of range (0-7)"),
        ("60 * * * * *", "second field '60': 60 is out of range (0-59)"),
        ("1-70 * * * *", "70 is out of range"),
        ("0 0 * * MONDAY", "unknown name 'monday'"),
        ("0 0 * MON *", "month field 'MON': unknown name 'mon'"),
        ("0 0 * * JAN", "day-of-week field 'JAN': unknown name 'jan'"),
        ("a b c d e", "unknown name 'a'"),
        ("H * * * *", "hashed (H) and random (R)"),
        ("R * * * *", "hashed (H) and random (R)"),
        ("H(0-5) * * * *", "unexpected character '('"),
        ("*/0 * * * *", "step '0'"),
        ("*/x * * * *", "step 'x'"),
        ("1,,2 * * * *", "empty list element"),
        ("1, * * * *", "empty list element"),
        ("1- * * * *", "cannot read the minute field '1-'"),
        ("1-2-3 * * * *", "cannot read the minute field '1-2-3'"),
        ("** * * * *", "cannot read the minute field '**'"),
        ("? * * * *", "cannot read the minute field '?'"),
        ("0 0 * * 1#6", "the number after '#' must be 1 to 5"),
        ("0 0 * * 1#", "the number after '#'"),
        ("1.5 * * * *", "unexpected character '.'"),
        ("0x1 * * * *", "unknown name 'x'"),
        ("-1 * * * *", "cannot read the minute field '-1'"),
        ("0 0 * * * *\n", "unexpected character '\\n'"),
        ("\uff10 * * * *", "unexpected character"),  # full-width zero
        ("*/\u00b2 * * * *", "unexpected character"),  # superscript two: a digit to str.isdigit
        ("0\x00 * * * *", "NUL"),
        ("@reboot", "@reboot is not supported"),
        ("@REBOOT", "@reboot is not supported"),
        ("@every 5m", "unknown cron nickname '@every 5m'"),
        ("@daily 0", "unknown cron nickname"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        ("0 0 0 30 2 *", "never fires"),
        ("x" * 2000, "longer than"),
    ],
)
def test_invalid_expressions(expr: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        CronSchedule.parse(expr)
    assert message in str(info.value)


def test_non_string_expression() -> None:
    with pytest.raises(ConfigError, match="must be a string"):
        CronSchedule.parse(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tz", "message"),
    [
        ("Mars/Olympus_Mons", "unknown time zone 'Mars/Olympus_Mons'"),
        ("", "unknown time zone ''"),
        ("utc", "unknown time zone 'utc'"),
        ("../etc/passwd", "unknown time zone"),
        ("/etc/localtime", "unknown time zone"),
        ("localtime", "not an IANA time zone name"),
        ("Europe/Lisbon\x00", "NUL"),
    ],
)
def test_invalid_time_zones(tz: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        CronSchedule.parse("0 0 * * *", tz)
    assert message in str(info.value)


def test_non_string_time_zone() -> None:
    with pytest.raises(ConfigError, match="must be a string"):
        CronSchedule.parse("0 0 * * *", 3)  # type: ignore[arg-type]


def test_running_off_the_calendar_is_a_bounded_error() -> None:
    schedule = CronSchedule.parse("0 0 29 2 *", NY)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="no occurrence"):
        schedule.next_after(utc(9999, 3, 1))
    with pytest.raises(ConfigError, match="no occurrence"):
        CronSchedule.parse("* * * * *").next_after(utc(9999, 12, 31, 23, 59, 30))
    assert time.monotonic() - started < 5


def test_never_firing_is_detected_quickly() -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError, match="never fires"):
        CronSchedule.parse("59 59 23 31 2 *")
    assert time.monotonic() - started < 2
    assert MAX_YEARS_BETWEEN_OCCURRENCES >= 40


# ---------------------------------------------------------------------------------------------
# Time zones and daylight saving
#
# America/New_York 2026: clocks go 02:00 EST -> 03:00 EDT on 8 March (07:00Z) and
# 02:00 EDT -> 01:00 EST on 1 November (06:00Z).
# Europe/Lisbon 2026: clocks go 01:00 WET -> 02:00 WEST on 29 March (01:00Z) and
# 02:00 WEST -> 01:00 WET on 25 October (01:00Z).


def test_new_york_spring_forward_daily() -> None:
    # 02:30 does not exist on 8 March; it runs once at 03:00 EDT, the end of the gap.
    assert run("30 2 * * *", NY, utc(2026, 3, 6), 4) == [
        "2026-03-06T07:30:00Z",
        "2026-03-07T07:30:00Z",
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:30:00Z",
    ]
    # Unaffected times just shift offset.
    assert run("0 30 1 * * *", NY, utc(2026, 3, 7), 3) == [
        "2026-03-07T06:30:00Z",
        "2026-03-08T06:30:00Z",
        "2026-03-09T05:30:00Z",
    ]


def test_new_york_spring_forward_hourly() -> None:
    assert run("0 * * * *", NY, utc(2026, 3, 8, 4, 30), 5) == [
        "2026-03-08T05:00:00Z",  # 00:00 EST
        "2026-03-08T06:00:00Z",  # 01:00 EST
        "2026-03-08T07:00:00Z",  # 02:00 does not exist -> 03:00 EDT, which is also 03:00's own run
        "2026-03-08T08:00:00Z",  # 04:00 EDT
        "2026-03-08T09:00:00Z",
    ]


def test_new_york_spring_forward_every_minute_fires_once_at_the_gap() -> None:
    assert run("* * * * *", NY, utc(2026, 3, 8, 6, 58), 4) == [
        "2026-03-08T06:59:00Z",
        "2026-03-08T07:00:00Z",
        "2026-03-08T07:01:00Z",
        "2026-03-08T07:02:00Z",
    ]
    assert run("0,30 2 * * *", NY, utc(2026, 3, 7, 12), 3) == [
        "2026-03-08T07:00:00Z",
        "2026-03-09T06:00:00Z",
        "2026-03-09T06:30:00Z",
    ]


def test_new_york_fall_back_daily() -> None:
    # 01:30 happens twice on 1 November; it runs at the first one (EDT) only.
    assert run("30 1 * * *", NY, utc(2026, 10, 30), 4) == [
        "2026-10-30T05:30:00Z",
        "2026-10-31T05:30:00Z",
        "2026-11-01T05:30:00Z",
        "2026-11-02T06:30:00Z",
    ]
    # Asked from inside the second pass, the next run is the next day's.
    schedule = CronSchedule.parse("30 1 * * *", NY)
    assert iso(schedule.next_after(utc(2026, 11, 1, 6, 10))) == "2026-11-02T06:30:00Z"
    assert iso(schedule.next_after(utc(2026, 11, 1, 5, 30))) == "2026-11-02T06:30:00Z"


def test_new_york_fall_back_hourly() -> None:
    assert run("0 * * * *", NY, utc(2026, 11, 1, 3, 30), 4) == [
        "2026-11-01T04:00:00Z",  # 00:00 EDT
        "2026-11-01T05:00:00Z",  # 01:00 EDT; 01:00 EST (06:00Z) is the same wall time: no run
        "2026-11-01T07:00:00Z",  # 02:00 EST
        "2026-11-01T08:00:00Z",
    ]
    schedule = CronSchedule.parse("0 * * * *", NY)
    for inside_second_pass in (utc(2026, 11, 1, 6), utc(2026, 11, 1, 6, 30), utc(2026, 11, 1, 6, 59, 59)):
        assert iso(schedule.next_after(inside_second_pass)) == "2026-11-01T07:00:00Z"
    assert iso(schedule.next_after(utc(2026, 11, 1, 5, 59, 59))) == "2026-11-01T07:00:00Z"


def test_new_york_fall_back_every_twenty_minutes() -> None:
    assert run("*/20 * * * *", NY, utc(2026, 11, 1, 5, 10), 5) == [
        "2026-11-01T05:20:00Z",
        "2026-11-01T05:40:00Z",
        "2026-11-01T07:00:00Z",
        "2026-11-01T07:20:00Z",
        "2026-11-01T07:40:00Z",
    ]


def test_lisbon_spring_forward() -> None:
    assert run("30 1 * * *", LISBON, utc(2026, 3, 27), 4) == [
        "2026-03-27T01:30:00Z",  # 01:30 WET
        "2026-03-28T01:30:00Z",
        "2026-03-29T01:00:00Z",  # 01:30 does not exist -> 02:00 WEST
        "2026-03-30T00:30:00Z",  # 01:30 WEST
    ]
    assert run("0 0 * * * *", LISBON, utc(2026, 3, 28, 23, 30), 4) == [
        "2026-03-29T00:00:00Z",  # 00:00 WET
        "2026-03-29T01:00:00Z",  # 01:00 skipped -> 02:00 WEST, which is also 02:00's own run
        "2026-03-29T02:00:00Z",  # 03:00 WEST
        "2026-03-29T03:00:00Z",
    ]


def test_lisbon_fall_back() -> None:
    assert run("30 1 * * *", LISBON, utc(2026, 10, 23), 4) == [
        "2026-10-23T00:30:00Z",  # 01:30 WEST
        "2026-10-24T00:30:00Z",
        "2026-10-25T00:30:00Z",  # first 01:30 (WEST) only
        "2026-10-26T01:30:00Z",  # 01:30 WET
    ]
    assert run("0 0 * * * *", LISBON, utc(2026, 10, 24, 22, 30), 4) == [
        "2026-10-24T23:00:00Z",  # 00:00 WEST
        "2026-10-25T00:00:00Z",  # 01:00 WEST; 01:00 WET is a repeat
        "2026-10-25T02:00:00Z",  # 02:00 WET
        "2026-10-25T03:00:00Z",
    ]
    schedule = CronSchedule.parse("0 * * * *", LISBON)
    assert iso(schedule.next_after(utc(2026, 10, 25, 1, 0))) == "2026-10-25T02:00:00Z"


@pytest.mark.parametrize("tz", [None, "UTC", "Etc/UTC"])
def test_utc_is_exact(tz: str | None) -> None:
    # Exact intervals straight through the dates other zones change their clocks.
    for expr, step_s, start in [
        ("0 */6 * * *", 6 * 3600, utc(2026, 3, 7)),
        ("30 2 * * *", 86400, utc(2026, 3, 6, 2, 30)),
        ("*/30 * * * * *", 30, utc(2026, 11, 1, 5, 58)),
        ("0 * * * *", 3600, utc(2026, 10, 25)),
    ]:
        schedule = CronSchedule.parse(expr, tz)
        t = start
        for _ in range(20):
            nxt = schedule.next_after(t)
            assert nxt - t == step_s * NS_PER_S
            t = nxt


def test_fixed_offset_zone() -> None:
    # POSIX sign convention: Etc/GMT+5 is UTC-5 all year.
    assert run("30 2 * * *", "Etc/GMT+5", utc(2026, 3, 7), 3) == [
        "2026-03-07T07:30:00Z",
        "2026-03-08T07:30:00Z",
        "2026-03-09T07:30:00Z",
    ]


def test_whole_day_skipped() -> None:
    # Samoa skipped 30 December 2011 (-10:00 -> +14:00 at 2011-12-30T10:00Z).
    assert run("0 12 * * *", "Pacific/Apia", utc(2011, 12, 29), 4) == [
        "2011-12-29T22:00:00Z",  # 29 Dec 12:00 -10:00
        "2011-12-30T10:00:00Z",  # 30 Dec never happened: runs at 31 Dec 00:00 +14:00
        "2011-12-30T22:00:00Z",  # 31 Dec 12:00 +14:00
        "2011-12-31T22:00:00Z",
    ]


# ---------------------------------------------------------------------------------------------
# Against an independent, minute-by-minute model of the rules


def _model(expr: str, tz: str, start: datetime, minutes: int) -> list[str]:
    """Walk UTC minute by minute and decide for each instant whether the schedule fires."""
    zone = ZoneInfo(tz)
    # Every matching wall-clock minute from a day before to a day after the window.
    it = croniter(expr, start.replace(tzinfo=None) - timedelta(days=1), ret_type=datetime)
    matching: set[datetime] = set()
    while not matching or max(matching) < start.replace(tzinfo=None) + timedelta(minutes=minutes, days=1):
        matching.add(it.get_next(datetime))
    fired: list[str] = []
    for i in range(1, minutes + 1):
        instant = start + timedelta(minutes=i)
        local = instant.astimezone(zone)
        wall = local.replace(tzinfo=None)
        if local.fold:
            continue  # second pass through a repeated range
        fires = wall in matching
        previous = (instant - timedelta(seconds=1)).astimezone(zone)
        gap = (local.utcoffset() or timedelta()) - (previous.utcoffset() or timedelta())
        if gap > timedelta(0):
            # The clocks just jumped forward: every skipped wall time fires here.
            skipped = wall - gap
            while skipped < wall and not fires:
                fires = skipped in matching
                skipped += timedelta(minutes=1)
        if fires:
            fired.append(instant.strftime("%Y-%m-%dT%H:%M:%SZ"))
    return fired


@pytest.mark.parametrize(
    ("tz", "day"),
    [
        (NY, datetime(2026, 3, 7, 12, tzinfo=UTC)),
        (NY, datetime(2026, 10, 31, 12, tzinfo=UTC)),
        (LISBON, datetime(2026, 3, 28, 12, tzinfo=UTC)),
        (LISBON, datetime(2026, 10, 24, 12, tzinfo=UTC)),
        ("Australia/Lord_Howe", datetime(2026, 4, 4, 0, tzinfo=UTC)),  # 30-minute fall-back
        ("Australia/Lord_Howe", datetime(2026, 10, 3, 0, tzinfo=UTC)),  # 30-minute spring-forward
    ],
)
@pytest.mark.parametrize(
    "expr",
    ["*/7 * * * *", "15,45 * * * *", "0 * * * *", "30 1 * * *", "30 2 * * *", "0 1-3 * * *", "59 * * * *"],
)
def test_matches_minute_by_minute_model(tz: str, day: datetime, expr: str) -> None:
    minutes = 24 * 60
    expected = _model(expr, tz, day, minutes)
    schedule = CronSchedule.parse(expr, tz)
    end = int((day + timedelta(minutes=minutes)).timestamp()) * NS_PER_S
    got: list[str] = []
    t = int(day.timestamp()) * NS_PER_S
    while True:
        t = schedule.next_after(t)
        if t > end:
            break
        got.append(iso(t))
    assert got == expected


def test_next_after_is_cheap() -> None:
    schedule = CronSchedule.parse("0 30 2 * * *", NY)
    t = utc(2026, 1, 1)
    started = time.monotonic()
    for _ in range(365):
        t = schedule.next_after(t)
    assert iso(t) == "2026-12-31T07:30:00Z"
    assert time.monotonic() - started < 2


# ---------------------------------------------------------------------------------------------
# rfc3339_utc


def test_rfc3339_utc() -> None:
    assert rfc3339_utc(0) == "1970-01-01T00:00:00Z"
    assert rfc3339_utc(utc(2026, 3, 8, 7, 30)) == "2026-03-08T07:30:00Z"
    assert rfc3339_utc(utc(2026, 3, 8, 7, 30) + 999_999_999) == "2026-03-08T07:30:00Z"
    assert rfc3339_utc(-1) == "1969-12-31T23:59:59Z"
    assert rfc3339_utc(utc(9999, 12, 31, 23, 59, 59)) == "9999-12-31T23:59:59Z"
    start = CronSchedule.parse("0 30 2 * * *", NY).next_after(utc(2026, 3, 7, 12))
    key = f"nightly-export@{rfc3339_utc(start)}"
    assert key == "nightly-export@2026-03-08T07:00:00Z"


def test_second_pass_query_skips_straight_to_the_end_of_the_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    # From inside the repeated hour, the search resumes where the repeat ends instead of
    # walking through (and discarding) every second of the first pass's wall times.
    import cronoq.engine.cron as cron

    calls: list[datetime] = []
    real = cron._next_wall

    def counting(croniter_expr: str, after: datetime) -> datetime:
        calls.append(after)
        return real(croniter_expr, after)

    schedule = CronSchedule.parse("* * * * * *", NY)
    monkeypatch.setattr(cron, "_next_wall", counting)
    assert iso(schedule.next_after(utc(2026, 11, 1, 6, 0, 5))) == "2026-11-01T07:00:00Z"
    assert len(calls) == 1
    assert iso(schedule.next_after(utc(2026, 11, 1, 5, 59, 58))) == "2026-11-01T05:59:59Z"
