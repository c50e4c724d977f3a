"""The scheduler service on a real PostgreSQL with pinned time: fire times across real DST
transitions (through the same ticks production runs), misfire policies, exactly one run
per fire time, stale schedulers, and rows it must refuse without stopping."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from helpers import eventually

import pgtasks
from pgtasks.cron import CronSchedule
from pgtasks.errors import DatabaseError
from pgtasks.scheduler import Scheduler, SchedulerConfig, SimulatedClock
from pgtasks.scheduler.firing import last_fires, plan_fires
from pgtasks.scheduler.runs import RunEvent
from pgtasks.scheduler.service import SchedulerResult, _Stale

MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)
T0 = datetime(2025, 6, 2, 0, 0, tzinfo=UTC)


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


@pytest.fixture
def sapp(dsn: str) -> Iterator[pgtasks.App]:
    app = pgtasks.App("sched", dsn=dsn, load_entry_points=False)
    app.task(name="t.job", max_retries=0)(lambda *a, **k: None)
    yield app
    app.close()


def scheduler(app: pgtasks.App, **overrides: Any) -> Scheduler:
    return Scheduler(app, SchedulerConfig(reap=False, **overrides))


def fired(conn: psycopg.Connection[Any], name: str) -> list[tuple[datetime, datetime]]:
    """(scheduled_for, run_at) of a schedule's cron-made runs, in fire order."""
    return conn.execute(
        "SELECT scheduled_for, run_at FROM pgtasks.jobs WHERE schedule_name = %s AND trigger = 'schedule'"
        " ORDER BY scheduled_for",
        (name,),
    ).fetchall()


def tick_through(app: pgtasks.App, start: datetime, end: datetime, step: timedelta) -> SchedulerResult:
    """Run ticks at pinned times ``start, start+step, ... <= end``; returns summed counts."""
    sched = scheduler(app)
    total = SchedulerResult()
    at = start
    while at <= end:
        one = sched.run_once(now=at)
        total.fired += one.fired
        total.skipped += one.skipped
        total.missed += one.missed
        at += step
    return total


# -- DST through the scheduler ------------------------------------------------------------

DST_CASES = [
    pytest.param(
        (
            "30 2 * * *",
            "Europe/Berlin",
            utc(2025, 3, 28, 12),
            utc(2025, 4, 1, 0),
            [utc(2025, 3, 29, 1, 30), utc(2025, 3, 30, 1, 0), utc(2025, 3, 31, 0, 30)],
        ),
        id="berlin-spring-daily-0230-runs-at-0300-cest",
    ),
    pytest.param(
        (
            "30 2 * * *",
            "Europe/Berlin",
            utc(2025, 10, 24, 12),
            utc(2025, 10, 28, 0),
            [utc(2025, 10, 25, 0, 30), utc(2025, 10, 26, 0, 30), utc(2025, 10, 27, 1, 30)],
        ),
        id="berlin-autumn-daily-0230-runs-once",
    ),
    pytest.param(
        (
            "30 2 * * *",
            "America/New_York",
            utc(2025, 3, 7, 12),
            utc(2025, 3, 11, 0),
            [utc(2025, 3, 8, 7, 30), utc(2025, 3, 9, 7, 0), utc(2025, 3, 10, 6, 30)],
        ),
        id="new-york-spring-daily-0230-runs-at-0300-edt",
    ),
    pytest.param(
        (
            "30 1 * * *",
            "America/New_York",
            utc(2025, 10, 31, 12),
            utc(2025, 11, 4, 0),
            [utc(2025, 11, 1, 5, 30), utc(2025, 11, 2, 5, 30), utc(2025, 11, 3, 6, 30)],
        ),
        id="new-york-autumn-daily-0130-runs-once",
    ),
]


