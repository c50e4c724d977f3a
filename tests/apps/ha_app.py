"""Tasks of the tests past one database server (failover, PgBouncer, replicas), and the
harness that starts real ``pgtasks`` processes for them.

Processes load this module with ``pgtasks -A tests.apps.ha_app:app ...``; the DSN
comes from ``PGTASKS_DSN`` (a multi-host DSN, or PgBouncer's), with
``PGTASKS_PREPARE_THRESHOLD=off`` and ``PGTASKS_LISTEN=off`` where a pooler sits in
between. The test process
builds the same tasks with `make_app`.

The side ledger (`LEDGER_DDL`): ``ha.record`` writes its row inside the task's
transaction (``self.transaction()``), which commits with the job's success, so the
ledger holds exactly one row per succeeded job whatever happened to the attempts
that did not commit. The other tasks note each attempt's start on a connection of
their own (autocommit, no prepared statements, so it works through PgBouncer too).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

import pgtasks
from pgtasks.context import TaskContext
from pgtasks.errors import DatabaseError

REPO = Path(__file__).resolve().parents[2]
APP_SPEC = "tests.apps.ha_app:app"

LEDGER_DDL = """
CREATE TABLE IF NOT EXISTS public.ha_ledger (
    id          bigserial PRIMARY KEY,
    job_id      bigint NOT NULL,
    attempt     integer NOT NULL,
    kind        text NOT NULL,
    worker_pid  integer NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS public.ha_flags (name text PRIMARY KEY);
"""

_local = threading.local()


def _conn(dsn: str) -> psycopg.Connection[Any]:
    """This thread's own autocommit connection to ``dsn`` (no prepared statements)."""
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or conn.broken:
        conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None, connect_timeout=5)
        _local.conn = conn
    return conn


def note(ctx: TaskContext, kind: str) -> None:
    """Note an attempt of the job in the ledger, outside the job's transaction."""
    _conn(ctx.app.stores.database.dsn).execute(
        "INSERT INTO public.ha_ledger (job_id, attempt, kind, worker_pid) VALUES (%s, %s, %s, %s)",
        (ctx.request.id, ctx.request.attempt, kind, os.getpid()),
    )


def flag_set(ctx: TaskContext, name: str) -> bool:
    """Whether the test raised flag ``name``."""
    found = _conn(ctx.app.stores.database.dsn).execute(
        "SELECT 1 FROM public.ha_flags WHERE name = %s", (name,)
    )
    return found.fetchone() is not None


def make_app(dsn: str | None = None, **settings: Any) -> pgtasks.App:
    """The test app with every task below (``dsn`` None: from the environment)."""
    if settings:
        app = pgtasks.App(
            "ha-tests", settings=pgtasks.Settings.from_env(dsn, **settings), load_entry_points=False
        )
    else:
        app = pgtasks.App("ha-tests", dsn=dsn, load_entry_points=False)

    @app.task(
        name="ha.record",
        bind=True,
        max_retries=50,
        autoretry_for=(DatabaseError, psycopg.Error),
        default_retry_delay=0.2,
    )
    def record(self: TaskContext, n: int = 0) -> int:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO public.ha_ledger (job_id, attempt, kind, worker_pid)"
                " VALUES (%s, %s, 'done', %s)",
                (self.request.id, self.request.attempt, os.getpid()),
            )
        return n

    @app.task(name="ha.fail", bind=True, max_retries=2, autoretry_for=(ValueError,), default_retry_delay=0)
    def fail(self: TaskContext) -> None:
        note(self, "fail")
        raise ValueError(f"attempt {self.request.attempt} fails")

    @app.task(name="ha.block", bind=True, max_retries=3)
    def block(self: TaskContext, flag: str) -> str:
        note(self, "block")
        while not flag_set(self, flag):
            time.sleep(0.05)
        return flag

    @app.task(name="ha.until_cancelled", bind=True, max_retries=0)
    def until_cancelled(self: TaskContext) -> str:
        note(self, "cancellable")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.is_cancelled():
                note(self, "saw cancel")
                return "stopped early"
            time.sleep(0.05)
        return "ran to the end"

    return app


app = make_app()


def setup_ledger(dsn: str) -> None:
    """Create the ledger and flags tables (on the primary)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(LEDGER_DDL)


def raise_flag(dsn: str, name: str) -> None:
    """Let tasks blocked on ``name`` go on."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("INSERT INTO public.ha_flags VALUES (%s) ON CONFLICT DO NOTHING", (name,))


class Process:
    """A ``pgtasks -A tests.apps.ha_app:app ...`` subprocess.

    Args:
        dsn: the DSN it connects with (``PGTASKS_DSN``).
        args: the command and its flags, e.g. ``["worker", "-c", "32", "--no-listen"]``.
        log_path: file receiving the process's output.
        env: extra environment variables (``PGTASKS_PREPARE_THRESHOLD``, ``PGTASKS_LISTEN``).
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

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait, return the exit code (SIGKILL and -9 if it does not stop)."""
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


@contextmanager
def processes(
    dsn: str, log_dir: Path, *commands: Sequence[str], env: dict[str, str] | None = None
) -> Iterator[list[Process]]:
    """Start one process per command; kill whatever is left on exit."""
    started: list[Process] = []
    try:
        for args in commands:
            fd, path = tempfile.mkstemp(dir=log_dir, prefix=f"{args[0]}-", suffix=".log")
            os.close(fd)
            started.append(Process(dsn, args, Path(path), env))
        yield started
    finally:
        for p in started:
            p.close()
