"""Transactional completion: a task's own writes commit with its job's success, or not at all.

The task ``w.tx_write`` (``tests/apps/worker_app.py``) inserts a row of
``public.tx_docs`` in ``with self.transaction() as conn:``. The row and the job's
success are one transaction: PostgreSQL stamps both rows with the same ``xmin``. A
failed attempt, a job that is no longer the worker's when the task returns, and a
worker killed with ``kill -9`` after the block leave no row; the retry writes it
exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.worker_app import one, raise_flag, rows, workers
from helpers import eventually, in_process_worker

import pgtasks
from pgtasks.states import JobStatus
from pgtasks.worker import Worker

FAST = ["--lease-timeout", "3", "--poll-interval", "0.2"]


def _docs(conn: psycopg.Connection[Any], job_id: int) -> list[tuple[Any, ...]]:
    return rows(
        conn, "SELECT attempt, note FROM public.tx_docs WHERE job_id = %s ORDER BY attempt", (job_id,)
    )


def _same_transaction(conn: psycopg.Connection[Any], job_id: int) -> bool:
    """Whether the job row's last write and its doc row came from one transaction."""
    return bool(
        one(
            conn,
            "SELECT j.xmin::text = d.xmin::text FROM pgtasks.jobs j JOIN public.tx_docs d ON d.job_id = j.id"
            " WHERE j.id = %s",
            (job_id,),
        )
    )


@pytest.fixture
def running(client: pgtasks.App) -> Iterator[Worker]:
    """An in-process worker (threads pool) on the test app, until the test ends."""
    with in_process_worker(client, concurrency=2) as worker:
        yield worker


def test_the_writes_and_the_success_commit_together(
    client: pgtasks.App, running: Worker, conn: psycopg.Connection[Any]
) -> None:
    result = client.tasks["w.tx_write"].delay("invoice 7")
    assert result.get(timeout=30) == "INVOICE 7"
    assert _docs(conn, result.id) == [(1, "invoice 7")]
    assert _same_transaction(conn, result.id)


def test_a_failed_attempt_leaves_nothing_and_the_retry_writes_once(
    client: pgtasks.App, running: Worker, conn: psycopg.Connection[Any]
) -> None:
    retried = client.tasks["w.tx_write"].delay("retried", fail_attempts=1)
    assert retried.get(timeout=30) == "RETRIED"
    assert _docs(conn, retried.id) == [(2, "retried")]  # attempt 1's row was rolled back
    assert _same_transaction(conn, retried.id)
    failed = client.tasks["w.tx_write"].delay("failed", fail_attempts=3)
    with pytest.raises(pgtasks.errors.TaskFailed, match="attempt 3 fails"):
        failed.get(timeout=30)
    assert client.get_job(failed.id).status == JobStatus.FAILED
    assert _docs(conn, failed.id) == []


def test_a_job_taken_away_before_it_returns_keeps_nothing(
    client: pgtasks.App, wdsn: str, conn: psycopg.Connection[Any]
) -> None:
    job = client.tasks["w.tx_write"].delay("taken", hold_flag="taken")
    with in_process_worker(client, concurrency=1) as worker:
        eventually(lambda: one(conn, "SELECT count(*) FROM public.ledger WHERE job_id = %s", (job.id,)) == 1)
        # What the reaper does to a job whose lease ran out: back to the queue.
        conn.execute(
            "UPDATE pgtasks.jobs SET status = 'queued', worker_id = NULL, run_at = now() + interval '1 hour'"
            " WHERE id = %s",
            (job.id,),
        )
        raise_flag(wdsn, "taken")
        eventually(lambda: worker.processed >= 1)
    assert client.get_job(job.id).status == JobStatus.QUEUED
    assert _docs(conn, job.id) == []


