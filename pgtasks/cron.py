"""Cron expressions in an IANA time zone, and the instants at which they fire.

This module is the only place where pgtasks turns a schedule into fire times: the
scheduler, ``pgtasks schedules next`` and the tests all go through
`CronSchedule`. It is pure: no database, no environment variables, no clock.

Accepted expressions
--------------------
* Standard five-field cron, ``minute hour day-of-month month day-of-week``, with the
  syntax croniter (https://github.com/pallets-eco/croniter) parses: lists, ranges,
  steps, month and weekday names, ``7`` for Sunday, and croniter's extensions ``L``
  (last day of month / last weekday of month), ``#`` (nth weekday of month), ``W``
  (nearest weekday) and ``?``. Day-of-month and day-of-week combine as in Vixie
  cron: when both are restricted a day matches if either matches.
* The aliases ``@yearly @annually @monthly @weekly @daily @midnight @hourly``, with
  their usual meaning (``0 0 1 1 *``, ``0 0 1 * *``, ``0 0 * * 0``, ``0 0 * * *``,
  ``0 * * * *``), case-insensitive.

Refused with `pgtasks.errors.InvalidSchedule`:

* ``@reboot`` (it names no time) and any other ``@`` word;
* six- and seven-field forms (croniter's seconds and year fields): schedules have
  minute resolution, sub-minute work is not what the scheduler is for;
* croniter's hashed and random values (``H``, ``R``): ``R`` picks a random value each
  time the expression is read, so two scheduler processes would disagree;
* anything croniter rejects (values out of range, zero steps, unknown names ...);
* expressions that can never fire, such as ``0 0 30 2 *`` or ``0 0 31 4 *``. These are
  found by asking croniter for the first fire after 2001-01-01 00:00: croniter gives
  up (``CroniterBadDateError``) when nothing matches within 50 years, and every
  combination of month, day of month and weekday that exists at all occurs within
  any 28 consecutive years of 2001-2099, so a refusal means "never";
* time zones that are not keys of the IANA database shipped in the ``tzdata``
  package (``Europe/Berln``, ``localtime``, ``Factory``, file paths).

Time zone data
--------------
Zones are always loaded from the ``tzdata`` package (a pgtasks dependency), never
from the host's ``/usr/share/zoneinfo``, so every host running the same pgtasks
install computes the same fire times even when the operating systems carry
different tz releases. Use `CronSchedule.zone` (or `load_zone`) to show local times
consistently with the fire times.

Daylight saving time: the rule
------------------------------
Fire times are computed by walking the local wall clock (naive date-times) with
croniter, which only matches fields, and mapping each matching wall time to real
instants with ``zoneinfo`` and PEP 495 ``fold``. croniter's own time-zone handling is
not used: it has changed behaviour across releases. The mapping follows the cron(8)
manual page of Vixie cron (the same text ships with cronie and Debian's cron): clock
changes are "handled specially" for jobs that run at a specific time or less often
than hourly, jobs that run more often are "scheduled normally"; after the clock moves
forward the jobs that would have run in the skipped interval run immediately, after
it moves backward care is taken not to run jobs twice. Precisely:

1. **Fixed-hour schedules** -- the hour field does not cover all 24 hours
   (``30 2 * * *``, ``0 */6 * * *``, ``@daily``, ``* 2 * * *``): every local date-time
   the fields match fires exactly once, at the first instant at which the zone's clock
   reads that date-time or later. So

   * a wall time that occurs twice (autumn fall-back) fires at its first occurrence
     only: ``30 1 * * *`` in America/New_York on 2025-11-02 fires at 01:30 EDT
     (05:30 UTC) and not again at 01:30 EST;
   * a wall time the clock skips (spring forward) fires once, at the instant the
     clock jumps: ``30 2 * * *`` in Europe/Berlin on 2025-03-30 fires at 03:00 CEST
     (01:00 UTC). Several skipped wall times collapse into that one fire, and so
     does a fire at the wall time the clock jumps to (``0 2,3 * * *`` fires once at
     03:00 CEST that day).

2. **Every-hour schedules** -- the hour field covers all 24 hours (``*``, ``*/1``,
   ``0-23``, ``@hourly``; croniter normalises these alike): they fire at every instant
   at which the zone's clock reads a matching date-time. A wall time that occurs twice
   fires twice (they are different real hours); a wall time the clock skips does not
   fire. With the usual whole-hour shifts this keeps real-time spacing across both
   changes: ``0 * * * *`` fires every 60 real minutes (Berlin spring: 01:00 CET,
   03:00 CEST; autumn: 02:00 CEST, 02:00 CET, 03:00 CET), ``*/15 * * * *`` every 15
   real minutes. In zones whose shift is not a whole hour (Australia/Lord_Howe moves
   by 30 minutes) the spacing across the change is that of the clock readings (90
   minutes for ``0 * * * *``).

Vixie cron's code tells the two kinds apart by whether the minute or the hour field
starts with ``*``; here only the hour field decides, by the hours it covers, so
``* 2 * * *`` and ``0 */2 * * *`` are fixed-hour schedules (they name hours of the
day) while ``0 0-23 * * *`` is an every-hour one.

Fire times are a set of instants: two wall times that map to one instant give one
fire. Unlike cron(8), which treats only clock changes shorter than three hours this
way (it cannot tell a larger one from the clock being reset), the rule applies to
every transition in the tz database, including Pacific/Apia skipping 2011-12-30.
"""

