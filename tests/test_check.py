"""``pgtasks check``: each exit code from its condition produced for real.

* 10: a server that does not listen (a closed port), and a database that does not exist;
* 11: a migration row deleted from a cloned database, and a database never migrated;
* 12: a due job and no live worker (none, or only one whose lease ran out);
* 13: a worker process killed with SIGKILL while it runs a job, its lease then expired;
* 14: ``--max-wait`` shorter than the wait of the oldest due job.

The JSON each run prints is compared with the database, read on a side connection,
and every run is checked to have changed nothing.
"""

from __future__ import annotations

import datetime as dt
import signal
import socket
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from apps.worker_app import ledger_rows, one, rows, worker_id_of, workers
from click.testing import CliRunner, Result
from helpers import eventually

import pgtasks
from pgtasks.cli import cli
from pgtasks.maintenance import Reaper, ReaperConfig
from pgtasks.migrate import migrations

CHECKS = ["database", "migrations", "workers", "stuck_jobs", "max_wait"]


def run(dsn: str, *args: str) -> Result:
    """``pgtasks --dsn DSN check ARGS`` in process."""
    env = {"COLUMNS": "400", "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return CliRunner().invoke(cli, ["--dsn", dsn, "check", *args], env=env, catch_exceptions=False)


def run_json(dsn: str, *args: str) -> tuple[int, dict[str, Any]]:
    """The exit code and the parsed document of ``pgtasks check --json ARGS``."""
    result = run(dsn, "--json", *args)
    document = orjson.loads(result.stdout)
    assert document["exit_code"] == result.exit_code
    assert [c["name"] for c in document["checks"]] == CHECKS
    return result.exit_code, document


def by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in document["checks"]}


