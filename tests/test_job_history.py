"""Finished jobs move out of the hot table (migration 0009, `pgtasks.maintenance.History`)
and every reader sees them as before: get, AsyncResult, list, explain, cancel, requeue
(back to the hot table as queued), tenant handles, schedules history, dependencies on a
moved prerequisite, purge and retention; with three worker processes running while the
mover moves, no job is lost or run twice, and no id is ever in both tables.

The moves are made by the history service itself (``after=0``: every finished job); the
checks read the two tables with plain SQL, apart from pgtasks' own readers.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.worker_app import one, rows, workers
from click.testing import CliRunner
from test_rls import JOBS, A, B, roles, setup  # noqa: F401 (fixtures)

import pgtasks
from pgtasks.cli import cli
from pgtasks.db.history import HistoryStore
from pgtasks.db.retention import RetentionStore
from pgtasks.errors import ConfigurationError, JobNotFound
from pgtasks.maintenance import History, HistoryConfig, Retention
from pgtasks.settings import RetentionPolicy, Settings
from pgtasks.testing import run_until_idle


def _columns(conn: psycopg.Connection[Any], table: str) -> list[tuple[Any, ...]]:
    return rows(
        conn,
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, coalesce(co.collname, '')"
        " FROM pg_attribute a LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 0"
        " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (table,),
    )


def _mover(app: pgtasks.App) -> History:
    return History(HistoryStore(app.database), HistoryConfig(after=0, batch=7, pause=0))


def _split(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    hot = one(conn, "SELECT count(*) FROM pgtasks.jobs")
    return int(hot), int(one(conn, "SELECT count(*) FROM pgtasks.job_history"))


@pytest.fixture
def happ(dsn: str) -> Any:
    application = pgtasks.App("history", dsn=dsn, load_entry_points=False)

    @application.task(name="h.ok")
    def ok(x: int) -> int:
        return x * 2

    @application.task(name="h.fail", max_retries=0)
    def fail(x: int) -> int:
        raise ValueError(f"no {x}")

    yield application
    application.close()


def test_the_history_has_the_columns_of_the_hot_table_in_order(conn: psycopg.Connection[Any]) -> None:
    # The rule of migration 0009: a migration that changes pgtasks.jobs' columns changes
    # pgtasks.job_history's alike, or the move (INSERT ... SELECT *) breaks.
    jobs = _columns(conn, "pgtasks.jobs")
    assert len(jobs) > 30
    assert _columns(conn, "pgtasks.job_history") == jobs
    assert ("pgtasks.job_history",) in rows(conn, "SELECT t::text FROM pgtasks.tenant_tables() t")


def test_moved_jobs_read_through_every_api(happ: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    ok, fail = happ.get_task("h.ok"), happ.get_task("h.fail")
    good = [ok.delay(i) for i in range(20)]
    bad = fail.delay(7)
    other = happ.tenant("globex").bind(ok).delay(100)
    waiting = ok.apply_async((5,), countdown=3600)  # queued: never moves
    run_until_idle(happ)
    mover = _mover(happ)
    result = mover.run_once()
    assert result.moved == 22 and not result.yielded and result.batches == 4
    assert _split(conn) == (1, 22)
    assert one(conn, "SELECT status FROM pgtasks.jobs") == "queued"
    assert mover.run_once().moved == 0

    # get, AsyncResult, list, explain, cancel: as before the move.
    assert [r.get(timeout=5) for r in good] == [i * 2 for i in range(20)]
    assert bad.status == "failed" and happ.get_job(bad.id).error is not None
    job = happ.get_job(good[3].id)
    assert (job.status, job.result, job.task_name) == ("succeeded", 6, "h.ok")
    listed = happ.list_jobs(limit=100)
    assert [j.id for j in listed] == sorted([r.id for r in (*good, bad, other, waiting)], reverse=True)
    assert [j.id for j in happ.list_jobs(status="failed")] == [bad.id]
    assert [j.id for j in happ.list_jobs(status="queued")] == [waiting.id]
    page = happ.list_jobs(limit=5, before_id=good[10].id)
    assert [j.id for j in page] == [r.id for r in reversed(good[5:10])]
    assert happ.explain(good[0].id).codes == ["finished"]
    assert happ.cancel_job(good[0].id) == "finished"

    # A tenant handle: its own moved job reads; another tenant's is no job at all.
    globex = happ.tenant("globex")
    assert globex.get_job(other.id).result == 200
    assert [j.id for j in globex.list_jobs()] == [other.id]
    with pytest.raises(JobNotFound):
        globex.get_job(good[0].id)
    with pytest.raises(JobNotFound):
        globex.requeue(bad.id)
    assert one(conn, "SELECT count(*) FROM pgtasks.job_history WHERE id = %s", (bad.id,)) == 1

    # Requeue of a moved failed job: back in the hot table, queued, attempts numbered on.
    assert happ.requeue(bad.id, by="test") is True
    assert rows(conn, "SELECT status FROM pgtasks.jobs WHERE id = %s", (bad.id,)) == [("queued",)]
    assert one(conn, "SELECT count(*) FROM pgtasks.job_history WHERE id = %s", (bad.id,)) == 0
    assert happ.requeue(good[1].id) is False  # succeeded: stays where it is
    run_until_idle(happ)
    again = happ.get_job(bad.id)
    assert again.status == "failed" and [a.attempt for a in again.history()] == [1, 2]

    # The command line (no app needed to read jobs), and where finished jobs are.
    env = {"COLUMNS": "300", "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    dsn = happ.settings.resolve_dsn()
    shown = CliRunner().invoke(cli, ["--dsn", dsn, "jobs", "show", str(good[4].id), "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    assert (json.loads(shown.output)["status"], json.loads(shown.output)["result"]) == ("succeeded", 8)
    listed_cli = CliRunner().invoke(
        cli, ["--dsn", dsn, "jobs", "list", "--status", "succeeded", "--json"], env=env
    )
    assert listed_cli.exit_code == 0, listed_cli.output
    assert len(json.loads(listed_cli.output)) == 21  # the 20 and globex's
    sizes = HistoryStore(happ.database).sizes()
    assert sizes.hot_finished == 1 and sizes.history_bytes > 0  # the requeued job and sizes.hot_bytes > 0

    # Purge reads both tables: the dry-run count, then the delete.
    assert happ.stores.jobs.purge_count(older_than=0, status=None) == 22
    assert happ.purge(older_than=0, batch=5) == 22
    assert _split(conn) == (1, 0)


def test_a_moved_prerequisite_counts_as_the_finished_job_it_is(
    happ: pgtasks.App, conn: psycopg.Connection[Any]
) -> None:
    ok, fail = happ.get_task("h.ok"), happ.get_task("h.fail")
    a, b = ok.delay(21), fail.delay(1)
    run_until_idle(happ)
    assert _mover(happ).run_once().moved == 2
    then = ok.apply_async((1,), depends_on=[a])
    cancelled = ok.apply_async((2,), depends_on=[b])
    anyway = ok.apply_async((3,), depends_on=[a, b], on_prerequisite_failure="run")
    chained = pgtasks.chain(ok.s(4), ok.s())  # the second gets the first's result
    assert (then.status, cancelled.status, anyway.status) == ("queued", "cancelled", "queued")
    assert happ.get_job(cancelled.id).error["prerequisite_status"] == "failed"  # type: ignore[index]
    last = chained.apply_async()
    run_until_idle(happ, raise_on_failure=False)
    assert (then.get(timeout=5), anyway.get(timeout=5), last.get(timeout=5)) == (2, 6, 16)
    # A dependent enqueued on a moved prerequisite gets its result passed on.
    assert last.parent is not None
    _mover(happ).run_once()
    passed = pgtasks.chain(ok.s(1), ok.s())
    first = passed.apply_async()
    run_until_idle(happ)
    assert first.get(timeout=5) == 4
    assert one(conn, "SELECT count(*) FROM pgtasks.job_dependencies") == 0


def test_unfinished_and_unfollowed_jobs_never_move(happ: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    ok = happ.get_task("h.ok")
    head = ok.apply_async((1,), countdown=3600)
    tail = ok.apply_async((2,), depends_on=[head])
    conn.execute(
        "INSERT INTO pgtasks.jobs (task_name, status, worker_id, started_at, finished_at, trigger,"
        " schedule_name, scheduled_for, followed_up_at)"
        " VALUES ('h.ok', 'succeeded', 'w', now(), now(), 'schedule', 'nightly', now(), NULL),"
        "        ('h.ok', 'succeeded', 'w', now(), now(), 'schedule', 'nightly', now() - interval '1 day',"
        "         NULL)"
    )
    conn.execute(
        "UPDATE pgtasks.jobs SET followed_up_at = finished_at WHERE scheduled_for < now() - interval '1 h'"
    )
    assert _mover(happ).run_once().moved == 1  # the followed-up run only
    assert rows(conn, "SELECT status FROM pgtasks.jobs ORDER BY id") == [
        ("queued",),
        ("blocked",),
        ("succeeded",),
    ]
    assert tail.status == "blocked"
    runs = happ.schedules.history("nightly")
    assert len(runs) == 2 and runs[0].id > runs[1].id
    assert happ.schedules.history("nightly", page=2, per_page=1)[0].id == runs[1].id


def test_retention_deletes_from_the_history_too(happ: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    ok = happ.get_task("h.ok")
    for i in range(5):
        ok.delay(i)
    run_until_idle(happ)
    assert _mover(happ).run_once().moved == 5
    ok.delay(9)
    run_until_idle(happ)
    assert _split(conn) == (1, 5)
    policy = RetentionPolicy(succeeded=0.0, batch=2, pause=0.0)
    retention = Retention(RetentionStore(happ.database), policy)
    assert sum(c.jobs for c in retention.preview()) == 6
    result = retention.run_once()
    assert (result.deleted, result.succeeded) == (6, 6)
    assert _split(conn) == (0, 0)


def test_history_after_from_the_environment() -> None:
    assert Settings.from_env("postgresql:///x", environ={}).history_after == 3600.0
    env = {"PGTASKS_HISTORY_AFTER": "30m"}
    assert Settings.from_env("postgresql:///x", environ=env).history_after == 1800.0
    assert (
        Settings.from_env("postgresql:///x", environ={"PGTASKS_HISTORY_AFTER": "off"}).history_after is None
    )
    assert Settings.from_env("postgresql:///x", environ={"PGTASKS_HISTORY_AFTER": "0"}).history_after == 0.0
    with pytest.raises(ConfigurationError, match="history_after"):
        Settings(dsn="postgresql:///x", history_after=-1)
    with pytest.raises(ConfigurationError, match="history batch"):
        HistoryConfig(batch=0)


@pytest.mark.slow
def test_three_workers_and_the_mover_lose_and_repeat_nothing(
    client: pgtasks.App,
    conn: psycopg.Connection[Any],
    wdsn: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The workers run the history service themselves (after 0 s), and this process moves
    # too, in small batches, while they drain 3,000 jobs.
    monkeypatch.setenv("PGTASKS_HISTORY_AFTER", "0")
    ids = [r.id for r in client.tasks["w.record"].delay_many(list(range(3000)))]
    mover = History(HistoryStore(client.database), HistoryConfig(after=0, batch=50, pause=0))
    stop = threading.Event()
    both: list[int] = []
    moved: list[int] = []

    def move() -> None:
        with psycopg.connect(wdsn, autocommit=True) as side:
            while not stop.is_set():
                moved.append(mover.run_once().moved)
                both.append(
                    one(side, "SELECT count(*) FROM pgtasks.jobs j JOIN pgtasks.job_history h USING (id)")
                )
                time.sleep(0.02)

    thread = threading.Thread(target=move)
    thread.start()
    try:
        with workers(
            wdsn, tmp_path, *(["-c", "4", "--burst", "--poll-interval", "0.2"] for _ in range(3))
        ) as ws:
            codes = [w.wait(180) for w in ws]
    finally:
        stop.set()
        thread.join(30)
    assert codes == [0, 0, 0], [w.log()[-2000:] for w in ws]
    mover.run_once()
    assert sum(moved) > 0 and set(both) == {0}
    assert _split(conn) == (0, 3000)
    assert (
        one(
            conn,
            "SELECT count(*) FROM pgtasks.job_history WHERE status = 'succeeded' AND id = ANY(%s)",
            (ids,),
        )
        == 3000
    )
    per_job = rows(
        conn,
        "SELECT job_id FROM public.ledger GROUP BY job_id HAVING count(*) <> 1 OR count(finished_at) <> 1",
    )
    assert per_job == []
    assert one(conn, "SELECT count(DISTINCT job_id) FROM public.ledger") == 3000
    assert client.get_job(ids[-1]).status == "succeeded"


def test_row_level_security_covers_the_history(setup: dict[str, Any]) -> None:  # noqa: F811
    # test_rls's setup: the mode on, a tenant-facing role "web" granted by `rls grant`,
    # 20 jobs of each tenant enqueued through its tenant handles.
    owner, web, ids, dsn = setup["owner"], setup["web"], setup["ids"], setup["dsn"]
    run_until_idle(owner, queues=["work"])
    assert History(HistoryStore(owner.database), HistoryConfig(after=0)).run_once().moved == 2 * JOBS
    a, b = web.tenant(A), web.tenant(B)
    assert a.get_job(ids[A][3]).result == 3
    with pytest.raises(JobNotFound):
        a.get_job(ids[B][3])
    assert sorted(j.id for j in a.list_jobs(limit=100)) == ids[A]
    with a.connection() as conn:  # raw SQL of tenant A sees A's moved rows only
        assert one(conn, "SELECT count(*) FROM pgtasks.job_history") == JOBS
        assert one(conn, "SELECT count(*) FROM pgtasks.job_history WHERE tenant <> %s", (A,)) == 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE pgtasks.job_history SET status = 'failed', result = NULL, error = '{}'"
            " WHERE id = ANY(%s)",
            ([ids[A][0], ids[A][1]],),
        )
    # B can move none of A's jobs back, through its handle or the function itself.
    with pytest.raises(JobNotFound):
        b.requeue(ids[A][0])
    with b.connection() as conn:
        assert one(conn, "SELECT pgtasks.job_history_restore(%s, NULL)", (ids[A][1],)) is None
    assert a.requeue(ids[A][0]) is True
    with psycopg.connect(dsn) as conn:
        assert rows(conn, "SELECT status, tenant FROM pgtasks.jobs WHERE id = %s", (ids[A][0],)) == [
            ("queued", A)
        ]
        assert one(conn, "SELECT count(*) FROM pgtasks.job_history WHERE id = ANY(%s)", (ids[A][:2],)) == 1