from __future__ import annotations

import difflib
import functools
import heapq
import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from types import MappingProxyType
from typing import Any
from zoneinfo import ZoneInfo

from croniter import CroniterBadDateError, CroniterError, croniter

from pgtasks.errors import InvalidSchedule

__all__ = ["ALIASES", "CronSchedule", "load_zone"]

#: Accepted ``@`` aliases and the five-field expressions they stand for (the
#: meanings of Vixie cron's crontab(5)).
ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "@yearly": "0 0 1 1 *",
        "@annually": "0 0 1 1 *",
        "@monthly": "0 0 1 * *",
        "@weekly": "0 0 * * 0",
        "@daily": "0 0 * * *",
        "@midnight": "0 0 * * *",
        "@hourly": "0 * * * *",
    }
)

_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
# croniter's hashed (H) and random (R) values, alone or with a range or step.
_HASHED_VALUE = re.compile(r"^[hr](?:$|[(/])", re.IGNORECASE)
# Start of the search that proves an expression can fire at all (see module docstring).
_FEASIBILITY_START = datetime(2001, 1, 1)
# tzdata keys that are not places: "Factory" has the placeholder offset "-00".
_REFUSED_ZONES = frozenset({"Factory"})
_ONE_MINUTE = timedelta(minutes=1)


@functools.cache
def _zone_keys() -> frozenset[str]:
    """Every zone key the installed ``tzdata`` package ships (its ``zones`` file)."""
    text = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines() if line.strip()) - _REFUSED_ZONES


@functools.cache
def _load_zone(name: str) -> ZoneInfo:
    path = resources.files("tzdata").joinpath("zoneinfo", *name.split("/"))
    with path.open("rb") as fh:
        return ZoneInfo.from_file(fh, key=name)


def load_zone(name: str) -> ZoneInfo:
    """Load an IANA time zone from the ``tzdata`` package.

    Args:
        name: an IANA key such as ``"Europe/Berlin"`` or ``"UTC"`` (case-sensitive).

    Returns:
        The zone, cached per name. It is built from the ``tzdata`` package rather than
        the host's zoneinfo files, so all hosts agree (see the module docstring).

    Raises:
        InvalidSchedule: ``name`` is not a str, or not a zone in ``tzdata``; the
            message suggests close matches.
    """
    if not isinstance(name, str):
        raise InvalidSchedule(f"time zone must be a str such as 'Europe/Berlin', not {type(name).__name__}")
    if name not in _zone_keys():
        close = difflib.get_close_matches(name, sorted(_zone_keys()), n=3)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise InvalidSchedule(f"unknown time zone {name!r}: not an IANA time zone key{hint}")
    return _load_zone(name)


