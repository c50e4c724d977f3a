"""Fleet proofs with real worker processes: exactly-once under load, crash recovery,
graceful shutdown, tenant fairness, locks, listener recovery and exit codes.

Every worker here is a ``pgtasks -A tests.apps.worker_app:app worker`` subprocess on
the test's own database. Tasks write a side ledger (`apps.worker_app.LEDGER_DDL`)
so the checks do not rely on pgtasks' own bookkeeping.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.worker_app import (
    db_now,
    ledger_rows,
    one,
    raise_flag,
    rows,
    status,
    worker_id_of,
    workers,
)
from helpers import eventually

import pgtasks


@pytest.mark.slow
def test_three_workers_run_5000_jobs_exactly_once(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    ids = [r.id for r in client.tasks["w.record"].delay_many(list(range(5000)))]
    assert len(ids) == 5000
    started = time.monotonic()
    with workers(wdsn, tmp_path, *(["-c", "4", "--burst", "--poll-interval", "0.2"] for _ in range(3))) as ws:
        codes = [w.wait(120) for w in ws]
    elapsed = time.monotonic() - started
    assert codes == [0, 0, 0], [w.log()[-2000:] for w in ws]
    assert rows(conn, "SELECT status, count(*), max(attempt) FROM pgtasks.jobs GROUP BY status") == [
        ("succeeded", 5000, 1)
    ]
    # The ledger, written by the tasks themselves: one run per job, none unfinished.
    per_job = rows(
        conn,
        "SELECT count(*) AS runs, count(finished_at) AS finished FROM public.ledger"
        " GROUP BY job_id HAVING count(*) <> 1 OR count(finished_at) <> 1",
    )
    assert per_job == []
    assert one(conn, "SELECT count(DISTINCT job_id) FROM public.ledger") == 5000
    assert one(conn, "SELECT count(*) FROM public.ledger WHERE job_id <> ALL(%s)", (ids,)) == 0
    # Every worker took part; results match the arguments.
    assert one(conn, "SELECT count(DISTINCT worker_pid) FROM public.ledger") == 3
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE result <> args -> 0") == 0
    assert one(conn, "SELECT count(*) FROM pgtasks.workers") == 0  # all unregistered
    print(f"5000 jobs on 3x4 workers: {elapsed:.1f}s")


@pytest.mark.slow
def test_kill_9_mid_job_recovers_after_lease(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """A killed worker's idempotent job runs again elsewhere; a non-idempotent one fails."""
    retried = client.tasks["w.block"].delay("go").id
    once = client.tasks["w.block_once"].delay("go").id
    fast = ["--lease-timeout", "3", "--poll-interval", "0.2"]
    with workers(wdsn, tmp_path, ["-c", "2", *fast]) as (victim,):
        victim_id = worker_id_of(conn, victim.pid)
        eventually(
            lambda: len(ledger_rows(conn, retried)) == 1 and len(ledger_rows(conn, once)) == 1,
            timeout=20,
            message="both jobs started",
        )
        # An ordinary task's start is recorded within a tick of the worker's start recorder:
        # wait for it, as the lost attempt this test asserts is one whose start was recorded.
        eventually(
            lambda: one(conn, "SELECT started_at IS NOT NULL FROM pgtasks.jobs WHERE id = %s", (retried,)),
            timeout=10,
            message="the start of the idempotent job recorded",
        )
        with workers(wdsn, tmp_path, ["-c", "2", *fast]) as (rescuer,):
            rescuer_id = worker_id_of(conn, rescuer.pid)
            victim.signal(signal.SIGKILL)
            assert victim.wait(10) == -signal.SIGKILL
            killed_at = db_now(conn)
            eventually(lambda: len(ledger_rows(conn, retried)) == 2, timeout=30, message="second attempt")
            eventually(
                lambda: status(conn, once) == "failed", timeout=30, message="non-idempotent job failed"
            )
            raise_flag(wdsn, "go")
            eventually(lambda: status(conn, retried) == "succeeded", timeout=20, message="job succeeded")
            lease_end = one(conn, "SELECT lease_expires_at FROM pgtasks.workers WHERE id = %s", (victim_id,))

    first, second = ledger_rows(conn, retried)
    assert (first[0], first[1]) == (1, victim.pid)
    assert (second[0], second[1]) == (2, rescuer.pid)
    # Never run by two workers at once while the victim's lease was alive.
    assert second[2] > lease_end
    assert second[2] > killed_at
    job = client.get_job(retried)
    assert (job.status, job.attempt, job.worker_id) == ("succeeded", 2, rescuer_id)
    history = job.history()
    assert [(a.attempt, a.outcome) for a in history] == [(1, "lost"), (2, "succeeded")]
    assert history[0].worker_id == victim_id
    assert history[0].error is not None and history[0].error["code"] == "WORKER_LOST"
    assert history[1].trigger == "retry"

    gone = client.get_job(once)
    assert (gone.status, gone.attempt) == ("failed", 1)
    assert gone.error is not None
    assert (gone.error["code"], gone.error["class"]) == ("WORKER_LOST", "transient")
    assert victim_id in gone.error["message"]
    assert [(a["attempt"], a["outcome"]) for a in gone.attempts] == [(1, "lost")]
    assert len(ledger_rows(conn, once)) == 1  # never ran again
    print(f"reclaimed {(second[2] - killed_at).total_seconds():.1f}s after kill -9 (lease 3s)")


