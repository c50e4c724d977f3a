"""The fleet through a real PgBouncer in transaction pooling.

A private PostgreSQL (the primary of `cluster.primary_and_standby`, asynchronous)
behind Debian's ``pgbouncer`` with ``pool_mode = transaction`` and
``default_pool_size = 8``: two ``pgtasks worker -c 32`` processes, 64 job threads and
their pools, share 8 server connections. Every process runs as docs/operations.md
says for such a pooler: ``PGTASKS_LISTEN=off`` (a ``LISTEN`` would stay behind on a
server connection; workers poll, ``AsyncResult.get`` reads each second) and, as
PgBouncer before 1.21 keeps no prepared statements across transactions,
``PGTASKS_PREPARE_THRESHOLD=off``. The scenarios of the
fleet tests run through it: many jobs exactly once, retries, ``kill -9`` of a worker
and recovery after the lease, cancel of a running job, and the scheduler firing.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.ha_app import make_app, processes, raise_flag, setup_ledger
from cluster import PgBouncer, Server, primary_and_standby, running_pgbouncer
from helpers import eventually

import pgtasks

POOL = 8  # server connections PgBouncer opens to the database
THREADS = 32  # job threads per worker process; two processes
# What every process through the pooler sets: no prepared statements, no LISTEN.
POOLED_ENV = {"PGTASKS_PREPARE_THRESHOLD": "off", "PGTASKS_LISTEN": "off"}
START = datetime(2025, 6, 2, 12, 0, 30, tzinfo=UTC)


@pytest.fixture(scope="module")
def bouncer() -> Iterator[tuple[Server, PgBouncer]]:
    with (
        primary_and_standby(synchronous=False) as (primary, _standby),
        running_pgbouncer(primary.port, pool_size=POOL) as pooler,
    ):
        yield primary, pooler


@pytest.fixture
def pooled(bouncer: tuple[Server, PgBouncer]) -> Iterator[tuple[str, str, pgtasks.App]]:
    """A fresh migrated database: (its direct DSN, its DSN through PgBouncer, the app
    through PgBouncer without prepared statements)."""
    primary, pooler = bouncer
    name = f"t_{time.monotonic_ns()}"
    with psycopg.connect(primary.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    direct = primary.dsn(name)
    through = pooler.dsn(name)
    setup_ledger(direct)
    app = make_app(through, prepare_threshold=None, listen=False)
    app.migrate()
    yield direct, through, app
    app.close()
    with psycopg.connect(primary.dsn(), autocommit=True) as admin:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def worker_args(*extra: str) -> list[str]:
    """A worker's command: it polls because of ``PGTASKS_LISTEN=off``, not a flag."""
    return ["worker", "-c", str(THREADS), "--poll-interval", "0.2", *extra]


def no_session_state_left(pooler: PgBouncer, direct: str) -> None:
    """No ``LISTEN`` stayed behind on a server connection of the pooler: notifications
    on pgtasks' channels, sent straight to the server while the pooler's server
    connections are idle, reach none (PgBouncer logs each one it gets on an idle
    server connection and drops: packet 'A')."""
    with psycopg.connect(direct, autocommit=True) as conn:
        for channel in ("pgtasks_done", "pgtasks_jobs", "pgtasks_cancel"):
            conn.execute("SELECT pg_notify(%s, '1')", (channel,))
    time.sleep(0.5)
    assert "got packet 'A' from server when not linked" not in pooler.log.read_text(errors="replace")


def server_connections(pooler: PgBouncer, dbname: str) -> int:
    """Server connections PgBouncer holds for ``dbname`` now."""
    return sum(1 for row in pooler.show("SERVERS") if row[2] == dbname)