def _normalise(expression: object) -> tuple[str, str]:
    """Check the shape of ``expression``; return (normalised text, five-field form).

    Raises:
        InvalidSchedule: not a str, empty, an unknown or refused alias, not five
            fields, or hashed/random values.
    """
    if not isinstance(expression, str):
        raise InvalidSchedule(f"cron expression must be a str, not {type(expression).__name__}")
    text = " ".join(expression.split())
    if not text:
        raise InvalidSchedule("cron expression is empty")
    if text.startswith("@"):
        alias = text.lower()
        if alias == "@reboot":
            raise InvalidSchedule(
                f"cron expression {expression!r} is refused: @reboot names no time, "
                "and pgtasks schedules fire only at times"
            )
        if alias not in ALIASES:
            raise InvalidSchedule(
                f"cron expression {expression!r} is refused: unknown alias; accepted are {', '.join(ALIASES)}"
            )
        return alias, ALIASES[alias]
    fields = text.split(" ")
    if len(fields) in (6, 7):
        raise InvalidSchedule(
            f"cron expression {expression!r} has {len(fields)} fields: seconds and year fields are "
            "not supported, pgtasks schedules have minute resolution; use the five fields "
            "'minute hour day-of-month month day-of-week'"
        )
    if len(fields) != len(_FIELD_NAMES):
        raise InvalidSchedule(
            f"cron expression {expression!r} has {len(fields)} field(s); expected five: "
            "'minute hour day-of-month month day-of-week', or an alias such as @daily"
        )
    for name, value in zip(_FIELD_NAMES, fields, strict=True):
        if any(_HASHED_VALUE.match(item) for item in value.split(",")):
            raise InvalidSchedule(
                f"cron expression {expression!r} is refused: hashed or random value {value!r} in the "
                f"{name} field; every scheduler process must compute the same fire times"
            )
    return text, text


