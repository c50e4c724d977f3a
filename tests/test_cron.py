"""Fire times of `pgtasks.cron.CronSchedule`, checked against real DST transitions.

Pure tests: no database. Expected instants are written out in UTC; the DST rule they
check is stated in the docstring of ``pgtasks/cron.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from pgtasks.cron import CronSchedule, load_zone
from pgtasks.errors import InvalidSchedule

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def fires(expression: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    return CronSchedule.parse(expression, tz).fires_between(start, end, limit=100_000)


# -- the exact transitions named in the module docstring -----------------------------

# Europe/Berlin 2025-03-30: 02:00 CET -> 03:00 CEST at 01:00 UTC.
# Europe/Berlin 2025-10-26: 03:00 CEST -> 02:00 CET at 01:00 UTC.
# America/New_York 2025-03-09: 02:00 EST -> 03:00 EDT at 07:00 UTC.
# America/New_York 2025-11-02: 02:00 EDT -> 01:00 EST at 06:00 UTC.


@pytest.mark.parametrize(
    ("tz", "start", "expected"),
    [
        pytest.param(
            "Europe/Berlin",
            utc(2025, 3, 28),
            [
                utc(2025, 3, 28, 1, 30),
                utc(2025, 3, 29, 1, 30),
                utc(2025, 3, 30, 1, 0),
                utc(2025, 3, 31, 0, 30),
            ],
            id="berlin-spring: 02:30 skipped, fires at 03:00 CEST",
        ),
        pytest.param(
            "Europe/Berlin",
            utc(2025, 10, 24),
            [
                utc(2025, 10, 24, 0, 30),
                utc(2025, 10, 25, 0, 30),
                utc(2025, 10, 26, 0, 30),
                utc(2025, 10, 27, 1, 30),
            ],
            id="berlin-autumn: 02:30 twice, fires at the CEST one",
        ),
        pytest.param(
            "America/New_York",
            utc(2025, 3, 7),
            [utc(2025, 3, 7, 7, 30), utc(2025, 3, 8, 7, 30), utc(2025, 3, 9, 7, 0), utc(2025, 3, 10, 6, 30)],
            id="new-york-spring: 02:30 skipped, fires at 03:00 EDT",
        ),
        pytest.param(
            "America/New_York",
            utc(2025, 10, 31, 12),
            [
                utc(2025, 11, 1, 6, 30),
                utc(2025, 11, 2, 7, 30),
                utc(2025, 11, 3, 7, 30),
                utc(2025, 11, 4, 7, 30),
            ],
            id="new-york-autumn: 02:30 exists once (01:xx repeats)",
        ),
    ],
)
def test_daily_0230_fires_once_per_local_day(tz: str, start: datetime, expected: list[datetime]) -> None:
    schedule = CronSchedule.parse("30 2 * * *", tz)
    got = schedule.fire_times(start, 4)
    assert got == expected
    days = [t.astimezone(schedule.zone).date() for t in got]
    assert len(set(days)) == len(days) == 4


def test_daily_0130_new_york_fall_back_fires_once_at_first_occurrence() -> None:
    got = fires("30 1 * * *", "America/New_York", utc(2025, 11, 1), utc(2025, 11, 4))
    # 01:30 EDT on Nov 1 and Nov 2 (the first of the two 01:30s), 01:30 EST on Nov 3.
    assert got == [utc(2025, 11, 1, 5, 30), utc(2025, 11, 2, 5, 30), utc(2025, 11, 3, 6, 30)]


def test_skipped_wall_times_collapse_into_one_fire_at_the_jump() -> None:
    # 02:00, 02:30 and 03:00 Berlin on the spring day are all 03:00 CEST.
    got = fires("0,30 2,3 * * *", "Europe/Berlin", utc(2025, 3, 29, 12), utc(2025, 3, 30, 12))
    assert got == [utc(2025, 3, 30, 1, 0), utc(2025, 3, 30, 1, 30)]


def test_fixed_hour_every_minute_runs_its_hour_once() -> None:
    # "* 2 * * *" names a specific hour: spring collapses the hour into the jump,
    # autumn runs the first 02:xx only.
    spring = fires("* 2 * * *", "Europe/Berlin", utc(2025, 3, 30), utc(2025, 3, 30, 12))
    assert spring == [utc(2025, 3, 30, 1, 0)]
    autumn = fires("* 2 * * *", "Europe/Berlin", utc(2025, 10, 25, 12), utc(2025, 10, 26, 12))
    assert autumn == [utc(2025, 10, 26, 0, 0) + i * MINUTE for i in range(60)]


@pytest.mark.parametrize(
    ("tz", "window", "hours_lost_or_gained"),
    [
        ("Europe/Berlin", (utc(2025, 3, 29, 20), utc(2025, 3, 30, 6)), -1),
        ("Europe/Berlin", (utc(2025, 10, 25, 20), utc(2025, 10, 26, 6)), +1),
        ("America/New_York", (utc(2025, 3, 9, 2), utc(2025, 3, 9, 12)), -1),
        ("America/New_York", (utc(2025, 11, 2, 2), utc(2025, 11, 2, 12)), +1),
    ],
)
@pytest.mark.parametrize(
    ("expression", "step"), [("0 * * * *", HOUR), ("@hourly", HOUR), ("*/15 * * * *", 15 * MINUTE)]
)
def test_hourly_and_sub_hourly_keep_real_spacing(
    tz: str, window: tuple[datetime, datetime], hours_lost_or_gained: int, expression: str, step: timedelta
) -> None:
    start, end = window
    got = fires(expression, tz, start, end)
    assert len(got) == len(set(got))
    assert {b - a for a, b in pairwise(got)} == {step}
    assert got[0] == start + step and got[-1] == end  # nothing lost at either end
    # The wall clock shows the change: its span differs from the real span by an hour.
    zone = ZoneInfo(tz)
    wall_span = got[-1].astimezone(zone).replace(tzinfo=None) - got[0].astimezone(zone).replace(tzinfo=None)
    assert wall_span - (got[-1] - got[0]) == -hours_lost_or_gained * HOUR


def test_hourly_autumn_fires_in_both_repeated_hours() -> None:
    got = fires("0 * * * *", "Europe/Berlin", utc(2025, 10, 25, 23, 30), utc(2025, 10, 26, 2, 30))
    zone = ZoneInfo("Europe/Berlin")
    assert [t.astimezone(zone).isoformat() for t in got] == [
        "2025-10-26T02:00:00+02:00",
        "2025-10-26T02:00:00+01:00",
        "2025-10-26T03:00:00+01:00",
    ]


def test_every_hour_is_read_from_the_normalised_hour_field() -> None:
    assert CronSchedule.parse("0 * * * *").every_hour
    assert CronSchedule.parse("0 0-23 * * *").every_hour
    assert CronSchedule.parse("*/5 */1 * * *").every_hour
    assert not CronSchedule.parse("0 */2 * * *").every_hour
    assert not CronSchedule.parse("* 2 * * *").every_hour


# -- next_fire from inside a repeated or skipped interval -------------------------------


def test_next_fire_from_first_pass_of_repeated_hour_finds_second_pass() -> None:
    quarter = CronSchedule.parse("*/15 * * * *", "Europe/Berlin")
    # 00:50 UTC is 02:50 CEST; the clock next reads a quarter at 02:00 CET.
    assert quarter.next_fire(utc(2025, 10, 26, 0, 50)) == utc(2025, 10, 26, 1, 0)
    # 01:10 UTC is 02:10 CET (second pass).
    assert quarter.next_fire(utc(2025, 10, 26, 1, 10)) == utc(2025, 10, 26, 1, 15)
    daily = CronSchedule.parse("30 2 * * *", "Europe/Berlin")
    # 02:40 CEST: the 02:30 CET reading later that hour is not a fire for a fixed hour.
    assert daily.next_fire(utc(2025, 10, 26, 0, 40)) == utc(2025, 10, 27, 1, 30)


def test_next_fire_just_before_the_jump() -> None:
    daily = CronSchedule.parse("30 2 * * *", "Europe/Berlin")
    assert daily.next_fire(utc(2025, 3, 30, 1) - timedelta(seconds=1)) == utc(2025, 3, 30, 1, 0)
    assert daily.next_fire(utc(2025, 3, 30, 1, 0)) == utc(2025, 3, 31, 0, 30)


def test_next_fire_is_strictly_after() -> None:
    schedule = CronSchedule.parse("0 9 * * *", "Europe/Berlin")
    first = schedule.next_fire(utc(2025, 6, 1))
    assert first == utc(2025, 6, 1, 7, 0)
    assert schedule.next_fire(first) == utc(2025, 6, 2, 7, 0)
    assert schedule.next_fire(first - timedelta(microseconds=1)) == first


def test_after_may_be_in_any_zone() -> None:
    schedule = CronSchedule.parse("0 9 * * *", "Europe/Berlin")
    tokyo = datetime(2025, 6, 1, 15, 59, tzinfo=ZoneInfo("Asia/Tokyo"))  # 06:59 UTC
    fixed = datetime(2025, 6, 1, 3, 0, tzinfo=timezone(timedelta(hours=-4)))  # 07:00 UTC
    assert schedule.next_fire(tokyo) == utc(2025, 6, 1, 7, 0)
    assert schedule.next_fire(fixed) == utc(2025, 6, 2, 7, 0)
    assert schedule.next_fire(tokyo).tzinfo is UTC


# -- aliases, weekly, monthly --------------------------------------------------------


def test_daily_alias_is_local_midnight() -> None:
    schedule = CronSchedule.parse("@DAILY", "Europe/Berlin")
    assert schedule.expression == "@daily"
    assert schedule.fire_times(utc(2025, 3, 28, 12), 3) == [
        utc(2025, 3, 28, 23, 0),  # 00:00 CET
        utc(2025, 3, 29, 23, 0),  # 00:00 CET on the spring day
        utc(2025, 3, 30, 22, 0),  # 00:00 CEST
    ]
    assert CronSchedule.parse("@midnight", "Europe/Berlin").fire_times(utc(2025, 3, 28, 12), 3) == (
        schedule.fire_times(utc(2025, 3, 28, 12), 3)
    )


def test_midnight_that_does_not_exist_fires_at_0100() -> None:
    # America/Santiago springs forward at 24:00 on 2025-09-06: 00:00 -04 -> 01:00 -03.
    got = CronSchedule.parse("@daily", "America/Santiago").fire_times(utc(2025, 9, 5), 3)
    assert got == [utc(2025, 9, 5, 4, 0), utc(2025, 9, 6, 4, 0), utc(2025, 9, 7, 4, 0)]
    assert got[2].astimezone(ZoneInfo("America/Santiago")).hour == 1


def test_a_skipped_calendar_day_fires_at_the_start_of_the_next() -> None:
    # Pacific/Apia skipped 2011-12-30 entirely (-10 -> +14 at 10:00 UTC).
    got = CronSchedule.parse("0 10 * * *", "Pacific/Apia").fire_times(utc(2011, 12, 28), 4)
    assert got == [utc(2011, 12, 28, 20), utc(2011, 12, 29, 20), utc(2011, 12, 30, 10), utc(2011, 12, 30, 20)]


def test_weekly_across_spring_change() -> None:
    schedule = CronSchedule.parse("0 9 * * mon", "America/New_York")
    assert schedule.fire_times(utc(2025, 3, 1), 3) == [
        utc(2025, 3, 3, 14, 0),  # 09:00 EST
        utc(2025, 3, 10, 13, 0),  # 09:00 EDT
        utc(2025, 3, 17, 13, 0),
    ]
    assert CronSchedule.parse("@weekly", "UTC").fire_times(utc(2025, 3, 1), 2) == [
        utc(2025, 3, 2),
        utc(2025, 3, 9),
    ]


def test_monthly_and_day_31_skips_short_months() -> None:
    monthly = CronSchedule.parse("@monthly", "Europe/Berlin")
    assert monthly.fire_times(utc(2025, 2, 1), 3) == [
        utc(2025, 2, 28, 23, 0),  # 2025-03-01 00:00 CET
        utc(2025, 3, 31, 22, 0),  # 2025-04-01 00:00 CEST
        utc(2025, 4, 30, 22, 0),
    ]
    last = CronSchedule.parse("0 3 31 * *", "Europe/Berlin")
    assert last.fire_times(utc(2025, 3, 1), 3) == [
        utc(2025, 3, 31, 1, 0),
        utc(2025, 5, 31, 1, 0),
        utc(2025, 7, 31, 1, 0),
    ]
    assert CronSchedule.parse("@yearly", "America/New_York").next_fire(utc(2025, 6, 1)) == utc(2026, 1, 1, 5)


def test_day_of_month_or_day_of_week_when_both_restricted() -> None:
    # Vixie cron semantics: April 31 never comes, but every Monday in April does.
    schedule = CronSchedule.parse("0 0 31 4 mon")
    assert schedule.fire_times(utc(2025, 1, 1), 2) == [utc(2025, 4, 7), utc(2025, 4, 14)]


# -- fire_times and fires_between ------------------------------------------------------


def test_fire_times_strictly_increasing_and_count() -> None:
    schedule = CronSchedule.parse("*/7 1-3 * * *", "Europe/Berlin")
    got = schedule.fire_times(utc(2025, 10, 25), 60)
    assert len(got) == 60
    assert all(a < b for a, b in pairwise(got))
    assert schedule.fire_times(utc(2025, 10, 25), 0) == []


def test_fires_between_bounds_and_limit() -> None:
    schedule = CronSchedule.parse("0 * * * *")
    start, end = utc(2025, 1, 1, 0), utc(2025, 1, 1, 5)
    assert schedule.fires_between(start, end, limit=10) == [utc(2025, 1, 1, h) for h in range(1, 6)]
    assert schedule.fires_between(start, end, limit=2) == [utc(2025, 1, 1, 1), utc(2025, 1, 1, 2)]
    # Resuming from the last one returned continues without gaps or repeats.
    assert schedule.fires_between(utc(2025, 1, 1, 2), end, limit=2) == [
        utc(2025, 1, 1, 3),
        utc(2025, 1, 1, 4),
    ]
    assert schedule.fires_between(end, start, limit=10) == []
    assert schedule.fires_between(start, start, limit=10) == []
    assert schedule.fires_between(start, end, limit=0) == []


def test_fires_between_stops_at_end_for_rare_schedules() -> None:
    # Feb 29 on a Monday: 2016, 2044, 2072. The search must stop at `end`.
    schedule = CronSchedule.parse("0 0 29 2 1#5")
    assert schedule.fires_between(utc(2017, 1, 1), utc(2043, 1, 1), limit=5) == []
    assert schedule.next_fire(utc(2017, 1, 1)) == utc(2044, 2, 29)


# -- refused input -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("", ["empty"]),
        ("   ", ["empty"]),
        ("0 0 30 2 *", ["'0 0 30 2 *'", "never fire"]),
        ("0 0 31 4 *", ["'0 0 31 4 *'", "never fire"]),
        ("0 0 30,31 2 *", ["never fire"]),
        ("0 0 31 2,4,6 *", ["never fire"]),
        ("@reboot", ["'@reboot'", "names no time"]),
        ("@every 5m", ["'@every 5m'", "unknown alias"]),
        ("@fortnightly", ["unknown alias", "@daily"]),
        ("0 0 * * * *", ["6 fields", "minute resolution"]),
        ("0 0 0 * * * 2025", ["7 fields", "minute resolution"]),
        ("0 0 *", ["3 field(s)", "expected five"]),
        ("0 0 * * * * * *", ["8 field(s)"]),
        ("60 * * * *", ["'60 * * * *'", "out of range"]),
        ("* 24 * * *", ["invalid cron expression"]),
        ("* * 0 * *", ["invalid cron expression"]),
        ("* * * 13 *", ["invalid cron expression"]),
        ("* * * * 8", ["invalid cron expression"]),
        ("*/0 * * * *", ["step"]),
        ("a b c d e", ["'a b c d e'", "invalid cron expression"]),
        ("0 0 * * funday", ["invalid cron expression"]),
        ("H * * * *", ["hashed or random", "minute field"]),
        ("R * * * *", ["hashed or random"]),
        ("H(0-29)/15 * * * *", ["hashed or random"]),
        ("0 r * * *", ["hashed or random", "hour field"]),
    ],
)
def test_refused_expressions(expression: str, words: list[str]) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        CronSchedule.parse(expression, "UTC")
    for word in words:
        assert word in str(caught.value)


@pytest.mark.parametrize("expression", [None, 5, b"0 0 * * *", ["0", "0", "*", "*", "*"]])
def test_refused_non_str_expression(expression: object) -> None:
    with pytest.raises(InvalidSchedule, match="must be a str"):
        CronSchedule.parse(expression, "UTC")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tz", "words"),
    [
        ("Europe/Berln", ["'Europe/Berln'", "unknown time zone", "'Europe/Berlin'"]),
        ("europe/berlin", ["unknown time zone"]),
        ("", ["unknown time zone"]),
        ("localtime", ["unknown time zone"]),
        ("Factory", ["unknown time zone"]),
        ("/etc/localtime", ["unknown time zone"]),
        ("../../etc/passwd", ["unknown time zone"]),
        ("Europe", ["unknown time zone"]),
        ("CEST", ["unknown time zone"]),
    ],
)
def test_refused_time_zones(tz: str, words: list[str]) -> None:
    with pytest.raises(InvalidSchedule) as caught:
        CronSchedule.parse("0 2 * * *", tz)
    for word in words:
        assert word in str(caught.value)


@pytest.mark.parametrize("tz", [None, 1, ZoneInfo("UTC")])
def test_refused_non_str_time_zone(tz: object) -> None:
    with pytest.raises(InvalidSchedule, match="must be a str"):
        CronSchedule.parse("0 2 * * *", tz)  # type: ignore[arg-type]


def test_invalid_schedule_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="never fire"):
        CronSchedule("0 0 30 2 *")


def test_naive_or_non_datetime_arguments_are_refused() -> None:
    schedule = CronSchedule.parse("0 2 * * *")
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.next_fire(datetime(2025, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        schedule.fires_between(utc(2025, 1, 1), datetime(2025, 2, 1), limit=5)
    with pytest.raises(TypeError, match="aware datetime"):
        schedule.next_fire(datetime(2025, 1, 1).date())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count"):
        schedule.fire_times(utc(2025, 1, 1), -1)
    with pytest.raises(TypeError, match="limit"):
        schedule.fires_between(utc(2025, 1, 1), utc(2025, 2, 1), limit=2.5)  # type: ignore[arg-type]


# -- value semantics -----------------------------------------------------------------


def test_value_semantics() -> None:
    a = CronSchedule.parse("0  2 * *   *", "Europe/Berlin")
    b = CronSchedule.parse("0 2 * * *", "Europe/Berlin")
    assert a.expression == "0 2 * * *"
    assert a == b and hash(a) == hash(b)
    assert a != CronSchedule.parse("0 2 * * *", "Europe/Paris")
    assert repr(a) == "CronSchedule(expression='0 2 * * *', timezone='Europe/Berlin')"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.timezone = "UTC"  # type: ignore[misc]
    for clone in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a)):
        assert clone == a
        assert clone.next_fire(utc(2025, 3, 29, 12)) == a.next_fire(utc(2025, 3, 29, 12))


def test_zones_come_from_the_tzdata_package() -> None:
    zone = load_zone("Europe/Berlin")
    assert str(zone) == "Europe/Berlin"
    assert load_zone("Europe/Berlin") is zone
    assert CronSchedule.parse("0 2 * * *", "Europe/Berlin").zone is zone


# -- an independent reference: scan real time minute by minute ---------------------------


def field_matcher(fields: str) -> Callable[[datetime], bool]:
    """Match a naive wall time against plain five-field cron (no L, #, W) by set lookup."""
    expanded, nth = croniter.expand(fields)
    assert not nth
    sets = [None if values == ["*"] else {int(v) for v in values} for values in expanded]
    minute, hour, dom, month, dow = sets

    def match(wall: datetime) -> bool:
        if minute is not None and wall.minute not in minute:
            return False
        if hour is not None and wall.hour not in hour:
            return False
        if month is not None and wall.month not in month:
            return False
        cron_dow = (wall.weekday() + 1) % 7
        if dom is not None and dow is not None:  # Vixie cron: either day field
            return wall.day in dom or cron_dow in dow
        return (dom is None or wall.day in dom) and (dow is None or cron_dow in dow)

    return match


def reference_fires(fields: str, tz: str, start: datetime, end: datetime, every_hour: bool) -> list[datetime]:
    """The DST rule restated over real time, on a one-minute grid of UTC instants.

    Every-hour schedules fire at each instant whose reading matches. Fixed-hour
    schedules fire a wall time at the first instant whose reading reaches it: at each
    instant, fire if a matching wall time lies between the highest reading so far
    (exclusive) and the current reading (inclusive).
    """
    zone = load_zone(tz)
    match = field_matcher(fields)

    def reading(t: datetime) -> datetime:
        return t.astimezone(zone).replace(tzinfo=None)

    out = []
    highest = reading(start)
    t = start + MINUTE
    while t <= end:
        now = reading(t)
        if every_hour:
            if match(now):
                out.append(t)
        elif now > highest:
            wall = highest + MINUTE
            while wall <= now and not match(wall):
                wall += MINUTE
            if wall <= now:
                out.append(t)
        highest = max(highest, now)
        t += MINUTE
    return out


def transitions(tz: str, year: int) -> list[datetime]:
    """UTC instants in ``year`` where ``tz`` changes offset (found to the minute)."""
    zone = load_zone(tz)
    found = []
    t = utc(year, 1, 1)
    while t.year == year:
        if t.astimezone(zone).utcoffset() != (t + HOUR).astimezone(zone).utcoffset():
            m = t
            while m.astimezone(zone).utcoffset() == t.astimezone(zone).utcoffset():
                m += MINUTE
            found.append(m)
        t += HOUR
    return found


REFERENCE_EXPRESSIONS = [
    "30 2 * * *",
    "0 2,3 * * *",
    "*/20 1-3 * * *",
    "0 */2 * * *",
    "0 * * * *",
    "*/15 * * * *",
    "45 * * * *",
    "0 0 * * *",
    "10 2 * * 0",
]


@pytest.mark.parametrize(
    ("tz", "year"),
    [
        ("Europe/Berlin", 2025),
        ("America/New_York", 2025),
        ("Australia/Sydney", 2025),
        ("Australia/Lord_Howe", 2025),  # 30-minute shifts
        ("America/Santiago", 2025),  # changes at midnight
        ("Pacific/Apia", 2011),  # a skipped calendar day
    ],
)
def test_matches_minute_by_minute_reference_around_every_transition(tz: str, year: int) -> None:
    changes = transitions(tz, year)
    assert changes, f"{tz} has no transition in {year}"
    for expression in REFERENCE_EXPRESSIONS:
        schedule = CronSchedule.parse(expression, tz)
        for change in changes:
            start, end = change - timedelta(hours=30), change + timedelta(hours=30)
            expected = reference_fires(expression, tz, start, end, schedule.every_hour)
            got = schedule.fires_between(start, end, limit=10_000)
            assert got == expected, f"{expression!r} in {tz} around {change.isoformat()}"
            # Starting from inside a repeated or skipped stretch finds the same fires.
            for offset in (-90, -45, -1, 0, 1, 30, 61):
                after = change + offset * MINUTE
                assert schedule.fires_between(after, end, limit=10_000) == [t for t in expected if t > after]


# -- property: one year of fire times ----------------------------------------------------


PROPERTY_EXPRESSIONS = [
    "30 2 * * *",
    "0 * * * *",
    "*/15 * * * *",
    "0 9 * * 1-5",
    "15 2,3 1 * *",
    "@monthly",
    "0 */6 * * *",
    "45 1 * * 0",
]


def is_jump(zone: ZoneInfo, t: datetime) -> timedelta:
    """How far the clock of ``zone`` jumps forward at instant ``t`` (zero if it does not)."""
    before = (t - timedelta(seconds=1)).astimezone(zone).utcoffset()
    after = t.astimezone(zone).utcoffset()
    assert before is not None and after is not None
    return max(after - before, timedelta(0))


@pytest.mark.parametrize("tz", ["Europe/Berlin", "America/New_York", "Australia/Sydney"])
@pytest.mark.parametrize("expression", PROPERTY_EXPRESSIONS)
def test_one_year_of_fires_is_increasing_and_matches_the_fields(tz: str, expression: str) -> None:
    schedule = CronSchedule.parse(expression, tz)
    zone = schedule.zone
    fields = {"@monthly": "0 0 1 * *"}.get(expression, expression)
    match = field_matcher(fields)
    start, end = utc(2025, 1, 1), utc(2026, 1, 1)
    got = schedule.fires_between(start, end, limit=100_000)
    assert got and got[0] > start and got[-1] <= end
    assert all(a < b for a, b in pairwise(got))
    shifted = 0
    for t in got:
        assert t.tzinfo is UTC and t.second == 0 and t.microsecond == 0
        wall = t.astimezone(zone).replace(tzinfo=None)
        if match(wall) and not (schedule.every_hour is False and t.astimezone(zone).fold == 1):
            continue
        # Otherwise it must be the documented gap shift: a fixed-hour schedule firing
        # at the instant the clock jumps, for a matching wall time that was skipped.
        jump = is_jump(zone, t)
        assert not schedule.every_hour and jump, f"{t.isoformat()} does not match {expression!r}"
        skipped = [wall - jump + i * MINUTE for i in range(jump // MINUTE)]
        assert any(match(w) for w in skipped), f"{t.isoformat()} is no gap shift for {expression!r}"
        shifted += 1
    assert shifted <= 2  # at most one per transition
    # Sanity on volume: one daily fire per local day, one hourly fire per real hour.
    if expression == "30 2 * * *":
        assert len(got) == 365
    if expression == "0 * * * *":
        assert len(got) == 365 * 24
    if expression == "*/15 * * * *":
        assert len(got) == 365 * 24 * 4
