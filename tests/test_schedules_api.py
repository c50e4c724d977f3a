"""``app.schedules`` and ``@app.periodic_task``: definitions, validation, sync, pause,
manual triggers and history, on a real PostgreSQL with pinned time."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import pgtasks
from pgtasks.errors import (
    InvalidSchedule,
    RunAlreadyActive,
    ScheduleNotFound,
    SerializationError,
    UnknownTask,
)
from pgtasks.scheduler import Scheduler, SchedulerConfig, ScheduleSpec

T0 = datetime(2025, 6, 2, 0, 0, tzinfo=UTC)  # a Monday
MIN = timedelta(minutes=1)


@pytest.fixture
def sapp(dsn: str) -> Iterator[pgtasks.App]:
    """An app with two plain tasks and no schedules."""
    app = pgtasks.App("sched", dsn=dsn, load_entry_points=False)
    app.task(name="t.job", max_retries=2)(lambda *a, **k: None)
    app.task(name="t.other", queue="other", lock="other-lock", retry_on_worker_lost=False)(
        lambda *a, **k: None
    )
    yield app
    app.close()


def scheduler(app: pgtasks.App) -> Scheduler:
    return Scheduler(app, SchedulerConfig(reap=False))


def runs(conn: psycopg.Connection[Any], name: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT trigger, scheduled_for, status, attempt, parent_id FROM pgtasks.jobs"
        " WHERE schedule_name = %s ORDER BY id",
        (name,),
    ).fetchall()


def finish(conn: psycopg.Connection[Any], job_id: int, status: str = "succeeded") -> None:
    """End a queued run the way a worker would (claim, then finish), without a worker."""
    conn.execute(
        "UPDATE pgtasks.jobs SET status = 'running', attempt = attempt + 1, worker_id = 'w',"
        " started_at = now() WHERE id = %s AND status = 'queued'",
        (job_id,),
    )
    conn.execute(
        "UPDATE pgtasks.jobs SET status = %s, finished_at = now() WHERE id = %s AND status = 'running'",
        (status, job_id),
    )


# -- validation at definition time -------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "timezone", "message"),
    [
        ("61 * * * *", "UTC", "invalid cron expression"),
        ("0 0 30 2 *", "UTC", "can never fire"),
        ("0 0 31 4 *", "UTC", "can never fire"),
        ("* * * *", "UTC", "expected five"),
        ("0 0 * * * *", "UTC", "seconds and year fields are not supported"),
        ("@reboot", "UTC", "@reboot"),
        ("H * * * *", "UTC", "hashed or random"),
        ("0 2 * * *", "Europe/Berln", "unknown time zone 'Europe/Berln'.*Europe/Berlin"),
        ("0 2 * * *", "localtime", "unknown time zone"),
        ("", "UTC", "empty"),
    ],
)
def test_bad_cron_or_zone_is_refused_when_defined(
    sapp: pgtasks.App, cron: str, timezone: str, message: str
) -> None:
    with pytest.raises(InvalidSchedule, match=message):
        sapp.add_periodic_task(cron, "t.job", name="bad", timezone=timezone)
    with pytest.raises(InvalidSchedule, match=message):
        sapp.schedules.create("bad", "t.job", cron, timezone=timezone)
    assert "bad" not in sapp.schedules.code_defined
    assert [s.name for s in sapp.schedules.all()] == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"overlap": "never"}, "overlap policy must be one of 'skip', 'queue', 'allow'"),
        ({"misfire": "run_all"}, "misfire policy must be one of 'skip', 'catch_up'"),
        ({"misfire": "catch_up"}, "overlap='skip' all but the first would be refused"),
        ({"misfire": "catch_up", "overlap": "queue", "catch_up_limit": 0}, "catch_up_limit"),
        ({"catch_up_limit": 1001}, "catch_up_limit"),
        ({"max_retries": -1}, "max_retries"),
        ({"after": "db-dump"}, "list of schedule names"),
        ({"name": " padded"}, "leading or trailing whitespace"),
        ({"name": "x\x00y"}, "no NUL"),
        ({"name": "self", "after": ["self"]}, "its own prerequisite"),
        ({"every": 5}, "unknown schedule option"),
    ],
)
def test_bad_policies_are_refused_when_defined(
    sapp: pgtasks.App, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSchedule, match=message):
        sapp.add_periodic_task("0 2 * * *", "t.job", **options)


def test_trigger_only_schedule_needs_prerequisites(sapp: pgtasks.App) -> None:
    with pytest.raises(InvalidSchedule, match="needs a cron expression, or prerequisites"):
        sapp.add_periodic_task(None, "t.job", name="nothing")
    with pytest.raises(InvalidSchedule, match="unknown time zone"):
        sapp.add_periodic_task(None, "t.job", name="later", after=["x"], timezone="Mars/Base")
    spec = sapp.add_periodic_task(None, "t.job", name="later", after=["x", "x"])
    assert spec.after == ("x",)


def test_unstorable_arguments_and_unknown_tasks_are_refused(sapp: pgtasks.App) -> None:
    with pytest.raises(SerializationError, match=r"args\[0\]"):
        sapp.add_periodic_task("@daily", "t.job", name="bad-args", args=[object()])
    with pytest.raises(SerializationError):
        sapp.add_periodic_task("@daily", "t.job", name="bad-kwargs", kwargs={"s": "nul\x00"})
    with pytest.raises(UnknownTask):
        sapp.add_periodic_task("@daily", "t.nope", name="ghost")
    with pytest.raises(UnknownTask):
        sapp.schedules.create("ghost", "t.nope", "@daily")


def test_a_refused_periodic_task_registers_no_task(sapp: pgtasks.App) -> None:
    def nightly() -> None: ...

    with pytest.raises(InvalidSchedule):
        sapp.periodic_task("0 2 * * *", timezone="Nowhere/City", name="nightly")(nightly)
    assert not any(name.endswith("nightly") for name in sapp.tasks)
    task = sapp.periodic_task(
        "0 2 * * *", timezone="Europe/Berlin", name="nightly", task_name="n.b", bind=True
    )(nightly)
    assert task.name == "n.b" and task.options.bind
    spec = sapp.schedules.code_defined["nightly"]
    assert (spec.task_name, spec.cron, spec.timezone) == ("n.b", "0 2 * * *", "Europe/Berlin")


def test_spec_inherits_the_task_options(sapp: pgtasks.App) -> None:
    spec = sapp.add_periodic_task("@HOURLY", "t.other", name="o", args=(1, (2, 3)))
    assert spec.cron == "@hourly"
    assert (spec.queue, spec.lock_key, spec.retry_on_worker_lost, spec.max_retries) == (
        "other",
        "other-lock",
        False,
        3,
    )
    assert spec.args == (1, (2, 3))  # tuples round-trip exactly (pgtasks.serialization)
    queued = sapp.add_periodic_task("@daily", "t.job", name="q", overlap="queue", max_retries=None)
    assert queued.lock_key == "schedule:q" and queued.max_retries is None
    with pytest.raises(InvalidSchedule, match="already defined in code differently"):
        sapp.add_periodic_task("@daily", "t.job", name="q")


# -- sync ---------------------------------------------------------------------------------


def test_sync_creates_then_keeps_an_operators_pause(sapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    sapp.add_periodic_task("30 2 * * *", "t.job", name="nightly", timezone="Europe/Berlin")
    first = sapp.schedules.sync(now=T0)
    assert first.created == ("nightly",)
    stored = sapp.schedules.get("nightly")
    assert stored.source == "code" and stored.next_fire_at == datetime(2025, 6, 2, 0, 30, tzinfo=UTC)
    assert sapp.schedules.pause("nightly", by="ops@host") is True
    assert sapp.schedules.pause("nightly") is False

    # A new process with the same code: nothing to write, the pause stays.
    again = pgtasks.App("sched", dsn=sapp.database.dsn, load_entry_points=False)
    try:
        again.task(name="t.job", max_retries=2)(lambda *a, **k: None)
        again.add_periodic_task("30 2 * * *", "t.job", name="nightly", timezone="Europe/Berlin")
        assert again.schedules.sync(now=T0 + MIN).unchanged == ("nightly",)
        # The code changes its cron: definition and next fire time follow, the pause stays.
        fresh = pgtasks.App("sched", dsn=sapp.database.dsn, load_entry_points=False)
        fresh.task(name="t.job", max_retries=2)(lambda *a, **k: None)
        fresh.add_periodic_task("0 4 * * *", "t.job", name="nightly", timezone="Europe/Berlin", args=[7])
        assert fresh.schedules.sync(now=T0 + MIN).updated == ("nightly",)
        changed = fresh.schedules.get("nightly")
        assert (changed.cron, changed.args, changed.paused, changed.paused_by) == (
            "0 4 * * *",
            [7],
            True,
            "ops@host",
        )
        assert changed.next_fire_at == datetime(2025, 6, 2, 2, 0, tzinfo=UTC)
        fresh.close()
    finally:
        again.close()


def test_sync_refuses_a_dependency_cycle_and_writes_nothing(sapp: pgtasks.App) -> None:
    sapp.schedules.create("a", "t.job", "@daily", after=["b"], now=T0)
    sapp.add_periodic_task("@daily", "t.job", name="b", after=["a"])
    with pytest.raises(InvalidSchedule, match="dependency cycle: b -> a -> b"):
        sapp.schedules.sync(now=T0)
    # Implicit syncs (any other call) log the refusal instead of failing every call.
    with pytest.raises(ScheduleNotFound):
        sapp.schedules.get("b")
    assert [s.name for s in sapp.schedules.all()] == ["a"]


# -- run-time changes --------------------------------------------------------------------


def test_create_change_pause_resume_delete(sapp: pgtasks.App) -> None:
    made = sapp.schedules.create("api", "t.job", "*/10 * * * *", args=[1], now=T0)
    assert (made.source, made.next_fire_at, made.args) == ("api", T0 + 10 * MIN, [1])
    with pytest.raises(InvalidSchedule, match="already exists"):
        sapp.schedules.create("api", "t.job", "@daily", now=T0)
    with pytest.raises(InvalidSchedule, match="cannot change name"):
        sapp.schedules.change("api", name="x")
    with pytest.raises(InvalidSchedule, match="can never fire"):
        sapp.schedules.change("api", cron="0 0 30 2 *")
    changed = sapp.schedules.change("api", cron="0 * * * *", timezone="Asia/Kolkata", now=T0)
    assert changed.next_fire_at == datetime(2025, 6, 2, 0, 30, tzinfo=UTC)  # Kolkata is UTC+05:30
    assert changed.args == [1]
    assert sapp.schedules.change("api", args=[2], now=T0).next_fire_at == changed.next_fire_at
    queued = sapp.schedules.change("api", overlap="queue")
    assert queued.lock_key == "schedule:api"
    assert sapp.schedules.change("api", overlap="allow").lock_key is None

    assert sapp.schedules.pause("api", by="me") is True
    assert sapp.schedules.get("api").paused_by == "me"
    assert sapp.schedules.resume("api", now=T0 + 3 * timedelta(hours=1)) is True
    resumed = sapp.schedules.get("api")
    assert not resumed.paused and resumed.paused_by is None
    assert resumed.next_fire_at == datetime(2025, 6, 2, 3, 30, tzinfo=UTC)  # missed ticks are not misfires
    assert sapp.schedules.resume("api") is False

    sapp.schedules.delete("api")
    for call in (
        lambda: sapp.schedules.get("api"),
        lambda: sapp.schedules.delete("api"),
        lambda: sapp.schedules.pause("api"),
        lambda: sapp.schedules.resume("api"),
        lambda: sapp.schedules.trigger("api"),
        lambda: sapp.schedules.change("api", cron="@daily"),
        lambda: sapp.schedules.history("api"),
    ):
        with pytest.raises(ScheduleNotFound, match="no schedule named 'api'"):
            call()


def test_paused_schedules_do_not_fire(sapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    sapp.schedules.create("p", "t.job", "* * * * *", now=T0)
    sapp.schedules.pause("p")
    assert scheduler(sapp).run_once(now=T0 + 5 * MIN).fired == 0
    assert runs(conn, "p") == []
    sapp.schedules.resume("p", now=T0 + 5 * MIN)
    assert scheduler(sapp).run_once(now=T0 + 6 * MIN).fired == 1
    assert [r[1] for r in runs(conn, "p")] == [T0 + 6 * MIN]


# -- manual triggers ---------------------------------------------------------------------


def test_manual_trigger_while_active_raises_and_never_shifts_the_next_tick(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    sapp.schedules.create("m", "t.job", "0 * * * *", now=T0)
    tick = scheduler(sapp)
    assert tick.run_once(now=T0 + 60 * MIN).fired == 1
    (active,) = [r.id for r in sapp.schedules.history("m")]
    with pytest.raises(RunAlreadyActive) as err:
        sapp.schedules.trigger("m", requested_by="ops@example")
    assert err.value.run_id == active and err.value.schedule == "m"
    assert sapp.schedules.get("m").next_fire_at == T0 + 120 * MIN

    finish(conn, active)
    manual = sapp.schedules.trigger("m", requested_by="ops@example")
    (run, _) = sapp.schedules.history("m")
    assert (run.id, run.trigger, run.requested_by, run.scheduled_for, run.attempt) == (
        manual.id,
        "manual",
        "ops@example",
        None,
        1,
    )
    assert sapp.schedules.get("m").next_fire_at == T0 + 120 * MIN
    finish(conn, manual.id)
    assert tick.run_once(now=T0 + 120 * MIN).fired == 1
    assert [r[0] for r in runs(conn, "m")] == ["schedule", "manual", "schedule"]


def test_manual_trigger_default_requester_and_overlap_allow(sapp: pgtasks.App) -> None:
    sapp.schedules.create("many", "t.job", "@daily", overlap="allow", now=T0)
    a = sapp.schedules.trigger("many")
    b = sapp.schedules.trigger("many")
    assert a.id != b.id
    who = sapp.schedules.history("many")[0].requested_by
    assert who is not None and "@" in who
    assert sapp.schedules.get("many").last_run_id == b.id


def test_paused_schedule_can_still_be_run_by_hand(sapp: pgtasks.App) -> None:
    sapp.schedules.create("held", "t.job", "@daily", now=T0)
    sapp.schedules.pause("held")
    assert sapp.schedules.trigger("held").job().trigger == "manual"


# -- history and next fire times --------------------------------------------------------------


def test_history_pages_newest_first(sapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    sapp.schedules.create("h", "t.job", "@daily", overlap="allow", now=T0)
    ids = [sapp.schedules.trigger("h").id for _ in range(5)]
    page1 = sapp.schedules.history("h", per_page=2)
    page3 = sapp.schedules.history("h", page=3, per_page=2)
    assert [r.id for r in page1] == ids[::-1][:2]
    assert [r.id for r in page3] == [ids[0]]
    assert sapp.schedules.history("h", page=4, per_page=2) == []
    assert [r.id for r in sapp.schedules.history("h", before_id=ids[2])] == ids[1::-1]
    with pytest.raises(InvalidSchedule):
        sapp.schedules.history("h", page=0)
    with pytest.raises(InvalidSchedule):
        sapp.schedules.history("h", per_page=1001)
    # Runs outlive their schedule.
    sapp.schedules.delete("h")
    assert len(sapp.schedules.history("h", per_page=100)) == 5


def test_next_fire_times_use_the_scheduler_code_path(sapp: pgtasks.App) -> None:
    sapp.schedules.create("dst", "t.job", "30 2 * * *", timezone="Europe/Berlin", now=T0)
    got = sapp.schedules.next_fire_times("dst", 3, after=datetime(2025, 3, 29, 12, tzinfo=UTC))
    assert got == [
        datetime(2025, 3, 30, 1, 0, tzinfo=UTC),  # 02:30 does not exist: 03:00 CEST
        datetime(2025, 3, 31, 0, 30, tzinfo=UTC),
        datetime(2025, 4, 1, 0, 30, tzinfo=UTC),
    ]
    sapp.schedules.create("dep", "t.job", None, after=["dst"], now=T0)
    assert sapp.schedules.next_fire_times("dep", 3) == []
    assert len(sapp.schedules.next_fire_times("dst")) == 10
    assert sapp.schedules.next("dst", 1, after=datetime(2025, 3, 29, 12, tzinfo=UTC)) == got[:1]


def test_spec_round_trips_through_the_row(sapp: pgtasks.App) -> None:
    spec = sapp.add_periodic_task("15 3 * * 1-5", "t.other", name="rt", kwargs={"k": [1, 2]}, after=["x"])
    sapp.schedules.sync(now=T0)
    row = sapp.stores.schedules.get_for_update(name="rt")
    assert row is not None
    assert spec.same_definition(row)
    assert ScheduleSpec.from_row(row) == spec