@pytest.mark.slow
def test_64_job_threads_through_8_server_connections_run_every_job_once(
    bouncer: tuple[Server, PgBouncer], pooled: tuple[str, str, pgtasks.App], tmp_path: Path
) -> None:
    """2,000 jobs and failing jobs that retry, two worker processes of 32 threads through
    8 server connections: each job's ledger row exactly once, each failing job three
    attempts; PgBouncer never opened more than 8 server connections."""
    _primary, pooler = bouncer
    direct, through, app = pooled
    ids = [r.id for r in app.tasks["ha.record"].delay_many(list(range(2000)))]
    failing = [app.tasks["ha.fail"].delay().id for _ in range(20)]
    most_servers = 0
    with (
        processes(through, tmp_path, worker_args(), worker_args(), env=POOLED_ENV) as procs,
        psycopg.connect(direct, autocommit=True) as conn,
    ):

        def finished() -> bool:
            nonlocal most_servers
            most_servers = max(most_servers, server_connections(pooler, conn.info.dbname))
            return bool(one(conn, "SELECT count(*) FROM pgtasks.jobs WHERE finished_at IS NULL") == 0)

        eventually(finished, timeout=180, interval=0.2, message="every job finished")
        assert one(conn, "SELECT count(*) FROM pgtasks.workers") == 2
        codes = [p.stop() for p in procs]
        logs = [p.log() for p in procs]
        per_job: dict[int, int] = dict(
            conn.execute(
                "SELECT job_id, count(*) FROM public.ha_ledger WHERE kind = 'done' GROUP BY job_id"
            ).fetchall()
        )
        statuses: dict[str, int] = dict(
            conn.execute(
                "SELECT status, count(*) FROM pgtasks.jobs WHERE id = ANY(%s) GROUP BY status", (ids,)
            ).fetchall()
        )
        attempts = conn.execute(
            "SELECT j.status, j.attempt, count(l.id) FROM pgtasks.jobs j"
            " LEFT JOIN public.ha_ledger l ON l.job_id = j.id AND l.kind = 'fail'"
            " WHERE j.id = ANY(%s) GROUP BY j.id, j.status, j.attempt",
            (failing,),
        ).fetchall()
        pids = one(conn, "SELECT count(DISTINCT worker_pid) FROM public.ha_ledger WHERE kind = 'done'")
    assert codes == [0, 0], [log[-3000:] for log in logs]
    assert statuses == {"succeeded": 2000}
    assert sorted(per_job) == sorted(ids) and set(per_job.values()) == {1}
    assert set(attempts) == {("failed", 3, 3)}
    assert pids == 2
    assert 0 < most_servers <= POOL, most_servers
    assert app.AsyncResult(ids[-1]).get(timeout=30) == 1999
    no_session_state_left(pooler, direct)
    for log in logs:
        assert "prepared statement" not in log, log[-3000:]
    print(f"{pooler.version}: 2,000 jobs on 2x{THREADS} threads through {most_servers} server connections")


@pytest.mark.slow
def test_kill_9_cancel_and_the_scheduler_through_pgbouncer(
    bouncer: tuple[Server, PgBouncer], pooled: tuple[str, str, pgtasks.App], tmp_path: Path
) -> None:
    """A worker killed with ``kill -9`` mid-job: its job runs again on the other worker
    after the lease. A running job is cancelled and sees it. A scheduler process fires
    a schedule on a simulated clock, one run per tick."""
    direct, through, app = pooled
    blocked = app.tasks["ha.block"].delay("go").id
    app.schedules.create("tick", "ha.record", "* * * * *", overlap="allow", now=START)
    clock = f"{START.isoformat()},30.0,{time.time() + 2.0!r}"  # a cron minute every 2 s
    fast = ["--lease-timeout", "3"]
    with (
        processes(
            through,
            tmp_path,
            worker_args(*fast),
            ["scheduler", "--interval", "0.1", "--simulate-clock", clock],
            env=POOLED_ENV,
        ) as (victim, scheduler),
        psycopg.connect(direct, autocommit=True) as conn,
    ):

        def runs_of(job: int) -> list[tuple[Any, ...]]:
            return conn.execute(
                "SELECT attempt, worker_pid FROM public.ha_ledger WHERE job_id = %s AND kind = 'block'"
                " ORDER BY id",
                (job,),
            ).fetchall()

        eventually(lambda: runs_of(blocked) == [(1, victim.pid)], timeout=30, message="the job started")
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        with processes(through, tmp_path, worker_args(*fast), env=POOLED_ENV) as (survivor,):
            eventually(
                lambda: [r[1] for r in runs_of(blocked)] == [victim.pid, survivor.pid],
                timeout=30,
                message="the job ran again after the lease",
            )
            raise_flag(direct, "go")
            assert app.AsyncResult(blocked).get(timeout=30) == "go"
            cancellable = app.tasks["ha.until_cancelled"].delay()
            eventually(
                lambda: (
                    one(
                        conn,
                        "SELECT count(*) FROM public.ha_ledger WHERE job_id = %s AND kind = 'cancellable'",
                        (cancellable.id,),
                    )
                    == 1
                ),
                timeout=30,
                message="the cancellable job started",
            )
            assert cancellable.revoke()
            eventually(
                lambda: (
                    one(
                        conn,
                        "SELECT count(*) FROM public.ha_ledger WHERE job_id = %s AND kind = 'saw cancel'",
                        (cancellable.id,),
                    )
                    == 1
                ),
                timeout=30,
                message="the task saw the cancel",
            )
            eventually(
                lambda: (
                    one(
                        conn,
                        "SELECT count(*) FROM pgtasks.jobs"
                        " WHERE schedule_name = 'tick' AND status = 'succeeded'",
                    )
                    >= 3
                ),
                timeout=60,
                message="three scheduled runs succeeded",
            )
            assert survivor.stop() == 0, survivor.log()[-3000:]
        assert scheduler.stop() == 0, scheduler.log()[-3000:]
        status = one(conn, "SELECT status FROM pgtasks.jobs WHERE id = %s", (cancellable.id,))
        doubled = conn.execute(
            "SELECT scheduled_for FROM pgtasks.jobs WHERE schedule_name = 'tick' AND trigger = 'schedule'"
            " GROUP BY scheduled_for HAVING count(*) > 1"
        ).fetchall()
    assert status == "cancelled"
    assert doubled == []
    no_session_state_left(bouncer[1], direct)
