"""Runs of schedules executed by a real worker: outcomes, retry runs, dependency triggers,
progress and history, followed up by the scheduler from the database."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from apps.sched_app import make_app, setup_ledger

import pgtasks
from pgtasks.scheduler import Run, Scheduler, SchedulerConfig
from pgtasks.worker import Worker, WorkerConfig

T0 = datetime(2025, 6, 2, 0, 0, tzinfo=UTC)
DAY = timedelta(days=1)
MIN = timedelta(minutes=1)


@pytest.fixture
def sapp(dsn: str) -> Iterator[pgtasks.App]:
    setup_ledger(dsn)
    app = make_app(dsn)
    yield app
    app.close()


def work(app: pgtasks.App) -> None:
    """Run every due job with a real worker until none is left (burst)."""
    worker = Worker(app, WorkerConfig(concurrency=2, burst=True, poll_interval=0.05, listen=False))
    assert worker.run(install_signal_handlers=False) == 0


def tick(app: pgtasks.App, at: datetime) -> Any:
    return Scheduler(app, SchedulerConfig(reap=False)).run_once(now=at)


def ledger(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT schedule, trigger, attempt, finished_at IS NOT NULL FROM public.sched_ledger ORDER BY id"
    ).fetchall()


def history(app: pgtasks.App, name: str) -> list[Run]:
    return list(reversed(app.schedules.history(name, per_page=100)))


def test_a_transient_failure_gets_a_retry_run_that_links_back(
    sapp: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    sapp.schedules.create("flaky", "s.flaky", "@daily", kwargs={"fail_attempts": 1}, now=T0)
    assert tick(sapp, T0 + DAY).fired == 1
    work(sapp)
    follow = tick(sapp, T0 + DAY + MIN)
    assert (follow.followed_up, follow.retries) == (1, 1)
    work(sapp)
    assert tick(sapp, T0 + DAY + 2 * MIN).followed_up == 1

    first, retry = history(sapp, "flaky")
    assert (first.trigger, first.attempt, first.outcome) == ("schedule", 1, "failed")
    assert (first.error_code, first.failure_class) == ("CONNECTIONERROR", "transient")
    assert "storage unreachable" in (first.error_message or "")
    assert (retry.trigger, retry.attempt, retry.outcome, retry.parent_id) == (
        "retry",
        2,
        "succeeded",
        first.id,
    )
    assert retry.scheduled_for == first.scheduled_for == T0 + DAY
    assert retry.correlation_id == first.correlation_id and first.correlation_id
    assert retry.worker_id and retry.started_at and retry.finished_at and retry.duration is not None
    assert retry.result == 2
    # What the task saw, from its own ledger.
    assert ledger(conn) == [("flaky", "schedule", 1, False), ("flaky", "retry", 2, True)]
    state = sapp.schedules.get("flaky")
    assert (state.last_outcome, state.last_outcome_run_id, state.last_run_id) == (
        "succeeded",
        retry.id,
        retry.id,
    )
    assert state.next_fire_at == T0 + 2 * DAY  # the retry did not move the schedule


def test_retries_stop_when_none_are_left(sapp: pgtasks.App) -> None:
    sapp.schedules.create("flaky", "s.flaky", "@daily", kwargs={"fail_attempts": 9}, max_retries=2, now=T0)
    tick(sapp, T0 + DAY)
    for minute in range(1, 6):
        work(sapp)
        tick(sapp, T0 + DAY + minute * MIN)
    runs = history(sapp, "flaky")
    assert [(r.trigger, r.attempt, r.outcome) for r in runs] == [
        ("schedule", 1, "failed"),
        ("retry", 2, "failed"),
        ("retry", 3, "failed"),
    ]
    assert [r.parent_id for r in runs] == [None, runs[0].id, runs[1].id]
    assert sapp.schedules.get("flaky").last_outcome == "failed"


def test_a_permanent_failure_is_not_retried(sapp: pgtasks.App) -> None:
    sapp.schedules.create("broken", "s.broken", "@daily", now=T0)
    tick(sapp, T0 + DAY)
    work(sapp)
    result = tick(sapp, T0 + DAY + MIN)
    assert (result.followed_up, result.retries) == (1, 0)
    (run,) = history(sapp, "broken")
    assert (run.outcome, run.failure_class, run.error_code) == ("failed", "permanent", "VALUEERROR")


def test_partial_failure_is_a_distinct_outcome_with_progress(sapp: pgtasks.App) -> None:
    sapp.schedules.create("part", "s.partial", "@daily", now=T0)
    sapp.schedules.create("after-part", "s.record", None, after=["part"], now=T0)
    tick(sapp, T0 + DAY)
    work(sapp)
    result = tick(sapp, T0 + DAY + MIN)
    assert (result.retries, result.dependencies) == (0, 0)  # not a success, not transient
    (run,) = history(sapp, "part")
    assert (run.outcome, run.error_code, run.error_message) == (
        "partial_failure",
        "PARTIAL_FAILURE",
        "1 of 4 files unreadable",
    )
    assert run.progress == {"files_processed": 3, "files_failed": 1, "bytes_processed": 1234}
    assert run.result == {"files": 3}
    assert sapp.schedules.get("part").last_outcome == "partial_failure"


def test_progress_counters_are_merged(sapp: pgtasks.App) -> None:
    sapp.schedules.create("prog", "s.progress", "@daily", now=T0)
    sapp.schedules.trigger("prog", requested_by="me@here")
    work(sapp)
    (run,) = history(sapp, "prog")
    assert (run.trigger, run.requested_by, run.outcome) == ("manual", "me@here", "succeeded")
    assert run.progress == {"bytes_processed": 20, "files_processed": 2}


def test_a_success_triggers_dependent_schedules(sapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    sapp.schedules.create("db-dump", "s.record", "0 1 * * *", now=T0)
    sapp.schedules.create("verify", "s.record", None, after=["db-dump"], kwargs={"n": 7}, now=T0)
    sapp.schedules.create("paused-dep", "s.record", None, after=["db-dump"], now=T0)
    sapp.schedules.pause("paused-dep")
    tick(sapp, T0 + 61 * MIN)
    work(sapp)
    result = tick(sapp, T0 + 62 * MIN)
    assert (result.followed_up, result.dependencies) == (1, 1)
    work(sapp)
    tick(sapp, T0 + 63 * MIN)
    (dump,) = history(sapp, "db-dump")
    (verify,) = history(sapp, "verify")
    assert (verify.trigger, verify.parent_id, verify.outcome, verify.result) == (
        "dependency",
        dump.id,
        "succeeded",
        7,
    )
    assert verify.correlation_id == dump.correlation_id
    assert verify.scheduled_for is None
    assert history(sapp, "paused-dep") == []
    assert sapp.schedules.get("verify").last_outcome == "succeeded"
    # A failed prerequisite triggers nothing.
    sapp.schedules.change("db-dump", task="s.broken")
    sapp.schedules.trigger("db-dump")
    work(sapp)
    assert tick(sapp, T0 + 64 * MIN).dependencies == 0
    assert len(history(sapp, "verify")) == 1


def test_a_cancelled_run_is_recorded_and_not_retried(sapp: pgtasks.App) -> None:
    sapp.schedules.create("c", "s.flaky", "@daily", now=T0)
    run = sapp.schedules.trigger("c")
    assert sapp.cancel(run.id)
    result = tick(sapp, T0 + MIN)
    assert (result.followed_up, result.retries) == (1, 0)
    (seen,) = history(sapp, "c")
    assert (seen.outcome, seen.attempt, seen.started_at) == ("cancelled", 1, None)
    assert sapp.schedules.get("c").last_outcome == "cancelled"


def test_follow_up_happens_once_across_concurrent_schedulers(sapp: pgtasks.App) -> None:
    sapp.schedules.create("flaky", "s.flaky", "@daily", now=T0)
    tick(sapp, T0 + DAY)
    work(sapp)  # fails once: a retry is due
    totals: list[Any] = []

    def follow() -> None:
        app = pgtasks.App("other", dsn=sapp.database.dsn, load_entry_points=False)
        try:
            gate.wait()
            totals.append(Scheduler(app, SchedulerConfig(reap=False)).run_once(now=T0 + DAY + MIN))
        finally:
            app.close()

    gate = threading.Barrier(6)
    threads = [threading.Thread(target=follow) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(t.followed_up for t in totals) == 1
    assert sum(t.retries for t in totals) == 1
    assert [r.trigger for r in history(sapp, "flaky")] == ["schedule", "retry"]