def ran_on(conn: psycopg.Connection[Any], job_id: int) -> list[str]:
    """Ids of the workers that started the job, from the ledger."""
    return [
        r[0]
        for r in rows(conn, "SELECT worker_id FROM public.ledger WHERE job_id = %s ORDER BY id", (job_id,))
    ]


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_sigterm_finishes_running_job_and_hands_back_the_rest(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path, pool: str
) -> None:
    long_job = client.tasks["w.record"].apply_async((0, 3.0), priority=10).id
    rest = [client.tasks["w.record"].delay(i).id for i in range(1, 6)]
    # One slot, four claimed: the 3 s job runs, three wait claimed-but-not-started.
    args = ["-P", pool, "-c", "1", "--prefetch-multiplier", "4", "--lease-timeout", "60"]
    with workers(wdsn, tmp_path, args) as (a,):
        a_id = worker_id_of(conn, a.pid)
        eventually(lambda: ledger_rows(conn, long_job), timeout=20, message="long job started")
        held = [
            r[0]
            for r in rows(
                conn,
                "SELECT id FROM pgtasks.jobs WHERE status = 'running' AND worker_id = %s AND id <> %s",
                (a_id, long_job),
            )
        ]
        assert len(held) == 3
        assert all(not ledger_rows(conn, j) for j in held)
        a.signal(signal.SIGTERM)
        term_at = db_now(conn)
        # The held jobs go back at once (not after the 60 s lease): visible as queued
        # while the long job is still running on the draining worker.
        eventually(
            lambda: all(status(conn, j) == "queued" for j in held) and status(conn, long_job) == "running",
            timeout=2.5,
            message="unstarted jobs handed back while draining",
        )
        with workers(wdsn, tmp_path, ["-P", pool, "-c", "4"]) as (b,):
            b_id = worker_id_of(conn, b.pid)
            code = a.wait(15)
            eventually(
                lambda: all(status(conn, j) == "succeeded" for j in rest),
                timeout=20,
                message="the rest done by the second worker",
            )
            b.signal(signal.SIGTERM)
            assert b.wait(15) == 0
    assert code == 0, a.log()[-2000:]
    long_rows = ledger_rows(conn, long_job)
    assert len(long_rows) == 1 and long_rows[0][3] is not None
    assert ran_on(conn, long_job) == [a_id]
    job = client.get_job(long_job)
    assert (job.status, job.attempt) == ("succeeded", 1)
    assert job.finished_at is not None and job.finished_at > term_at
    for j in held:
        (entry,) = ledger_rows(conn, j)
        assert entry[0] == 1  # the hand-back did not use up an attempt
        assert ran_on(conn, j) == [b_id]
        assert (entry[2] - term_at).total_seconds() < 30  # well before the 60 s lease
        assert client.get_job(j).attempts == []
    assert "handed back 3 job(s)" in a.log()