def _expand(expression: str, fields: str) -> bool:
    """Validate ``fields`` with croniter; return True when the hour field is every hour.

    Raises:
        InvalidSchedule: croniter rejects the fields, or they can never fire.
    """
    try:
        expanded, _nth = croniter.expand(fields)
        croniter(fields, _FEASIBILITY_START, ret_type=datetime).get_next(datetime)
    except CroniterBadDateError as exc:
        raise InvalidSchedule(
            f"cron expression {expression!r} can never fire: no date matches its day-of-month, "
            "month and day-of-week fields"
        ) from exc
    except CroniterError as exc:
        raise InvalidSchedule(f"invalid cron expression {expression!r}: {exc}") from exc
    return bool(expanded[1] == ["*"])


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A validated cron expression in an IANA time zone.

    Build it with `CronSchedule.parse` (the constructor validates the same way).
    Equality and hashing use the normalised ``expression`` and ``timezone``.

    Attributes:
        expression: the expression with runs of whitespace collapsed to one space,
            or the lower-cased alias (``"@daily"``).
        timezone: the IANA zone key the fields are read in.
    """

    expression: str
    timezone: str = "UTC"
    _fields: str = field(init=False, repr=False, compare=False)
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)
    _every_hour: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        text, fields = _normalise(self.expression)
        every_hour = _expand(self.expression, fields)
        zone = load_zone(self.timezone)
        object.__setattr__(self, "expression", text)
        object.__setattr__(self, "_fields", fields)
        object.__setattr__(self, "_zone", zone)
        object.__setattr__(self, "_every_hour", every_hour)

    def __reduce__(self) -> tuple[Any, ...]:
        # Zones loaded from tzdata files do not pickle; rebuild from the two strings.
        return (type(self), (self.expression, self.timezone))

    @classmethod
    def parse(cls, expression: str, timezone: str = "UTC") -> CronSchedule:
        """Validate a cron expression and a time zone.

        Args:
            expression: five-field cron or an alias (see the module docstring).
            timezone: IANA zone key the fields are read in, e.g. ``"Europe/Berlin"``.

        Returns:
            The schedule.

        Raises:
            InvalidSchedule: the expression or zone is refused; the message names the
                expression (or zone) and the reason.
        """
        return cls(expression, timezone)

    @property
    def zone(self) -> ZoneInfo:
        """The time zone, loaded from ``tzdata`` (use it to display local times)."""
        return self._zone

    @property
    def every_hour(self) -> bool:
        """True when the hour field covers all 24 hours (DST rule 2 in the module docstring)."""
        return self._every_hour

    def next_fire(self, after: datetime) -> datetime:
        """The first fire time strictly after ``after``.

        Args:
            after: an aware datetime in any zone.

        Returns:
            An aware datetime in UTC, whole minutes of local time.

        Raises:
            TypeError: ``after`` is not a datetime.
            ValueError: ``after`` is naive.
        """
        return next(self._fires(_as_utc(after, "after")))

    def fire_times(self, after: datetime, count: int) -> list[datetime]:
        """The first ``count`` fire times strictly after ``after``, in increasing order.

        Args:
            after: an aware datetime in any zone.
            count: how many fire times to return (>= 0).

        Returns:
            Aware UTC datetimes, strictly increasing.

        Raises:
            TypeError: ``after`` is not a datetime or ``count`` not an int.
            ValueError: ``after`` is naive or ``count`` negative.
        """
        start = _as_utc(after, "after")
        return list(itertools.islice(self._fires(start), _non_negative(count, "count")))

    def fires_between(self, start: datetime, end: datetime, limit: int) -> list[datetime]:
        """Fire times ``t`` with ``start < t <= end``, the earliest ``limit`` of them.

        Meant for misfire catch-up: ``start`` is the last fire already handled,
        ``end`` is now. When the result holds ``limit`` items there may be more;
        call again with ``start`` set to the last one returned.

        Args:
            start: aware datetime, exclusive lower bound.
            end: aware datetime, inclusive upper bound.
            limit: the most fire times to return (>= 0).

        Returns:
            Aware UTC datetimes, strictly increasing; empty when ``end <= start``.

        Raises:
            TypeError: ``start`` or ``end`` is not a datetime, or ``limit`` not an int.
            ValueError: ``start`` or ``end`` is naive, or ``limit`` negative.
        """
        lower = _as_utc(start, "start")
        upper = _as_utc(end, "end")
        limit = _non_negative(limit, "limit")
        if upper <= lower:
            return []
        fires = itertools.takewhile(lambda t: t <= upper, self._fires(lower))
        return list(itertools.islice(fires, limit))

    # -- the DST rule ---------------------------------------------------------------

    def _fires(self, after: datetime) -> Iterator[datetime]:
        """Yield every fire time strictly after the UTC instant ``after``, in order.

        Wall-clock candidates come from croniter in increasing local time; each is
        mapped to its instants by `_instants`. Because the clock can run backwards
        (a fold), a later wall time may map to an earlier instant than the second
        occurrence of an earlier one, so instants wait in a heap until no later
        candidate can precede them: the earliest instant of a wall time never
        decreases as the wall time increases.
        """
        zone = self._zone
        local = after.astimezone(zone)
        wall = local.replace(tzinfo=None)
        start = wall
        if local.fold == 0:
            # Inside the first pass of a repeated interval the clock will read
            # earlier wall times again; start the search that much earlier.
            repeat = wall.replace(tzinfo=zone, fold=1)
            back = (local.utcoffset() or timedelta(0)) - (repeat.utcoffset() or timedelta(0))
            if back > timedelta(0):
                start = wall - back
        candidates = croniter(self._fields, start - _ONE_MINUTE, ret_type=datetime)
        pending: list[datetime] = []
        last = after
        while True:
            candidate: datetime = candidates.get_next(datetime)
            bound, instants = self._instants(candidate)
            for instant in instants:
                if instant > last:
                    heapq.heappush(pending, instant)
            while pending and pending[0] <= bound:
                instant = heapq.heappop(pending)
                if instant > last:
                    last = instant
                    yield instant

    def _instants(self, wall: datetime) -> tuple[datetime, list[datetime]]:
        """Map a naive local wall time to the instants it fires at.

        Returns:
            ``(bound, instants)``: ``instants`` are the UTC fire times of ``wall``;
            ``bound`` is a UTC instant no later than any fire time of any later wall
            time.
        """
        zone = self._zone
        first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        if first == second:  # the clock reads this wall time once
            return first, [first]
        if first < second:  # read twice (PEP 495: fold=0 is the earlier reading)
            return first, [first, second] if self._every_hour else [first]
        # Skipped: in a gap fold=0 applies the offset from before the jump and lands
        # after it, fold=1 the offset from after and lands before it.
        if self._every_hour:
            return second, []
        jump = _first_instant_reading(zone, wall, before=second, after=first)
        return jump, [jump]


def _first_instant_reading(zone: ZoneInfo, wall: datetime, *, before: datetime, after: datetime) -> datetime:
    """The first instant at which ``zone``'s clock reads ``wall`` or later.

    ``before`` reads earlier than ``wall`` and ``after`` reads later; the answer lies
    in ``(before, after]``. tz database transitions fall on whole seconds, so a
    bisection over POSIX seconds finds it exactly.
    """
    low, high = int(before.timestamp()), int(after.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def _as_utc(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be an aware datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got naive {value.isoformat()}")
    return value.astimezone(UTC)


def _non_negative(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value
