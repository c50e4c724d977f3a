"""Tasks and schedules the scheduler tests use, and the harness for real scheduler processes.

Scheduler and worker processes load this module with
``pgtasks -A tests.apps.sched_app:app ...`` (DSN from ``PGTASKS_DSN``). The test
process builds the same tasks with `make_app` on its own database; task names are
fixed, so both sides agree.

Tasks write a side ledger (`LEDGER_DDL`): one row per attempt they start, with the
run's trigger, attempt and schedule, so tests count what really ran independently
of pgtasks' bookkeeping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

import pgtasks
from pgtasks.context import TaskContext

REPO = Path(__file__).resolve().parents[2]
APP_SPEC = "tests.apps.sched_app:app"

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS public.sched_ledger (
    id          bigserial PRIMARY KEY,
    job_id      bigint NOT NULL,
    schedule    text,
    trigger     text NOT NULL,
    attempt     integer NOT NULL,
    worker_pid  integer NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz
);
CREATE TABLE IF NOT EXISTS public.sched_flags (name text PRIMARY KEY);
"""

_local = threading.local()


def _conn(dsn: str) -> psycopg.Connection[Any]:
    conns: dict[str, psycopg.Connection[Any]] = _local.__dict__.setdefault("conns", {})
    conn = conns.get(dsn)
    if conn is None or conn.closed:
        conn = psycopg.connect(dsn, autocommit=True)
        conns[dsn] = conn
    return conn


def ledger_start(ctx: TaskContext) -> int:
    """Record that this attempt started; returns the ledger row id."""
    req = ctx.request
    row = (
        _conn(ctx.app.stores.database.dsn)
        .execute(
            "INSERT INTO public.sched_ledger (job_id, schedule, trigger, attempt, worker_pid)"
            " VALUES (%s, %s, %s, %s, %s) RETURNING id",
            (req.id, req.schedule_name, req.trigger, req.attempt, os.getpid()),
        )
        .fetchone()
    )
    assert row is not None
    return int(row[0])


def ledger_finish(ctx: TaskContext, entry: int) -> None:
    """Record that the attempt of ledger row ``entry`` finished."""
    _conn(ctx.app.stores.database.dsn).execute(
        "UPDATE public.sched_ledger SET finished_at = clock_timestamp() WHERE id = %s", (entry,)
    )


def flag_set(ctx: TaskContext, name: str) -> bool:
    """Whether the test raised flag ``name``."""
    row = (
        _conn(ctx.app.stores.database.dsn)
        .execute("SELECT 1 FROM public.sched_flags WHERE name = %s", (name,))
        .fetchone()
    )
    return row is not None


def make_app(dsn: str | None = None) -> pgtasks.App:
    """The test app (``dsn`` None: from ``PGTASKS_DSN``). No schedule is defined in code
    unless ``PGTASKS_TEST_SCHEDULES`` names some (see `_code_schedules`)."""
    app = pgtasks.App("sched-tests", dsn=dsn, load_entry_points=False)

    @app.task(name="s.record", bind=True, max_retries=0)
    def record(self: TaskContext, n: int = 0) -> int:
        ledger_finish(self, ledger_start(self))
        return n

    @app.task(name="s.block", bind=True, max_retries=2, default_retry_delay=0)
    def block(self: TaskContext, flag: str = "go") -> str:
        entry = ledger_start(self)
        while not flag_set(self, flag):
            time.sleep(0.05)
        ledger_finish(self, entry)
        return flag

    @app.task(name="s.block_once", bind=True, max_retries=2, retry_on_worker_lost=False)
    def block_once(self: TaskContext, flag: str = "go") -> str:
        entry = ledger_start(self)
        while not flag_set(self, flag):
            time.sleep(0.05)
        ledger_finish(self, entry)
        return flag

    @app.task(name="s.flaky", bind=True, max_retries=2, default_retry_delay=0)
    def flaky(self: TaskContext, fail_attempts: int = 1) -> int:
        """Fails with a transient error (OSError) on its first ``fail_attempts`` attempts."""
        entry = ledger_start(self)
        if self.request.attempt <= fail_attempts:
            raise ConnectionError(f"attempt {self.request.attempt}: storage unreachable")
        ledger_finish(self, entry)
        return self.request.attempt

    @app.task(name="s.broken", bind=True, max_retries=3, default_retry_delay=0)
    def broken(self: TaskContext) -> None:
        ledger_start(self)
        raise ValueError("bad input: a permanent failure")

    @app.task(name="s.partial", bind=True, max_retries=3)
    def partial(self: TaskContext) -> None:
        ledger_start(self)
        self.report_progress(files_processed=3, files_failed=1, bytes_processed=1234)
        self.partial_failure("1 of 4 files unreadable", result={"files": 3})

    @app.task(name="s.progress", bind=True, max_retries=0)
    def progress(self: TaskContext) -> str:
        entry = ledger_start(self)
        self.report_progress(bytes_processed=10, files_processed=1)
        self.report_progress(bytes_processed=20, files_processed=2)
        ledger_finish(self, entry)
        return "ok"

    _code_schedules(app)
    return app


def _code_schedules(app: pgtasks.App) -> None:
    """Code-defined schedules for process tests: ``PGTASKS_TEST_SCHEDULES=every-minute``."""
    wanted = set(filter(None, os.environ.get("PGTASKS_TEST_SCHEDULES", "").split(",")))
    if "every-minute" in wanted:
        app.add_periodic_task("* * * * *", "s.record", name="every-minute", overlap="allow")
    if "block-every-minute" in wanted:
        app.add_periodic_task("* * * * *", "s.block", name="block-every-minute", max_retries=2)


app = make_app()


# -- the test side ----------------------------------------------------------------------


def setup_ledger(dsn: str) -> None:
    """Create the ledger and flags tables in the test database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)


def raise_flag(dsn: str, name: str) -> None:
    """Let tasks blocked on ``name`` go on."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO public.sched_flags VALUES (%s) ON CONFLICT DO NOTHING", (name,))


class Process:
    """A ``pgtasks -A tests.apps.sched_app:app ...`` subprocess.

    Args:
        dsn: the test database (``PGTASKS_DSN``).
        args: the command and its flags, e.g. ``["scheduler", "--interval", "0.05"]``.
        log_path: file receiving the process's output.
        env: extra environment variables.
    """

    def __init__(
        self, dsn: str, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.log_path = log_path
        full_env = {
            **os.environ,
            "PGTASKS_DSN": dsn,
            "PGTASKS_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgtasks", "-A", APP_SPEC, "-l", "INFO", *args],
            cwd=REPO,
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        """The process id."""
        return self.proc.pid

    def log(self) -> str:
        """Everything the process printed so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait, return the exit code (SIGKILL if it does not stop)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        """Kill if still running and close the log."""
        self.kill()
        self._log.close()
