"""Which fire times a due schedule runs now: the misfire policy, as pure functions.

All fire times come from `pgtasks.cron.CronSchedule` (the one code path for fire
times, DST rule included); this module only decides which of them get a run when
the scheduler finds a schedule due, possibly long after its next fire time
(downtime, a paused process, a slow tick).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from pgtasks.cron import CronSchedule

__all__ = ["FirePlan", "last_fires", "plan_fires"]

_ONE_MICROSECOND = timedelta(microseconds=1)
_FIRST_LOOKBACK = timedelta(minutes=1)
_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class FirePlan:
    """What to do with a schedule at one tick.

    Attributes:
        fires: fire times to create runs for, oldest first (aware UTC).
        next_fire_at: the schedule's next fire time: the first one after ``now``.
        missed: True when due fire times older than ``fires`` were passed over
            (the misfire policy dropped them).
    """

    fires: tuple[datetime, ...]
    next_fire_at: datetime
    missed: bool


def _walk(cron: CronSchedule, start: datetime, end: datetime, keep: int) -> tuple[list[datetime], int]:
    """The last ``keep`` fire times in ``(start, end]`` and how many there are in all."""
    out: deque[datetime] = deque(maxlen=keep)
    total = 0
    cursor = start
    while True:
        chunk = cron.fires_between(cursor, end, _CHUNK)
        out.extend(chunk)
        total += len(chunk)
        if len(chunk) < _CHUNK:
            return list(out), total
        cursor = chunk[-1]


def last_fires(cron: CronSchedule, after: datetime, upto: datetime, count: int) -> list[datetime]:
    """The latest ``count`` fire times ``t`` with ``after < t <= upto``, oldest first.

    Looks back from ``upto`` over windows that double in length (from one minute),
    so a long downtime costs time in proportion to the fire times near ``upto``,
    not to all the missed ones.

    Args:
        cron: the schedule's cron expression and zone.
        after: exclusive lower bound (aware).
        upto: inclusive upper bound (aware).
        count: how many to return at most (>= 1).

    Returns:
        Up to ``count`` aware UTC datetimes, increasing.
    """
    span = _FIRST_LOOKBACK
    while True:
        start = max(after, upto - span)
        found, total = _walk(cron, start, upto, count)
        if total >= count or start == after:
            return found
        span *= 2


def plan_fires(
    cron: CronSchedule, next_fire_at: datetime, now: datetime, misfire: str, catch_up_limit: int
) -> FirePlan:
    """Decide the runs of a schedule whose stored next fire time is ``next_fire_at``.

    Every fire time in ``[next_fire_at, now]`` is due. ``misfire="skip"`` runs only
    the latest of them; ``"catch_up"`` runs the latest ``catch_up_limit``. The next
    fire time becomes the first one after ``now``, so a tick never runs a fire time
    twice and never runs one before it is due.

    Args:
        cron: the schedule's cron expression and zone.
        next_fire_at: the stored next fire time (aware).
        now: the tick's time (aware; the database clock unless pinned).
        misfire: ``"skip"`` or ``"catch_up"``.
        catch_up_limit: bound for ``"catch_up"`` (>= 1).

    Returns:
        The plan; ``fires`` is empty when nothing is due yet.
    """
    if next_fire_at > now:
        return FirePlan((), next_fire_at, missed=False)
    keep = 1 if misfire == "skip" else catch_up_limit
    lower = next_fire_at - _ONE_MICROSECOND
    fires = last_fires(cron, lower, now, keep)
    missed = bool(fires) and cron.next_fire(lower) < fires[0]
    return FirePlan(tuple(fires), cron.next_fire(now), missed=missed)
