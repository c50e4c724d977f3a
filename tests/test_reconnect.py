"""Recovery without waiting: after its connections are cut, a worker claims at once.

The data layer never hands out a pooled connection whose backend is gone, and never
runs a statement twice. The worker is a real ``pgtasks worker`` process (`apps.worker_app.workers`) with a
long poll interval, so a claim that failed on a dead pooled connection and then
waited for the poll timer would show as a job starting tens of seconds late. The
side ledger (`apps.worker_app.LEDGER_DDL`) records when each job's body started.
"""

from __future__ import annotations

import signal
import time
from functools import partial
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
from apps.worker_app import WorkerProcess, db_now, ledger_rows, one, rows, workers
from helpers import eventually

import pgtasks
from pgtasks.db import Database
from pgtasks.errors import DatabaseError

POLL_INTERVAL = 30.0  # seconds: far longer than the start the test allows
START_WITHIN = 5.0  # seconds from enqueue to the job's body starting
ENQUEUE_AFTER_CUT = 2.0  # seconds: the job arrives once the cut is over, as in the field


def worker_backends(conn: psycopg.Connection[Any], worker: WorkerProcess) -> list[int]:
    """Backend pids of the worker process's own connections (pool, listener).

    Matched by the client port of each TCP connection the process holds. The
    connection its tasks use to write the side ledger is left alone: it is the
    test's instrument, not the worker's.
    """
    ports = [c.laddr.port for c in psutil.Process(worker.pid).net_connections(kind="tcp") if c.raddr]
    return [
        r[0]
        for r in rows(
            conn,
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY(%s)"
            " AND query NOT LIKE '%%public.ledger%%' AND query NOT LIKE '%%public.flags%%'",
            (ports,),
        )
    ]


def test_pooled_connections_cut_are_replaced_before_any_statement_uses_them(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Every idle pooled connection terminated: the next statements run on fresh ones at once."""
    database = Database(dsn, max_size=4)
    try:
        with database.connection() as a, database.connection() as b, database.connection() as c:
            cut = [a.info.backend_pid, b.info.backend_pid, c.info.backend_pid]
        killed = one(
            conn,
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest(%s::int[]) pid",
            (cut,),
        )
        assert killed == 3
        eventually(
            lambda: one(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (cut,)) == 0,
            message="backends gone",
        )
        started = time.monotonic()
        for _ in range(4):  # more statements than dead connections: none of them fails
            with database.connection() as fresh:
                assert fresh.info.backend_pid not in cut
            database.now()
        # Without a check at checkout the first statement fails; with psycopg_pool's own
        # loop over failed checks the third waits 1 s, then 2 s more.
        assert time.monotonic() - started < 1.0
    finally:
        database.close()


def test_statement_lost_in_flight_is_not_run_again(dsn: str, conn: psycopg.Connection[Any]) -> None:
    """A statement whose connection dies while it runs may have committed: it raises, transient."""
    conn.execute("CREATE SEQUENCE public.runs")
    queries = {
        # nextval is not rolled back: the sequence counts how often the statement ran.
        "dies_in_flight": "SELECT nextval('public.runs'), pg_terminate_backend(pg_backend_pid())",
        "session_setup": "SELECT 1",
    }
    database = Database(dsn, queries=queries, max_size=2)
    try:
        with pytest.raises(DatabaseError) as info:
            database.fetch_all("dies_in_flight")
        assert info.value.transient
        assert one(conn, "SELECT last_value FROM public.runs") == 1
    finally:
        database.close()


@pytest.mark.slow
def test_jobs_start_at_once_after_every_connection_of_the_worker_is_cut(
    client: pgtasks.App, conn: psycopg.Connection[Any], wdsn: str, tmp_path: Path
) -> None:
    """Three cuts in a row; each job enqueued 2 s after a cut starts within 5 s, not a poll later."""
    if conn.info.host.startswith("/"):
        pytest.skip(
            "the worker's backends are told apart by their TCP client ports; this server "
            "is reached over a Unix socket, as the embedded one is: set PGTASKS_TEST_DSN to a TCP server"
        )
    latencies: list[float] = []
    cut_sizes: list[int] = []
    with workers(wdsn, tmp_path, ["-c", "2", "--poll-interval", str(POLL_INTERVAL)]) as (w,):

        def reconnected(times: int) -> bool:
            return w.log().count("listener reconnected") >= times

        def started(job_id: int) -> list[tuple[Any, ...]]:
            return ledger_rows(conn, job_id)

        assert client.tasks["w.record"].delay(0).get(timeout=20) == 0
        for cut in range(1, 4):
            # At least the listener and one pooled connection (the pool grows as the
            # claim loop, the completer and the heartbeat overlap).
            backends = eventually(
                lambda: found if len(found := worker_backends(conn, w)) >= 2 else [],
                timeout=10,
                message="the worker's connections",
            )
            cut_at = time.monotonic()
            killed = one(
                conn,
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest(%s::int[]) pid",
                (backends,),
            )
            assert killed == len(backends)
            cut_sizes.append(killed)
            eventually(partial(reconnected, cut), timeout=10, message=f"listener back after cut {cut}")
            time.sleep(max(0.0, ENQUEUE_AFTER_CUT - (time.monotonic() - cut_at)))  # the scenario's timing
            enqueued_at = db_now(conn)
            job = client.tasks["w.record"].delay(cut).id
            eventually(partial(started, job), timeout=POLL_INTERVAL + 10, message=f"job {cut} started")
            latencies.append((started(job)[0][2] - enqueued_at).total_seconds())
        w.signal(signal.SIGTERM)
        assert w.wait(20) == 0
    print(f"backends cut: {cut_sizes}; job start after each cut: {', '.join(f'{s:.3f}s' for s in latencies)}")
    assert all(s < START_WITHIN for s in latencies), latencies