@pytest.mark.parametrize("case", DST_CASES)
def test_daily_schedule_fires_once_per_day_across_dst(
    sapp: pgtasks.App,
    conn: psycopg.Connection[Any],
    case: tuple[str, str, datetime, datetime, list[datetime]],
) -> None:
    cron, tz, start, end, expected = case
    sapp.schedules.create("d", "t.job", cron, timezone=tz, overlap="allow", now=start)
    step = 10 * MIN
    total = tick_through(sapp, start + step, end, step)
    got = fired(conn, "d")
    assert [s for s, _ in got] == expected
    assert total.fired == 3 and total.missed == 0
    for scheduled_for, run_at in got:  # each run made at the first tick at or after its fire time
        assert timedelta(0) <= run_at - scheduled_for < step
    # The same fire times as `pgtasks schedules next` shows.
    assert sapp.schedules.next_fire_times("d", 3, after=start) == expected


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            ("0 * * * *", "Europe/Berlin", utc(2025, 10, 25, 21), utc(2025, 10, 26, 4), HOUR),
            id="berlin-autumn-hourly",
        ),
        pytest.param(
            ("0 * * * *", "Europe/Berlin", utc(2025, 3, 29, 22), utc(2025, 3, 30, 4), HOUR),
            id="berlin-spring-hourly",
        ),
        pytest.param(
            ("*/15 * * * *", "America/New_York", utc(2025, 3, 9, 5), utc(2025, 3, 9, 9), 15 * MIN),
            id="new-york-spring-quarter-hourly",
        ),
        pytest.param(
            ("*/15 * * * *", "America/New_York", utc(2025, 11, 2, 4), utc(2025, 11, 2, 8), 15 * MIN),
            id="new-york-autumn-quarter-hourly",
        ),
    ],
)
def test_sub_daily_schedules_keep_real_time_spacing_across_dst(
    sapp: pgtasks.App, conn: psycopg.Connection[Any], case: tuple[str, str, datetime, datetime, timedelta]
) -> None:
    cron, tz, start, end, spacing = case
    sapp.schedules.create("h", "t.job", cron, timezone=tz, overlap="allow", now=start)
    tick_through(sapp, start + 5 * MIN, end, 5 * MIN)
    times = [s for s, _ in fired(conn, "h")]
    assert times[0] == start + spacing
    assert times[-1] == end
    assert all(b - a == spacing for a, b in itertools.pairwise(times))


# -- misfire -------------------------------------------------------------------------------


