"""A worker whose lease lapsed does not start the jobs it had claimed ahead.

A worker stopped past its lease (``SIGSTOP``, a paused VM) has its claimed-ahead jobs
handed back by the reaper, attempt unused; they may already run elsewhere. When the
worker resumes, those jobs are still in its buffer. Before this was fixed it started
them anyway: their bodies ran on a worker that no longer held them, at the same time
as their new holder's, whose lease was alive. Now a start after a lapse of the lease
is written first (as a non-idempotent task's always is), and a job no longer held is
not run. Found by the chaos harness (docs/chaos.md).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psycopg
from apps.worker_app import ledger_rows, one, raise_flag, workers
from helpers import eventually

import pgtasks
from pgtasks.maintenance import Reaper, ReaperConfig


def test_a_job_handed_back_during_a_lapse_is_not_started_by_the_stale_worker(
    client: pgtasks.App, wdsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    blocker = client.tasks["w.block"].delay("lapse").id
    ahead = client.tasks["w.record"].delay(7).id
    flags = ["-c", "1", "--prefetch-multiplier", "2", "--lease-timeout", "2", "--poll-interval", "0.1"]
    with workers(wdsn, tmp_path, flags) as (worker,):
        eventually(lambda: ledger_rows(conn, blocker), timeout=60, message="the blocking job started")
        eventually(
            lambda: one(conn, "SELECT status = 'running' FROM pgtasks.jobs WHERE id = %s", (ahead,)),
            timeout=30,
            message="the second job claimed ahead",
        )
        assert one(conn, "SELECT started_at IS NULL FROM pgtasks.jobs WHERE id = %s", (ahead,))
        worker.signal(signal.SIGSTOP)
        time.sleep(3.0)  # past the 2 s lease
        reaped = Reaper(client.stores.jobs, client.stores.workers, ReaperConfig(lease_timeout=2.0)).run_once()
        assert reaped.requeued == 2, reaped
        # The job handed back runs elsewhere now; here: it is not due for an hour.
        conn.execute("UPDATE pgtasks.jobs SET run_at = now() + interval '1 hour' WHERE id = %s", (ahead,))
        worker.signal(signal.SIGCONT)
        time.sleep(1.5)  # the worker beats again (its lease row comes back), then:
        raise_flag(wdsn, "lapse")  # its slot is free for the job it claimed ahead
        eventually(
            lambda: ledger_rows(conn, ahead) or "not run" in worker.log(),
            timeout=30,
            message="the worker's slot took the job it claimed ahead",
        )
        time.sleep(0.5)
    assert ledger_rows(conn, ahead) == []
    assert one(conn, "SELECT status FROM pgtasks.jobs WHERE id = %s", (ahead,)) == "queued"
    assert one(conn, "SELECT attempt FROM pgtasks.jobs WHERE id = %s", (ahead,)) == 0
