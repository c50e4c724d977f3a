"""Real processes: several schedulers racing on one database, a worker killed with
``kill -9`` mid-run, ``worker --beat`` and the ``schedules`` commands.

Scheduler processes here run on a simulated clock (a hidden ``--simulate-clock``
option: every process derives the same time from one anchor, at a chosen speed), so
minutes of schedule time pass in seconds while the processes race for real on the
same rows. Tasks write a side ledger (`apps.sched_app.LEDGER_DDL`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps.sched_app import APP_SPEC, REPO, Process, make_app, raise_flag, setup_ledger
from helpers import eventually

import pgtasks

START = datetime(2025, 6, 2, 12, 0, 30, tzinfo=UTC)
MIN = timedelta(minutes=1)


@pytest.fixture
def sapp(dsn: str) -> Iterator[pgtasks.App]:
    setup_ledger(dsn)
    app = make_app(dsn)
    yield app
    app.close()


@contextmanager
def processes(dsn: str, log_dir: Path, *commands: list[str]) -> Iterator[list[Process]]:
    """Start one process per command; kill whatever is left on exit."""
    started: list[Process] = []
    try:
        for args in commands:
            fd, path = tempfile.mkstemp(dir=log_dir, prefix=f"{args[0]}-", suffix=".log")
            os.close(fd)
            started.append(Process(dsn, args, Path(path)))
        yield started
    finally:
        for p in started:
            p.close()


def clock(start: datetime, speed: float, anchor: float, until: datetime | None = None) -> str:
    parts = [start.isoformat(), str(speed), repr(anchor)]
    if until is not None:
        parts.append(until.isoformat())
    return ",".join(parts)


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGTASKS_DSN": dsn, "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1", "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "pgtasks", "-A", APP_SPEC, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def runs(conn: psycopg.Connection[Any], name: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT id, trigger, scheduled_for, status, attempt, parent_id, error ->> 'code', error ->> 'class'"
        " FROM pgtasks.jobs WHERE schedule_name = %s ORDER BY id",
        (name,),
    ).fetchall()


@pytest.mark.slow
def test_three_schedulers_for_three_minutes_make_exactly_three_runs(
    sapp: pgtasks.App, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    sapp.schedules.create("every-minute", "s.record", "* * * * *", overlap="allow", now=START)
    until = START + 3 * MIN  # 12:03:30: fires at 12:01, 12:02 and 12:03
    anchor = time.time() + 6.0  # all three are up and polling before the first fire time
    command = ["scheduler", "--interval", "0.01", "--simulate-clock", clock(START, 30.0, anchor, until)]
    with processes(sapp.database.dsn, tmp_path, command, command, command) as procs:
        eventually(lambda: all("scheduler ready" in p.log() for p in procs), timeout=30, message="ready")
        assert time.time() < anchor, "the processes took too long to start for a real race"
        # Let simulated time run to the end (3 minutes at 30x = 6 s) and a little beyond.
        eventually(lambda: time.time() > anchor + 7.0, timeout=30, interval=0.1, message="clock ran out")
        codes = [p.stop() for p in procs]
        logs = [p.log() for p in procs]
    assert codes == [0, 0, 0], logs
    made = runs(conn, "every-minute")
    assert [(r[1], r[2]) for r in made] == [
        ("schedule", START + m * MIN - timedelta(seconds=30)) for m in (1, 2, 3)
    ]
    # Every process ticked the whole time; together they created three runs.
    fired_lines = [log.count("fired for") for log in logs]
    assert sum(fired_lines) == 3, fired_lines
    assert all("Traceback" not in log for log in logs), logs


@pytest.mark.slow
def test_a_killed_workers_run_fails_worker_lost_is_retried_and_the_schedule_keeps_firing(
    sapp: pgtasks.App, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    sapp.schedules.create("lost", "s.block", "* * * * *", now=START)  # retries: the task's 2
    sapp.schedules.create("lost-once", "s.block_once", "* * * * *", now=START)  # not idempotent
    dsn = sapp.database.dsn
    sim = clock(START, 10.0, time.time() + 3.0)  # one simulated minute every 6 s
    scheduler = ["scheduler", "--interval", "0.05", "--no-reap", "--simulate-clock", sim]
    victim_args = ["worker", "-c", "2", "--lease-timeout", "2", "--poll-interval", "0.1"]
    with processes(dsn, tmp_path, scheduler, victim_args) as (sched, victim):
        first = eventually(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM public.sched_ledger WHERE attempt = 1 AND worker_pid = %s",
                    (victim.pid,),
                ).fetchone()[0]  # type: ignore[index]
                == 2
            ),
            timeout=60,
            message="both first runs started on the victim",
        )
        assert first
        lost_id = runs(conn, "lost")[0][0]
        # A manual trigger while the run is active is refused, naming the active run.
        refused = cli(dsn, "schedules", "trigger", "lost")
        assert refused.returncode == 1
        assert f"already has an active run {lost_id}" in refused.stderr

        victim.kill()
        with processes(
            dsn, tmp_path, ["worker", "-c", "2", "--lease-timeout", "2", "--poll-interval", "0.1"]
        ):
            eventually(lambda: len(runs(conn, "lost")) >= 2, timeout=60, message="retry run")
            raise_flag(dsn, "go")
            eventually(
                lambda: [r[3] for r in runs(conn, "lost")][:3] == ["failed", "succeeded", "succeeded"],
                timeout=60,
                message="retry succeeded and the next tick ran",
            )
            eventually(lambda: len(runs(conn, "lost-once")) >= 2, timeout=60, message="lost-once fires again")
        sched.stop()

    # The retry and the next tick are independent: under load the tick may come first.
    lost, *others = runs(conn, "lost")
    retry = next(r for r in others if r[1] == "retry")
    later = next(r for r in others if r[1] == "schedule")
    assert lost[1:5] == ("schedule", START + 30 * timedelta(seconds=1), "failed", 1)
    assert (lost[6], lost[7]) == ("WORKER_LOST", "transient")
    assert (retry[1], retry[4], retry[5], retry[2]) == ("retry", 2, lost[0], lost[2])
    assert later[1] == "schedule" and later[2] > lost[2]
    once = runs(conn, "lost-once")
    assert (once[0][3], once[0][6]) == ("failed", "WORKER_LOST")
    assert [r[1] for r in once] == ["schedule"] * len(once)  # never a retry: not idempotent
    # The ledger: what the tasks themselves saw.
    seen = conn.execute(
        "SELECT trigger, attempt, finished_at IS NOT NULL FROM public.sched_ledger"
        " WHERE job_id = ANY(%s) ORDER BY id",
        ([lost[0], retry[0]],),
    ).fetchall()
    assert seen == [("schedule", 1, False), ("retry", 2, True)]
    history = sapp.schedules.history("lost", per_page=100)
    old = next(r for r in history if r.id == lost[0])
    assert old.worker_id is not None and str(victim.pid) in old.worker_id  # the worker that vanished
    assert sapp.schedules.get("lost").last_outcome == "succeeded"


@pytest.mark.slow
def test_worker_beat_runs_the_scheduler_inside_the_worker(
    sapp: pgtasks.App, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    sapp.schedules.create("beat", "s.record", "* * * * *", kwargs={"n": 5}, now=row[0] - 10 * MIN)
    with processes(
        sapp.database.dsn, tmp_path, ["worker", "--beat", "-c", "1", "--poll-interval", "0.1"]
    ) as (w,):
        eventually(lambda: [r[3] for r in runs(conn, "beat")][:1] == ["succeeded"], timeout=60, message="run")
        assert w.stop() == 0
    assert "scheduler (beat) started" in w.log()
    (first, *_) = runs(conn, "beat")
    assert first[1] == "schedule"


def test_schedules_commands(sapp: pgtasks.App, conn: psycopg.Connection[Any]) -> None:
    dsn = sapp.database.dsn
    sapp.schedules.create("nightly", "s.record", "30 2 * * *", timezone="Europe/Berlin", now=START)
    out = cli(dsn, "schedules", "next", "nightly", "-n", "3", "--from", "2025-03-29T12:00")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "2025-03-30 03:00:00 CEST (01:00:00 UTC)",
        "2025-03-31 02:30:00 CEST (00:30:00 UTC)",
        "2025-04-01 02:30:00 CEST (00:30:00 UTC)",
    ]
    triggered = cli(dsn, "schedules", "trigger", "nightly", "--by", "ops@cli")
    assert triggered.returncode == 0 and "manual run" in triggered.stdout
    assert (
        cli(dsn, "schedules", "pause", "nightly", "--by", "ops").stdout.strip() == "schedule nightly: paused"
    )
    assert "paused" in cli(dsn, "schedules", "show", "nightly").stdout
    assert "resumed" in cli(dsn, "schedules", "resume", "nightly").stdout
    history = cli(dsn, "schedules", "history", "nightly", "--page", "1")
    assert history.returncode == 0 and "ops@cli" in history.stdout
    assert "nightly" in cli(dsn, "schedules", "list").stdout
    once = cli(dsn, "scheduler", "--once")
    assert once.returncode == 0 and "fired=0" in once.stdout
    missing = cli(dsn, "schedules", "show", "nope")
    assert missing.returncode == 1 and "no schedule named 'nope'" in missing.stderr
    assert cli(dsn, "schedules", "delete", "nightly", "--yes").returncode == 0
    assert conn.execute("SELECT count(*) FROM pgtasks.schedules").fetchone() == (0,)