def test_an_attempt_whose_lease_lapsed_cannot_write_into_the_next_attempts_transaction(
    client: pgtasks.App, wdsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Attempt 1 waits before its block; the job is taken away from it and the same
    worker claims it again (attempt 2, also waiting). Attempt 1 then writes and returns:
    its block must not join attempt 2's transaction, and its success must not be
    written; attempt 2 commits its own row with its success."""
    job = client.tasks["w.tx_write_late"].delay("late", hold_flag="late")
    waiting = "SELECT array_agg(attempt ORDER BY attempt) FROM public.ledger WHERE job_id = %s"
    with in_process_worker(client, concurrency=2) as worker:
        eventually(lambda: one(conn, waiting, (job.id,)) == [1])
        # What the reaper does to a job whose lease ran out: back to the queue, due now.
        conn.execute(
            "UPDATE pgtasks.jobs SET status = 'queued', worker_id = NULL, run_at = now() WHERE id = %s",
            (job.id,),
        )
        eventually(lambda: one(conn, waiting, (job.id,)) == [1, 2])
        raise_flag(wdsn, "late-1")
        eventually(lambda: worker.processed >= 1)
        row = "SELECT status, attempt FROM pgtasks.jobs WHERE id = %s"
        assert conn.execute(row, (job.id,)).fetchone() == ("running", 2)
        assert _docs(conn, job.id) == []
        raise_flag(wdsn, "late-2")
        assert job.get(timeout=30) == "LATE"
    assert _docs(conn, job.id) == [(2, "late")]
    assert _same_transaction(conn, job.id)


def test_kill_9_after_the_block_leaves_no_row_and_the_retry_writes_it_once(
    client: pgtasks.App, wdsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    job = client.tasks["w.tx_write"].delay("survives", hold_flag="never")
    with workers(wdsn, tmp_path, FAST) as (first,):
        eventually(
            lambda: one(conn, "SELECT count(*) FROM public.ledger WHERE job_id = %s", (job.id,)) == 1,
            timeout=60,
        )
        first.kill()  # SIGKILL, its transaction open
    assert _docs(conn, job.id) == []
    with workers(wdsn, tmp_path, FAST):
        assert job.get(timeout=60) == "SURVIVES"
    # One ledger entry (the killed run noted itself; the next run saw it and went on),
    # and one row: the next run's, committed with its success.
    assert one(conn, "SELECT count(*) FROM public.ledger WHERE job_id = %s", (job.id,)) == 1
    assert _docs(conn, job.id) == [(client.get_job(job.id).attempt, "survives")]
    assert _same_transaction(conn, job.id)


def test_the_processes_pool_refuses_it_clearly(
    client: pgtasks.App, wdsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    job = client.tasks["w.tx_write"].delay("in a child")
    with workers(wdsn, tmp_path, ["-P", "processes", "-c", "1", *FAST]):
        eventually(lambda: client.get_job(job.id).status == JobStatus.FAILED, timeout=60)
    error = client.get_job(job.id).error
    assert error is not None and "needs the threads pool" in error["message"]
    assert _docs(conn, job.id) == []


def test_a_failed_outcome_write_rolls_back_and_hands_the_pool_an_autocommit_connection(dsn: str) -> None:
    """If the job's outcome cannot be written (here a failing statement), the task's
    writes are rolled back and the connection goes back to the pool as the pool hands
    its connections out (autocommit, outside a transaction)."""
    database = pgtasks.db.Database(dsn, max_size=1)
    try:
        with database.transaction() as setup:
            setup.execute("CREATE TABLE side (n int)")
        held = database.held_transaction()
        with held.block() as conn:
            conn.execute("INSERT INTO side VALUES (1)")

        def failing_write(conn: Any) -> bool:
            conn.execute("SELECT 1 / 0")
            return True

        with pytest.raises(pgtasks.errors.DatabaseError, match="division by zero"):
            held.commit_with(failing_write)
        assert not held.open
        with database.connection() as again:  # the pool's only connection
            assert again.autocommit
            assert again.execute("SELECT count(*) FROM side").fetchone() == (0,)
    finally:
        database.close()
