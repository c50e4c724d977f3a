"""How attempts end, proven with real worker processes: retry counts and backoff,
Reject, time limits in both pools, cancellation, unknown tasks, asyncio tasks and
child replacement.

Workers are ``pgtasks -A tests.apps.worker_app:app worker`` subprocesses; the tasks
write the side ledger of `apps.worker_app`.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from apps.worker_app import (
    REPO,
    db_now,
    ledger_rows,
    one,
    rows,
    status,
    workers,
)
from helpers import eventually

import pgtasks
from pgtasks.task import MAX_DELAY, UNLIMITED_ATTEMPTS

FAST = ["--poll-interval", "0.1"]


def finished(conn: psycopg.Connection[Any], *ids: int) -> bool:
    """Whether every job has a terminal status."""
    return bool(
        one(
            conn,
            "SELECT count(*) = 0 FROM pgtasks.jobs WHERE id = ANY(%s) AND status IN ('queued', 'running')",
            (list(ids),),
        )
    )


# -- retries ------------------------------------------------------------------------------


def test_an_outcome_write_repeated_after_a_lost_reply_does_not_end_the_next_attempt(
    app: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    """A retry written, its reply lost (it committed), the job claimed again by the same
    worker: the completer's repeat of that write (one by one, after the batch "failed")
    is of attempt 1 and must change nothing of attempt 2, which runs."""
    app.task(name="outcome.fenced", max_retries=3)(lambda: None)
    job_id = app.get_task("outcome.fenced").delay().id
    claim = (
        "UPDATE pgtasks.jobs SET status = 'running', attempt = attempt + 1, worker_id = 'w-1',"
        " started_at = NULL, heartbeat_at = now() WHERE id = %s AND status = 'queued' RETURNING attempt"
    )
    jobs = app.stores.jobs
    error = {"type": "Flaky", "message": "try again", "code": "FLAKY", "class": "transient"}
    assert one(conn, claim, (job_id,)) == 1
    assert jobs.retry(id=job_id, worker_id="w-1", delay=0, max_attempts=4, error=error, attempt=1)
    assert one(conn, claim, (job_id,)) == 2  # the same worker takes it again
    # The repeats of attempt 1's outcome: refused, attempt 2 still runs.
    assert not jobs.retry(id=job_id, worker_id="w-1", delay=0, max_attempts=4, error=error, attempt=1)
    assert not jobs.finish(id=job_id, worker_id="w-1", status="failed", error=error, attempt=1)
    assert jobs.succeed_batch(worker_id="w-1", ids=[job_id], results_json=["1"], attempts=[1]) == []
    assert conn.execute(
        "SELECT status, attempt, jsonb_array_length(attempts) FROM pgtasks.jobs WHERE id = %s", (job_id,)
    ).fetchone() == ("running", 2, 1)
    assert jobs.succeed_batch(worker_id="w-1", ids=[job_id], results_json=["2"], attempts=[2]) == [job_id]
    assert conn.execute("SELECT status, result FROM pgtasks.jobs WHERE id = %s", (job_id,)).fetchone() == (
        "succeeded",
        2,
    )


def test_attempt_counts_follow_max_retries_and_reject_is_final(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    fail = client.tasks["w.fail"]
    counted = {n: fail.apply_async(max_retries=n).id for n in (0, 1, 3)}
    crash = client.tasks["w.crash"].delay().id
    reject = client.tasks["w.reject"].delay().id
    with workers(wdsn, tmp_path, ["-c", "4", "--burst", *FAST]) as (w,):
        assert w.wait(60) == 0, w.log()[-3000:]

    for max_retries, job_id in counted.items():
        job = client.get_job(job_id)
        expected = max_retries + 1
        assert (job.status, job.attempt, job.max_attempts) == ("failed", expected, expected)
        assert [r[0] for r in ledger_rows(conn, job_id)] == list(range(1, expected + 1))
        history = job.history()
        assert [a.attempt for a in history] == list(range(1, expected + 1))
        assert [a.outcome for a in history] == ["retry"] * max_retries + ["failed"]
        assert [a.trigger for a in history] == ["api"] + ["retry"] * max_retries
        assert all(a.error and a.error["class"] == "transient" for a in history)
        assert all(a.error and a.error["type"] == "ValueError" for a in history)
        assert job.error is not None and job.error["message"] == f"attempt {expected} fails"
        assert "Traceback" in job.error["traceback"]

    # Not covered by autoretry_for: one attempt, permanent, although max_retries=5.
    job = client.get_job(crash)
    assert (job.status, job.attempt, len(ledger_rows(conn, crash))) == ("failed", 1, 1)
    assert job.error is not None and (job.error["type"], job.error["class"]) == ("RuntimeError", "permanent")

    # Reject: one attempt, permanent, although autoretry_for=(Exception,) and max_retries=5.
    job = client.get_job(reject)
    assert (job.status, job.attempt, len(ledger_rows(conn, reject))) == ("failed", 1, 1)
    assert job.error is not None
    assert (job.error["code"], job.error["class"], job.error["message"]) == (
        "BAD_INPUT",
        "permanent",
        "input cannot be processed",
    )
    assert [a["outcome"] for a in job.attempts] == ["failed"]


def test_outcomes_postgres_cannot_store_fail_the_job_and_keep_the_slot(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """An error message with NUL, or a partial result jsonb refuses, must not wedge a slot."""
    nul = client.tasks["w.nul_error"].apply_async(priority=2).id
    partial = client.tasks["w.partial_unstorable"].apply_async(priority=1).id
    after = client.tasks["w.record"].delay(9).id
    with workers(wdsn, tmp_path, ["-c", "1", "--burst", *FAST]) as (w,):
        assert w.wait(30) == 0, w.log()[-3000:]
    assert (status(conn, after), len(ledger_rows(conn, after))) == ("succeeded", 1)
    job = client.get_job(nul)
    assert job.status == "failed" and job.error is not None
    assert job.error["type"] == "ValueError"
    assert job.error["message"] == "bad\\x00byte and a lone \\ud800 surrogate"
    job = client.get_job(partial)
    assert job.status == "failed" and job.error is not None
    assert (job.error["code"], job.error["class"]) == ("OUTCOME_NOT_RECORDED", "permanent")
    assert "NUL" in job.error["message"]


def test_countdown_backoff_and_huge_retry_counts_on_a_live_worker(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    later = client.tasks["w.retry_later"].delay(1.0).id
    backoff = client.tasks["w.backoff"].delay().id
    unbounded = client.tasks["w.retry_unbounded"].delay().id
    # A job that has already been retried two billion times (unlimited retries).
    huge = client.tasks["w.huge"].delay().id
    conn.execute("UPDATE pgtasks.jobs SET attempt = 1999999999 WHERE id = %s", (huge,))
    with workers(wdsn, tmp_path, ["-c", "4", *FAST]) as (w,):
        eventually(lambda: finished(conn, later, backoff), timeout=30, message="retries done")
        eventually(
            lambda: (
                one(conn, "SELECT jsonb_array_length(attempts) FROM pgtasks.jobs WHERE id = %s", (huge,)) == 1
                and one(
                    conn, "SELECT jsonb_array_length(attempts) FROM pgtasks.jobs WHERE id = %s", (unbounded,)
                )
                == 1
            ),
            timeout=20,
            message="far retries recorded",
        )
        now = db_now(conn)
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0
    log = w.log()
    assert "Traceback" not in log, log[-3000:]

    # self.retry(countdown=1): the second attempt came at least 1 s later, and succeeded.
    job = client.get_job(later)
    assert (job.status, job.attempt, job.result) == ("succeeded", 2, 2)
    (a1, *_), (a2, *_) = ledger_rows(conn, later)
    assert (a1, a2) == (1, 2)
    gap = (ledger_rows(conn, later)[1][2] - ledger_rows(conn, later)[0][2]).total_seconds()
    assert 1.0 <= gap < 2.5
    assert [(a.attempt, a.trigger, a.outcome) for a in job.history()] == [
        (1, "api", "retry"),
        (2, "retry", "succeeded"),
    ]
    first_error = job.history()[0].error
    assert first_error is not None and (first_error["type"], first_error["class"]) == ("OSError", "transient")

    # Exponential backoff 0.3 s * 2**n capped at 1.2 s: gaps 0.3, 0.6, 1.2, 1.2.
    starts = [r[2] for r in ledger_rows(conn, backoff)]
    assert len(starts) == 5 and status(conn, backoff) == "failed"
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    for gap_seen, planned in zip(gaps, [0.3, 0.6, 1.2, 1.2], strict=True):
        assert planned <= gap_seen < planned + 0.6, gaps
    assert gaps[0] < gaps[1] < gaps[2]
    assert abs(gaps[3] - gaps[2]) < 0.6

    # Two billion retries in: the delay is capped, run_at stays representable.
    job = client.get_job(huge)
    assert (job.status, job.attempt, job.max_attempts) == ("queued", 2_000_000_000, UNLIMITED_ATTEMPTS)
    ahead = (job.run_at - now).total_seconds()
    assert MAX_DELAY - 60 <= ahead <= MAX_DELAY
    assert job.run_at.year < 2100

    # retry(max_retries=10**12, countdown=MAX_DELAY): stored, clamped, not an overflow.
    job = client.get_job(unbounded)
    assert (job.status, job.attempt, job.max_attempts) == ("queued", 1, UNLIMITED_ATTEMPTS)
    assert MAX_DELAY - 60 <= (job.run_at - now).total_seconds() <= MAX_DELAY
    assert len(ledger_rows(conn, unbounded)) == 1


# -- time limits ----------------------------------------------------------------------------


def test_time_limits_in_the_threads_pool(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    soft = client.tasks["w.soft"].delay().id
    hard = client.tasks["w.hard_loop"].delay().id
    after = client.tasks["w.record"].delay(5).id
    with workers(wdsn, tmp_path, ["-c", "2", "--burst", *FAST]) as (w,):
        assert w.wait(60) == 0, w.log()[-3000:]
    # soft_time_limit raised inside the task, which caught it and returned.
    assert (status(conn, soft), ledger_rows(conn, soft)[0][4]) == ("succeeded", "soft")
    assert client.AsyncResult(soft).get(timeout=1) == "soft limit seen"
    # A hard limit in a thread arrives at the next bytecode (best effort): here it did.
    job = client.get_job(hard)
    assert job.status == "failed" and job.error is not None
    assert (job.error["code"], job.error["class"]) == ("TIME_LIMIT", "transient")
    assert ledger_rows(conn, hard)[0][3] is None  # never reached its end
    assert status(conn, after) == "succeeded"


@pytest.mark.slow
def test_time_limits_in_the_processes_pool(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    soft = client.tasks["w.soft"].apply_async(priority=3).id
    hard = client.tasks["w.hard"].apply_async(priority=2).id
    pid_job = client.tasks["w.pid"].apply_async(priority=1).id
    aio = client.tasks["w.aio"].apply_async((21,), priority=0).id
    with workers(wdsn, tmp_path, ["-P", "processes", "-c", "1", "--burst", *FAST]) as (w,):
        assert w.wait(60) == 0, w.log()[-3000:]
    assert (status(conn, soft), ledger_rows(conn, soft)[0][4]) == ("succeeded", "soft")
    job = client.get_job(hard)
    assert job.status == "failed" and job.error is not None
    assert (job.error["code"], job.error["class"]) == ("TIME_LIMIT", "transient")
    killed_child = ledger_rows(conn, hard)[0][1]
    assert killed_child != w.pid
    assert not psutil.pid_exists(killed_child)
    # The next job ran in a fresh child.
    assert status(conn, pid_job) == "succeeded"
    assert client.AsyncResult(pid_job).get(timeout=1) not in (killed_child, w.pid)
    assert client.AsyncResult(aio).get(timeout=1) == {"double": 42, "loop": "_UnixSelectorEventLoop"}


# -- cancellation --------------------------------------------------------------------------


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``pgtasks -A tests.apps.worker_app:app ARGS`` on the test database."""
    env = {**os.environ, "PGTASKS_DSN": dsn, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pgtasks", "-A", "tests.apps.worker_app:app", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cancel_queued_and_running_jobs_in_the_threads_pool(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    task = client.tasks["w.until_cancelled"]
    queued = task.apply_async(countdown=3600)
    assert queued.revoke() is True
    assert queued.status == "cancelled"  # at once, no worker involved

    by_api = task.delay()
    by_cli = task.delay()
    with workers(wdsn, tmp_path, ["-c", "2", *FAST]) as (w,):
        eventually(
            lambda: ledger_rows(conn, by_api.id) and ledger_rows(conn, by_cli.id),
            timeout=20,
            message="both running",
        )
        asked = time.monotonic()
        assert by_api.revoke() is True
        eventually(lambda: status(conn, by_api.id) == "cancelled", timeout=5, message="cancelled")
        took = time.monotonic() - asked
        done = cli(wdsn, "jobs", "cancel", str(by_cli.id))
        assert done.returncode == 0, done.stderr
        assert f"job {by_cli.id}: running: cancel requested" in done.stdout
        eventually(lambda: status(conn, by_cli.id) == "cancelled", timeout=5, message="cancelled by CLI")
        again = cli(wdsn, "jobs", "cancel", str(by_cli.id))
        assert f"job {by_cli.id}: already finished" in again.stdout
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0
    assert took < 2.0
    for job_id in (by_api.id, by_cli.id):
        ((_, _, _, end, note),) = ledger_rows(conn, job_id)
        assert (note, end is not None) == ("saw cancel", True)
        job = client.get_job(job_id)
        assert job.error is not None and job.error["code"] == "CANCELLED"
        assert job.result == "stopped early"
        assert [a["outcome"] for a in job.attempts] == ["cancelled"]
    assert cli(wdsn, "jobs", "cancel", "999999").returncode == 1


@pytest.mark.slow
def test_revoke_terminate_kills_the_child_in_the_processes_pool(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    stuck = client.tasks["w.stuck"].apply_async(priority=1)
    polite = client.tasks["w.until_cancelled"].apply_async(priority=1)
    after = client.tasks["w.pid"].delay()
    with workers(wdsn, tmp_path, ["-P", "processes", "-c", "2", *FAST]) as (w,):
        eventually(
            lambda: ledger_rows(conn, stuck.id) and ledger_rows(conn, polite.id),
            timeout=30,
            message="both running",
        )
        child = ledger_rows(conn, stuck.id)[0][1]
        asked = time.monotonic()
        assert stuck.revoke(terminate=True) is True
        assert polite.revoke() is True
        eventually(lambda: status(conn, stuck.id) == "cancelled", timeout=5, message="terminated")
        took = time.monotonic() - asked
        eventually(lambda: status(conn, polite.id) == "cancelled", timeout=5, message="polite cancel")
        assert after.get(timeout=30) not in (child, w.pid)
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0
    assert took < 2.0
    assert not psutil.pid_exists(child)
    job = client.get_job(stuck.id)
    assert job.error is not None and job.error["code"] == "CANCELLED"
    assert ledger_rows(conn, stuck.id)[0][3] is None  # killed, never reached its end
    assert ledger_rows(conn, polite.id)[0][4] == "saw cancel"


# -- unknown tasks, asyncio, child replacement ---------------------------------------------------


def _insert_unknown(conn: psycopg.Connection[Any]) -> int:
    return one(  # type: ignore[no-any-return]
        conn, "INSERT INTO pgtasks.jobs (task_name, args) VALUES ('w.nobody_knows', '[1]') RETURNING id"
    )


def test_unknown_task_fails_with_its_name_and_the_worker_goes_on(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    with workers(wdsn, tmp_path, ["-c", "2", *FAST]) as (w,):
        unknown = _insert_unknown(conn)
        conn.execute("NOTIFY pgtasks_jobs, 'default'")
        eventually(lambda: status(conn, unknown) == "failed", timeout=10, message="unknown task failed")
        later = client.tasks["w.record"].delay(3)
        assert later.get(timeout=10) == 3
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0
    job = client.get_job(unknown)
    assert job.error is not None
    assert (job.error["code"], job.error["class"]) == ("UNKNOWN_TASK", "permanent")
    assert "'w.nobody_knows'" in job.error["message"]
    assert job.attempt == 1
    assert "unknown task 'w.nobody_knows'" in w.log()


def test_unknown_task_can_be_left_for_a_worker_that_knows_it(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    # The worker claims only the tasks it knows: it passes over the unknown job (due
    # before the known one) without claiming or deferring it, so a worker that knows
    # the task can take it at once (tests/test_rolling_deploy.py).
    unknown = _insert_unknown(conn)
    enqueued = client.get_job(unknown)
    known = client.tasks["w.record"].delay(4)
    with workers(wdsn, tmp_path, ["-c", "2", "--unknown-tasks", "defer", *FAST]) as (w,):
        assert known.get(timeout=20) == 4
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0
    job = client.get_job(unknown)
    assert (job.status, job.attempt, job.worker_id, job.error) == ("queued", 0, None, None)
    assert job.run_at == enqueued.run_at
    assert "deferring it" not in w.log()


def test_async_def_tasks_run_on_the_worker(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    results = client.tasks["w.aio"].delay_many([1, 2, 3])
    with workers(wdsn, tmp_path, ["-c", "2", "--burst", *FAST]) as (w,):
        assert w.wait(30) == 0
    assert [r.get(timeout=1)["double"] for r in results] == [2, 4, 6]


@pytest.mark.slow
def test_max_tasks_per_child_replaces_children(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    results = client.tasks["w.pid"].delay_many([() for _ in range(6)])
    with workers(wdsn, tmp_path, ["-P", "processes", "-c", "1", "--max-tasks-per-child", "2", "--burst"]) as (
        w,
    ):
        assert w.wait(60) == 0, w.log()[-3000:]
    assert all(status(conn, r.id) == "succeeded" for r in results), w.log()[-3000:]
    pids = [r.get(timeout=1) for r in results]
    assert w.pid not in pids
    assert sorted(pids.count(p) for p in set(pids)) == [2, 2, 2]


def test_max_tasks_per_child_stops_a_threads_worker(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    results = client.tasks["w.record"].delay_many(list(range(10)))
    with workers(wdsn, tmp_path, ["-c", "1", "--prefetch-multiplier", "1", "--max-tasks-per-child", "3"]) as (
        w,
    ):
        assert w.wait(30) == 0
    assert "stopping (max-tasks)" in w.log()
    done = [r.id for r in results if status(conn, r.id) == "succeeded"]
    assert len(done) == 3
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE status = 'queued'") == 7
    assert rows(conn, "SELECT DISTINCT attempt FROM pgtasks.jobs WHERE status = 'queued'") == [(0,)]


@pytest.mark.slow
def test_a_child_that_dies_mid_job_follows_the_worker_lost_policy(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """A killed child (OOM killer, segfault) is a lost worker in small: retried unless the
    task is non-idempotent, as the reaper does for a lost worker process."""
    again = client.tasks["w.die_first"].delay().id
    once = client.tasks["w.die_first_once"].delay().id
    with workers(wdsn, tmp_path, ["-P", "processes", "-c", "1", "--burst", *FAST]) as (w,):
        assert w.wait(60) == 0, w.log()[-3000:]
    job = client.get_job(again)
    assert (job.status, job.attempt, job.result) == ("succeeded", 2, 2), job.error
    assert [(a.attempt, a.outcome) for a in job.history()] == [(1, "retry"), (2, "succeeded")]
    first = job.history()[0].error
    assert first is not None and (first["code"], first["class"]) == ("WORKER_LOST", "transient")
    gone = client.get_job(once)
    assert (gone.status, gone.attempt) == ("failed", 1)
    assert gone.error is not None and gone.error["code"] == "WORKER_LOST"
    assert len(ledger_rows(conn, once)) == 1


def test_future_dated_jobs_start_on_time_between_polls(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """A countdown shorter than the poll interval is honoured: the idle worker sleeps until the
    next run-at, not for the whole poll interval (and not in a busy loop)."""
    with workers(wdsn, tmp_path, ["-c", "1", "--poll-interval", "30"]) as (w,):
        assert client.tasks["w.record"].delay(0).get(timeout=20) == 0  # the worker is up and idle
        job = client.tasks["w.record"].apply_async((1,), countdown=1.5).id
        eventually(lambda: ledger_rows(conn, job), timeout=10, message="future job started")
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0
    created = one(conn, "SELECT created_at FROM pgtasks.jobs WHERE id = %s", (job,))
    late = (ledger_rows(conn, job)[0][2] - created).total_seconds()
    assert 1.5 <= late < 2.5, late
