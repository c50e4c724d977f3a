"""Primary failover: the fleet follows a promoted standby without a restart, and with
synchronous replication no acknowledged enqueue is lost.

A private primary and a streaming standby (`cluster.primary_and_standby`, from the
machine's PostgreSQL binaries). Every pgtasks process connects with one libpq
multi-host DSN (``host=127.0.0.1,127.0.0.1 port=P1,P2 target_session_attrs=read-write``):
two ``pgtasks worker`` processes, a ``pgtasks scheduler`` (on a simulated clock, a
cron minute every 2 s), a producer thread enqueuing all the time and a thread
waiting in ``AsyncResult.get``. Mid-run the primary is stopped (``immediate``: as a
crash) and the standby promoted. The side ledger (`apps.ha_app`) gets its row in the
job's own transaction, so it holds exactly one row per succeeded job.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.ha_app import make_app, processes, setup_ledger
from cluster import Server, multi_host_dsn, primary_and_standby, wait_replayed
from helpers import eventually

import pgtasks
import pgtasks.errors

START = datetime(2025, 6, 2, 12, 0, 30, tzinfo=UTC)
SPEED = 30.0  # simulated seconds per second: a cron minute every 2 s
PROMOTE_LATE = 5.0  # seconds between the primary's loss and the promotion, as a failover manager waits
RECOVERY_WITHIN = 30.0  # seconds from the cut to a job finished on the new primary (measured: see docs)


@pytest.fixture
def pair() -> Iterator[tuple[Server, Server]]:
    with primary_and_standby(synchronous=True) as servers:
        yield servers


class Producer(threading.Thread):
    """Enqueues ``ha.record`` jobs one by one until stopped; keeps the ids it was
    given (acknowledged enqueues) and counts the refusals (during the cut)."""

    def __init__(self, app: pgtasks.App) -> None:
        super().__init__(name="producer", daemon=True)
        self.app = app
        self.acknowledged: list[int] = []
        self.refused = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop_event.is_set():
            n += 1
            try:
                self.acknowledged.append(self.app.tasks["ha.record"].delay(n).id)
            except pgtasks.errors.PgtasksError:
                self.refused += 1
                time.sleep(0.1)
                continue
            time.sleep(0.01)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(30)


def one(conn: psycopg.Connection[Any], query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "promote_after"),
    [("immediate", 0.0), ("fast", 0.0), ("immediate", PROMOTE_LATE)],
    ids=["immediate", "fast", "immediate-promoted-late"],
)
def test_failover_to_a_synchronous_standby_loses_no_acknowledged_job(
    pair: tuple[Server, Server], tmp_path: Path, mode: str, promote_after: float
) -> None:
    """``pg_ctl stop -m immediate`` (a crash) or ``-m fast`` of the primary, then
    ``pg_ctl promote`` of the standby: every acknowledged enqueue succeeds exactly once
    (one ledger row, written in the job's transaction), the scheduler creates one run
    per cron tick, ``AsyncResult.get`` returns across the cut, and every process goes
    on without a restart and exits 0 on SIGTERM."""
    primary, standby = pair
    with psycopg.connect(primary.dsn(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE test")
    dsn = multi_host_dsn([primary, standby], "test")
    setup_ledger(dsn)
    app = make_app(dsn)
    app.migrate()
    app.schedules.create("tick", "ha.record", "* * * * *", overlap="allow", now=START)
    anchor = time.time() + 3.0
    clock = f"{START.isoformat()},{SPEED},{anchor!r}"
    worker = ["worker", "-c", "4", "--poll-interval", "0.5", "--lease-timeout", "5"]
    scheduler = ["scheduler", "--interval", "0.1", "--simulate-clock", clock]
    producer = Producer(app)
    waited: dict[str, Any] = {}
    try:
        with processes(dsn, tmp_path, worker, worker, scheduler) as procs:
            db = psycopg.connect(primary.dsn("test"), autocommit=True)

            def done() -> int:
                return int(one(db, "SELECT count(*) FROM public.ha_ledger WHERE kind = 'done'"))

            producer.start()
            eventually(lambda: done() >= 100, timeout=60, message="jobs done before the cut")
            eventually(
                lambda: one(db, "SELECT count(*) FROM pgtasks.jobs WHERE schedule_name = 'tick'") >= 2,
                timeout=30,
                message="the scheduler fired before the cut",
            )
            db.close()
            # Callers waiting for a result across the cut (the jobs run 2 s later).
            waiting = app.tasks["ha.record"].apply_async(args=(-1,), countdown=2)
            waiting_async = app.tasks["ha.record"].apply_async(args=(-2,), countdown=2)

            def wait() -> None:
                try:
                    waited["result"] = waiting.get(timeout=120)
                except Exception as exc:  # the assertion below shows it
                    waited["error"] = exc

            def wait_async() -> None:
                try:
                    waited["async result"] = asyncio.run(waiting_async.get_async(timeout=120))
                except Exception as exc:  # the assertion below shows it
                    waited["async error"] = exc

            waiters = [threading.Thread(target=f, name=f.__name__, daemon=True) for f in (wait, wait_async)]
            for waiter in waiters:
                waiter.start()
            acknowledged_before = len(producer.acknowledged)
            primary.stop(mode)
            # The cut: the old primary is gone; what commits from here on commits on
            # the new one, once promoted.
            cut_wall = datetime.now(UTC)
            cut = time.monotonic()
            time.sleep(promote_after)  # a failover manager that waits before promoting
            standby.promote()
            promoted = time.monotonic() - cut
            with psycopg.connect(standby.dsn("test"), autocommit=True) as new:

                def first_done_after_cut() -> datetime | None:
                    value: datetime | None = one(
                        new,
                        "SELECT min(at) FROM public.ha_ledger WHERE kind = 'done' AND at > %s",
                        (cut_wall,),
                    )
                    return value

                found = eventually(
                    first_done_after_cut,
                    timeout=RECOVERY_WITHIN + 30,
                    interval=0.05,
                    message="a job done after",
                )
                assert found is not None
                first = found
                recovery = (first - cut_wall).total_seconds()
                # Go on for a while on the new primary, then let the queue drain.
                eventually(
                    lambda: len(producer.acknowledged) >= acknowledged_before + 200,
                    timeout=60,
                    message="enqueues on the new primary",
                )
                fired_after = eventually(
                    lambda: (
                        one(
                            new,
                            "SELECT count(*) FROM pgtasks.jobs"
                            " WHERE schedule_name = 'tick' AND created_at > %s",
                            (cut_wall,),
                        )
                        >= 2
                    ),
                    timeout=60,
                    message="the scheduler fired on the new primary",
                )
                assert fired_after
                producer.stop()
                for waiter in waiters:
                    waiter.join(130)

                def unfinished() -> list[tuple[Any, ...]]:
                    # A scheduled run whose task broke at the cut fails (a run is one
                    # attempt); its retry run, linked by parent_id, stands for it.
                    return new.execute(
                        "SELECT id, status, attempt, run_at, worker_id, error->>'message' FROM pgtasks.jobs j"
                        " WHERE status <> 'succeeded'"
                        " AND NOT (status = 'failed' AND schedule_name IS NOT NULL"
                        " AND EXISTS (SELECT 1 FROM pgtasks.jobs r WHERE r.parent_id = j.id))"
                        " ORDER BY id"
                    ).fetchall()

                deadline = time.monotonic() + 90  # jobs held at the cut wait for their lease
                while (left := unfinished()) and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert left == [], f"jobs not succeeded: {left}"
                ids = producer.acknowledged
                runs: dict[int, int] = dict(
                    new.execute(
                        "SELECT job_id, count(*) FROM public.ha_ledger WHERE kind = 'done' GROUP BY job_id"
                    ).fetchall()
                )
                missing = [i for i in ids if i not in runs]
                twice = {i: n for i, n in runs.items() if n != 1}
                statuses: dict[str, int] = dict(
                    new.execute(
                        "SELECT status, count(*) FROM pgtasks.jobs WHERE id = ANY(%s) GROUP BY status", (ids,)
                    ).fetchall()
                )
                ticks = new.execute(
                    "SELECT scheduled_for, count(*) FROM pgtasks.jobs"
                    " WHERE schedule_name = 'tick' AND trigger = 'schedule'"
                    " GROUP BY scheduled_for HAVING count(*) > 1"
                ).fetchall()
                retried = one(new, "SELECT count(*) FROM pgtasks.jobs WHERE attempt > 1")
            codes = [p.stop() for p in procs]
            logs = [p.log() for p in procs]
    finally:
        producer.stop()
        app.close()
    print(
        f"failover ({mode}, promoted after {promote_after:.0f}s): {len(ids)} acknowledged enqueues"
        f" ({len(ids) - acknowledged_before} after the cut), {producer.refused} refused during the cut;"
        f" promote took {promoted:.2f}s; first job done on the new primary {recovery:.2f}s after the cut;"
        f" {retried} jobs ran a second attempt"
    )
    assert missing == [], f"{len(missing)} acknowledged jobs lost"
    assert twice == {}, "a job's transaction committed twice"
    assert statuses == {"succeeded": len(ids)}
    assert ticks == [], "two runs of one cron tick"
    assert waited == {"result": -1, "async result": -2}, waited
    # Each worker's LISTEN connection came back on the new primary by itself.
    assert all("listener reconnected" in log for log in logs[:2]), [log[-3000:] for log in logs[:2]]
    assert recovery < RECOVERY_WITHIN, recovery
    assert codes == [0, 0, 0], [log[-3000:] for log in logs]
    assert all(p.proc.returncode == 0 for p in procs)
    assert timedelta(0) < first - cut_wall


def _database_on(primary: Server, standby: Server) -> tuple[str, pgtasks.App]:
    """A migrated database ``test`` on ``primary``, replayed on ``standby``: (the
    multi-host DSN, an app on it)."""
    with psycopg.connect(primary.dsn(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE test")
    dsn = multi_host_dsn([primary, standby], "test")
    app = make_app(dsn)
    app.migrate()
    wait_replayed(primary.dsn(), standby.dsn())
    return dsn, app


def _jobs_on(server: Server) -> list[int]:
    with psycopg.connect(server.dsn("test"), autocommit=True) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM pgtasks.jobs ORDER BY id").fetchall()]


@pytest.mark.slow
def test_with_asynchronous_replication_an_acknowledged_enqueue_can_be_lost() -> None:
    """The window of loss of asynchronous replication, shown at its widest: the standby
    is down while the primary acknowledges an enqueue, then the primary dies and the
    standby is promoted. The job is gone (docs/guarantees.md says so)."""
    with primary_and_standby(synchronous=False) as (primary, standby):
        _dsn, app = _database_on(primary, standby)
        try:
            kept = app.tasks["ha.record"].delay(1).id
            wait_replayed(primary.dsn(), standby.dsn())
            standby.stop("fast")
            lost = app.tasks["ha.record"].delay(2).id  # acknowledged by the primary alone
            primary.stop("immediate")
            standby.start()
            standby.promote()
            assert _jobs_on(standby) == [kept]
            assert lost > kept
            after = app.tasks["ha.record"].delay(3).id  # the app follows the new primary
            assert _jobs_on(standby) == [kept, after]
        finally:
            app.close()


@pytest.mark.slow
def test_with_synchronous_replication_an_enqueue_is_acknowledged_only_once_on_the_standby() -> None:
    """The same cut with synchronous replication: while the standby is down the
    enqueue's commit waits for it and is never acknowledged; when the primary dies the
    caller gets a transient `DatabaseError`, not an id, so nothing acknowledged is lost."""
    with primary_and_standby(synchronous=True) as (primary, standby):
        _dsn, app = _database_on(primary, standby)
        outcome: dict[str, Any] = {}
        try:
            kept = app.tasks["ha.record"].delay(1).id
            standby.stop("fast")

            def enqueue() -> None:
                try:
                    outcome["id"] = app.tasks["ha.record"].delay(2).id
                except pgtasks.errors.DatabaseError as exc:
                    outcome["error"] = exc

            caller = threading.Thread(target=enqueue, name="enqueue")
            caller.start()
            time.sleep(1.0)  # the commit waits for the synchronous standby the whole time
            assert caller.is_alive() and outcome == {}
            primary.stop("immediate")
            caller.join(30)
            assert not caller.is_alive()
            assert "id" not in outcome and outcome["error"].transient, outcome
            standby.start()
            standby.promote()
            assert _jobs_on(standby) == [kept]
        finally:
            app.close()


def test_a_multi_host_dsn_is_described_host_by_host_without_its_password() -> None:
    """What logs and errors say about a multi-host DSN (`pgtasks.db.describe_dsn`)."""
    from pgtasks.db.database import describe_dsn

    secret = "pw-0f9e"
    uri = f"postgresql://app:{secret}@db1:5432,db2:5433/app?target_session_attrs=read-write"
    keywords = f"host=db1,db2 port=5432,5433 password={secret} dbname=app target_session_attrs=read-write"
    assert describe_dsn(uri) == describe_dsn(keywords) == "db1:5432,db2:5433/app"
    assert describe_dsn("host=db1,db2 port=6432 dbname=app") == "db1:6432,db2:6432/app"
    with pytest.raises(pgtasks.errors.ConnectionFailed) as info:
        pgtasks.App(
            "x", dsn=f"host=127.0.0.1,127.0.0.1 port=1,2 password={secret} dbname=app connect_timeout=2"
        ).migrate()
    assert "127.0.0.1:1,127.0.0.1:2/app" in str(info.value) and secret not in str(info.value)


@pytest.mark.slow
def test_jobs_of_a_claim_whose_reply_was_lost_run_after_the_failover(
    pair: tuple[Server, Server], tmp_path: Path
) -> None:
    """A claim can commit on the primary (and reach the synchronous standby) while its
    reply is lost with the connection: its jobs are then ``running`` under the live
    worker's lease, and the reaper leaves them. The worker hands back what it holds but
    does not know of once its claims go through again, so those jobs run."""
    primary, standby = pair
    dsn, app = _database_on(primary, standby)
    setup_ledger(dsn)
    try:
        # A lease far longer than the test: the reaper does not step in.
        worker = ["worker", "-c", "2", "--poll-interval", "0.2", "--lease-timeout", "120"]
        with processes(dsn, tmp_path, worker) as (proc,):
            with psycopg.connect(primary.dsn("test"), autocommit=True) as conn:
                worker_id = eventually(
                    lambda: one(conn, "SELECT min(id) FROM pgtasks.workers WHERE pid = %s", (proc.pid,)),
                    timeout=30,
                    message="the worker registered",
                )
                # What a claim whose reply was lost leaves behind.
                lost = app.tasks["ha.record"].apply_async(args=(7,), countdown=3600).id
                conn.execute(
                    "UPDATE pgtasks.jobs SET status = 'running', attempt = attempt + 1, worker_id = %s,"
                    " heartbeat_at = now(), run_at = now() WHERE id = %s",
                    (worker_id, lost),
                )
            primary.stop("immediate")
            # A claim that fails, as the lost one did (here it waits for a connection
            # until the pool gives up, 10 s), before the standby takes over.
            eventually(lambda: "claim failed" in proc.log(), timeout=60, message="a claim failed")
            standby.promote()
            assert app.AsyncResult(lost).get(timeout=60) == 7
            assert "handed back 1 job(s) a claim took whose reply was lost" in proc.log()
            assert proc.stop() == 0
        with psycopg.connect(standby.dsn("test"), autocommit=True) as conn:
            assert one(conn, "SELECT attempt FROM pgtasks.jobs WHERE id = %s", (lost,)) == 1
            assert one(conn, "SELECT count(*) FROM public.ha_ledger WHERE job_id = %s", (lost,)) == 1
    finally:
        app.close()


def test_a_connection_whose_set_up_fails_raises_database_error_and_is_closed(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """`Database.connect` raises `DatabaseError`, and closes the connection, when the
    set-up of a new connection fails (a server stopping right after accepting it, in a
    failover): a raw psycopg error there ended the listener's thread, which catches
    `DatabaseError` and connects again. The set-up here is a statement with a
    parameter and none given, which psycopg refuses."""
    from pgtasks.db import Database

    database = Database(dsn, session="job_release")
    before = one(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
    with pytest.raises(pgtasks.errors.DatabaseError):
        database.connect()

    async def connect_async() -> None:
        await database.connect_async()

    with pytest.raises(pgtasks.errors.DatabaseError):
        asyncio.run(connect_async())
    eventually(
        lambda: (
            one(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()") == before
        ),
        message="the connections closed",
    )
