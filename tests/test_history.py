"""A job's history tells the truth: attempts numbered across manual requeues, each
requeue recorded with who asked and when, a fresh budget of attempts per requeue, no
stale error on a job that succeeded, a requeue refused (not half-done) when another
job holds the unique key, and histories written before migration 0005 renumbered.

The attempts are run by the testing kit's `run_until_idle` (a real burst worker in this
thread), on the kit's database per test; the tasks count the attempts they see
themselves, independently of pgtasks' bookkeeping.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import subprocess
import sys
import time
from typing import Any

import psycopg
import psycopg.types.json
import pytest

import pgtasks
from pgtasks.db import AnyConnection, text_array_literal
from pgtasks.errors import AlreadyQueued, ConfigurationError
from pgtasks.migrate import Migration, apply_each, migrations
from pgtasks.records import Attempt, Requeue
from pgtasks.states import JobStatus
from pgtasks.testing import RunSummary, run_until_idle

FLAKY_RETRIES = 1  # two attempts per round


class HistoryApp:
    """An app whose ``h.flaky`` fails until healed and ``h.once`` fails its first attempt
    only; ``seen`` holds (job id, ``self.request.attempt``) of every attempt they start."""

    def __init__(self, app: pgtasks.App) -> None:
        self.app = app
        self.healed = False
        self.seen: list[tuple[int | None, int]] = []

        @self.app.task(
            name="h.flaky",
            bind=True,
            autoretry_for=(ValueError,),
            max_retries=FLAKY_RETRIES,
            default_retry_delay=0,
        )
        def flaky(task: pgtasks.TaskContext) -> str:
            self.seen.append((task.request.id, task.request.attempt))
            if not self.healed:
                raise ValueError(f"attempt {task.request.attempt} fails")
            return "ok"

        @self.app.task(
            name="h.once", bind=True, autoretry_for=(ValueError,), max_retries=3, default_retry_delay=0
        )
        def once(task: pgtasks.TaskContext) -> str:
            self.seen.append((task.request.id, task.request.attempt))
            if task.request.attempt == 1:
                raise ValueError("the first attempt fails")
            return "ok"

    def drain(self) -> RunSummary:
        """Run the due jobs in this thread until none is left; how their attempts ended."""
        summary = run_until_idle(self.app)
        assert summary.idle
        return summary

    def attempts_seen(self, job_id: int) -> list[int]:
        return [n for j, n in self.seen if j == job_id]


@pytest.fixture
def h(pgtasks_app: pgtasks.App) -> HistoryApp:
    return HistoryApp(pgtasks_app)


def timeline(job: pgtasks.Job) -> list[tuple[Any, ...]]:
    """The history as comparable tuples: attempts (number, trigger, outcome, error
    message) and requeues ("requeue", by, from status, after attempt)."""
    out: list[tuple[Any, ...]] = []
    for entry in job.timeline():
        if isinstance(entry, Requeue):
            out.append(("requeue", entry.by, entry.from_status, entry.after_attempt))
        else:
            assert isinstance(entry, Attempt)
            out.append((entry.attempt, entry.trigger, entry.outcome, (entry.error or {}).get("message")))
    return out


def run_cli(dsn: str, *args: str) -> str:
    """What ``pgtasks --dsn DSN ARGS`` prints (a real process, as an operator runs it)."""
    env = {**os.environ, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1", "COLUMNS": "250"}
    done = subprocess.run(
        [sys.executable, "-m", "pgtasks", "--dsn", dsn, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def cells(out: str) -> list[list[str]]:
    """The body rows of the tables the CLI printed, as cell texts."""
    return [
        [c.strip() for c in line.strip().strip("│").split("│")]
        for line in out.splitlines()
        if line.startswith("│")
    ]


# -- attempts across requeues -----------------------------------------------------------------


def test_a_requeued_job_that_succeeds_shows_every_attempt_numbered_on(h: HistoryApp) -> None:
    job_id = h.app.tasks["h.flaky"].delay().id
    assert h.drain().counts == {
        "succeeded": 0,
        "retried": 1,
        "failed": 1,
        "cancelled": 0,
        "partial_failure": 0,
    }
    assert h.app.get_job(job_id).status is JobStatus.FAILED

    assert h.app.requeue(job_id, by="ops:alice") is True
    queued = h.app.get_job(job_id)
    requeue = queued.timeline()[-1]
    assert isinstance(requeue, Requeue) and requeue.at is not None
    assert (queued.status, queued.attempt_number) == (JobStatus.QUEUED, 2)

    h.healed = True
    assert h.drain().succeeded == 1
    job = h.app.get_job(job_id)
    assert job.status is JobStatus.SUCCEEDED
    assert timeline(job) == [
        (1, "api", "retry", "attempt 1 fails"),
        (2, "retry", "failed", "attempt 2 fails"),
        ("requeue", "ops:alice", "failed", 2),
        (3, "manual", "succeeded", None),
    ]
    assert job.attempt_number == 3
    # A requeue grants a fresh budget: the task saw attempt 1 of a new round.
    assert h.attempts_seen(job_id) == [1, 2, 1]


def test_each_requeue_grants_a_fresh_budget_and_the_cli_records_its_user(
    h: HistoryApp, pgtasks_dsn: str
) -> None:
    job_id = h.app.tasks["h.flaky"].delay().id
    h.drain()
    h.app.requeue(job_id)  # by the API, no actor given
    h.drain()
    job = h.app.get_job(job_id)
    assert (job.status, job.attempt, job.max_attempts) == (JobStatus.FAILED, 2, FLAKY_RETRIES + 1)
    assert h.attempts_seen(job_id) == [1, 2, 1, 2]  # max_retries=1 again after the requeue

    assert f"job {job_id}: requeued" in run_cli(pgtasks_dsn, "jobs", "retry", str(job_id))
    h.drain()
    job = h.app.get_job(job_id)
    assert timeline(job) == [
        (1, "api", "retry", "attempt 1 fails"),
        (2, "retry", "failed", "attempt 2 fails"),
        ("requeue", "api", "failed", 2),
        (3, "manual", "retry", "attempt 1 fails"),
        (4, "retry", "failed", "attempt 2 fails"),
        ("requeue", f"cli:{getpass.getuser()}", "failed", 4),
        (5, "manual", "retry", "attempt 1 fails"),
        (6, "retry", "failed", "attempt 2 fails"),
    ]
    assert job.error is not None and job.error["message"] == "attempt 2 fails"  # the last attempt's

    rows = cells(run_cli(pgtasks_dsn, "jobs", "show", str(job_id)))
    history = [r for r in rows if len(r) == 7]  # attempt, trigger, worker, started, finished, outcome, error
    assert [(r[0], r[1], r[5], r[6]) for r in history] == [
        ("1", "api", "retry", "attempt 1 fails"),
        ("2", "retry", "failed", "attempt 2 fails"),
        ("", "manual", "requeued", ""),
        ("3", "manual", "retry", "attempt 1 fails"),
        ("4", "retry", "failed", "attempt 2 fails"),
        ("", "manual", "requeued", ""),
        ("5", "manual", "retry", "attempt 1 fails"),
        ("6", "retry", "failed", "attempt 2 fails"),
    ]
    assert [r[2] for r in history if r[5] == "requeued"] == ["by api", f"by cli:{getpass.getuser()}"]


def test_a_cancelled_job_requeued_by_a_named_caller_records_it(h: HistoryApp) -> None:
    job_id = h.app.tasks["h.flaky"].apply_async(countdown=3600).id
    assert h.app.cancel(job_id) is True
    assert h.app.requeue(job_id, by="billing-service") is True
    h.healed = True
    h.drain()
    job = h.app.get_job(job_id)
    assert job.status is JobStatus.SUCCEEDED and job.error is None
    assert timeline(job) == [("requeue", "billing-service", "cancelled", 0), (1, "manual", "succeeded", None)]


def test_a_lost_attempt_after_a_requeue_is_numbered_on(h: HistoryApp) -> None:
    """The reaper records a lost attempt of a new round with its number across rounds."""
    job_id = h.app.tasks["h.flaky"].delay().id
    h.drain()
    assert h.app.requeue(job_id, by="ops:alice") is True
    jobs = h.app.stores.jobs
    # A worker that then vanished (it never registered) claims and starts attempt 3.
    (claimed,) = jobs.claim_batch(
        queues=text_array_literal(["default"]), worker_id="gone", limit=1, max_tenants=10, fair=True
    )
    assert claimed[0] == job_id
    assert jobs.start(id=job_id, worker_id="gone", started=time.time())
    later = h.app.database.now() + dt.timedelta(minutes=5)
    assert [r.job_id for r in jobs.reap_lost(lease_timeout=30.0, limit=10, now=later)] == [job_id]

    job = h.app.get_job(job_id)
    assert (job.status, job.attempt, job.attempt_number) == (JobStatus.QUEUED, 1, 3)
    assert [e[:3] for e in timeline(job)] == [
        (1, "api", "retry"),
        (2, "retry", "failed"),
        ("requeue", "ops:alice", "failed"),
        (3, "manual", "lost"),
    ]


# -- the current error is the last attempt's ----------------------------------------------------


def test_a_job_that_succeeds_after_a_retry_has_no_error(h: HistoryApp, pgtasks_dsn: str) -> None:
    result = h.app.tasks["h.once"].delay()
    summary = h.drain()
    assert (summary.retried, summary.succeeded, summary.failures) == (1, 1, ())
    job = h.app.get_job(result.id)
    assert (job.status, job.attempt) == (JobStatus.SUCCEEDED, 2)
    assert job.error is None
    assert (result.result, result.traceback) == ("ok", None)
    # The failed attempt keeps its error in the history.
    assert timeline(job) == [(1, "api", "retry", "the first attempt fails"), (2, "retry", "succeeded", None)]
    first = job.history()[0]
    assert isinstance(first, Attempt) and first.error is not None and "Traceback" in first.error["traceback"]

    (row,) = [r for r in cells(run_cli(pgtasks_dsn, "jobs", "list")) if r[0] == str(result.id)]
    assert (row[4], row[-1]) == ("succeeded", "")  # status, and no error code
    rows = cells(run_cli(pgtasks_dsn, "jobs", "show", str(result.id)))
    assert [r for r in rows if r[0] == "error"] == []
    assert ["1", "api", "retry", "the first attempt fails"] in [
        [r[0], r[1], r[5], r[6]] for r in rows if len(r) == 7
    ]


# -- requeue refused when the unique key is taken ----------------------------------------------------


def test_requeue_of_a_job_whose_unique_key_is_held_raises_already_queued(h: HistoryApp) -> None:
    flaky = h.app.tasks["h.flaky"]
    first = flaky.apply_async(unique_key="report:7").id
    h.drain()
    before = h.app.get_job(first)
    assert before.status is JobStatus.FAILED
    second = flaky.apply_async(unique_key="report:7", countdown=3600).id  # the key is free again

    with pytest.raises(AlreadyQueued) as caught:
        h.app.requeue(first, by="ops:alice")
    assert (caught.value.unique_key, caught.value.job_id) == ("report:7", second)
    assert h.app.get_job(first) == before  # nothing written

    assert h.app.cancel(second) is True  # the key is free: the requeue goes through
    assert h.app.requeue(first, by="ops:alice") is True


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("by", ["", "x" * 201, "a\x00b", "lone \ud800", 7, None])
def test_requeue_refuses_a_bad_actor_and_writes_nothing(h: HistoryApp, by: Any) -> None:
    job_id = h.app.tasks["h.flaky"].apply_async(countdown=3600).id
    assert h.app.cancel(job_id) is True
    before = h.app.get_job(job_id)
    with pytest.raises(ConfigurationError, match=r"^by must be a string of 1 to 200 characters"):
        h.app.requeue(job_id, by=by)
    assert h.app.get_job(job_id) == before
    assert h.app.requeue(job_id, by="x" * 200) is True  # the limit itself is fine


# -- histories written before 0005 -----------------------------------------------------------------


def _migrate_through(app: pgtasks.App, last: int) -> None:
    ledger = app.stores.migrations

    def applied(conn: AnyConnection) -> set[int]:
        ledger.bootstrap(conn=conn)
        return ledger.applied(conn=conn)

    def record(conn: AnyConnection, m: Migration) -> None:
        ledger.record(version=m.version, name=m.name, conn=conn)

    apply_each(app.stores, [m for m in migrations() if m.version <= last], applied=applied, record=record)


def _old_attempt(n: int, outcome: str) -> dict[str, Any]:
    return {
        "attempt": n,
        "trigger": "retry" if n > 1 else "api",
        "worker_id": "w1",
        "started_at": "2026-01-01T00:00:00+00:00",
        "finished_at": "2026-01-01T00:00:01+00:00",
        "outcome": outcome,
        "error": {"type": "ValueError", "message": f"old {n}"},
    }


def test_migration_0005_numbers_old_histories_across_requeues(empty_dsn: str) -> None:
    app = pgtasks.App("history-migrate", dsn=empty_dsn, load_entry_points=False)
    try:
        _migrate_through(app, 4)
        old_error = psycopg.types.json.Jsonb({"type": "ValueError", "message": "old 1"})
        cases: dict[str, tuple[str, int, int, list[dict[str, Any]], Any]] = {
            # Requeued after attempt 1 failed, then succeeded: the success went unrecorded.
            "succeeded": ("succeeded", 1, 1, [_old_attempt(1, "failed")], old_error),
            # Two rounds of two attempts (the second round's numbers restarted at 1).
            "two_rounds": (
                "failed",
                2,
                2,
                [
                    _old_attempt(1, "retry"),
                    _old_attempt(2, "failed"),
                    _old_attempt(1, "retry"),
                    _old_attempt(2, "failed"),
                ],
                old_error,
            ),
            # Requeued and waiting.
            "queued": ("queued", 0, 1, [_old_attempt(1, "failed")], old_error),
            # Never requeued: left as it is.
            "plain": ("queued", 1, 3, [_old_attempt(1, "retry")], old_error),
        }
        ids: dict[str, int] = {}
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            for name, (status, attempt, max_attempts, attempts, error) in cases.items():
                finished = "now()" if status not in ("queued", "running") else "NULL"
                row = conn.execute(
                    "INSERT INTO pgtasks.jobs (task_name, status, attempt, max_attempts, attempts, error,"
                    f" finished_at, started_at) VALUES (%s, %s, %s, %s, %s, %s, {finished}, {finished})"
                    " RETURNING id",
                    (name, status, attempt, max_attempts, psycopg.types.json.Jsonb(attempts), error),
                ).fetchone()
                assert row is not None
                ids[name] = int(row[0])

        app.migrate()

        unknown = ("requeue", None, None)
        job = app.get_job(ids["succeeded"])
        assert (job.attempt_base, job.attempt_number, job.error) == (1, 2, None)
        assert timeline(job) == [
            (1, "api", "failed", "old 1"),
            (*unknown, 1),
            (2, "manual", "succeeded", None),
        ]
        job = app.get_job(ids["two_rounds"])
        assert (job.attempt_base, job.attempt_number) == (2, 4)
        assert timeline(job) == [
            (1, "api", "retry", "old 1"),
            (2, "retry", "failed", "old 2"),
            (*unknown, 2),
            (3, "manual", "retry", "old 1"),
            (4, "retry", "failed", "old 2"),
        ]
        job = app.get_job(ids["queued"])
        assert (job.attempt_base, job.attempt_number) == (1, 1)
        assert timeline(job) == [(1, "api", "failed", "old 1"), (*unknown, 1)]
        job = app.get_job(ids["plain"])
        assert (job.attempt_base, job.attempt_number, job.error) == (
            0,
            1,
            {"type": "ValueError", "message": "old 1"},
        )
        assert timeline(job) == [(1, "api", "retry", "old 1")]
    finally:
        app.close()