def test_misfire_skip_runs_only_the_latest_missed_fire_time(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    sapp.schedules.create("s", "t.job", "*/5 * * * *", overlap="allow", now=T0)
    sched = scheduler(sapp)
    assert sched.run_once(now=T0 + 5 * MIN).fired == 1
    late = sched.run_once(now=T0 + 62 * MIN)  # down from 00:05 to 01:02
    assert (late.fired, late.missed) == (1, 1)
    assert [s for s, _ in fired(conn, "s")] == [T0 + 5 * MIN, T0 + 60 * MIN]
    assert sapp.schedules.get("s").next_fire_at == T0 + 65 * MIN
    assert sapp.schedules.get("s").last_fire_at == T0 + 60 * MIN


def test_misfire_catch_up_runs_the_latest_bounded_fire_times(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    sapp.schedules.create(
        "c", "t.job", "*/5 * * * *", overlap="queue", misfire="catch_up", catch_up_limit=3, now=T0
    )
    sched = scheduler(sapp)
    assert sched.run_once(now=T0 + 5 * MIN).fired == 1
    assert sched.run_once(now=T0 + 16 * MIN).fired == 2  # 10 and 15: within the bound, nothing missed
    late = sched.run_once(now=T0 + 61 * MIN)
    assert (late.fired, late.missed) == (3, 1)
    assert [s for s, _ in fired(conn, "c")] == [T0 + m * MIN for m in (5, 10, 15, 50, 55, 60)]
    # overlap=queue: the runs wait for each other through one lock key.
    keys = conn.execute("SELECT DISTINCT lock_key, unique_key FROM pgtasks.jobs").fetchall()
    assert keys == [("schedule:c", None)]


def test_a_month_of_downtime_costs_little(sapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    sapp.schedules.create("m", "t.job", "* * * * *", overlap="allow", now=T0)
    started = time.monotonic()
    result = scheduler(sapp).run_once(now=T0 + timedelta(days=31, seconds=30))
    assert time.monotonic() - started < 5
    assert (result.fired, result.missed) == (1, 1)
    assert [s for s, _ in fired(conn, "m")] == [T0 + timedelta(days=31)]


def test_plan_and_last_fires_are_exact() -> None:
    cron = CronSchedule.parse("0 3 1 * *", "UTC")  # monthly: a sparse schedule
    assert last_fires(cron, utc(2024, 1, 1), utc(2025, 6, 15), 2) == [utc(2025, 5, 1, 3), utc(2025, 6, 1, 3)]
    assert last_fires(cron, utc(2025, 5, 2), utc(2025, 5, 30), 5) == []
    plan = plan_fires(cron, utc(2025, 1, 1, 3), utc(2025, 6, 15), "catch_up", 100)
    assert plan.fires == tuple(utc(2025, m, 1, 3) for m in range(1, 7)) and not plan.missed
    assert plan.next_fire_at == utc(2025, 7, 1, 3)
    assert plan_fires(cron, utc(2025, 7, 1, 3), utc(2025, 6, 15), "skip", 1).fires == ()


# -- exactly one run per fire time ---------------------------------------------------------------


def test_concurrent_ticks_make_one_run_per_fire_time(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    sapp.schedules.create("race", "t.job", "* * * * *", overlap="allow", now=T0)
    results: list[SchedulerResult] = []
    errors: list[BaseException] = []

    def tick(at: datetime, gate: threading.Barrier) -> None:
        app = pgtasks.App("racer", dsn=sapp.database.dsn, load_entry_points=False)
        try:
            gate.wait()
            results.append(scheduler(app).run_once(now=at))
        except BaseException as exc:
            errors.append(exc)
        finally:
            app.close()

    for minute in (1, 2, 3):
        gate = threading.Barrier(8)
        threads = [threading.Thread(target=tick, args=(T0 + minute * MIN, gate)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert errors == []
    assert [s for s, _ in fired(conn, "race")] == [T0 + m * MIN for m in (1, 2, 3)]
    assert sum(r.fired for r in results) == 3


def test_a_stale_scheduler_changes_nothing(sapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    sapp.schedules.create("stale", "t.job", "* * * * *", overlap="allow", now=T0)
    stale_row = sapp.stores.schedules.get_for_update(name="stale")
    assert stale_row is not None
    assert scheduler(sapp).run_once(now=T0 + MIN).fired == 1  # another process moved on
    slow = scheduler(sapp)
    with pytest.raises(_Stale), sapp.database.transaction() as tx:
        slow._fire_one(tx, stale_row, T0 + MIN, SchedulerResult(), [])
    assert len(fired(conn, "stale")) == 1
    # And the database itself refuses a second cron-made run for one fire time.
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO pgtasks.jobs (task_name, trigger, schedule_name, scheduled_for)"
            " VALUES ('t.job', 'schedule', 'stale', %s)",
            (T0 + MIN,),
        )


def test_a_reset_next_fire_time_cannot_duplicate_a_run(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    sapp.schedules.create("again", "t.job", "* * * * *", overlap="allow", now=T0)
    sched = scheduler(sapp)
    sched.run_once(now=T0 + MIN)
    conn.execute("UPDATE pgtasks.schedules SET next_fire_at = %s WHERE name = 'again'", (T0 + MIN,))
    result = sched.run_once(now=T0 + MIN)
    assert (result.fired, result.duplicates) == (0, 1)
    assert len(fired(conn, "again")) == 1
    assert sapp.schedules.get("again").next_fire_at == T0 + 2 * MIN


# -- rows the scheduler must refuse without stopping ------------------------------------------------


def test_bad_rows_written_by_hand_are_marked_and_the_rest_is_served(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    sapp.schedules.create("good", "t.job", "* * * * *", overlap="allow", now=T0)
    conn.execute(
        "INSERT INTO pgtasks.schedules (name, task_name, cron, timezone, next_fire_at) VALUES"
        " ('bad-cron', 't.job', '0 0 30 2 *', 'UTC', %(t)s),"
        " ('bad-zone', 't.job', '* * * * *', 'Mars/Olympus', %(t)s),"
        " ('bad-syntax', 't.job', 'every minute', 'UTC', %(t)s),"
        " ('fresh', 't.job', '*/2 * * * *', 'UTC', NULL)",
        {"t": T0},
    )
    sched = scheduler(sapp)
    first = sched.run_once(now=T0 + MIN)
    assert (first.fired, first.invalid, first.initialised) == (1, 3, 1)
    reasons = dict(
        conn.execute("SELECT name, invalid_reason FROM pgtasks.schedules ORDER BY name").fetchall()
    )
    assert "can never fire" in reasons["bad-cron"]
    assert "unknown time zone 'Mars/Olympus'" in reasons["bad-zone"]
    assert "expected five" in reasons["bad-syntax"]
    assert reasons["good"] is None and reasons["fresh"] is None
    assert sapp.schedules.get("fresh").next_fire_at == T0 + 2 * MIN
    second = sched.run_once(now=T0 + 2 * MIN)
    assert (second.fired, second.invalid) == (1 + 1, 0)  # good and fresh; bad rows stay quiet
    # A change through the API makes the row valid again and it is served.
    sapp.schedules.change("bad-cron", cron="*/3 * * * *", now=T0 + 2 * MIN)
    assert sapp.schedules.get("bad-cron").invalid_reason is None
    assert sched.run_once(now=T0 + 3 * MIN).fired == 2  # good and the fixed one


def test_the_database_refuses_bad_policies(conn: psycopg.Connection[Any]) -> None:
    for column, value in (("overlap", "never"), ("misfire", "all"), ("catch_up_limit", 0), ("source", "x")):
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                f"INSERT INTO pgtasks.schedules (name, task_name, cron, {column})"
                " VALUES ('x', 't', '@daily', %s)",
                (value,),
            )


def test_a_schedule_that_breaks_a_tick_is_skipped_for_that_tick(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """A row the database refuses to run (its queue was made empty by hand) costs only itself."""
    sapp.schedules.create("ok", "t.job", "* * * * *", now=T0)
    sapp.schedules.create("broken", "t.job", "* * * * *", now=T0)
    conn.execute("ALTER TABLE pgtasks.schedules DROP CONSTRAINT schedules_queue_check")
    conn.execute("UPDATE pgtasks.schedules SET queue = '' WHERE name = 'broken'")
    result = scheduler(sapp).run_once(now=T0 + MIN)
    assert (result.fired, result.errors) == (1, 1)
    assert [s for s, _ in fired(conn, "ok")] == [T0 + MIN]
    assert sapp.schedules.get("broken").next_fire_at == T0 + MIN  # untouched: retried next tick


def test_transient_database_errors_do_not_stop_the_service(sapp: pgtasks.App) -> None:
    broken = pgtasks.App("broken", dsn="postgresql://postgres@127.0.0.1:1/none", load_entry_points=False)
    with pytest.raises(DatabaseError) as err:
        Scheduler(broken, SchedulerConfig(reap=False)).run_once(now=T0)
    assert err.value.transient
    unreachable = Scheduler(broken, SchedulerConfig(interval=0.02))
    unreachable.start()
    try:
        eventually(lambda: unreachable.failures >= 3, timeout=10, message="failed ticks")
        assert unreachable._thread is not None and unreachable._thread.is_alive()
    finally:
        unreachable.stop()
        broken.close()
    # The same loop on a reachable database ticks on a clock of its own.
    sapp.schedules.create("svc", "t.job", "* * * * *", now=T0)
    clock = SimulatedClock(T0 + timedelta(seconds=30), speed=60.0, anchor=time.time())
    sched = Scheduler(sapp, SchedulerConfig(interval=0.02, reap=False), clock=clock)
    sched.start()
    try:
        eventually(lambda: len(sapp.schedules.history("svc")) >= 1, timeout=10, message="a run")
    finally:
        sched.stop()
    assert sched.failures == 0


def test_events_reach_plugins_after_commit(sapp: pgtasks.App) -> None:
    seen: list[tuple[str, int | None, str]] = []

    class Listener:
        @pgtasks.hookimpl
        def pgtasks_schedule_fired(
            self, schedule_name: str, job_id: int | None, trigger: str, scheduled_for: Any
        ) -> None:
            seen.append((schedule_name, job_id, trigger))

    sapp.plugin_manager.register(Listener())
    sapp.schedules.create("ev", "t.job", "* * * * *", now=T0)
    scheduler(sapp).run_once(now=T0 + MIN)
    scheduler(sapp).run_once(now=T0 + 2 * MIN)  # refused: run 1 still queued
    assert [(n, t) for n, _, t in seen] == [("ev", "schedule"), ("ev", "schedule")]
    assert seen[0][1] is not None and seen[1][1] is None
    assert RunEvent("ev", "t.job", "schedule", None, None).job_id is None