def statuses(document: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in document["checks"]}


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def snapshot(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """What a check must leave as it was: jobs, workers and the migration ledger."""
    return [
        *rows(conn, "SELECT id, status, attempt, worker_id, run_at, error FROM pgtasks.jobs ORDER BY id"),
        *rows(conn, "SELECT id, lease_expires_at FROM pgtasks.workers ORDER BY id"),
        *rows(conn, "SELECT version FROM pgtasks.migrations ORDER BY version"),
    ]


def register_worker(app: pgtasks.App, name: str, queues: list[str], *, expired: bool = False) -> None:
    """Register a worker row the way a worker does; ``expired``: its lease ran out an hour ago."""
    now = app.database.now()
    app.stores.workers.register(
        id=f"h:1:{name}",
        host="h",
        pid=1,
        queues=queues,
        concurrency=1,
        pool="threads",
        lease_timeout=30.0,
        now=now - dt.timedelta(hours=1) if expired else None,
    )


# -- 0 ------------------------------------------------------------------------------------------


def test_a_healthy_deployment_exits_0_and_says_so(app: pgtasks.App, dsn: str) -> None:
    code, document = run_json(dsn)
    assert code == 0 and document["status"] == "ok"
    assert statuses(document) == {
        "database": "ok",
        "migrations": "ok",
        "workers": "ok",
        "stuck_jobs": "ok",
        "max_wait": "skipped",
    }
    checks = by_name(document)
    assert checks["migrations"]["details"] == {"applied": len(migrations()), "pending": []}
    assert checks["workers"]["details"] == {"unserved": [], "queues": []}
    assert checks["stuck_jobs"]["details"] == {"total": 0, "jobs": []}
    assert dt.datetime.fromisoformat(document["checked_at"]).utcoffset() == dt.timedelta(0)
    assert document["queues"] is None

    text = run(dsn)
    assert text.exit_code == 0
    lines = text.output.splitlines()
    assert [line.split()[:2] for line in lines[:5]] == [
        ["database", "ok"],
        ["migrations", "ok"],
        ["workers", "ok"],
        ["stuck_jobs", "ok"],
        ["max_wait", "skipped"],
    ]
    assert lines[-1] == "status: ok (exit 0)"


def test_help_lists_every_exit_code() -> None:
    result = CliRunner().invoke(cli, ["check", "--help"])
    assert result.exit_code == 0
    codes = ["0   every", "10  database", "11  migrations", "12  workers", "13  stuck_jobs", "14  max_wait"]
    for line in codes:
        assert line in result.output


# -- 10 -----------------------------------------------------------------------------------------


def test_a_server_that_does_not_listen_exits_10(tmp_path: Path) -> None:
    dsn = f"postgresql://postgres:hunter22@127.0.0.1:{closed_port()}/nowhere"
    code, document = run_json(dsn)
    assert code == 10 and document["status"] == "failed" and document["checked_at"] is None
    checks = by_name(document)
    assert checks["database"]["status"] == "failed"
    assert checks["database"]["details"]["server"].startswith("127.0.0.1:")
    assert "hunter22" not in run(dsn, "--json").stdout  # the password is never shown
    assert [checks[name]["status"] for name in CHECKS[1:]] == ["skipped"] * 4

    text = run(dsn)
    assert text.exit_code == 10
    assert text.output.splitlines()[0].split()[:2] == ["database", "failed"]
    assert "cannot reach the database" in text.output and "hunter22" not in text.output


def test_a_database_that_does_not_exist_exits_10(admin_dsn: str) -> None:
    params = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    params["dbname"] = "pgtasks_no_such_database"
    code, document = run_json(psycopg.conninfo.make_conninfo("", **params))
    assert code == 10
    assert "does not exist" in by_name(document)["database"]["details"]["error"]


# -- 11 -----------------------------------------------------------------------------------------


def test_a_deleted_migration_row_exits_11_and_names_it(dsn: str, conn: psycopg.Connection[Any]) -> None:
    last = migrations()[-1]
    conn.execute("DELETE FROM pgtasks.migrations WHERE version = %s", (last.version,))
    before = snapshot(conn)
    code, document = run_json(dsn)
    assert code == 11
    checks = by_name(document)
    assert checks["migrations"]["status"] == "failed"
    assert checks["migrations"]["details"] == {
        "applied": len(migrations()) - 1,
        "pending": [{"version": last.version, "name": last.name}],
    }
    # The schema is there: the other checks still ran.
    assert [checks[name]["status"] for name in ("workers", "stuck_jobs")] == ["ok", "ok"]
    assert snapshot(conn) == before  # check applies nothing


def test_a_database_never_migrated_exits_11_and_creates_nothing(empty_dsn: str) -> None:
    code, document = run_json(empty_dsn)
    assert code == 11
    checks = by_name(document)
    assert [p["version"] for p in checks["migrations"]["details"]["pending"]] == [
        m.version for m in migrations()
    ]
    assert [checks[name]["status"] for name in CHECKS[2:]] == ["skipped"] * 3
    with psycopg.connect(empty_dsn) as conn:
        assert one(conn, "SELECT to_regnamespace('pgtasks') IS NULL") is True


# -- 12 and 14 ----------------------------------------------------------------------------------


def test_a_due_job_without_a_live_worker_exits_12(
    app: pgtasks.App, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    @app.task(queue="ocr")
    def ocr(n: int) -> int:
        return n

    @app.task(queue="mail")
    def mail() -> None: ...

    for n in range(3):
        ocr.delay(n)
    mail.apply_async(countdown=3600)  # not due: no problem for anyone
    register_worker(app, "dead", ["ocr"], expired=True)  # a lost worker does not serve
    register_worker(app, "other", ["mail"])  # a live worker of another queue does not either
    before = snapshot(conn)

    code, document = run_json(dsn)
    assert code == 12
    workers_check = by_name(document)["workers"]
    assert workers_check["status"] == "failed"
    assert workers_check["details"]["unserved"] == ["ocr"]
    (queue,) = workers_check["details"]["queues"]
    oldest = one(conn, "SELECT min(run_at) FROM pgtasks.jobs WHERE queue = 'ocr' AND status = 'queued'")
    assert (queue["queue"], queue["due"], queue["live_workers"]) == ("ocr", 3, 0)
    assert dt.datetime.fromisoformat(queue["oldest_run_at"]) == oldest
    assert queue["oldest_wait_seconds"] > 0
    assert "no live worker" in run(dsn).output
    assert snapshot(conn) == before

    # Limited to another queue, the check passes; a filter naming no queue at all does too.
    assert run_json(dsn, "--queue", "mail")[0] == 0
    assert run_json(dsn, "--queue", "no-such-queue")[1]["checks"][2]["details"]["queues"] == []

    # A live worker for the queue: served, though the jobs still wait.
    register_worker(app, "live", ["mail", "ocr"])
    code, document = run_json(dsn, "-Q", "ocr")
    assert code == 0 and document["queues"] == ["ocr"]
    assert by_name(document)["workers"]["details"]["queues"][0]["live_workers"] == 1

    # ... but they have waited longer than --max-wait 0.
    code, document = run_json(dsn, "--max-wait", "0")
    assert code == 14
    wait = by_name(document)["max_wait"]
    assert wait["details"]["max_wait_seconds"] == 0
    assert [late["queue"] for late in wait["details"]["late"]] == ["ocr"]
    assert run_json(dsn, "--max-wait", "3600")[0] == 0


def test_no_worker_wins_over_max_wait_in_the_exit_code(app: pgtasks.App, dsn: str) -> None:
    @app.task(queue="ocr")
    def ocr() -> None: ...

    ocr.delay()
    code, document = run_json(dsn, "--max-wait", "0")
    assert code == 12
    assert statuses(document)["max_wait"] == "failed"  # reported, with the lower code first


# -- 13 -----------------------------------------------------------------------------------------


def test_a_killed_worker_s_running_job_exits_13_until_reaped(
    client: pgtasks.App, wdsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    job_id = client.tasks["w.block"].delay("never").id
    with workers(wdsn, tmp_path, ["-c", "1", "--lease-timeout", "1", "--poll-interval", "0.1"]) as (victim,):
        victim_id = worker_id_of(conn, victim.pid)
        eventually(lambda: len(ledger_rows(conn, job_id)) == 1, timeout=20, message="the job started")
        assert run_json(wdsn)[0] == 0  # alive: not stuck
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
    eventually(
        lambda: one(conn, "SELECT lease_expires_at < now() FROM pgtasks.workers WHERE id = %s", (victim_id,)),
        timeout=10,
        message="the victim's lease expired",
    )
    before = snapshot(conn)
    code, document = run_json(wdsn)
    assert code == 13
    stuck = by_name(document)["stuck_jobs"]
    assert stuck["details"]["total"] == 1
    (listed,) = stuck["details"]["jobs"]
    lease = one(conn, "SELECT lease_expires_at FROM pgtasks.workers WHERE id = %s", (victim_id,))
    assert (listed["id"], listed["worker_id"], listed["task_name"]) == (job_id, victim_id, "w.block")
    assert dt.datetime.fromisoformat(listed["lease_expires_at"]) == lease
    assert one(conn, "SELECT status FROM pgtasks.jobs WHERE id = %s", (job_id,)) == "running"
    assert str(job_id) in run(wdsn).output
    assert snapshot(conn) == before  # check reports, the reaper recovers

    # Another queue's view does not see it.
    assert run_json(wdsn, "--queue", "elsewhere")[0] == 0
    # Recovered by the reaper (a worker's maintenance, run here once): no longer stuck, and
    # now a due job without a live worker.
    reaped = Reaper(client.stores.jobs, client.stores.workers, ReaperConfig(lease_timeout=1.0)).run_once()
    assert reaped.requeued == 1
    code, document = run_json(wdsn)
    assert code == 12 and statuses(document)["stuck_jobs"] == "ok"


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--max-wait", "-1"],
        ["--max-wait", "nan"],
        ["--max-wait", "soon"],
        ["--queue", ""],
        ["--queue", "a\x00b"],
        ["--nope"],
    ],
)
def test_bad_options_are_usage_errors_and_check_nothing(
    dsn: str, conn: psycopg.Connection[Any], args: list[str]
) -> None:
    before = snapshot(conn)
    result = run(dsn, "--json", *args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert "Error" in result.stderr
    assert snapshot(conn) == before


def test_an_app_that_cannot_be_loaded_exits_1(dsn: str) -> None:
    result = CliRunner().invoke(cli, ["--dsn", dsn, "-A", "no_such_module:app", "check", "--json"])
    assert result.exit_code == 1
    assert result.stdout == "" and "no_such_module" in result.stderr