@pytest.mark.slow
def test_a_small_tenant_is_not_starved_by_a_bulk_upload(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    record = client.tasks["w.record"]
    with workers(wdsn, tmp_path, ["-c", "4", "--poll-interval", "0.2"]) as (w,):
        bulk = record.delay_many(list(range(20_000)), tenant="A")
        eventually(
            lambda: one(conn, "SELECT count(*) FROM public.ledger") >= 50,
            timeout=20,
            message="bulk upload being processed",
        )
        small = [record.apply_async((i,), tenant="B").id for i in range(10)]
        eventually(
            lambda: all(status(conn, j) == "succeeded" for j in small), timeout=30, message="tenant B done"
        )
        b_done = one(conn, "SELECT max(finished_at) FROM public.ledger WHERE job_id = ANY(%s)", (small,))
        a_before = one(
            conn,
            "SELECT count(*) FROM public.ledger WHERE job_id <> ALL(%s) AND started_at <= %s",
            (small, b_done),
        )
        w.signal(signal.SIGTERM)
        assert w.wait(30) == 0
    assert len(bulk) == 20_000
    assert a_before < 0.05 * 20_000, a_before
    print(f"tenant A jobs run before tenant B's 10 finished: {a_before}")


@pytest.mark.slow
def test_jobs_sharing_a_lock_never_overlap(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    record = client.tasks["w.record"]
    # More keys (40) than one worker can hold at once (-c 4 x prefetch 4 = 16, one job per
    # key): whichever worker starts first, the other finds keys free to claim, so both
    # run locked jobs however far apart the two processes start. With two keys, the
    # first worker could run both chains to the end on its own.
    for i in range(4):
        for key in range(40):
            record.apply_async((i, 0.03), lock=f"lock:{key}")
    free = record.delay_many([(i, 0.03) for i in range(40)])
    args = ["-c", "4", "--burst", "--poll-interval", "0.05"]
    with workers(wdsn, tmp_path, args, args) as ws:
        codes = [w.wait(60) for w in ws]
    assert codes == [0, 0]
    assert one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE status <> 'succeeded'") == 0
    overlaps = rows(
        conn,
        """
        SELECT a.job_id, b.job_id, ja.lock_key
        FROM public.ledger a JOIN pgtasks.jobs ja ON ja.id = a.job_id
        JOIN public.ledger b ON b.id <> a.id
        JOIN pgtasks.jobs jb ON jb.id = b.job_id AND jb.lock_key = ja.lock_key
        WHERE tstzrange(a.started_at, a.finished_at) && tstzrange(b.started_at, b.finished_at)
        """,
    )
    assert overlaps == []
    # Both workers ran locked jobs, and unlocked jobs did overlap (the check can see overlap).
    assert (
        one(
            conn,
            "SELECT count(DISTINCT l.worker_pid) FROM public.ledger l JOIN pgtasks.jobs j ON j.id = l.job_id"
            " WHERE j.lock_key IS NOT NULL",
        )
        == 2
    )
    assert (
        one(
            conn,
            """
        SELECT count(*) FROM public.ledger a JOIN public.ledger b ON a.id < b.id
        WHERE a.job_id = ANY(%(free)s) AND b.job_id = ANY(%(free)s)
          AND tstzrange(a.started_at, a.finished_at) && tstzrange(b.started_at, b.finished_at)
        """,
            {"free": [r.id for r in free]},
        )
        > 0
    )


@pytest.mark.slow
def test_listener_reconnects_after_pg_terminate_backend(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    poll = 5.0

    def listen_backends() -> list[int]:
        return [
            r[0]
            for r in rows(
                conn,
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND query LIKE '%%LISTEN pgtasks_cancel%%' AND pid <> pg_backend_pid()",
            )
        ]

    with workers(wdsn, tmp_path, ["-c", "2", "--poll-interval", str(poll)]) as (w,):
        (old,) = eventually(listen_backends, timeout=20, message="listener connected")
        assert one(conn, "SELECT pg_terminate_backend(%s)", (old,)) is True
        eventually(lambda: "listener reconnected" in w.log(), timeout=10, message="reconnect logged")
        (new,) = eventually(listen_backends, timeout=10, message="listener back")
        assert new != old
        enqueued_at = db_now(conn)
        job = client.tasks["w.record"].delay(7).id
        eventually(lambda: ledger_rows(conn, job), timeout=poll + 5, message="job started")
        latency = (ledger_rows(conn, job)[0][2] - enqueued_at).total_seconds()
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0
    assert latency < poll
    assert "listener connection lost" in w.log()
    print(f"job started {latency:.2f}s after enqueue (poll interval {poll}s)")


@pytest.mark.slow
def test_second_sigterm_exits_at_once_with_130(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    job = client.tasks["w.stuck"].delay().id
    with workers(wdsn, tmp_path, ["-c", "1", "--shutdown-timeout", "60"]) as (w,):
        eventually(lambda: ledger_rows(conn, job), timeout=20, message="job started")
        w.signal(signal.SIGTERM)
        eventually(lambda: "signal again to exit at once" in w.log(), timeout=5, message="first signal seen")
        started = time.monotonic()
        w.signal(signal.SIGTERM)
        code = w.wait(10)
        took = time.monotonic() - started
    assert code == 130
    assert took < 3
    # Its running job is left to the lease, not lost.
    assert status(conn, job) == "running"


def test_burst_worker_exits_0_and_a_usage_error_exits_2(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    ids = [r.id for r in client.tasks["w.record"].delay_many(list(range(20)))]
    with workers(wdsn, tmp_path, ["--burst", "-c", "2"], ["-c", "0"]) as (ok, bad):
        assert ok.wait(30) == 0
        assert bad.wait(30) == 2
    assert all(status(conn, j) == "succeeded" for j in ids)
    assert "stopping (burst-done)" in ok.log()


@pytest.mark.slow
def test_jobs_still_running_at_shutdown_timeout_are_left_to_the_lease(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """After --shutdown-timeout a running job is not handed back as if it never ran: it is
    recovered by lease, so a non-idempotent job ends failed instead of running twice."""
    again = client.tasks["w.block"].delay("go").id
    once = client.tasks["w.block_once"].delay("go").id
    args = ["-c", "2", "--lease-timeout", "3", "--shutdown-timeout", "0.5", "--poll-interval", "0.2"]
    with workers(wdsn, tmp_path, args) as (victim,):
        victim_id = worker_id_of(conn, victim.pid)
        eventually(
            lambda: ledger_rows(conn, again) and ledger_rows(conn, once), timeout=20, message="both running"
        )
        victim.signal(signal.SIGTERM)
        assert victim.wait(15) == 0
        assert (status(conn, again), status(conn, once)) == ("running", "running")
        with workers(wdsn, tmp_path, args) as (rescuer,):
            eventually(
                lambda: status(conn, once) == "failed", timeout=30, message="non-idempotent job failed"
            )
            eventually(lambda: len(ledger_rows(conn, again)) == 2, timeout=30, message="idempotent job again")
            raise_flag(wdsn, "go")
            eventually(lambda: status(conn, again) == "succeeded", timeout=20, message="job succeeded")
            rescuer.signal(signal.SIGTERM)
            assert rescuer.wait(20) == 0
    assert len(ledger_rows(conn, once)) == 1
    gone = client.get_job(once)
    assert gone.error is not None and gone.error["code"] == "WORKER_LOST"
    job = client.get_job(again)
    first = job.history()[0]
    assert (first.attempt, first.outcome, first.worker_id) == (1, "lost", victim_id)
    assert job.attempt == 2


@pytest.mark.slow
def test_kill_9_of_a_processes_worker_takes_its_children_along(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """An orphaned child would finish the job while the lease recovery runs it again."""
    import psutil

    job = client.tasks["w.record"].delay(1, 3.0).id
    with workers(wdsn, tmp_path, ["-P", "processes", "-c", "1"]) as (w,):
        eventually(lambda: ledger_rows(conn, job), timeout=30, message="job started in a child")
        child = ledger_rows(conn, job)[0][1]
        assert child != w.pid and psutil.pid_exists(child)
        w.signal(signal.SIGKILL)
        w.wait(10)
        eventually(
            lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE,
            timeout=2,
            message="child gone with its parent",
        )
    assert ledger_rows(conn, job)[0][3] is None  # it never finished behind the fleet's back


def test_worker_survives_losing_all_its_connections(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    with workers(wdsn, tmp_path, ["-c", "2", "--poll-interval", "0.2"]) as (w,):
        assert client.tasks["w.record"].delay(1).get(timeout=20) == 1
        client.close()  # our own pool would be cut too
        killed = one(
            conn,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        assert killed >= 2
        assert client.tasks["w.record"].delay(2).get(timeout=20) == 2
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0
